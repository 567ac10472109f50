#!/usr/bin/env bash
# Start the clipbert-legacy container with ClipBERT's mount points:
#   /clipbert  this repository (read-write, the working directory)
#   /txt       annotations (txt_db; read-only)
#   /img       LMDB video/image stores (vis_db; read-only)
#   /storage   outputs: checkpoints, logs, results (read-write)
#   /pretrain  pretrained weights (read-only)
# Usage: ./docker/launch_container.sh TXT_DIR IMG_DIR OUTPUT_DIR PRETRAIN_DIR [command...]
#   CLIPBERT_IMAGE=NAME   image (default clipbert-legacy:latest)
#   CONTAINER_USER=U:G    user inside (default: yours, $(id -u):$(id -g), so outputs are owned by you;
#                         CONTAINER_USER=root for root)
#   HOST_NETWORK=1        --network host: the nodes' own addresses and ports, needed for multi-node
#                         horovodrun -H / torchrun (NCCL and Gloo open ports between the hosts)
#   CUDA_VISIBLE_DEVICES  which GPUs (default all)
# Works without a terminal (nohup, SLURM, CI): -it only when stdin and stdout are TTYs.
set -euo pipefail
if [ "$#" -lt 4 ]; then
  echo "usage: $0 TXT_DIR IMG_DIR OUTPUT_DIR PRETRAIN_DIR [command...]" >&2
  exit 2
fi
TXT_DB=$1; IMG_DIR=$2; OUTPUT=$3; PRETRAIN_DIR=$4; shift 4
for d in "$TXT_DB" "$IMG_DIR" "$PRETRAIN_DIR"; do
  [ -d "$d" ] || { echo "[launch_container] ERROR: directory '$d' does not exist" >&2; exit 2; }
done
mkdir -p "$OUTPUT"
IMAGE="${CLIPBERT_IMAGE:-clipbert-legacy:latest}"
GPUS="${CUDA_VISIBLE_DEVICES:-all}"
[ "$GPUS" = all ] || GPUS="\"device=$GPUS\""
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
opts=(--gpus "$GPUS" --ipc=host --rm --ulimit memlock=-1 --ulimit stack=67108864)
if [ -t 0 ] && [ -t 1 ]; then opts+=(-it); fi
[ "${HOST_NETWORK:-0}" = 1 ] && opts+=(--network host)
USER_SPEC="${CONTAINER_USER:-$(id -u):$(id -g)}"
[ "$USER_SPEC" = root ] || opts+=(--user "$USER_SPEC")
exec "${DOCKER:-docker}" run "${opts[@]}" \
  --mount src="$REPO",dst=/clipbert,type=bind \
  --mount src="$(realpath "$TXT_DB")",dst=/txt,type=bind,readonly \
  --mount src="$(realpath "$IMG_DIR")",dst=/img,type=bind,readonly \
  --mount src="$(realpath "$OUTPUT")",dst=/storage,type=bind \
  --mount src="$(realpath "$PRETRAIN_DIR")",dst=/pretrain,type=bind,readonly \
  -w /clipbert "$IMAGE" "${@:-bash}"
