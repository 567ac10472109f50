#!/usr/bin/env bash
# Create/refresh the project's virtualenv (.venv): torch, requirements.txt, Horovod.
# Idempotent: a second run only checks what is installed and takes seconds.
#
#   TORCH_SPEC   pip requirement for torch (default: torch==2.13.0, the CPU wheel on this
#                disk). On a CUDA machine use e.g. TORCH_SPEC="torch==2.13.0" with
#                PIP_INDEX_URL pointing at the CUDA wheel index of your choice.
#   VENV_DIR     virtualenv location (default: <repo>/.venv)
#   SKIP_LEGACY_REQUIREMENTS=1  skip requirements-legacy.txt (the legacy layer's source-only packages;
#                the Docker image sets it: pip install -e ".[legacy]" adds them where a fork needs them)
#   SKIP_HOROVOD=1  skip Horovod (the torch.distributed backend of src/clipbert_legacy/compat/hvd/__init__.py still works)
#   SKIP_PROJECT_INSTALL=1  dependencies only, not `pip install -e .` (a Docker layer built before
#                the source is copied in; the Dockerfile installs the project afterwards)
#   CLIPBERT_ENV_FROZEN=1  verify only, never install (set in the Docker image: its env is read-only to
#                a non-root user and the image may have no network)
# Every pip failure stops the script with pip's own error (pip's output is filtered, never its exit code).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${VENV_DIR:-$REPO/.venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
PY="${PYTHON:-python3}"

log() { echo "[setup_env] $*"; }
die() { echo "[setup_env] ERROR: $*" >&2; exit 1; }
# pip with its exit status kept (pipefail); only the noise about absent local index folders is dropped
pip_install() {
  "${PIP[@]}" install -q "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

if [ "${CLIPBERT_ENV_FROZEN:-0}" = "1" ]; then
  [ -x "$VENV_DIR/bin/python" ] || die "CLIPBERT_ENV_FROZEN=1 but there is no $VENV_DIR/bin/python"
fi
if [ ! -x "$VENV_DIR/bin/python" ]; then
  log "creating virtualenv $VENV_DIR"
  "$PY" -m venv "$VENV_DIR"
fi
VPY="$VENV_DIR/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check)

# Stamp = hash of everything that defines the env; unchanged stamp + importable packages => no-op.
stamp_file="$VENV_DIR/.clipbert_env_stamp"
want_stamp="$(cat "$REPO/requirements.txt" "$REPO/pyproject.toml" "$REPO/run_scripts/setup_env.sh" "$REPO/run_scripts/install_horovod.sh" $([ "${SKIP_LEGACY_REQUIREMENTS:-0}" != "1" ] && echo "$REPO/requirements-legacy.txt") | sha256sum | cut -c1-16)-$TORCH_SPEC-${SKIP_HOROVOD:-0}"
# the editable install must point at this checkout (a venv copied from another clone would not)
project_here() { [ "${SKIP_PROJECT_INSTALL:-0}" = "1" ] || (cd / && "$VPY" -c "import os, sys, clipbert_legacy; sys.exit(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(clipbert_legacy.__file__)))) != os.path.abspath(sys.argv[1]))" "$REPO") 2>/dev/null; }
# Bytecode caches of the project's own sources (pip compiles the packages it installs, not an editable
# project): where PYTHONDONTWRITEBYTECODE is set (CI images, this project's sandboxes) Python never writes
# them, and every process would compile ~27k lines again (~0.35 CPU-s a training process; the test suite
# starts ~650). Stale caches are never used (Python checks the source's mtime); -q: only errors print.
precompile() {
  "$VPY" -m compileall -q -j 0 "$REPO/src" "$REPO/tests" "$REPO/run_scripts" "$REPO/tools" "$REPO/benchmarks" >/dev/null \
    || log "warning: compileall could not cache every file under $REPO (a read-only checkout, or a file that does not compile: python -m compileall $REPO/src shows which); processes compile what is missing at start"
}
if [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$want_stamp" ] && project_here \
   && "$VPY" -c "import torch, lmdb, av, transformers, tensorboardX" 2>/dev/null; then
  if [ "${SKIP_HOROVOD:-0}" = "1" ] || "$VPY" -c "import horovod.torch" 2>/dev/null; then
    precompile
    log "environment up to date ($VENV_DIR)"
    exit 0
  fi
fi
if [ "${CLIPBERT_ENV_FROZEN:-0}" = "1" ]; then
  (cd / && "$VPY" -c "import torch, lmdb, av, transformers, tensorboardX, ujson, tqdm") \
    || die "the frozen env $VENV_DIR lacks a package (import error above): rebuild the image"
  project_here || die "'import clipbert_legacy' in $VENV_DIR does not resolve to $REPO: rebuild the image or mount the checkout at $REPO"
  if [ "${SKIP_HOROVOD:-0}" != "1" ]; then
    "$VPY" -c "import horovod.torch" || die "Horovod is not importable in the frozen env $VENV_DIR"
  fi
  log "frozen environment verified ($VENV_DIR; CLIPBERT_ENV_FROZEN=1, nothing installed)"
  exit 0
fi

if ! "$VPY" -c "import torch" 2>/dev/null; then
  log "installing $TORCH_SPEC"
  pip_install "$TORCH_SPEC" || die "pip could not install $TORCH_SPEC (pip's error above)"
  "$VPY" -c "import torch" || die "$TORCH_SPEC installed but 'import torch' fails (above)"
fi
log "installing requirements.txt"
# Constrain torch to what is installed so no dependency can pull another (multi-GB) build. The version
# of the installed distribution, not torch.__version__: PyPI's CUDA wheel is "2.13.0" but reports
# "2.13.0+cu130", a constraint no candidate meets (pip: ResolutionImpossible for anything needing torch)
tv="$("$VPY" -c 'import importlib.metadata as m; print(m.version("torch"))')"
cons="$(mktemp)"; echo "torch==$tv" > "$cons"
pip_install -r "$REPO/requirements.txt" -c "$cons" || die "pip could not install requirements.txt (pip's error above)"
"$VPY" -c "import torch, lmdb, av, transformers, tensorboardX, ujson, tqdm" \
  || { echo "[setup_env] ERROR: requirements did not install; see pip output above" >&2; exit 1; }
# the legacy layer's source-only packages (the Docker image skips them: its pins are checked to have wheels)
if [ "${SKIP_LEGACY_REQUIREMENTS:-0}" != "1" ]; then
  log "installing requirements-legacy.txt"
  pip_install -r "$REPO/requirements-legacy.txt" -c "$cons" \
    || die "pip could not install requirements-legacy.txt (pip's error above)"
fi
rm -f "$cons"

# The project itself, editable: `import clipbert_legacy...` works from any directory and from
# `python src/tasks/run_*.py` without path shims. --no-deps: requirements.txt pinned them above.
if [ "${SKIP_PROJECT_INSTALL:-0}" != "1" ]; then
  log "installing the project (pip install -e $REPO)"
  pip_install --no-deps -e "$REPO" || die "pip could not install the project (pip install -e $REPO; error above)"
fi
project_here || { echo "[setup_env] ERROR: 'pip install -e $REPO' did not make the package importable; see pip output above" >&2; exit 1; }

if [ "${SKIP_HOROVOD:-0}" != "1" ]; then
  VENV_DIR="$VENV_DIR" "$REPO/run_scripts/install_horovod.sh"
fi
precompile
echo "$want_stamp" > "$stamp_file"
log "done: $("$VPY" -c 'import torch; print("torch", torch.__version__)')"
