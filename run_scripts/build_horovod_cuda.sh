#!/usr/bin/env bash
# Build Horovod 0.28.1 with NCCL (GPU) + Gloo (CPU) against PyPI's CUDA torch 2.13.0 and the NCCL wheel
# that torch itself depends on (nvidia-nccl-cu13), so Horovod and torch load one libnccl.so.2.
# A GPU is not needed: this only needs nvcc (CUDA 13). Used by docker/Dockerfile and opt-in on a host
# (not part of CI: the CUDA torch download is several GB and the compile takes minutes).
#
#   VENV_DIR   venv to build into (default ~/.cache/clipbert-legacy/cuda-build/venv, created with $PYTHON);
#              an existing venv with a CUDA torch is used as it is (the Docker image's /opt/venv)
#   PYTHON     interpreter for a new venv (default python3)
#   TORCH_SPEC torch requirement for a new venv (default torch==2.13.0)
#   HOROVOD_BUILD_CUDA_CC_LIST  compute capabilities (default 75,80,86,89,90,100,120: CUDA 13 has no sm_70;
#              without the list Horovod compiles for every arch nvcc knows)
#   APEX_TAG   also build NVIDIA apex at this tag (25.05 or older: still has apex.amp) with --cpp_ext
#              --cuda_ext for the same archs; empty (default) = no apex. APEX_REPO: where to clone it from
#              (default https://github.com/NVIDIA/apex; a local clone or mirror works offline)
# The fixes for torch >= 2.1 (C++17, Gloo C++17, CMake 3.x) are applied by install_horovod.sh.
# Prints hvd.nccl_built() (fails if NCCL was not built in) and, with APEX_TAG, imports apex's kernels.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_ROOT="${XDG_CACHE_HOME:-$HOME/.cache}/clipbert-legacy"
export VENV_DIR="${VENV_DIR:-$CACHE_ROOT/cuda-build/venv}"
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-75,80,86,89,90,100,120}"
VPY="$VENV_DIR/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check --no-cache-dir)
log() { echo "[build_horovod_cuda] $(date +%T) $*"; }
die() { echo "[build_horovod_cuda] ERROR: $*" >&2; exit 1; }

command -v nvcc >/dev/null 2>&1 || die "nvcc not found: install a CUDA 13 toolkit (or use the devel image)"
nvcc_major="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
if [ ! -x "$VPY" ]; then
  log "creating $VENV_DIR with ${PYTHON:-python3}"
  "${PYTHON:-python3}" -m venv "$VENV_DIR"
fi
if ! "$VPY" -c "import torch" 2>/dev/null; then
  log "installing $TORCH_SPEC (PyPI's CUDA build, several GB) and numpy"
  "${PIP[@]}" install -q "$TORCH_SPEC" numpy
fi
torch_cuda="$("$VPY" -c 'import torch; print(torch.version.cuda or "")')"
[ -n "$torch_cuda" ] || die "torch in $VENV_DIR is a CPU build; install a CUDA one (TORCH_SPEC, pip index)"
[ "${torch_cuda%%.*}" = "$nvcc_major" ] \
  || die "torch is built for CUDA $torch_cuda but nvcc is CUDA $nvcc_major: use a CUDA ${torch_cuda%%.*} toolkit"

# NCCL: torch's own wheel (headers + libnccl.so.2); Horovod's FindNCCL looks for libnccl.so.
nccl_home="$("$VPY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])')" \
  || die "torch's nvidia-nccl wheel is not installed in $VENV_DIR"
