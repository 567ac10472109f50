#!/usr/bin/env bash
# Lint (ruff) and the whole pytest suite inside the project env (creating/updating it first).
#   ./run_scripts/test.sh                 # everything
#   ./run_scripts/test.sh tests/test_hvd.py -k torchrun   # extra args go to pytest
#   ./run_scripts/test.sh -m "not multiprocess"            # skip the horovodrun/torchrun tests
#   PYTEST_WORKERS=0 ./run_scripts/test.sh                 # one pytest process (default 2: two xdist workers)
# The env is VENV_DIR (default <repo>/.venv; /opt/venv in the Docker image), as in setup_env.sh.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
VENV_DIR="${VENV_DIR:-$REPO/.venv}"
export VENV_DIR
"$REPO/run_scripts/setup_env.sh"
"$REPO/run_scripts/install_test_deps.sh"   # openssh-server for tests/test_multinode.py (root + apt)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
set +e
echo "[test.sh] ruff check (config: pyproject.toml)"
"$VENV_DIR/bin/ruff" check "$REPO"
lint_rc=$?
[ "$lint_rc" -eq 0 ] || echo "[test.sh] ERROR: ruff found problems (see above; 'ruff check --fix' fixes some)" >&2
# PYTEST_WORKERS=N (default 2): N xdist workers, the multi-process tests and the files sharing data/demo kept
# one after another on one worker (tests/conftest.py: the "serial" group; tests/test_xdist_groups.py checks
# it reaches the workers); PYTEST_WORKERS=0: one process. The 30 slowest tests are listed at the end.
"$VENV_DIR/bin/python" -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup --durations=30 "$@"
rc=$?
set -e
if [ "$rc" -eq 5 ]; then
  echo "[test.sh] ERROR: pytest collected no tests (exit code 5)" >&2
  exit 1
fi
[ "$rc" -ne 0 ] && exit "$rc"
exit "$lint_rc"
