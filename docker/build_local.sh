#!/usr/bin/env bash
# The image on a machine without an image registry or a GPU, then the demo in it:
#   1. the local Debian base (debootstrap --variant=minbase bookworm from the Debian mirror apt uses here,
#      apt caches removed, docker import) unless it exists;
#      --cuda: also the stand-in CUDA base on it (docker/make_cuda_base.sh: the CUDA 13.0 toolkit from
#      NVIDIA's pip wheels) and torch 2.13.0 (CUDA 13.0) + requirements.txt downloaded once into WHEEL_CACHE;
#   2. this host's pip setup handed to the build (docker/stage_build_extras.py; never kept in the image);
#      --cuda: the wheel cache instead of this host's local wheels (its CPU torch would win), and no index:
#      the build installs from the cache only (Horovod's sdist included);
#   3. docker build of the real docker/Dockerfile. CPU image: Python 3.11, torch CPU, Horovod with Gloo
#      (install_horovod.sh). --cuda: Python 3.11, torch 2.13.0 (CUDA 13.0), Horovod with NCCL + Gloo
#      compiled by nvcc for CUDA_CC_LIST (build_horovod_cuda.sh), apex too when APEX_TAG is set;
#   4. the quickstart in it through docker/launch_container.sh (GPUs off, --network host), outputs in
#      DEMO_OUT on the host, owned by you (--cuda: the CUDA torch on the CPU).
#
#   ./docker/build_local.sh            # base (once), CPU image, full quickstart
#   QUICKSTART_FAST=1 ./docker/build_local.sh    # the reduced quickstart (CI smoke run)
#   ./docker/build_local.sh --no-demo  # base and image only
#   QUICKSTART_FAST=1 ./docker/build_local.sh --cuda   # the GPU image (clipbert-legacy:cuda), demo on the CPU
# Settings (environment): CLIPBERT_IMAGE (clipbert-legacy:cpu; --cuda: clipbert-legacy:cuda), BASE_IMAGE
#   (local/debian:bookworm), CUDA_BASE_IMAGE (local/cuda:13.0.3-devel-debian12), DEBIAN_MIRROR (default:
#   apt's bookworm source here), PYTHON_VERSION (3.11), TORCH_SPEC (torch==2.13.0+cpu; --cuda: torch==2.13.0),
#   WHEEL_CACHE (--cuda: ~/.cache/clipbert-legacy/docker-wheels/cuda-py3.11), APEX_TAG (--cuda: e.g. 25.04;
#   empty: no apex), CUDA_CC_LIST (the Dockerfile's default archs), DEMO_OUT (output/docker_demo),
#   BUILD_CPU_SHARES (256: the build yields the CPU to other work; 1024 is docker's default weight),
#   EXTRA_BUILD_ARGS (more `docker build` arguments).
# Needs a running Docker daemon (as root: ./docker/start_dockerd.sh) and, for step 1, root and debootstrap.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
log() { echo "[build_local] $(date +%T) $*"; }
die() { echo "[build_local] ERROR: $*" >&2; exit 1; }
CUDA=0 DEMO=1
for a in "$@"; do
  case "$a" in
    --cuda) CUDA=1 ;;
    --no-demo) DEMO=0 ;;
    *) die "unknown argument '$a' (usage: $0 [--cuda] [--no-demo])" ;;
  esac
done
BASE="${BASE_IMAGE:-local/debian:bookworm}"
PYTHON_VERSION="${PYTHON_VERSION:-3.11}"
DEMO_OUT="${DEMO_OUT:-output/docker_demo}"
if [ "$CUDA" = 1 ]; then
  IMAGE="${CLIPBERT_IMAGE:-clipbert-legacy:cuda}"
  TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
  CUDA_BASE="${CUDA_BASE_IMAGE:-local/cuda:13.0.3-devel-debian12}"
  WHEEL_CACHE="${WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clipbert-legacy/docker-wheels/cuda-py$PYTHON_VERSION}"
