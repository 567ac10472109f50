"""The GPU image built and checked on a machine without a GPU (opt-in, long: ``pytest -m docker_cuda``).

``QUICKSTART_FAST=1 docker/build_local.sh --cuda`` from a clean copy of the checkout makes the stand-in
CUDA base (local Debian + the CUDA 13.0 toolkit from NVIDIA's pip wheels), builds the real
docker/Dockerfile with HOROVOD_BUILD=cuda and PyPI's torch 2.13.0 (CUDA 13.0), Horovod compiled with NCCL
by nvcc inside the image, and runs the demo quickstart in it on the CPU. Then, inside the image: the
versions are those docker/check_stack.py derives from torch's wheel metadata (torch, CUDA 13.0, NCCL of
torch's nvidia-nccl wheel, nvcc of the stand-in toolkit), Horovod has NCCL and Gloo and links torch's
NCCL, apex imports when APEX_TAG was given (and not otherwise), the quick CPU subset of the suite passes;
launch_container.sh asked for GPUs on a host without the NVIDIA runtime stops with one line.
What needs a GPU host (kernels running, NCCL between GPUs) is run_scripts/gpu_check.sh's.
``CLIPBERT_CUDA_IMAGE=NAME`` checks an image already built by ``build_local.sh --cuda`` instead of building
one (the build-and-quickstart test is then skipped, saying so).
Not in CI (.ci/run): a cold build takes longer than CI's budget left after the suite and the CPU image.
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests import docker_utils as du

pytestmark = [pytest.mark.docker_cuda, pytest.mark.timeout(7200)]
REPO = Path(__file__).resolve().parents[1]
IMAGE = os.environ.get("CLIPBERT_CUDA_IMAGE") or "clipbert-legacy:cuda-test"
# the build arguments docker/build_local.sh --cuda passes
CUDA_ARGS = {"CUDA_IMAGE": "local/cuda:13.0.3-devel-debian12", "PYTHON_VERSION": "3.11",
             "HOROVOD_BUILD": "cuda", "TORCH_SPEC": "torch==2.13.0"}
_spec = importlib.util.spec_from_file_location("check_stack", REPO / "docker/check_stack.py")
stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stack)
# printed as JSON inside the image: what was built, without a GPU
PROBE = r"""
import ctypes, glob, importlib.metadata, json, os, re, struct, subprocess, sys, torch, horovod
import horovod.torch as hvd
lib = glob.glob(os.path.join(os.path.dirname(hvd.__file__), "mpi_lib_v2*.so"))[0]
ldd = subprocess.run(["ldd", lib], capture_output=True, text=True).stdout
# the GPU code nvcc compiled into Horovod: one cubin (an ELF, its SM in e_flags bits 8-15) per arch
subprocess.run(["objcopy", "-O", "binary", "--only-section=.nv_fatbin", lib, "/tmp/fatbin"], check=True)
fatbin = open("/tmp/fatbin", "rb").read()
archs = sorted((struct.unpack_from("<I", fatbin, m.start() + 48)[0] >> 8) & 0xFF
               for m in re.finditer(rb"\x7fELF", fatbin))
nccl = ctypes.c_int()
ctypes.CDLL("libnccl.so.2").ncclGetVersion(ctypes.byref(nccl))  # the NCCL the loader gives this process
v = nccl.value
try:
    import apex.amp, amp_C, fused_layer_norm_cuda  # noqa: F401
    apex = True
except ImportError:
    apex = False
print(json.dumps({"torch": importlib.metadata.version("torch"), "torch_version": torch.__version__,
                  "cuda": torch.version.cuda, "gpu": torch.cuda.is_available(),
                  "horovod": horovod.__version__, "nccl_built": bool(hvd.nccl_built()),
                  "gloo_built": bool(hvd.gloo_built()), "ldd": ldd, "apex": apex,
                  "nvcc": subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout,
                  "nccl": f"{v // 10000}.{v // 100 % 100}.{v % 100}", "python": sys.version.split()[0],
                  "archs": archs}))
