#!/usr/bin/env bash
# Run the whole pytest suite inside the project env (creating/updating it first).
#   ./run_scripts/test.sh                 # everything
#   ./run_scripts/test.sh tests/test_hvd.py -k torchrun   # extra args go to pytest
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
"$REPO/run_scripts/setup_env.sh"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
set +e
"$REPO/.venv/bin/python" -m pytest "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[test.sh] ERROR: pytest collected no tests (exit code 5)" >&2
  exit 1
fi
exit "$rc"