else
  [ -z "${APEX_TAG:-}" ] || die "APEX_TAG=$APEX_TAG needs the CUDA image: $0 --cuda"
  IMAGE="${CLIPBERT_IMAGE:-clipbert-legacy:cpu}"
  TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu}"
fi

apt_bookworm_mirror() {  # the first bookworm (not -security) source of apt, one-line or deb822 format
  python3 - <<'PY'
import glob, re
files = ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")
                                           + glob.glob("/etc/apt/sources.list.d/*.sources"))
for f in files:
    try:
        text = open(f).read()
    except OSError:
        continue
    for m in re.finditer(r"^deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s", text, re.M):
        print(m.group(1)); raise SystemExit
    for para in re.split(r"\n\s*\n", text):
        uris = re.search(r"^URIs:\s*(\S+)", para, re.M)
        suites = re.search(r"^Suites:(.*)$", para, re.M)
        if uris and suites and "bookworm" in suites.group(1).split():
            print(uris.group(1)); raise SystemExit
PY
}

make_base() {
  if docker image inspect "$BASE" >/dev/null 2>&1; then log "base image $BASE present"; return; fi
  [ "$BASE" = local/debian:bookworm ] || die "base image $BASE does not exist (this script makes only local/debian:bookworm)"
  [ "$(id -u)" = 0 ] || die "making $BASE needs root (debootstrap): sudo $0"
  command -v debootstrap >/dev/null 2>&1 || die "debootstrap missing: apt-get install -y debootstrap"
  local mirror="${DEBIAN_MIRROR:-$(apt_bookworm_mirror)}" root t
  [ -n "$mirror" ] || die "no bookworm source in /etc/apt/sources.list*: set DEBIAN_MIRROR=http://deb.debian.org/debian"
  root="$(mktemp -d)"
  t=$(date +%s)
  log "making $BASE: debootstrap --variant=minbase bookworm from $mirror"
  nice -n 10 debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.log" 2>&1 \
    || { tail -20 "$root.log" >&2; rm -rf "$root" "$root.log"; die "debootstrap failed (log above)"; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root.log"
  tar -C "$root" -c . | docker import - "$BASE" >/dev/null
  rm -rf "$root"
  log "base image $BASE made in $(( $(date +%s) - t ))s"
}

# --cuda: everything the env stage installs, downloaded once (the build then needs no index; see
# stage_build_extras.py --no-index): torch and requirements.txt for the image's Python and glibc (2.36),
# setuptools, Horovod's sdist and the runtime dependencies install_horovod.sh installs, apex's build tools
HOROVOD_DEPS=(cloudpickle psutil pyyaml packaging cffi)  # install_horovod.sh's runtime_deps
fill_wheel_cache() {
  local t plats=(--only-binary=:all: --python-version "$PYTHON_VERSION") reqs
  t=$(date +%s)
  for v in $(seq 36 -1 5); do plats+=(--platform "manylinux_2_${v}_x86_64"); done
  plats+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
  reqs=("$TORCH_SPEC" -r requirements.txt "setuptools>=68" "${HOROVOD_DEPS[@]}")
  [ -z "${APEX_TAG:-}" ] || reqs+=(ninja packaging wheel)
  mkdir -p "$WHEEL_CACHE"
  log "wheel cache $WHEEL_CACHE: $TORCH_SPEC, requirements.txt, Horovod's sdist for Python $PYTHON_VERSION (fetched once)"
  # PIP_FIND_LINKS=the cache: what is there is not fetched again, and no other local folder (a CPU torch) is
  # used; a complete cache resolves without the index (seconds), else pip fetches what is missing
  if ! PIP_FIND_LINKS="$WHEEL_CACHE" python3 -m pip download -q --disable-pip-version-check --no-index \
      "${plats[@]}" -d "$WHEEL_CACHE" "${reqs[@]}" >/dev/null 2>&1 \
    && ! PIP_FIND_LINKS="$WHEEL_CACHE" nice -n 10 python3 -m pip download -q --disable-pip-version-check \
      "${plats[@]}" -d "$WHEEL_CACHE" "${reqs[@]}" 2>&1 \
      | { grep -v "is ignored: it is neither a file nor a directory" || true; }; then
    die "pip could not download ${reqs[*]} into $WHEEL_CACHE (pip's error above)"
  fi
  if [ ! -f "$WHEEL_CACHE/horovod-0.28.1.tar.gz" ] \
     && ! PIP_FIND_LINKS="$WHEEL_CACHE" python3 -m pip download -q --disable-pip-version-check --no-deps \
       --no-binary horovod -d "$WHEEL_CACHE" horovod==0.28.1; then
    die "pip could not download the horovod==0.28.1 sdist into $WHEEL_CACHE (pip's error above)"
  fi
  log "wheel cache ready in $(( $(date +%s) - t ))s ($(du -sh "$WHEEL_CACHE" | cut -f1))"
}