"""


@pytest.fixture(scope="module")
def daemon():
    started = du.start_daemon()
    yield
    du.stop_daemon(started)


@pytest.fixture(scope="module")
def built(daemon, tmp_path_factory):
    """build_local.sh --cuda from a clean copy: stand-in base, image build, then QUICKSTART_FAST=1 in it."""
    if os.environ.get("CLIPBERT_CUDA_IMAGE"):
        p = du.docker("image", "inspect", IMAGE)
        assert p.returncode == 0, f"CLIPBERT_CUDA_IMAGE={IMAGE}: no such image ({p.stderr.strip()})"
        return {"p": subprocess.CompletedProcess([], 0, "", ""), "out": None}
    repo = du.clean_copy(tmp_path_factory.mktemp("cuda_ctx") / "clipbert")
    out = tmp_path_factory.mktemp("cuda_demo")
    t = time.time()
    p = subprocess.run([str(repo / "docker/build_local.sh"), "--cuda"], cwd=repo, capture_output=True,
                       text=True, timeout=6600,
                       env=dict(os.environ, CLIPBERT_IMAGE=IMAGE, QUICKSTART_FAST="1", DEMO_OUT=str(out)))
    print(f"build_local.sh --cuda (bases, build, QUICKSTART_FAST=1): {time.time() - t:.0f} s")
    print("\n".join(ln for ln in p.stdout.splitlines() if ln.startswith(("[build_local]", "[make_cuda"))))
    if p.returncode == 0:
        # the quickstart wrote root-owned caches into the copy's data/; the copy goes with tmp_path
        shutil.rmtree(repo / "data", ignore_errors=True)
    return {"p": p, "out": out}


@pytest.fixture(scope="module")
def probe(built):
    assert built["p"].returncode == 0, "the image did not build (see the first test)"
    p = du.docker("run", "--rm", "--network", "none", IMAGE, "python", "-c", PROBE, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_build_local_cuda_builds_the_image_and_runs_the_quickstart_on_the_cpu(built):
    if built["out"] is None:
        pytest.skip(f"CLIPBERT_CUDA_IMAGE={IMAGE}: checking a prebuilt image, not building one")
    p, qs = built["p"], built["out"] / "quickstart"
    assert p.returncode == 0, f"{p.stdout[-6000:]}\n{p.stderr[-4000:]}"
    assert f"built {IMAGE} in" in p.stdout and "7/7 results" in p.stdout and "R@1" in p.stdout
    assert all(f.stat().st_uid == os.getuid() for f in du.quickstart_scores(qs))


def test_the_versions_inside_are_the_ones_check_stack_derives(probe):
    want = stack.expected_versions((REPO / "docker/Dockerfile").read_text(), CUDA_ARGS)
    assert want == {"torch": "2.13.0", "cuda": "13.0", "nccl": "2.29.7", "nvcc": "13.0.88"}, want
    assert probe["torch"] == want["torch"] and probe["cuda"] == want["cuda"], probe
    assert probe["torch_version"] == f"{want['torch']}+cu{want['cuda'].replace('.', '')}"  # 2.13.0+cu130
    assert probe["nccl"] == want["nccl"], probe
    assert f"release {want['cuda']}, V{want['nvcc']}" in probe["nvcc"], probe["nvcc"]
    assert probe["python"].startswith("3.11.") and probe["gpu"] is False  # a CUDA torch, run on the CPU


def test_horovod_has_nccl_and_gloo_and_links_torchs_nccl(probe):
    assert probe["horovod"] == "0.28.1" and probe["nccl_built"] and probe["gloo_built"], probe
    nccl = re.search(r"libnccl\.so\.2 => (\S+)", probe["ldd"])
    assert nccl and "/site-packages/nvidia/nccl/lib/" in nccl.group(1), probe["ldd"]
    assert re.search(r"libcudart\.so\.13 => /", probe["ldd"]), probe["ldd"]
    cc = stack.arg_defaults((REPO / "docker/Dockerfile").read_text())["CUDA_CC_LIST"].split(",")
    assert probe["archs"] == sorted(int(c) for c in cc), probe["archs"]  # its kernels, one per arch


def test_apex_is_there_exactly_when_apex_tag_was_given(probe):
    assert probe["apex"] is bool(os.environ.get("APEX_TAG")), probe["apex"]


def test_the_quick_cpu_subset_passes_inside_the_cuda_image(built):
    assert built["p"].returncode == 0, "the image did not build"
    p = du.docker("run", "--rm", "--network", "host", "--ipc=host", "-e", "SKIP_SYSTEM_PACKAGES=1",
                  *du.host_ca_mount(), IMAGE, "./run_scripts/test.sh", "-p", "no:cacheprovider", "-rs",
                  *du.IN_IMAGE_TESTS, timeout=1800)
    tail = p.stdout[-4000:] + p.stderr[-2000:]
    assert p.returncode == 0 and " passed" in p.stdout and " failed" not in p.stdout, tail
    assert "cannot resolve wheels here" not in p.stdout, tail  # check_stack's tests ran, not skipped


def test_launch_container_with_gpus_on_a_host_without_the_nvidia_runtime_is_one_line(built, tmp_path):
    assert built["p"].returncode == 0, "the image did not build"
    if any(shutil.which(t) for t in ("nvidia-container-runtime-hook", "nvidia-container-toolkit",
                                     "nvidia-ctk", "nvidia-container-cli")):
        pytest.skip("this host has the NVIDIA container toolkit")
    dirs = [tmp_path / d for d in ("txt", "img", "out", "pre")]
    for d in dirs:
        d.mkdir()
    p = subprocess.run([str(REPO / "docker/launch_container.sh"), *map(str, dirs), "nvidia-smi"],
                       capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                       env=dict(os.environ, GPUS="all", CLIPBERT_IMAGE=IMAGE))
    assert p.returncode == 2 and p.stdout == "", p.stdout + p.stderr
    assert p.stderr.count("\n") == 1 and "GPUS=all but this host has no NVIDIA container runtime" in p.stderr
    # what it saves the user from: docker's own refusal (rc 125) after the image is set up
    raw = du.docker("run", "--rm", "--gpus", "all", IMAGE, "true")
    assert raw.returncode == 125, raw.stderr
