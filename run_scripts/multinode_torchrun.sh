#!/usr/bin/env bash
# torchrun across machines: run this once on every node (slurm_torchrun.sbatch does it with srun).
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=host1 [MASTER_PORT=29500] [NPROC_PER_NODE=8] [LOCAL_ADDR=this-host] \
#     ./run_scripts/multinode_torchrun.sh src/tasks/run_video_retrieval.py --config C --output_dir /shared/out
# The nodes meet at MASTER_ADDR:MASTER_PORT (c10d rendezvous, hosted by the node whose address it is).
# NNODES / NODE_RANK default to SLURM_NNODES / SLURM_NODEID, NPROC_PER_NODE to SLURM_GPUS_ON_NODE, else
# the visible GPUs (1 on CPU), the rendezvous id to SLURM_JOB_ID. output_dir must be on shared storage.
# The rendezvous and the workers' store take unauthenticated commands: MASTER_PORT and the workers' ports
# must be on a private network or behind a firewall (docs/scaling_out.md). NNODES=1 with a loopback
# MASTER_ADDR (127.0.0.1, localhost) listens on 127.0.0.1 only (src/clipbert_legacy/compat/loopback.py).
set -euo pipefail
REPO="${REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
cd "$REPO"
PY="${PYTHON:-${VENV_DIR:-$REPO/.venv}/bin/python}"
NNODES="${NNODES:-${SLURM_NNODES:-}}"
NODE_RANK="${NODE_RANK:-${SLURM_NODEID:-}}"
if [ -z "$NNODES" ] || [ -z "$NODE_RANK" ] || [ -z "${MASTER_ADDR:-}" ] || [ $# -lt 1 ]; then
  echo "usage: NNODES=N NODE_RANK=i MASTER_ADDR=host $0 SCRIPT.py [args...]" >&2
  exit 2
fi
NPROC_PER_NODE="${NPROC_PER_NODE:-${SLURM_GPUS_ON_NODE:-}}"
[ -n "$NPROC_PER_NODE" ] || NPROC_PER_NODE="$("$PY" -c 'import torch; print(max(1, torch.cuda.device_count()))')"
opts=(--nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE"
      --rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:${MASTER_PORT:-29500}"
      --rdzv-id "${RDZV_ID:-${SLURM_JOB_ID:-clipbert}}")
[ -n "${LOCAL_ADDR:-}" ] && opts+=(--local-addr "$LOCAL_ADDR")
case "$MASTER_ADDR" in
  127.*|localhost|::1|"[::1]") [ "$NNODES" = 1 ] && exec "$PY" -m clipbert_legacy.compat.loopback torchrun "${opts[@]}" "$@" ;;
esac
exec "$PY" -m torch.distributed.run "${opts[@]}" "$@"
