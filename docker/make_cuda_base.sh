#!/usr/bin/env bash
# The stand-in CUDA base image on a machine without an image registry (no GPU needed): the local Debian
# base plus the CUDA toolkit of NVIDIA's pip wheels, pinned in docker/cuda_base/toolkit.txt to the
# cuda-toolkit release that PyPI's torch 2.13.0 requires (13.0.3: nvcc 13.0.88, cudart 13.0.96).
#   1. the wheels are downloaded once into TOOLKIT_WHEELS (outside the repository) and reused;
#   2. pip installs them into a scratch folder, where they are laid out as in the nvidia/cuda devel images:
#      cuda-13.0/{bin,include,lib,lib64 -> lib,nvvm,targets/x86_64-linux/{include,lib}}, libX.so links;
#   3. docker build -f docker/cuda_base/Dockerfile on top of DEBIAN_IMAGE, tagged CUDA_BASE_IMAGE.
# Nothing happens when CUDA_BASE_IMAGE exists (delete it to rebuild: docker image rm CUDA_BASE_IMAGE).
#
#   ./docker/make_cuda_base.sh         # called by ./docker/build_local.sh --cuda
# Settings (environment): DEBIAN_IMAGE (local/debian:bookworm, made by build_local.sh), CUDA_BASE_IMAGE
#   (local/cuda:13.0.3-devel-debian12), TOOLKIT_WHEELS (~/.cache/clipbert-legacy/docker-wheels/cuda-toolkit).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEBIAN_IMAGE="${DEBIAN_IMAGE:-local/debian:bookworm}"
CUDA_BASE="${CUDA_BASE_IMAGE:-local/cuda:13.0.3-devel-debian12}"
WHEELS="${TOOLKIT_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/clipbert-legacy/docker-wheels/cuda-toolkit}"
PINS="$REPO/docker/cuda_base/toolkit.txt"
log() { echo "[make_cuda_base] $(date +%T) $*"; }
die() { echo "[make_cuda_base] ERROR: $*" >&2; exit 1; }

if docker image inspect "$CUDA_BASE" >/dev/null 2>&1; then log "CUDA base $CUDA_BASE present"; exit 0; fi
docker image inspect "$DEBIAN_IMAGE" >/dev/null 2>&1 \
  || die "no $DEBIAN_IMAGE to build on: ./docker/build_local.sh --cuda makes it"
cuda_version="$(sed -n 's/.*:\([0-9][0-9.]*\)-devel.*/\1/p' <<< "$CUDA_BASE")"
[ -n "$cuda_version" ] || die "CUDA_BASE_IMAGE=$CUDA_BASE: the tag must read X.Y.Z-devel-... (the CUDA release)"
t=$(date +%s)
# the toolkit wheels are platform wheels for any Python 3: fetched for the base's glibc (2.36) on x86_64
plats=(--only-binary=:all: --python-version 3 --platform manylinux2014_x86_64)
for v in $(seq 36 -1 5); do plats+=(--platform "manylinux_2_${v}_x86_64"); done
plats+=(--platform manylinux2010_x86_64 --platform manylinux1_x86_64)
mkdir -p "$WHEELS"
# PIP_FIND_LINKS=the cache: wheels already there are not fetched again (and no other local folder is used)
if ! PIP_FIND_LINKS="$WHEELS" python3 -m pip download -q --disable-pip-version-check --no-deps "${plats[@]}" \
    -d "$WHEELS" -r "$PINS" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }; then
  die "pip could not download the toolkit wheels of $PINS into $WHEELS (pip's error above)"
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip install -q --disable-pip-version-check --no-index --find-links "$WHEELS" --no-deps \
  "${plats[@]}" --target "$work/site" -r "$PINS" || die "pip could not install the toolkit wheels (above)"
top="$work/ctx/cuda-13.0"
mkdir -p "$work/ctx" && mv "$work/site/nvidia/cu13" "$top"
rm -rf "$top/.metadata" "$top"/__init__.py "$top"/__pycache__
ln -s lib "$top/lib64"
mkdir -p "$top/targets/x86_64-linux"
ln -s ../../include "$top/targets/x86_64-linux/include"
ln -s ../../lib "$top/targets/x86_64-linux/lib"
for so in "$top"/lib/lib*.so.*; do  # the unversioned names linkers look for (libcudart.so -> libcudart.so.13)
  base="${so%%.so.*}.so"
  [ -e "$base" ] || ln -s "$(basename "$so")" "$base"
done
mkdir -p "$top/dist-info" && mv "$work/site"/*.dist-info "$top/dist-info/"  # what the toolkit was made from
[ -x "$top/bin/nvcc" ] && [ -f "$top/include/cuda_runtime.h" ] && [ -f "$top/lib/libcudart.so.13" ] \
  || die "the toolkit wheels did not give bin/nvcc, include/cuda_runtime.h and lib/libcudart.so.13"
log "toolkit laid out ($(du -sh "$top" | cut -f1)); building $CUDA_BASE on $DEBIAN_IMAGE"
nice -n 10 docker build -q --network host -f "$REPO/docker/cuda_base/Dockerfile" \
  --build-arg DEBIAN_IMAGE="$DEBIAN_IMAGE" --build-arg CUDA_VERSION="$cuda_version" -t "$CUDA_BASE" \
  "$work/ctx" >/dev/null || die "docker build of $CUDA_BASE failed (output above)"
log "CUDA base $CUDA_BASE made in $(( $(date +%s) - t ))s"
