# Sourced by the example scripts: run "$@" (a python script + args) on NP processes.
#   NP=1 (default): plain python (single GPU / CPU);  NP>1: horovodrun -np NP [-H HOSTS];
#   LAUNCHER=torchrun: torchrun --nproc_per_node NP instead of horovodrun.
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
    "$PY" -m torch.distributed.run --nproc_per_node "$NP" "$@"
  else
    local hosts=(); [ -n "${HOSTS:-}" ] && hosts=(-H "$HOSTS")
    "$(dirname "$PY")/horovodrun" -np "$NP" "${hosts[@]}" "$PY" "$@"
  fi
}
