"""The collective operations of ``horovod.torch`` (0.28.1 signatures), forwarded to the chosen backend.

Re-exported by ``clipbert_legacy.compat.hvd``. Each function only resolves Horovod's deprecated ``average=``
argument and hands everything to the backend: ``hvd.horovod_backend`` passes it to Horovod itself,
``hvd.torch_backend`` implements it over ``torch.distributed``. Semantics (names, handles, gradients,
process sets) are Horovod's; see docs/horovod.md.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import torch

from clipbert_legacy.compat.hvd.compression import Compression, Compressor
from clipbert_legacy.compat.hvd.process_sets import ProcessSet, global_process_set
from clipbert_legacy.compat.hvd.state import impl

# Reduction ops (values are ours; each backend maps them to its own constants).
Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"
REDUCE_OPS = (Average, Sum, Adasum, Min, Max, Product)

Tensors = Sequence[torch.Tensor]


def resolve_op(op: str | None, average: bool | None) -> str:
    """Horovod's rule: ``op`` supersedes the deprecated ``average``; default Average."""
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    op = Average if op is None else op
    if op not in REDUCE_OPS:
        raise ValueError(f"unknown reduction op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or Product")
    return op


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Compressor = Compression.none, op: str | None = None, prescale_factor: float = 1.0,
              postscale_factor: float = 1.0, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce ``tensor`` over the ranks (input untouched); differentiable."""
    return impl().allreduce(tensor, name=name, compression=compression, op=resolve_op(op, average),
                            prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                            process_set=process_set)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce; returns a handle for ``poll``/``synchronize``."""
    return impl().allreduce_async(tensor, name=name, op=resolve_op(op, average),
                                  prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                  process_set=process_set)


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place allreduce."""
    return impl().allreduce_(tensor, name=name, op=resolve_op(op, average), prescale_factor=prescale_factor,
                             postscale_factor=postscale_factor, process_set=process_set)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place allreduce; returns a handle."""
    return impl().allreduce_async_(tensor, name=name, op=resolve_op(op, average),
                                   prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                   process_set=process_set)


def grouped_allreduce(tensors: Tensors, average: bool | None = None, name: str | None = None,
                      compression: Compressor = Compression.none, op: str | None = None,
                      prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allreduce a list of tensors as one operation; differentiable."""
    return impl().grouped_allreduce(list(tensors), name=name, compression=compression,
                                    op=resolve_op(op, average), prescale_factor=prescale_factor,
                                    postscale_factor=postscale_factor, process_set=process_set)


def grouped_allreduce_async(tensors: Tensors, average: bool | None = None, name: str | None = None,
                            op: str | None = None, prescale_factor: float = 1.0,
                            postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start a grouped allreduce; returns a handle."""
    return impl().grouped_allreduce_async(list(tensors), name=name, op=resolve_op(op, average),
                                          prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                          process_set=process_set)


def grouped_allreduce_(tensors: Tensors, average: bool | None = None, name: str | None = None,
                       op: str | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """In-place grouped allreduce."""
    return impl().grouped_allreduce_(list(tensors), name=name, op=resolve_op(op, average),
                                     prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                     process_set=process_set)


def grouped_allreduce_async_(tensors: Tensors, average: bool | None = None, name: str | None = None,
                             op: str | None = None, prescale_factor: float = 1.0,
                             postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place grouped allreduce; returns a handle."""
    return impl().grouped_allreduce_async_(list(tensors), name=name, op=resolve_op(op, average),
                                           prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                                           process_set=process_set)


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: str,
                           process_set: ProcessSet = global_process_set) -> Any:
    """Reduce a sparse tensor by allgathering its indices and values; returns a callable giving the result."""
    return impl().sparse_allreduce_async(tensor, name=name, op=op, process_set=process_set)


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0 (first dims may differ); differentiable."""
    return impl().allgather(tensor, name=name, process_set=process_set)


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather; returns a handle."""
    return impl().allgather_async(tensor, name=name, process_set=process_set)


def grouped_allgather(tensors: Tensors, name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Allgather a list of tensors as one operation; differentiable."""
    return impl().grouped_allgather(list(tensors), name=name, process_set=process_set)


def grouped_allgather_async(tensors: Tensors, name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start a grouped allgather; returns a handle."""
    return impl().grouped_allgather_async(list(tensors), name=name, process_set=process_set)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """The root rank's ``tensor`` on every rank (input untouched); differentiable."""
    return impl().broadcast(tensor, root_rank, name=name, process_set=process_set)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start a broadcast; returns a handle."""
    return impl().broadcast_async(tensor, root_rank, name=name, process_set=process_set)


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """In-place broadcast from ``root_rank``."""
    return impl().broadcast_(tensor, root_rank, name=name, process_set=process_set)


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place broadcast; returns a handle."""
    return impl().broadcast_async_(tensor, root_rank, name=name, process_set=process_set)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send ``splits[j]`` rows to rank j and receive theirs; with ``splits`` also the received splits."""
    return impl().alltoall(tensor, splits=splits, name=name, process_set=process_set)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; ``synchronize`` returns ``(output, received_splits)``."""
    return impl().alltoall_async(tensor, splits=splits, name=name, process_set=process_set)


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Compressor = Compression.none,
                  op: str = Average, process_set: ProcessSet = global_process_set,
                  prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce over the ranks, then give each rank its slice of dim 0; differentiable."""
    return impl().reducescatter(tensor, name=name, compression=compression, op=op, process_set=process_set,
                                prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: str = Average,
                        process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                        postscale_factor: float = 1.0) -> int:
    """Start a reducescatter; returns a handle."""
    return impl().reducescatter_async(tensor, name=name, op=op, process_set=process_set,
                                      prescale_factor=prescale_factor, postscale_factor=postscale_factor)


def grouped_reducescatter(tensors: Tensors, name: str | None = None,
                          compression: Compressor = Compression.none, op: str = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """Reducescatter a list of tensors as one operation; differentiable."""
    return impl().grouped_reducescatter(list(tensors), name=name, compression=compression, op=op,
                                        process_set=process_set, prescale_factor=prescale_factor,
                                        postscale_factor=postscale_factor)


def grouped_reducescatter_async(tensors: Tensors, name: str | None = None, op: str = Average,
                                process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a grouped reducescatter; returns a handle."""
    return impl().grouped_reducescatter_async(list(tensors), name=name, op=op, process_set=process_set,
                                              prescale_factor=prescale_factor,
                                              postscale_factor=postscale_factor)


def poll(handle: int) -> bool:
    """Whether the operation behind ``handle`` has finished (``synchronize`` will not block)."""
    return impl().poll(handle)


def synchronize(handle: int) -> Any:
    """Wait for ``handle``'s operation and return its output (``HorovodInternalError`` if it failed)."""
    return impl().synchronize(handle)


def join(device: int = -1) -> int:
    """This rank has no more data: until every rank joins, it contributes zeros to the others' allreduces.
    Returns the rank that joined last (the same on every rank)."""
    return impl().join(device)


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of ``process_set`` reaches the barrier."""
    impl().barrier(process_set=process_set)
