"""torch backend: run one negotiated operation's collective, with Horovod's numerics.

Called by a process set's executor thread (``hvd.torch_backend.controller``) with the coordinator's response
and this rank's request (None on a rank that has joined: it takes part with zeros, or with no rows
where an internal allgather allows it). Horovod's definitions kept here:

* Average is a sum followed by a post-scale of ``1 / size`` (on the process set), in the reduced
  tensor's own dtype (an fp16-compressed tensor is averaged in fp16, before it is decompressed); prescale
  and postscale multiply in float64 for integer tensors and truncate toward zero, in float32 for half
  precision on the CPU, in the tensor's own type otherwise (Horovod's ``ScaleBuffer``, see ``scale``);
* joined ranks add zeros to an allreduce, whatever its op, and Average still divides by the set size;
* reducescatter gives the first ``dim0 % size`` ranks one row more than the others;
* alltoall sends ``splits[j]`` rows to rank j (default: ``dim0 / size`` each) and returns the received
  splits as int32.

Gloo and NCCL cannot reduce int16 tensors; they are reduced as int32 and cast back (wrapping like an
int16 sum). Data that is only moved (allgather, broadcast, alltoall) travels as bytes, so every dtype works.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from clipbert_legacy.compat.hvd.torch_backend.timeline import activity, operation, transport

_REDUCE = {"sum": dist.ReduceOp.SUM, "average": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN,
           "max": dist.ReduceOp.MAX, "product": dist.ReduceOp.PRODUCT}
_WIRE = {torch.int16: torch.int32}  # dtypes the backends cannot reduce, and what they travel as


class Place:
    """Where a set's collectives run, from this rank: its group and its position in the set."""

    def __init__(self, ranks: list[int], rank: int, group: Any, cuda_index: int | None = None) -> None:
        self.ranks, self.rank, self.group = list(ranks), rank, group
        self.size, self.index = len(self.ranks), self.ranks.index(rank)
        self.join_device = torch.device("cpu")  # where a joined rank makes its zeros (hvd.join(device))
        self.cuda_index = cuda_index  # this rank's GPU: the executor thread's current device for NCCL


def execute(resp: dict, req: Any, place: Place) -> Any:
    """Run ``resp`` on this rank and return the request's result (see ``hvd.torch_backend.ops``)."""
    kind = resp["k"]
    tensors = req.tensors if req is not None else _stand_ins(resp, place)
    outputs = req.outputs if req is not None else None
    extra = req.extra if req is not None else {}
    if place.cuda_index is not None and torch.cuda.current_device() != place.cuda_index:
        torch.cuda.set_device(place.cuda_index)  # the current device is per thread
    with operation(kind, resp["n"], tensors), torch.no_grad():  # the callers' autograd owns the graph
        if kind == "BARRIER":  # a CPU allreduce: the Gloo half of a cpu:gloo,cuda:nccl group, on any GPU
            if place.size > 1:
                with _wire(resp, "cpu"):
                    dist.all_reduce(torch.zeros(1), group=place.group)
            return None
        return _RUNNERS[kind](resp, tensors, outputs, place, extra)


def _wire(resp: dict, device: Any) -> Any:
    """The timeline's activity of the collective itself (``GLOO_ALLREDUCE``, ``NCCL_BCAST`` ...)."""
    return activity(resp["k"], resp["n"], transport(resp["k"], device))


