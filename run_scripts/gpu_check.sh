#!/usr/bin/env bash
# One prepared check for a CUDA machine (no network needed; about 5 minutes on one GPU):
#   1. the tests that need a GPU (they skip on CPU machines)
#   2. benchmarks/gpu_check.py: fp32 vs amp O2 vs amp O1 vs bf16 step time and peak memory on the base
#      model at ClipBERT's MSRVTT input, the FusedLayerNorm path, the CUDA PrefetchLoader, a 1-process
#      torchrun NCCL init, data-loader clips/s vs GPU steps/s -> OUT/gpu_check.json + gpu_check.md
#   3. benchmarks/amp_oracle.py --steps 300 (real apex.amp vs ours), when that script is present
#
#   ./run_scripts/gpu_check.sh [--cpu-dry-run] [--out DIR]     (default DIR: output/gpu_check)
# --cpu-dry-run: the same code paths on CPU with the tiny model (CI runs it: tests/test_gpu_check.py).
# The env is VENV_DIR (default <repo>/.venv; /opt/venv in the Docker image); PYTHON overrides it.
set -uo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-${VENV_DIR:-$REPO/.venv}/bin/python}"
# the checkout importable without `pip install -e .` (an offline GPU machine with wheels only)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
DRY=0
for arg in "$@"; do [ "$arg" = --cpu-dry-run ] && DRY=1; done
log() { echo "[gpu_check.sh] $*"; }
failed=()

if [ "$DRY" = 0 ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "[gpu_check.sh] ERROR: torch sees no CUDA device ($PY); use --cpu-dry-run on a CPU machine" >&2
  exit 1
fi

log "1/3 GPU-only tests"
mapfile -t ids < <("$PY" benchmarks/gpu_check.py --list-cuda-tests)
if [ "${#ids[@]}" -eq 0 ]; then
  log "no GPU-only tests found"
else
  "$PY" -m pytest -q -rs -p no:cacheprovider "${ids[@]}" || failed+=("GPU-only tests")
fi

log "2/3 precision / memory / loader / torchrun check"
"$PY" benchmarks/gpu_check.py "$@" || failed+=("benchmarks/gpu_check.py")

log "3/3 apex.amp oracle"
if [ -f benchmarks/amp_oracle.py ]; then
  if [ "$DRY" = 1 ]; then oracle=(--cpu-dry-run); else oracle=(--steps 300); fi
  "$PY" benchmarks/amp_oracle.py "${oracle[@]}" || failed+=("benchmarks/amp_oracle.py ${oracle[*]}")
else
  log "skipped: benchmarks/amp_oracle.py is not in this checkout"
fi

if [ "${#failed[@]}" -gt 0 ]; then
  echo "[gpu_check.sh] FAILED: ${failed[*]}" >&2
  exit 1
fi
log "all parts passed"
