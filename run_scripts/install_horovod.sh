#!/usr/bin/env bash
# Build Horovod 0.28.1 (the last release) against the installed torch, with the three fixes
# needed for torch >= 2.1 (see docs/horovod.md):
#   1. CMake 4 rejects Gloo's cmake_minimum_required -> CMAKE_POLICY_VERSION_MINIMUM=3.5 (a pip cmake
#      the machine came with stays installed; a cmake 3.x works as well)
#   2. torch headers need C++17 -> CMAKE_CXX_STANDARD 14 -> 17 (top level and horovod/torch)
#   3. Gloo compiled as C++11 -> -std=c++17 (else duplicate kDefaultTimeout at link time)
# Gloo is always built; NCCL when CUDA (nvcc + torch.cuda) is present. The wheel is built once into
# HOROVOD_WHEEL_CACHE (outside the repo) and reused, so reinstalls take seconds.
#
#   VENV_DIR        the env to install into (default <repo>/.venv)
#   HOROVOD_PYTHON  an interpreter to install into instead (gpu_check.sh: the GPU node's own python3)
#   HOROVOD_SDIST   a local horovod-0.28.1.tar.gz (offline); without it pip downloads the sdist
#   HOROVOD_WHEEL_CACHE  where built wheels are kept (default ~/.cache/clipbert-legacy/horovod)
#   MAKEFLAGS       compile jobs (default -j<all cores>)
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV_DIR="${VENV_DIR:-$REPO/.venv}"
VPY="${HOROVOD_PYTHON:-$VENV_DIR/bin/python}"
HVD_VERSION=0.28.1
CACHE="${HOROVOD_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/clipbert-legacy/horovod}"
PIP=("$VPY" -m pip --disable-pip-version-check)
log() { echo "[install_horovod] $*"; }
die() { echo "[install_horovod] ERROR: $*" >&2; exit 1; }

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
  local scripts
  scripts="$("$VPY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
  [ -x "$scripts/horovodrun" ] || command -v horovodrun >/dev/null 2>&1 \
    || die "horovodrun is neither in $scripts nor on PATH"
}

# Horovod's runtime dependencies, also its setup_requires (setuptools would fetch them mid-build, which
# fails offline): installed first, only where missing (offline machines bring them as wheels)
runtime_deps() {
  local missing
  missing="$("$VPY" - <<'PY'
import importlib.util
print(" ".join(d for d, m in (("cloudpickle", "cloudpickle"), ("psutil", "psutil"), ("pyyaml", "yaml"),
                              ("packaging", "packaging"), ("cffi", "cffi")) if importlib.util.find_spec(m) is None))
PY
)"
  [ -z "$missing" ] && return 0
  log "installing Horovod's missing runtime dependencies: $missing"
  # shellcheck disable=SC2086
  "${PIP[@]}" install -q $missing || die "pip could not install $missing (offline: install them from wheels first)"
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
whl="$(find "$wheel_dir" -maxdepth 1 -name 'horovod-*.whl' | head -1)"

build_wheel() {
  # setup.py bdist_wheel: setuptools >= 70.1 has it built in, older ones need the wheel package
  "$VPY" -c "import setuptools, importlib.util as u, sys; sys.exit(not (u.find_spec('wheel') or u.find_spec('setuptools.command.bdist_wheel')))" \
    || die "$VPY lacks setuptools (>= 70.1) or the wheel package, which Horovod's setup.py needs (pip install setuptools wheel)"
  command -v cmake >/dev/null 2>&1 || die "cmake not found; install it (pip install cmake, or apt-get install cmake)"
  export CMAKE_POLICY_VERSION_MINIMUM=3.5  # CMake 4 refuses Gloo's old cmake_minimum_required without it
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
  local sdist="${HOROVOD_SDIST:-}"
  if [ -z "$sdist" ]; then
    "${PIP[@]}" download -q --no-deps --no-binary horovod "horovod==$HVD_VERSION" -d "$work" \
      || die "pip could not download the horovod==$HVD_VERSION sdist (offline: set HOROVOD_SDIST=path/to/horovod-$HVD_VERSION.tar.gz)"
    sdist="$work/horovod-$HVD_VERSION.tar.gz"
  fi
  [ -f "$sdist" ] || die "no Horovod sdist at $sdist (HOROVOD_SDIST)"
  tar -xzf "$sdist" -C "$work" || die "$sdist is not a readable .tar.gz"
  src="$work/horovod-$HVD_VERSION"
  [ -f "$src/CMakeLists.txt" ] || die "$sdist does not unpack to horovod-$HVD_VERSION/"
  sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
  sed -i 's/-std=c++11/-std=c++17/g' "$src/third_party/gloo/CMakeLists.txt"
  grep -q "CMAKE_CXX_STANDARD 17" "$src/CMakeLists.txt" || die "C++17 patch did not apply to $src/CMakeLists.txt"
  export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 \
         HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 MAKEFLAGS="${MAKEFLAGS:--j$(nproc)}"
  if [ "$CUDA" = 1 ]; then
    export HOROVOD_GPU_OPERATIONS=NCCL
    log "CUDA found: building with NCCL (GPU) + Gloo (CPU tensors), $MAKEFLAGS"
  else
    export HOROVOD_CPU_OPERATIONS=GLOO
  fi
  # progress stays visible: a heartbeat while the compiler works
  ( while sleep 30; do echo "[install_horovod] ... still compiling ($(date +%T))"; done ) &
  local hb=$! rc=0
  "${PIP[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$wheel_dir.tmp" "$src" \
    > "$work/build.log" 2>&1 || rc=$?
  kill "$hb"
  wait "$hb" 2>/dev/null || [ $? -eq 143 ]  # the heartbeat ends by our SIGTERM
  if [ "$rc" -ne 0 ]; then
    tail -40 "$work/build.log" >&2
    die "Horovod build failed (log above); see docs/horovod.md"
  fi
  mv "$wheel_dir.tmp"/horovod-*.whl "$wheel_dir"/
  rm -rf "$wheel_dir.tmp"
}

runtime_deps
if [ -z "$whl" ]; then
  log "no cached wheel in $wheel_dir; building Horovod $HVD_VERSION from ${HOROVOD_SDIST:-the PyPI sdist} (about 5 min on 2 cores)"
  build_wheel
  whl="$(find "$wheel_dir" -maxdepth 1 -name 'horovod-*.whl' | head -1)"
  log "built $whl"
else
  log "using cached wheel $whl"
fi
"${PIP[@]}" install -q --no-deps "$whl" || die "pip could not install $whl"
verify
