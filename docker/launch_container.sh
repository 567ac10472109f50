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
#   GPUS=all|none|0,1     GPUs (default: all when the NVIDIA container toolkit is installed, else none);
#                         CUDA_VISIBLE_DEVICES=0,1 picks devices, CUDA_VISIBLE_DEVICES= (empty) means none;
#                         GPUs asked for on a host without the NVIDIA container toolkit (docker's --gpus
#                         needs its hook) nor an nvidia runtime in `docker info`: one line, exit 2
#   DOCKER_RUN_ARGS="..." more `docker run` arguments (split on spaces), e.g. "-e QUICKSTART_FAST=1"
# --ipc=host always (DataLoader workers pass batches through /dev/shm; Docker's default is 64 MB).
# --ulimit memlock=-1 / stack=64 MiB only where this host's hard limits allow them (else docker run fails
# with rc 125). Works without a terminal (nohup, SLURM, CI): -it only when stdin and stdout are TTYs.
set -euo pipefail
if [ "$#" -lt 4 ]; then
  echo "usage: $0 TXT_DIR IMG_DIR OUTPUT_DIR PRETRAIN_DIR [command...]" >&2
  exit 2
fi
TXT_DB=$1; IMG_DIR=$2; OUTPUT=$3; PRETRAIN_DIR=$4; shift 4
say() { echo "[launch_container] $*" >&2; }
for d in "$TXT_DB" "$IMG_DIR" "$PRETRAIN_DIR"; do
  [ -d "$d" ] || { say "ERROR: directory '$d' does not exist"; exit 2; }
done
mkdir -p "$OUTPUT"
IMAGE="${CLIPBERT_IMAGE:-clipbert-legacy:latest}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

gpus="${GPUS:-}"
if [ -z "$gpus" ]; then
  if command -v nvidia-container-cli >/dev/null 2>&1 || command -v nvidia-ctk >/dev/null 2>&1; then
    gpus=all; else gpus=none; fi
  if [ "$gpus" = all ] && [ -n "${CUDA_VISIBLE_DEVICES+set}" ]; then gpus="${CUDA_VISIBLE_DEVICES:-none}"; fi
fi
# docker run --gpus needs the NVIDIA container toolkit's hook on the daemon's host (else rc 125 and
# "could not select device driver"); an nvidia runtime registered with the daemon also serves
nvidia_runtime() {
  local t
  for t in nvidia-container-runtime-hook nvidia-container-toolkit nvidia-ctk nvidia-container-cli; do
    command -v "$t" >/dev/null 2>&1 && return 0
  done
  "${DOCKER:-docker}" info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}' 2>/dev/null \
    | tr ' ' '\n' | grep -qx nvidia
}
opts=(--ipc=host --rm)
if [ "$gpus" != none ] && ! nvidia_runtime; then
  say "ERROR: GPUS=$gpus but this host has no NVIDIA container runtime (no nvidia-container-toolkit, no nvidia runtime in docker info): install the NVIDIA Container Toolkit, or run on the CPU with GPUS=none"
  exit 2
fi
case "$gpus" in
  none) ;;
  all) opts+=(--gpus all) ;;
  *) opts+=(--gpus "\"device=$gpus\"") ;;
esac
# the container cannot get more than the host's hard limits allow
if [ "$(ulimit -Hl)" = unlimited ]; then opts+=(--ulimit memlock=-1)
else say "host hard memlock limit $(ulimit -Hl) kB: not passing --ulimit memlock=-1"; fi
hs="$(ulimit -Hs)"
if [ "$hs" = unlimited ] || [ "$hs" -ge 65536 ]; then opts+=(--ulimit stack=67108864)
else say "host hard stack limit $hs kB: not passing --ulimit stack=67108864"; fi
if [ -t 0 ] && [ -t 1 ]; then opts+=(-it); fi
[ "${HOST_NETWORK:-0}" = 1 ] && opts+=(--network host)
USER_SPEC="${CONTAINER_USER:-$(id -u):$(id -g)}"
[ "$USER_SPEC" = root ] || opts+=(--user "$USER_SPEC")
read -r -a extra <<< "${DOCKER_RUN_ARGS:-}"
exec "${DOCKER:-docker}" run "${opts[@]}" "${extra[@]}" \
  --mount src="$REPO",dst=/clipbert,type=bind \
  --mount src="$(realpath "$TXT_DB")",dst=/txt,type=bind,readonly \
  --mount src="$(realpath "$IMG_DIR")",dst=/img,type=bind,readonly \
  --mount src="$(realpath "$OUTPUT")",dst=/storage,type=bind \
  --mount src="$(realpath "$PRETRAIN_DIR")",dst=/pretrain,type=bind,readonly \
  -w /clipbert "$IMAGE" "${@:-bash}"
