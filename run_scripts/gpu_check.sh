#!/usr/bin/env bash
# The GPU check: one command on a (possibly offline) GPU node, about 9 minutes at most, results first.
#
#   ./run_scripts/gpu_check.sh [--out DIR] [--bundle DIR] [--parts env,amp_o2,...] [--cpu-dry-run]
#
# DIR (default output/gpu_check) gets one JSON file per part the moment the part has figures, and
# summary.md after each part (8 files): 1 env, 2 amp O2 vs fp32, 3 bf16 (+ fp32 TF32), 4 real-apex
# oracle (O2, O1), 5 the GPU tests, 6 loader clips/s, 7 torchrun NCCL + Horovod built with NCCL and
# horovodrun --fp16 1 steps. A part that fails records its error and the next part runs.
# --bundle (default third_party_wheels/gpu_bundle, made by run_scripts/gpu_bundle.sh on a machine with
# network) is installed first into this python, only the packages it lacks (pip --no-index --no-deps).
# --cpu-dry-run: every part on CPU with the tiny model (CI: tests/test_gpu_check_node.py).
# The interpreter: PYTHON, else VENV_DIR's (default <repo>/.venv) where it exists, else python3 (a GPU
# node's own python with its CUDA torch).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
venv_py="${VENV_DIR:-$REPO/.venv}/bin/python"
if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"; elif [ -x "$venv_py" ]; then PY="$venv_py"; else PY=python3; fi
# the checkout importable without `pip install -e .`, and benchmarks/ for the parts' shared workers
export PYTHONPATH="$REPO/src:$REPO:$REPO/benchmarks${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
exec "$PY" "$REPO/tools/gpu_check.py" "$@"
