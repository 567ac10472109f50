"""torch backend: object collectives and ``broadcast_parameters``, each one negotiated operation.

Objects travel pickled in uint8 tensors (Horovod uses cloudpickle the same way); ``allgather_object``
is one allgather of the byte tensors (their lengths may differ), ``broadcast_object`` one broadcast
whose length only the root knows (the negotiation carries it). Unnamed calls are matched by their order
per process set (``allgather_object.noname.<n>``), not by the object's type name as in Horovod, so ranks
passing objects of different types still meet.
"""
from __future__ import annotations

import pickle
from typing import Any

import torch

from clipbert_legacy.compat.hvd.process_sets import ProcessSet, global_process_set
from clipbert_legacy.compat.hvd.torch_backend import ops as ops
from clipbert_legacy.compat.hvd.torch_backend.sets import member


def _to_bytes(obj: Any) -> torch.Tensor:
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def allgather_object(obj: Any, name: str | None = None, process_set: ProcessSet = global_process_set) -> list:
    """Every rank's object, in rank order (of the process set)."""
    data = _to_bytes(obj)
    handle = ops.allgather_async(data, name or member(process_set).controller.auto_name("allgather_object"),
                                 process_set)
    req = ops.request(handle)
    gathered = ops.synchronize(handle)
    out, start = [], 0
    for n in req.extra["rows"][0]:
        out.append(pickle.loads(gathered[start:start + n].numpy().tobytes()))  # from the job's own ranks
        start += n
    return out


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """The root's object on every rank of ``process_set``."""
    tset = member(process_set)
    data = _to_bytes(obj) if tset.rank == root_rank else torch.empty(0, dtype=torch.uint8)
    name = name or tset.controller.auto_name("broadcast_object")
    out = ops.synchronize(ops.object_broadcast_async(data, root_rank, name, process_set))
    if tset.rank == root_rank:
        return obj
    return pickle.loads(out.numpy().tobytes())  # from the job's own root rank


CHUNK_BYTES = 64 * 2 ** 20  # one grouped broadcast moves at most this much (plus one tensor)


def broadcast_parameters(named_tensors: list, root_rank: int) -> None:
    """All tensors in place from ``root_rank``: grouped broadcasts of about 64 MB, per device."""
    by_device: dict = {}
    for _, t in named_tensors:
        by_device.setdefault(t.device, []).append(t)
    for device in sorted(by_device, key=str):
        chunk, size, n = [], 0, 0
        for t in [*by_device[device], None]:
            if chunk and (t is None or size + t.numel() * t.element_size() > CHUNK_BYTES):
                ops.grouped_broadcast_(chunk, root_rank, name=f"broadcast_parameters.{device}.{n}")
                chunk, size, n = [], 0, n + 1
            if t is not None:
                chunk.append(t)
                size += t.numel() * t.element_size()