def _stand_ins(resp: dict, place: Place) -> list[torch.Tensor]:
    """A joined rank's part: zeros of the agreed shapes (no rows for an allgather)."""
    meta, device = resp["m"], place.join_device
    shapes = resp["shapes"][place.index] if "shapes" in resp else meta["sh"]
    return [torch.zeros(s, dtype=_dtype(d), device=device) for s, d in zip(shapes, meta["dt"])]


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name.replace("torch.", ""))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def scale(t: torch.Tensor, factor: float) -> torch.Tensor:
    """Horovod's ScaleBuffer: ``factor * t`` in Horovod's arithmetic, element for element (see the module
    docstring): integers in float64, truncated; CPU fp16 as ``(float) factor * (float) x`` rounded to fp16
    (``ScaleBufferCPUImpl``, subnormals included); CUDA fp16 with the factor itself rounded to fp16 first
    (``ScaleBufferCudaImpl``); float32 with ``(float) factor``; float64 in float64."""
    if factor == 1.0:
        return t
    if not (t.is_floating_point() or t.is_complex()):
        return (t.double() * factor).to(t.dtype)
    if t.dtype in (torch.float16, torch.bfloat16) and t.device.type == "cpu":
        return (t.float() * factor).to(t.dtype)
    if t.dtype == torch.float16:  # CUDA: __float2half((float) factor), then an fp16 product
        return t * float(torch.tensor(factor, dtype=torch.float32).half())
    return t * factor  # a Python float multiplies a float32 tensor as (float) factor


def _allreduce(resp: dict, tensors: list, outputs: list | None, place: Place, _extra: dict) -> Any:
    meta = resp["m"]
    post = meta["post"] / place.size if meta["op"] == "average" else meta["post"]
    results = [None] * len(tensors)
    for dtype, idx in _by_dtype(tensors).items():
        flat = torch.cat([scale(tensors[i].detach().reshape(-1), meta["pre"]) for i in idx])
        wire = flat.to(_WIRE.get(dtype, dtype))
        if place.size > 1:
            with _wire(resp, wire.device):
                dist.all_reduce(wire, op=_REDUCE[meta["op"]], group=place.group)
        flat = scale(wire.to(dtype), post)
        for i, part in zip(idx, flat.split([tensors[i].numel() for i in idx])):
            results[i] = _store(part.view(tensors[i].shape), outputs, i)
    return results[0] if meta.get("single") else results


def _store(value: torch.Tensor, outputs: list | None, i: int) -> torch.Tensor:
    if outputs is None:
        return value
    outputs[i].data.copy_(value)
    return outputs[i]


def _by_dtype(tensors: list) -> dict:
    groups: dict = {}
    for i, t in enumerate(tensors):
        groups.setdefault(t.dtype, []).append(i)
    return groups


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().contiguous()
    if not t.numel():
        return torch.empty(0, dtype=torch.uint8, device=t.device)
    return t.reshape(-1).view(torch.uint8)


def _from_bytes(b: torch.Tensor, dtype: torch.dtype, shape: list[int]) -> torch.Tensor:
    if math.prod(shape) == 0:
        return torch.empty(shape, dtype=dtype, device=b.device)
    if b.storage_offset() % _itemsize(dtype):  # after a tensor of a smaller type in the same buffer
        b = b.clone()
    return b.view(dtype).view(shape)


def _allgather(resp: dict, tensors: list, _outputs: Any, place: Place, extra: dict) -> Any:
    shapes = resp["shapes"]  # [set rank][tensor] -> shape
    dtypes = [t.dtype for t in tensors]
    sizes = [[math.prod(s) * _itemsize(d) for s, d in zip(rank_shapes, dtypes)] for rank_shapes in shapes]
    mine = torch.cat([_as_bytes(t) for t in tensors]) if tensors else torch.empty(0, dtype=torch.uint8)
    longest = max(sum(s) for s in sizes)
    parts = [mine]
    if place.size > 1:
        buf = torch.zeros(longest, dtype=torch.uint8, device=mine.device)
        buf[:mine.numel()] = mine
        parts = [torch.empty_like(buf) for _ in range(place.size)]
        with _wire(resp, buf.device):
            dist.all_gather(parts, buf, group=place.group)
    results = []
    for i, t in enumerate(tensors):
        pieces = []
        for r, part in enumerate(parts):
            start = sum(sizes[r][:i])
            pieces.append(_from_bytes(part[start:start + sizes[r][i]], t.dtype, shapes[r][i]))
        results.append(torch.cat(pieces))
    extra["rows"] = [[rank_shapes[i][0] for rank_shapes in shapes] for i in range(len(tensors))]
    return results[0] if resp["m"].get("single") else results