docker info >/dev/null 2>&1 || die "no Docker daemon answers: start one (as root: ./docker/start_dockerd.sh)"
make_base
build_args=(--build-arg PYTHON_VERSION="$PYTHON_VERSION" --build-arg TORCH_SPEC="$TORCH_SPEC")
if [ "$CUDA" = 1 ]; then
  DEBIAN_IMAGE="$BASE" CUDA_BASE_IMAGE="$CUDA_BASE" ./docker/make_cuda_base.sh
  fill_wheel_cache
  python3 docker/stage_build_extras.py --no-host-wheels --no-index --wheels "$WHEEL_CACHE"
  build_args+=(--build-arg CUDA_IMAGE="$CUDA_BASE" --build-arg HOROVOD_BUILD=cuda
               --build-arg APEX_TAG="${APEX_TAG:-}")
  [ -z "${CUDA_CC_LIST:-}" ] || build_args+=(--build-arg CUDA_CC_LIST="$CUDA_CC_LIST")
else
  python3 docker/stage_build_extras.py
  build_args+=(--build-arg CUDA_IMAGE="$BASE" --build-arg HOROVOD_BUILD=cpu)
fi
t=$(date +%s)
log "building $IMAGE (docker build --network host, cpu-shares ${BUILD_CPU_SHARES:-256})"
read -r -a extra_build <<< "${EXTRA_BUILD_ARGS:-}"
nice -n 10 docker build --network host --cpu-shares "${BUILD_CPU_SHARES:-256}" -f docker/Dockerfile \
  "${build_args[@]}" "${extra_build[@]}" -t "$IMAGE" . || die "docker build failed (output above)"
size="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
log "built $IMAGE in $(( $(date +%s) - t ))s; image size $(( size / 1000000 )) MB"
[ "$DEMO" = 0 ] && exit 0

# the demo's data is made by the quickstart in data/demo (this checkout is /clipbert in the container);
# ClipBERT's read-only mounts point at it, the outputs go to DEMO_OUT (/storage)
mkdir -p data/demo/txt data/demo/vis_db data/demo/pretrained "$DEMO_OUT"
t=$(date +%s)
log "quickstart in $IMAGE (QUICKSTART_FAST=${QUICKSTART_FAST:-0}) -> $DEMO_OUT/quickstart"
GPUS=none HOST_NETWORK=1 CLIPBERT_IMAGE="$IMAGE" \
  DOCKER_RUN_ARGS="-e QUICKSTART_FAST=${QUICKSTART_FAST:-0} -e QUICKSTART_OUT=/storage/quickstart" \
  ./docker/launch_container.sh data/demo/txt data/demo/vis_db "$DEMO_OUT" data/demo/pretrained \
  ./run_scripts/quickstart.sh
log "quickstart done in $(( $(date +%s) - t ))s; results in $DEMO_OUT/quickstart"
