"""torch backend: ``horovod.torch``'s asynchronous operations, handles, ``poll`` and ``synchronize``.

Each ``*_async`` call checks its local arguments (raising ``ValueError`` as Horovod does), names the
operation (its ``name``, else ``<kind>.noname.<n>`` counted per process set and kind, so ranks that
issue the same unnamed operations in the same order match), submits it to its process set's
negotiation and returns an integer handle at once. The collective runs in the set's executor thread;
``synchronize`` waits for it and returns the output, or raises ``HorovodInternalError`` with the
coordinator's message (e.g. mismatched shapes) on every rank alike.
"""
from __future__ import annotations

from typing import Any

import torch

from clipbert_legacy.compat.hvd.errors import HorovodInternalError
from clipbert_legacy.compat.hvd.process_sets import ProcessSet, global_process_set
from clipbert_legacy.compat.hvd.torch_backend.controller import Request
from clipbert_legacy.compat.hvd.torch_backend.negotiation import JOIN, JOIN_NAME
from clipbert_legacy.compat.hvd.torch_backend.sets import member
from clipbert_legacy.compat.hvd.torch_backend.state import STATE

_HANDLES: dict[int, Request] = STATE.handles
_NEXT = STATE.next_handle
_LOCK = STATE.handles_lock


def _meta(tensors: list[torch.Tensor], **extra: Any) -> dict:
    dev = {t.device.type for t in tensors}
    if len(dev) > 1:
        raise HorovodInternalError("a grouped operation got tensors on CPU and GPU at once; put them on one "
                                   "device")
    return {"dt": [str(t.dtype) for t in tensors], "sh": [list(t.shape) for t in tensors],
            "dev": dev.pop() if dev else "cpu", **extra}


def submit(kind: str, process_set: ProcessSet, name: str | None, tensors: list[torch.Tensor],
           outputs: list[torch.Tensor] | None, extra: dict | None = None, **meta: Any) -> int:
    """Submit one operation; returns its handle."""
    tset = member(process_set)
    name = name if name else tset.controller.auto_name(kind)
    req = Request(name, kind, _meta(tensors, **meta), tensors, outputs)
    req.extra.update(extra or {})
    with _LOCK:
        handle = next(_NEXT)
        _HANDLES[handle] = req
    try:
        tset.controller.submit(req)
    except BaseException:
        with _LOCK:
            _HANDLES.pop(handle, None)
        raise
    return handle


def request(handle: int) -> Request | None:
    """The request behind ``handle`` (None once synchronized)."""
    return _HANDLES.get(handle)


def poll(handle: int) -> bool:
    req = _HANDLES.get(handle)
    if req is None:
        raise ValueError(f"Handle {handle} was not created or has been cleared.")
    return req.done.is_set()


def synchronize(handle: int) -> Any:
    req = _HANDLES.get(handle)
    if req is None:
        return None
    req.wait()
    with _LOCK:
        _HANDLES.pop(handle, None)
    if req.error is not None:
        raise HorovodInternalError(req.error)
    return req.result


def _factors(op: str, prescale_factor: float, postscale_factor: float) -> dict:
    return {"op": op, "pre": float(prescale_factor), "post": float(postscale_factor)}


def _check_reduce_op(op: str) -> None:
    if op == "adasum":
        raise HorovodInternalError("Adasum needs real Horovod built with MPI; the torch backend reduces with "
                                   "Average, Sum, Min, Max or Product")


