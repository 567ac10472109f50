"""detectron2's ``comm`` helpers over whatever runs the processes: Horovod (the project's
``clipbert_legacy.compat.hvd``, or a real ``horovod.torch`` a fork imported), else ``torch.distributed``,
else one process.

ClipBERT starts its processes with ``hvd.init()`` and never initialises ``torch.distributed``; detectron2's
helpers only looked at ``torch.distributed``, so under Horovod they said world size 1. Here they ask Horovod
first, so ``get_world_size()`` is the job's size under horovodrun and torchrun alike.
"""
import sys

import numpy as np
import torch
import torch.distributed as dist

from clipbert_legacy.compat import launcher_env

__all__ = ["get_world_size", "get_rank", "get_local_rank", "get_local_size", "is_main_process",
           "synchronize", "all_gather", "gather", "reduce_dict", "shared_random_seed"]


def _horovod():
    """The initialised Horovod API module (the project's first, then a real one a fork imported), or None."""
    from clipbert_legacy.compat import hvd
    if hvd.is_initialized():
        return hvd
    real = sys.modules.get("horovod.torch")
    if real is not None and real is not hvd and getattr(real, "is_initialized", lambda: False)():
        return real
    return None


def _torch_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_world_size() -> int:
    """The number of processes in the job (1 when none was started)."""
    hvd = _horovod()
    if hvd is not None:
        return hvd.size()
    return dist.get_world_size() if _torch_dist() else 1


def get_rank() -> int:
    """This process's rank (0 when alone)."""
    hvd = _horovod()
    if hvd is not None:
        return hvd.rank()
    return dist.get_rank() if _torch_dist() else 0


def get_local_rank() -> int:
    """This process's rank on its machine."""
    hvd = _horovod()
    if hvd is not None:
        return hvd.local_rank()
    if _torch_dist():
        return launcher_env.torchrun_process().local_rank
    return 0


def get_local_size() -> int:
    """The number of processes on this machine."""
    hvd = _horovod()
    if hvd is not None:
        return hvd.local_size()
    if _torch_dist():
        return launcher_env.torchrun_process().local_size
    return 1


def is_main_process() -> bool:
    return get_rank() == 0


def synchronize() -> None:
    """A barrier across all processes (nothing when alone)."""
    if get_world_size() == 1:
        return
    hvd = _horovod()
    if hvd is not None:
        hvd.barrier() if hasattr(hvd, "barrier") else hvd.allreduce(torch.zeros(1), name="d2_synchronize")
    else:
        dist.barrier()


def all_gather(data, group=None):
    """Every rank's picklable ``data``, as a list indexed by rank."""
    if get_world_size() == 1:
        return [data]
    hvd = _horovod()
    if hvd is not None:
        return list(hvd.allgather_object(data))
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, data)
    return out


def gather(data, dst=0, group=None):
    """Every rank's ``data`` as a list on rank ``dst``; ``[]`` on the others."""
    gathered = all_gather(data, group)
    return gathered if get_rank() == dst else []


def reduce_dict(input_dict, average=True):
    """Tensors of ``input_dict`` summed (or averaged) over ranks, the result valid on rank 0 (every rank
    here)."""
    world = get_world_size()
    if world < 2:
        return input_dict
    with torch.no_grad():
        names = sorted(input_dict)
        gathered = all_gather(torch.stack([input_dict[k].detach().cpu() for k in names]))
        total = torch.stack(gathered).sum(dim=0)
        if average:
            total /= world
        return {k: total[i].to(input_dict[k].device) for i, k in enumerate(names)}


def shared_random_seed() -> int:
    """A random int that every rank agrees on (rank 0's)."""
    ints = np.random.randint(2 ** 31)
    return int(all_gather(ints)[0])
