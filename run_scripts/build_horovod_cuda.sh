#!/usr/bin/env bash
# Build Horovod 0.28.1 with NCCL (GPU) + Gloo (CPU) against the machine's own CUDA torch (whatever
# version it is; nothing here installs or replaces torch) and the NCCL wheel that torch itself depends
# on (nvidia-nccl-cu*), so Horovod and torch load one libnccl.so.2; a system NCCL is the fallback.
# A GPU is not needed: this only needs nvcc. Used by docker/Dockerfile and by run_scripts/gpu_check.sh on
# a GPU node (offline, from the bundle's sdist); opt-in on a host (not part of CI).
#
#   VENV_DIR   the env whose torch Horovod is built against and installed into (the Docker image's
#              /opt/venv); unset: the interpreter PYTHON (default python3) as it is
#   HOROVOD_SDIST  a local horovod-0.28.1.tar.gz (offline; passed on to install_horovod.sh)
#   HOROVOD_BUILD_CUDA_CC_LIST  compute capabilities (default 75,80,86,89,90,100,120: CUDA 13 has no sm_70;
#              without the list Horovod compiles for every arch nvcc knows; gpu_check.sh: the local GPU's)
#   ALLOW_CUDA_MISMATCH=1  warn instead of stopping when torch's CUDA major differs from nvcc's (two CUDA
#              runtimes in one process usually work; gpu_check.sh sets it and records both versions)
#   APEX_TAG   also build NVIDIA apex at this tag (25.05 or older: still has apex.amp) with --cpp_ext
#              --cuda_ext for the same archs; empty (default) = no apex. APEX_REPO: where to clone it from
#              (default https://github.com/NVIDIA/apex; a local clone or mirror works offline)
# The fixes for torch >= 2.1 (C++17, Gloo C++17, CMake 4) are applied by install_horovod.sh.
# Prints hvd.nccl_built() (fails if NCCL was not built in) and, with APEX_TAG, imports apex's kernels.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export HOROVOD_BUILD_CUDA_CC_LIST="${HOROVOD_BUILD_CUDA_CC_LIST:-75,80,86,89,90,100,120}"
if [ -n "${VENV_DIR:-}" ]; then
  VPY="$VENV_DIR/bin/python"
else
  VPY="$(command -v "${PYTHON:-python3}")" || { echo "[build_horovod_cuda] ERROR: no ${PYTHON:-python3} on PATH (set PYTHON or VENV_DIR)" >&2; exit 1; }
fi
PIP=("$VPY" -m pip --disable-pip-version-check --no-cache-dir)
log() { echo "[build_horovod_cuda] $(date +%T) $*"; }
die() { echo "[build_horovod_cuda] ERROR: $*" >&2; exit 1; }

[ -x "$VPY" ] || die "no python at $VPY (set VENV_DIR or PYTHON)"
if ! command -v nvcc >/dev/null 2>&1 && [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
  export PATH="${CUDA_HOME:-/usr/local/cuda}/bin:$PATH"  # a toolkit that is installed but not on PATH
fi
command -v nvcc >/dev/null 2>&1 || die "nvcc not found: install a CUDA toolkit (or use the devel image)"
nvcc_major="$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')"
"$VPY" -c "import torch" || die "$VPY cannot import torch: install a CUDA torch there first (this script never installs torch)"
torch_cuda="$("$VPY" -c 'import torch; print(torch.version.cuda or "")')"
[ -n "$torch_cuda" ] || die "torch in $VPY is a CPU build; install a CUDA one (TORCH_SPEC, pip index)"
if [ "${torch_cuda%%.*}" != "$nvcc_major" ]; then
  msg="torch is built for CUDA $torch_cuda but nvcc is CUDA $nvcc_major"
  [ "${ALLOW_CUDA_MISMATCH:-0}" = 1 ] || die "$msg: use a CUDA ${torch_cuda%%.*} toolkit (or ALLOW_CUDA_MISMATCH=1)"
  log "WARNING: $msg (ALLOW_CUDA_MISMATCH=1: building anyway)"
fi

# NCCL: torch's own wheel (headers + libnccl.so.2; Horovod's FindNCCL looks for libnccl.so), else the system's
if nccl_home="$("$VPY" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)" \
   && [ -f "$nccl_home/include/nccl.h" ]; then
  if [ ! -e "$nccl_home/lib/libnccl.so" ] && ! ln -s libnccl.so.2 "$nccl_home/lib/libnccl.so" 2>/dev/null; then
    # torch's site-packages is read-only here: the unversioned name in a private folder instead
    link_dir="$(mktemp -d)"
    mkdir "$link_dir/lib" && ln -s "$nccl_home/include" "$link_dir/include"
    ln -s "$nccl_home/lib/libnccl.so.2" "$link_dir/lib/libnccl.so"
    ln -s "$nccl_home/lib/libnccl.so.2" "$link_dir/lib/libnccl.so.2"
    nccl_home="$link_dir"
  fi
  export HOROVOD_NCCL_HOME="$nccl_home"
else
  nccl_home="${NCCL_HOME:-/usr}"
  [ -f "$nccl_home/include/nccl.h" ] \
    || die "no NCCL: neither torch's nvidia-nccl wheel nor $nccl_home/include/nccl.h (set NCCL_HOME)"
  [ "$nccl_home" = /usr ] || export HOROVOD_NCCL_HOME="$nccl_home"
  log "torch's NCCL wheel not found: using the NCCL at $nccl_home"
fi
export HOROVOD_NCCL_LINK=SHARED HOROVOD_GPU_OPERATIONS=NCCL
# nvcc may be a wrapper script: ask the compiler where its toolkit is
cuda_top="$(nvcc -v -E -x c /dev/null 2>&1 | sed -n 's/^#\$ TOP=//p')"
export HOROVOD_CUDA_HOME="${HOROVOD_CUDA_HOME:-${CUDA_HOME:-$(readlink -f "${cuda_top:-/usr/local/cuda}")}}"
[ -f "$HOROVOD_CUDA_HOME/include/cuda_runtime.h" ] || die "no CUDA toolkit at $HOROVOD_CUDA_HOME (set CUDA_HOME)"
# torch's cpp_extension (read by Horovod's CMake for cudart) guesses CUDA_HOME from `which nvcc`: a wrapper
# in /usr/local/bin gave /usr/local and "FOUND_LIB_cudart NOTFOUND"; pin it to the real toolkit
export CUDA_HOME="$HOROVOD_CUDA_HOME"
log "torch $("$VPY" -c 'import torch; print(torch.__version__)') (CUDA $torch_cuda), nvcc $nvcc_major," \
    "NCCL $("$VPY" -c 'import torch; print(".".join(map(str, torch.cuda.nccl.version())))' 2>/dev/null) at $nccl_home," \
    "CUDA_HOME $HOROVOD_CUDA_HOME, archs $HOROVOD_BUILD_CUDA_CC_LIST"
t0=$(date +%s)
HOROVOD_PYTHON="$VPY" "$REPO/run_scripts/install_horovod.sh"
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
