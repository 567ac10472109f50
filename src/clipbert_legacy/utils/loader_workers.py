"""DataLoader worker settings every loader of the project uses: a /dev/shm check before any worker starts
and a timeout on worker results, so a loader whose workers cannot hand batches back ends the run (one-line
error, exit status 1) instead of hanging it (Docker's default /dev/shm is 64 MB)."""
import os

import torch

from clipbert_legacy.utils.errors import UserError

SHM_DIR = "/dev/shm"
MIN_SHM_MB = 256  # below this the demo's frame-QA inference already fails (Docker's default: 64 MB)
WORKER_TIMEOUT_S = 300  # seconds a loader waits for one batch of its workers (CLIPBERT_LOADER_TIMEOUT_S)


class SharedMemoryError(UserError, RuntimeError):
    """DataLoader workers would fail: /dev/shm is too small for the batches they pass back."""


def check_shared_memory(num_workers, shm_dir=SHM_DIR, min_mb=None):
    """Raise SharedMemoryError (one line: the size and the fix) when workers would run out of /dev/shm.

    Worker processes hand each batch to the main process as tensors in /dev/shm; when it fills up, torch
    raises in the worker, and under horovodrun the job stalled instead of ending. Checked before any
    worker starts. ``min_mb``: default CLIPBERT_MIN_SHM_MB or MIN_SHM_MB; no check without workers.
    """
    if num_workers <= 0 or not os.path.isdir(shm_dir):
        return
    min_mb = min_mb if min_mb is not None else float(os.environ.get("CLIPBERT_MIN_SHM_MB", MIN_SHM_MB))
    st = os.statvfs(shm_dir)
    free_mb = st.f_bavail * st.f_frsize / 2 ** 20
    if free_mb < min_mb:
        raise SharedMemoryError(
            f"{shm_dir} has {free_mb:.0f} MiB free, DataLoader workers (n_workers={num_workers}) need at "
            f"least {min_mb:.0f} MiB: run the container with --shm-size 1g or --ipc=host "
            f"(docker/launch_container.sh passes --ipc=host), or use --n_workers 0")


def loader_settings(cfg, device) -> dict:
    """The DataLoader keyword arguments every loader of a run takes from the config: workers
    (``n_workers``, see ``clipbert_legacy.utils.device.num_workers``), their timeout, and ``pin_memory``
    (``pin_mem``, only when the batches go to a CUDA device)."""
    from clipbert_legacy.utils.device import num_workers
    return {"pin_memory": bool(cfg.pin_mem) and torch.device(device).type == "cuda",
            **worker_settings(num_workers(cfg.n_workers))}


def worker_settings(num_workers):
    """``num_workers`` and ``timeout`` for a DataLoader, after :func:`check_shared_memory`: a worker that
    dies or stalls ends the run (RuntimeError, exit status 1) after CLIPBERT_LOADER_TIMEOUT_S seconds
    (default WORKER_TIMEOUT_S) instead of hanging it."""
    check_shared_memory(num_workers)
    if num_workers <= 0:
        return {"num_workers": 0}
    return {"num_workers": num_workers,
            "timeout": float(os.environ.get("CLIPBERT_LOADER_TIMEOUT_S", WORKER_TIMEOUT_S))}
