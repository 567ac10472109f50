#!/usr/bin/env bash
# Horovod across machines: horovodrun starts one process per slot of HOSTS, on the other hosts over ssh.
#   HOSTS=host1:4,host2:4 [NIC=eth0] [SSH_PORT=22] [SSH_KEY=~/.ssh/id_ed25519] [NP=8] [HOROVOD_ARGS="--gloo"] \
#     ./run_scripts/multinode_horovod.sh src/tasks/run_video_retrieval.py --config C --output_dir /shared/out
# Run it on one of the hosts. Needs passwordless ssh from there to every host, this repository and its
# .venv at the same absolute path on every host (the remote side runs "cd $PWD; $PY ..."), and output_dir
# on storage all hosts see. NP defaults to the sum of the slots; NIC is horovodrun --network-interface.
set -euo pipefail
REPO="${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$REPO"
PY="${PYTHON:-${VENV_DIR:-$REPO/.venv}/bin/python}"
HOROVODRUN="${HOROVODRUN:-$(dirname "$PY")/horovodrun}"
if [ -z "${HOSTS:-}" ] || [ $# -lt 1 ]; then
  echo "usage: HOSTS=host1:slots,host2:slots $0 SCRIPT.py [args...]" >&2
  exit 2
fi
np=0
IFS=, read -ra entries <<< "$HOSTS"
for entry in "${entries[@]}"; do
  slots="${entry##*:}"
  if [[ "$entry" != *:* || ! "$slots" =~ ^[1-9][0-9]*$ ]]; then
    echo "error: HOSTS entry '$entry' is not host:slots (e.g. HOSTS=host1:4,host2:4)" >&2
    exit 2
  fi
  np=$((np + slots))
done
opts=(-np "${NP:-$np}" -H "$HOSTS")
[ -n "${NIC:-}" ] && opts+=(--network-interface "$NIC")
[ -n "${SSH_PORT:-}" ] && opts+=(--ssh-port "$SSH_PORT")
[ -n "${SSH_KEY:-}" ] && opts+=(--ssh-identity-file "$SSH_KEY")
read -ra extra <<< "${HOROVOD_ARGS:-}"
exec "$HOROVODRUN" "${opts[@]}" "${extra[@]}" "$PY" "$@"
