"""The machine a process runs on: its training device, batches moved there, its share of CPU cores."""
from __future__ import annotations

import os

import torch

from clipbert_legacy.compat import launcher_env

MAX_AUTO_WORKERS = 4  # ClipBERT's n_workers


def cpus_per_process() -> int:
    """CPU cores this process may use (its affinity) divided among the job's processes on this machine."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(launcher_env.local_size(), 1))


def num_workers(n_workers: int | None) -> int:
    """DataLoader workers: ``n_workers`` when set, else ClipBERT's 4 capped at this process's cores (4
    workers per process on a 2-core machine only made every loader warn and the decoders fight)."""
    if n_workers is not None:
        return n_workers
    return min(MAX_AUTO_WORKERS, cpus_per_process())


def move_to_device(batch, device: torch.device | str, non_blocking: bool = True):
    """Tensors in (nested) dicts, lists and tuples moved to ``device``; everything else unchanged."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in batch):
        return type(batch)(move_to_device(v, device, non_blocking) for v in batch)
    return batch


def training_device(local_rank: int | None = None) -> torch.device:
    """The one place a process's device is chosen: ``cuda:local_rank`` (default: ``hvd.local_rank()``)
    when CUDA is available, made the current device; else the CPU."""
    if torch.cuda.is_available():
        if local_rank is None:
            import clipbert_legacy.compat.hvd as hvd
            local_rank = hvd.local_rank() if hvd.is_initialized() else 0
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for :func:`memory_mb` (CUDA; the CPU figure is the RSS at the time)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def memory_mb(device: torch.device) -> float:
    """CUDA: the peak ``max_memory_allocated`` since :func:`reset_peak_memory`; CPU: this process's
    resident set size now (MB)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20
    except (OSError, ValueError):  # not Linux: the high-water mark (KB on Linux, bytes on macOS)
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
