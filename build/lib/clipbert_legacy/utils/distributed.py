"""Object-level collectives used by evaluation and logging (ClipBERT's helper names).

ClipBERT's ``all_gather_list`` pickled into a fixed 4 KB CUDA buffer and asserted on anything
larger; these go through ``hvd.allgather_object``/``broadcast_object``, so size is unbounded and
they work on CPU and in a single process without a launcher. As in ClipBERT, every rank gets fresh
objects (unpickled copies), its own entry included, also in a single process: editing a result
never edits the caller's input.
"""
import pickle
from dataclasses import dataclass

import torch

import clipbert_legacy.compat.hvd as hvd


def _ensure_init():
    if not hvd.is_initialized():
        hvd.init()


def _copy(obj):
    return pickle.loads(pickle.dumps(obj))


def all_gather_list(data):
    """Gather one picklable object from every rank; returns a list of copies in rank order."""
    _ensure_init()
    return [_copy(x) if x is data else x for x in hvd.allgather_object(data)]


def any_broadcast(data, root_rank=0):
    """Return (a copy of) the root rank's picklable object on every rank."""
    _ensure_init()
    out = hvd.broadcast_object(data, root_rank)
    return _copy(out) if out is data else out


@dataclass(frozen=True)
class _Slot:
    """Where a tensor was in an object sent by :func:`allgather_with_tensors`: its bytes' place in the
    rank's flat buffer, its dtype and shape."""
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple


def _strip(obj, tensors: list, offset: list):
    """``obj`` with every tensor replaced by a :class:`_Slot`; the tensors (CPU, contiguous) appended."""
    if torch.is_tensor(obj):
        t = obj.detach().cpu().contiguous()
        tensors.append(t)
        nbytes = t.numel() * t.element_size()
        offset[0] += nbytes
        return _Slot(offset[0] - nbytes, nbytes, t.dtype, tuple(t.shape))
    if isinstance(obj, dict):
        return type(obj)((k, _strip(v, tensors, offset)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_strip(v, tensors, offset) for v in obj)
    return obj


def _fill(obj, buf: torch.Tensor):
    """Inverse of :func:`_strip`: every :class:`_Slot` becomes a new tensor from ``buf``'s bytes."""
    if isinstance(obj, _Slot):
        return buf[obj.offset:obj.offset + obj.nbytes].clone().view(obj.dtype).reshape(obj.shape)
    if isinstance(obj, dict):
        return type(obj)((k, _fill(v, buf)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_fill(v, buf) for v in obj)
    return obj


def allgather_with_tensors(obj, name: str) -> list:
    """``hvd.allgather_object(obj)`` for an object (dicts, lists, tuples) holding large tensors, e.g. an
    optimizer state shard: the structure goes pickled (small), the tensors' bytes as one flat uint8
    ``hvd.allgather``. Horovod's ``allgather_object`` copies its whole pickle into a ByteTensor one
    element at a time (``torch.ByteTensor(bytearray(...))``: seconds for tens of MB; see
    benchmarks/bench_restore_save.py). Every rank gets new tensors (CPU), its own entry included;
    collective."""
    _ensure_init()
    tensors, size = [], [0]
    skeleton = _strip(obj, tensors, size)
    flat = (torch.cat([t.reshape(-1).view(torch.uint8) for t in tensors]) if tensors
            else torch.empty(0, dtype=torch.uint8))
    skeletons = hvd.allgather_object((skeleton, size[0]), name=f"{name}.skeleton")
    gathered = hvd.allgather(flat, name=f"{name}.bytes")
    out, start = [], 0
    for skel, n in skeletons:
        out.append(_fill(skel, gathered[start:start + n]))
        start += n
    return out