[ -f "$nccl_home/include/nccl.h" ] || die "no include/nccl.h under $nccl_home"
[ -e "$nccl_home/lib/libnccl.so" ] || ln -s libnccl.so.2 "$nccl_home/lib/libnccl.so"
export HOROVOD_NCCL_HOME="$nccl_home" HOROVOD_NCCL_LINK=SHARED HOROVOD_GPU_OPERATIONS=NCCL
# nvcc may be a wrapper script: ask the compiler where its toolkit is
cuda_top="$(nvcc -v -E -x c /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')"
export HOROVOD_CUDA_HOME="${HOROVOD_CUDA_HOME:-${CUDA_HOME:-$(readlink -f "${cuda_top:-/usr/local/cuda}")}}"
[ -f "$HOROVOD_CUDA_HOME/include/cuda_runtime.h" ] || die "no CUDA toolkit at $HOROVOD_CUDA_HOME (set CUDA_HOME)"
# torch's cpp_extension (read by Horovod's CMake for cudart) guesses CUDA_HOME from `which nvcc`: a wrapper
# in /usr/local/bin gave /usr/local and "FOUND_LIB_cudart NOTFOUND"; pin it to the real toolkit
export CUDA_HOME="$HOROVOD_CUDA_HOME"
log "torch $("$VPY" -c 'import torch; print(torch.__version__)') (CUDA $torch_cuda), nvcc $nvcc_major," \
    "NCCL $("$VPY" -m pip show nvidia-nccl-cu13 2>/dev/null | sed -n 's/^Version: //p') at $nccl_home," \
    "CUDA_HOME $HOROVOD_CUDA_HOME, archs $HOROVOD_BUILD_CUDA_CC_LIST"
t0=$(date +%s)
"$REPO/run_scripts/install_horovod.sh"
"$VPY" - <<'PY' || die "Horovod was built without NCCL"
import sys
import horovod.torch as hvd
print("[build_horovod_cuda] nccl_built=%s gloo_built=%s" % (bool(hvd.nccl_built()), bool(hvd.gloo_built())))
sys.exit(0 if hvd.nccl_built() else 1)
PY
log "Horovod done in $(( $(date +%s) - t0 ))s (build or cached wheel, install, import)"

build_apex() {  # apex's CUDA extensions, compiled by this nvcc (apex refuses a torch of another CUDA)
  local work arch_list
  work="$(mktemp -d)"
  arch_list="$(echo "$HOROVOD_BUILD_CUDA_CC_LIST" | sed 's/\([0-9]\)\([0-9]\)\(,\|$\)/\1.\2\3/g; s/,/;/g')"
  log "apex $APEX_TAG: --cpp_ext --cuda_ext for TORCH_CUDA_ARCH_LIST=$arch_list"
  git -c advice.detachedHead=false clone -q --depth 1 --branch "$APEX_TAG" "${APEX_REPO:-https://github.com/NVIDIA/apex}" "$work/apex"
  # apex 25.04's setup.py hard-codes sm_70 for fused_weight_gradient_mlp_cuda; CUDA 13's nvcc rejects it
  # ("Unsupported gpu architecture 'compute_70'"): compile that kernel for sm_75 instead
  if [ "$nvcc_major" -ge 13 ]; then
    sed -i 's/arch=compute_70,code=sm_70/arch=compute_75,code=sm_75/' "$work/apex/setup.py"
  fi
  "${PIP[@]}" install -q ninja packaging wheel
  # A minimal toolkit (nvcc + cudart, as on this project's build machines) lacks the math-library headers
  # that torch's CUDA headers include (cusparse.h, cublas_v2.h): take them from torch's own nvidia wheels.
  if [ ! -f "$CUDA_HOME/include/cusparse.h" ]; then
    local inc
    inc="$("$VPY" -c 'import nvidia, os, sys; print(os.path.join(list(nvidia.__path__)[0], sys.argv[1], "include"))' \
      "cu$nvcc_major")"
    [ -f "$inc/cusparse.h" ] || die "no cusparse.h in $CUDA_HOME/include or $inc"
    log "headers missing from $CUDA_HOME/include are taken from $inc"
    export CPATH="$inc${CPATH:+:$CPATH}"
  fi
  (cd "$work/apex" && TORCH_CUDA_ARCH_LIST="$arch_list" MAX_JOBS="${MAX_JOBS:-$(nproc)}" "${PIP[@]}" install \
      --no-build-isolation --config-settings "--build-option=--cpp_ext" \
      --config-settings "--build-option=--cuda_ext" . > "$work/apex-build.log" 2>&1) \
    || { tail -40 "$work/apex-build.log" >&2; die "apex $APEX_TAG did not build (log above)"; }
  rm -rf "$work"
  "$VPY" -c "import torch, amp_C, fused_layer_norm_cuda, apex.amp; print('[build_horovod_cuda] apex kernels import: amp_C, fused_layer_norm_cuda')" \
    || die "apex built but its kernels do not import"
}
if [ -n "${APEX_TAG:-}" ]; then
  t1=$(date +%s)
  build_apex
  log "apex done in $(( $(date +%s) - t1 ))s"
fi
