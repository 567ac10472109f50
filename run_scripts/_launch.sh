# Sourced by the example scripts: run "$@" (a python script + args) on NP processes.
#   NP=1 (default): plain python (single GPU / CPU);  NP>1: horovodrun -np NP [-H HOSTS];
#   LAUNCHER=torchrun: torchrun --nproc_per_node NP instead of horovodrun.
# Without HOSTS the job stays on this machine and its launcher listens on 127.0.0.1 only
# (src/clipbert_legacy/compat/loopback.py; torchrun and horovodrun would listen on every interface).
# The env is found through VENV_DIR (default <repo>/.venv; /opt/venv in the Docker image), as in
# setup_env.sh; PYTHON overrides the interpreter itself.
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
PY="${PYTHON:-${VENV_DIR:-$REPO/.venv}/bin/python}"
NP="${NP:-1}"
launch() {
  if [ "$NP" = 1 ]; then
    "$PY" "$@"
  elif [ "${LAUNCHER:-horovodrun}" = torchrun ]; then
    "$PY" -m clipbert_legacy.compat.loopback torchrun --nproc_per_node "$NP" --master_addr 127.0.0.1 "$@"
  elif [ -n "${HOSTS:-}" ]; then
    "$(dirname "$PY")/horovodrun" -np "$NP" -H "$HOSTS" "$PY" "$@"
  else
    "$PY" -m clipbert_legacy.compat.loopback horovodrun -np "$NP" -H "localhost:$NP" "$PY" "$@"
  fi
}