def _broadcast(resp: dict, tensors: list, outputs: list | None, place: Place, _extra: dict) -> Any:
    meta = resp["m"]
    root = meta["root"]
    if meta.get("obj"):  # only the root knows the length: the negotiation carried its shape
        root_shapes = resp["shapes"][place.ranks.index(root)]
    else:
        root_shapes = [list(t.shape) for t in tensors]
    if place.rank == root or place.size == 1:
        buf = torch.cat([_as_bytes(t) for t in tensors])
    else:
        total = sum(math.prod(s) * t.element_size() for s, t in zip(root_shapes, tensors))
        buf = torch.empty(total, dtype=torch.uint8, device=tensors[0].device)
    if place.size > 1:
        with _wire(resp, buf.device):
            dist.broadcast(buf, src=root, group=place.group)
    results, start = [], 0
    for i, (s, t) in enumerate(zip(root_shapes, tensors)):
        n = math.prod(s) * t.element_size()
        if place.rank == root:
            value = t.detach() if outputs is not None else t.detach().clone()
        else:
            value = _from_bytes(buf[start:start + n], t.dtype, s)
        if outputs is None or (place.rank == root and outputs[i] is t):
            results.append(value if outputs is None else t)
        else:
            results.append(_store(value, outputs, i))
        start += n
    return results[0] if meta.get("single") else results


def _alltoall(resp: dict, tensors: list, _outputs: Any, place: Place, extra: dict) -> Any:
    t = tensors[0]
    row = math.prod(t.shape[1:]) * t.element_size()
    send = resp["splits"][place.index]
    recv = [s[place.index] for s in resp["splits"]]
    src = _as_bytes(t)[:sum(send) * row]
    out = torch.empty(sum(recv) * row, dtype=torch.uint8, device=t.device)
    if place.size > 1:
        with _wire(resp, out.device):
            dist.all_to_all_single(out, src, [n * row for n in recv], [n * row for n in send],
                                   group=place.group)
    else:
        out.copy_(src)
    result = _from_bytes(out, t.dtype, [sum(recv), *t.shape[1:]])
    return result, torch.tensor(recv, dtype=torch.int32, device=extra.get("splits_device", "cpu"))


def reducescatter_rows(dim0: int, size: int) -> list[int]:
    """Horovod's split of dim 0: the first ``dim0 % size`` ranks get one row more."""
    return [dim0 // size + (1 if r < dim0 % size else 0) for r in range(size)]


def _reducescatter(resp: dict, tensors: list, _outputs: Any, place: Place, _extra: dict) -> Any:
    meta = resp["m"]
    post = meta["post"] / place.size if meta["op"] == "average" else meta["post"]
    results = [None] * len(tensors)
    for dtype, idx in _by_dtype(tensors).items():
        wire_dtype = _WIRE.get(dtype, dtype)
        chunks = [[] for _ in range(place.size)]  # per destination rank: its rows of every tensor
        for i in idx:
            t = scale(tensors[i].detach(), meta["pre"]).to(wire_dtype)
            for r, part in enumerate(t.split(reducescatter_rows(t.shape[0], place.size))):
                chunks[r].append(part.reshape(-1))
        inputs = [torch.cat(c) for c in chunks]
        out = torch.empty_like(inputs[place.index])
        if place.size > 1:
            with _wire(resp, out.device):
                dist.reduce_scatter(out, inputs, op=_REDUCE[meta["op"]], group=place.group)
        else:
            out.copy_(inputs[0])
        out = scale(out.to(dtype), post)
        start = 0
        for i in idx:
            shape = [reducescatter_rows(tensors[i].shape[0], place.size)[place.index], *tensors[i].shape[1:]]
            n = math.prod(shape)
            results[i] = out[start:start + n].view(shape)
            start += n
    return results[0] if meta.get("single") else results


_RUNNERS = {"ALLREDUCE": _allreduce, "ALLGATHER": _allgather, "BROADCAST": _broadcast, "ALLTOALL": _alltoall,
            "REDUCESCATTER": _reducescatter}
