#!/usr/bin/env bash
# Start the clipbert-legacy container with ClipBERT's mount points:
#   /clipbert  this repository (read-write, the working directory)
#   /txt       annotations (txt_db; read-only)
#   /img       LMDB video/image stores (vis_db; read-only)
#   /storage   outputs: checkpoints, logs, results (read-write)
#   /pretrain  pretrained weights (read-only)
# Usage: ./docker/launch_container.sh TXT_DIR IMG_DIR OUTPUT_DIR PRETRAIN_DIR [command...]
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
exec docker run --gpus "$GPUS" --ipc=host --rm -it \
  --mount src="$REPO",dst=/clipbert,type=bind \
  --mount src="$(realpath "$TXT_DB")",dst=/txt,type=bind,readonly \
  --mount src="$(realpath "$IMG_DIR")",dst=/img,type=bind,readonly \
  --mount src="$(realpath "$OUTPUT")",dst=/storage,type=bind \
  --mount src="$(realpath "$PRETRAIN_DIR")",dst=/pretrain,type=bind,readonly \
  -w /clipbert "$IMAGE" "${@:-bash}"