def allreduce_async(tensor, name=None, op="average", prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    _check_reduce_op(op)
    return submit("ALLREDUCE", process_set, name, [tensor], [torch.empty_like(tensor)], single=True,
                  **_factors(op, prescale_factor, postscale_factor))


def allreduce_async_(tensor, name=None, op="average", prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    _check_reduce_op(op)
    return submit("ALLREDUCE", process_set, name, [tensor], [tensor], single=True,
                  **_factors(op, prescale_factor, postscale_factor))


def allreduce_(tensor, name=None, op="average", prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    return synchronize(allreduce_async_(tensor, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors, name=None, op="average", prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    _check_reduce_op(op)
    return submit("ALLREDUCE", process_set, name, list(tensors), [torch.empty_like(t) for t in tensors],
                  **_factors(op, prescale_factor, postscale_factor))


def grouped_allreduce_async_(tensors, name=None, op="average", prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    _check_reduce_op(op)
    return submit("ALLREDUCE", process_set, name, list(tensors), list(tensors),
                  **_factors(op, prescale_factor, postscale_factor))


def grouped_allreduce_(tensors, name=None, op="average", prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, name, op, prescale_factor, postscale_factor,
                                                process_set))


def allgather_async(tensor, name=None, process_set=global_process_set, join_ok=False):
    return submit("ALLGATHER", process_set, name, [tensor], None, single=True, jo=join_ok)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    return submit("ALLGATHER", process_set, name, list(tensors), None)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    return submit("BROADCAST", process_set, name, [tensor], [torch.empty_like(tensor)], single=True,
                  root=int(root_rank))


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    return submit("BROADCAST", process_set, name, [tensor], [tensor], single=True, root=int(root_rank))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def grouped_broadcast_(tensors, root_rank, name=None, process_set=global_process_set):
    """Ours: broadcast a list of tensors in place as one negotiated operation (broadcast_parameters)."""
    return synchronize(submit("BROADCAST", process_set, name, list(tensors), list(tensors),
                              root=int(root_rank)))


def object_broadcast_async(data: torch.Tensor, root_rank: int, name: str, process_set: ProcessSet) -> int:
    """Ours: broadcast bytes whose length only the root knows (broadcast_object), one negotiation."""
    return submit("BROADCAST", process_set, name, [data], None, single=True, root=int(root_rank), obj=True)


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    tset = member(process_set)
    extra = {"splits_device": splits.device if isinstance(splits, torch.Tensor) else torch.device("cpu")}
    return submit("ALLTOALL", process_set, name, [tensor], None, extra,
                  splits=_alltoall_splits(tensor, splits, tset.size))


def _alltoall_splits(tensor: torch.Tensor, splits: Any, size: int) -> list[int]:
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is None:
        if tensor.shape[0] % size:
            raise ValueError(f"alltoall without splits needs the first dimension ({tensor.shape[0]}) to be a "
                             f"multiple of the number of ranks ({size}); pass splits=")
        return [tensor.shape[0] // size] * size
    if isinstance(splits, torch.Tensor):
        if splits.dtype != torch.int32:
            raise ValueError(f"alltoall splits must be an int32 tensor, got {splits.dtype}")
        splits = splits.tolist()
    splits = [int(s) for s in splits]
    if len(splits) != size or any(s < 0 for s in splits):
        raise ValueError(f"alltoall splits must be {size} non-negative row counts, got {splits}")
    if sum(splits) > tensor.shape[0]:
        raise ValueError(f"alltoall splits sum to {sum(splits)}, more than the tensor's first dimension "
                         f"({tensor.shape[0]})")
    return splits


def reducescatter_async(tensor, name=None, op="average", process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    _check_reducescatter_op(op)
    return submit("REDUCESCATTER", process_set, name, [tensor], None, single=True,
                  **_factors(op, prescale_factor, postscale_factor))


def grouped_reducescatter_async(tensors, name=None, op="average", process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0):
    _check_reducescatter_op(op)
    return submit("REDUCESCATTER", process_set, name, list(tensors), None,
                  **_factors(op, prescale_factor, postscale_factor))


def _check_reducescatter_op(op: str) -> None:
    if op not in ("average", "sum"):
        raise HorovodInternalError(f"Reducescatter currently only supports AVERAGE and SUM (got {op!r})")


def barrier(process_set=global_process_set):
    tset = member(process_set)
    synchronize(submit("BARRIER", process_set, tset.controller.auto_name("BARRIER"), [], None))


def join_async(process_set: ProcessSet = global_process_set) -> int:
    """Ours: announce this rank's join to the negotiation (``_hvd_torch_join`` waits for it)."""
    return submit(JOIN, process_set, JOIN_NAME, [], None)


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Horovod's sparse reduction: allgather the indices (transposed, so rows concatenate) and the values;
    the returned callable waits and builds the summed (averaged for Average) sparse tensor."""
    t = tensor
    indices = allgather_async(t._indices().transpose(0, 1).contiguous(), name=f"{name}.indices",
                              process_set=process_set)
    values = allgather_async(t._values(), name=f"{name}.values", process_set=process_set)
    set_size = member(process_set).size

    def handle():
        v = synchronize(values)
        i = synchronize(indices)
        v = v / set_size if op == "average" else v
        return torch.sparse_coo_tensor(i.transpose(0, 1), v, t.size(), check_invariants=False)
    return handle
