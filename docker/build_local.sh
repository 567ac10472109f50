#!/usr/bin/env bash
# The CPU image on a machine without an image registry or a GPU, then the demo in it:
#   1. the local Debian base (debootstrap --variant=minbase bookworm from the Debian mirror apt uses here,
#      apt caches removed, docker import) unless it exists;
#   2. this host's pip setup handed to the build (docker/stage_build_extras.py; never kept in the image);
#   3. docker build of the CPU image: Python 3.11, torch CPU, Horovod with Gloo (install_horovod.sh);
#   4. the quickstart in it through docker/launch_container.sh (GPUs off, --network host), outputs in
#      DEMO_OUT on the host, owned by you.
#
#   ./docker/build_local.sh            # base (once), image, full quickstart
#   QUICKSTART_FAST=1 ./docker/build_local.sh    # the reduced quickstart (CI smoke run)
#   ./docker/build_local.sh --no-demo  # base and image only
# Settings (environment): CLIPBERT_IMAGE (clipbert-legacy:cpu), BASE_IMAGE (local/debian:bookworm),
#   DEBIAN_MIRROR (default: apt's bookworm source here), PYTHON_VERSION (3.11), TORCH_SPEC
#   (torch==2.13.0+cpu), DEMO_OUT (output/docker_demo), BUILD_CPU_SHARES (256: the build yields the CPU to
#   other work; 1024 is docker's default weight), EXTRA_BUILD_ARGS (more `docker build` arguments).
# Needs a running Docker daemon (as root: ./docker/start_dockerd.sh) and, for step 1, root and debootstrap.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"
IMAGE="${CLIPBERT_IMAGE:-clipbert-legacy:cpu}"
BASE="${BASE_IMAGE:-local/debian:bookworm}"
DEMO_OUT="${DEMO_OUT:-output/docker_demo}"
log() { echo "[build_local] $(date +%T) $*"; }
die() { echo "[build_local] ERROR: $*" >&2; exit 1; }

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

docker info >/dev/null 2>&1 || die "no Docker daemon answers: start one (as root: ./docker/start_dockerd.sh)"
make_base
python3 docker/stage_build_extras.py
t=$(date +%s)
log "building $IMAGE (docker build --network host, cpu-shares ${BUILD_CPU_SHARES:-256})"
read -r -a extra_build <<< "${EXTRA_BUILD_ARGS:-}"
nice -n 10 docker build --network host --cpu-shares "${BUILD_CPU_SHARES:-256}" -f docker/Dockerfile \
  --build-arg CUDA_IMAGE="$BASE" --build-arg PYTHON_VERSION="${PYTHON_VERSION:-3.11}" \
  --build-arg HOROVOD_BUILD=cpu --build-arg TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0+cpu}" \
  "${extra_build[@]}" -t "$IMAGE" . || die "docker build failed (output above)"
size="$(docker image inspect -f '{{.Size}}' "$IMAGE")"
log "built $IMAGE in $(( $(date +%s) - t ))s; image size $(( size / 1000000 )) MB"
[ "${1:-}" = --no-demo ] && exit 0

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
