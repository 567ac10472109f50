#!/usr/bin/env bash
# Build Horovod 0.28.1 (the last release) against the venv's torch, with the three fixes
# needed for torch >= 2.1 (see README "Horovod on torch 2.x"):
#   1. CMake 4 rejects Gloo's cmake_minimum_required -> use system cmake 3.x / CMAKE_POLICY_VERSION_MINIMUM
#   2. torch headers need C++17 -> CMAKE_CXX_STANDARD 14 -> 17 (top level and horovod/torch)
#   3. Gloo compiled as C++11 -> -std=c++17 (else duplicate kDefaultTimeout at link time)
# Gloo is always built; NCCL when CUDA (nvcc + torch.cuda) is present. The wheel is built once into
# HOROVOD_WHEEL_CACHE (outside the repo) and reused, so reinstalls take seconds.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${VENV_DIR:-$REPO/.venv}"
VPY="$VENV_DIR/bin/python"
HVD_VERSION=0.28.1
CACHE="${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clipbert-legacy/horovod}"
log() { echo "[install_horovod] $*"; }

verify() {
  "$VPY" - <<'PY'
import sys
import horovod.torch as hvd
if not hvd.gloo_built():
    sys.exit("[install_horovod] ERROR: Horovod imported but gloo_built() is False; "
             "rebuild with HOROVOD_WITH_GLOO=1 (delete the cached wheel first)")
import horovod
print("[install_horovod] horovod", horovod.__version__,
      "gloo_built=True nccl_built=%s" % bool(hvd.nccl_built()))
PY
  [ -x "$VENV_DIR/bin/horovodrun" ] || { echo "[install_horovod] ERROR: horovodrun missing from $VENV_DIR/bin" >&2; exit 1; }
}

if "$VPY" -c "import horovod.torch" 2>/dev/null; then
  verify; exit 0
fi

torch_tag="$("$VPY" -c 'import torch,sys; print(torch.__version__.replace("+","_"), "py%d%d" % sys.version_info[:2])' | tr ' ' '-')"
CUDA=0
if command -v nvcc >/dev/null 2>&1 && "$VPY" -c "import torch,sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  CUDA=1
fi
wheel_dir="$CACHE/$HVD_VERSION-torch$torch_tag-cuda$CUDA"
mkdir -p "$wheel_dir"
whl="$(ls "$wheel_dir"/horovod-*.whl 2>/dev/null | head -1 || true)"

if [ -z "$whl" ]; then
  log "no cached wheel in $wheel_dir; building Horovod $HVD_VERSION from source (about 5 min on 2 cores)"
  "$VPY" -m pip --disable-pip-version-check install -q "cloudpickle" "psutil" "pyyaml" "packaging" 2>&1 | grep -v "is ignored" || true
  # A pip-installed cmake (4.x) breaks the Gloo build: prefer a cmake 3.x elsewhere on PATH.
  if "$VPY" -m pip show cmake >/dev/null 2>&1; then "$VPY" -m pip uninstall -y -q cmake; fi
  command -v cmake >/dev/null 2>&1 || { echo "[install_horovod] ERROR: cmake not found; install it (apt-get install cmake)" >&2; exit 1; }
  export CMAKE_POLICY_VERSION_MINIMUM=3.5
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  "$VPY" -m pip --disable-pip-version-check download -q --no-binary :all: --no-deps \
      "horovod==$HVD_VERSION" -d "$work" 2>&1 | grep -v "is ignored" || true
  tar -xzf "$work"/horovod-$HVD_VERSION.tar.gz -C "$work"
  src="$work/horovod-$HVD_VERSION"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i 's/-std=c++11/-std=c++17/g' "$src/third_party/gloo/CMakeLists.txt"
  grep -q "CMAKE_CXX_STANDARD 17" "$src/CMakeLists.txt" || { echo "[install_horovod] ERROR: C++17 patch did not apply to $src/CMakeLists.txt" >&2; exit 1; }
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
         HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 MAKEFLAGS="-j$(nproc)"
  if [ "$CUDA" = 1 ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
    log "CUDA found: building with NCCL (GPU) + Gloo (CPU tensors)"
  else
    export HOROVOD_CPU_OPERATIONS=GLOO
  fi
  # progress stays visible: print a heartbeat while the compiler works
  ( while sleep 30; do echo "[install_horovod] ... still compiling ($(date +%T))"; done ) &
  hb=$!
  if ! "$VPY" -m pip --disable-pip-version-check wheel --no-build-isolation --no-deps --no-cache-dir \
        -w "$wheel_dir.tmp" "$src" > "$work/build.log" 2>&1; then
    kill $hb 2>/dev/null || true
    tail -40 "$work/build.log" >&2
    echo "[install_horovod] ERROR: Horovod build failed (log above); see README 'Horovod on torch 2.x'" >&2
    exit 1
  fi
  kill $hb 2>/dev/null || true
  mv "$wheel_dir.tmp"/horovod-*.whl "$wheel_dir"/ && rm -rf "$wheel_dir.tmp"
  whl="$(ls "$wheel_dir"/horovod-*.whl | head -1)"
  log "built $whl"
else
  log "using cached wheel $whl"
fi
"$VPY" -m pip --disable-pip-version-check install -q --no-deps "$whl"
"$VPY" -m pip --disable-pip-version-check install -q cloudpickle psutil pyyaml packaging 2>&1 | grep -v "is ignored" || true
verify
