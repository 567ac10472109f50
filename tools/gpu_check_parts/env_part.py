"""Part 1 of the GPU check: what machine this is, before anything is measured.

GPU name, compute capability and memory, driver, torch / CUDA / cuDNN / NCCL versions, the TF32 flags
torch starts with, CPU cores, Python, the packages the project needs (and whether the bundle brought
them: the driver's install record is read from ``--work``), and the tools the Horovod build needs.
"""
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys

import _common
import torch

PACKAGES = ("torch", "numpy", "transformers", "tokenizers", "safetensors", "av", "lmdb", "ujson",
            "tensorboardX", "scikit-video", "pillow", "psutil", "pytest", "horovod", "apex", "cmake")


def _run(cmd: list) -> str | None:
    """First line of a tool's output, or None where it is absent or fails."""
    if shutil.which(cmd[0]) is None:
        return None
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    out = (p.stdout or p.stderr).strip().splitlines()
    return out[0] if p.returncode == 0 and out else None


def versions() -> dict:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def gpu() -> dict:
    if not torch.cuda.is_available():
        return {"cuda_available": False}
    props = torch.cuda.get_device_properties(0)
    query = "--query-gpu=driver_version,power.limit,clocks.max.sm"
    smi = _run(["nvidia-smi", query, "--format=csv,noheader"])
    return {"cuda_available": True, "count": torch.cuda.device_count(), "name": props.name,
            "capability": f"{props.major}.{props.minor}", "memory_bytes": props.total_memory,
            "multiprocessors": props.multi_processor_count, "nvidia_smi": smi,
            "driver": smi.split(",")[0].strip() if smi else None,
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else None}


def tf32_flags() -> dict:
    """torch's defaults in a fresh process (the precision parts set them explicitly per mode)."""
    return {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark}


def bundle_record(work: str | None) -> dict | None:
    path = os.path.join(work or "", "bundle_install.json")
    if not work or not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def main() -> int:
    a = _common.parse(__doc__.split("\n")[0])
    res = _common.Result("env", a.result, a.cpu_dry_run)
    res.save(python=sys.version.split()[0], executable=sys.executable, platform=platform.platform(),
             cpu_cores=os.cpu_count(), torch=torch.__version__, torch_cuda=torch.version.cuda,
             cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
             tf32_defaults=tf32_flags(), gpu=gpu())
    res.save(packages=versions(), bundle=bundle_record(a.work),
             tools={"nvcc": _nvcc_release(), "cmake": _run(["cmake", "--version"]),
                    "ninja": _run(["ninja", "--version"]), "c++": _run(["c++", "--version"])})
    ok = a.cpu_dry_run or res.data["gpu"]["cuda_available"]
    return res.finish(ok)


def _nvcc_release() -> str | None:
    if shutil.which("nvcc") is None:
        return None
    p = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=30)
    lines = [ln for ln in p.stdout.splitlines() if "release" in ln]
    return lines[0].strip() if lines else None


if __name__ == "__main__":
    sys.exit(main())
