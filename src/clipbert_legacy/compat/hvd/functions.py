"""``horovod.torch``'s helper functions: parameters, optimizer state, objects, ``DistributedOptimizer``.

Re-exported by ``clipbert_legacy.compat.hvd``. Deliberate differences from Horovod 0.28.1 (docs/horovod.md):

* ``broadcast_parameters`` also takes a generator (``model.named_parameters()``), not only a dict or list.
* ``broadcast_optimizer_state`` is Horovod's (its zero-gradient step on a fresh optimizer included) and
  takes one keyword of ours: ``zero_grad_step=False`` broadcasts the root's ``state_dict()`` without
  a step (the project's trainer uses it).
* ``DistributedOptimizer`` takes two arguments of ours: ``row_sparse`` and ``reduce_to`` (ZeRO stage 2).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Union

import torch

from clipbert_legacy.compat.hvd.api import Average
from clipbert_legacy.compat.hvd.compression import Compression, Compressor
from clipbert_legacy.compat.hvd.process_sets import ProcessSet, global_process_set
from clipbert_legacy.compat.hvd.state import backend_name, impl

# What broadcast_parameters accepts: a state_dict, named_parameters(), or a plain list of tensors.
Params = Union[Mapping[str, torch.Tensor], Iterable[tuple[str, torch.Tensor]], Iterable[torch.Tensor]]


def broadcast_parameters(params: Params, root_rank: int) -> None:
    """Broadcast a state_dict / named parameters / list of tensors in place from ``root_rank``.

    Dicts are processed in sorted key order (as Horovod), so every rank issues the same sequence.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, Iterable) and not torch.is_tensor(params):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    tensors = [(name, p.data if isinstance(p, torch.nn.Parameter) else p) for name, p in items
               if p is not None]
    if impl().size() > 1 or backend_name() == "horovod":
        impl().broadcast_parameters(tensors, root_rank)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    """List of every rank's (picklable) object, in rank order. No size limit."""
    if impl().size() == 1:
        return [obj]
    return impl().allgather_object(obj, name=name)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """Return the root rank's object on every rank of ``process_set``."""
    if impl().size() == 1:
        return obj
    return impl().broadcast_object(obj, root_rank, name=name, process_set=process_set)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None, *,
                              zero_grad_step: bool = True) -> None:
    """Make every rank's optimizer state (and hyper-parameters) equal to the root's.

    By default Horovod 0.28.1's function, numbers included: under horovodrun Horovod's own, under
    torchrun the same steps (``hvd.torch_backend.optimizer_state``): an optimizer with an empty state
    first takes one step with zero gradients (Adam's counter becomes 1, weight decay and momentum apply
    once; ``model`` marks sparse embeddings for SGD), then the state tensors and hyper-parameters are
    broadcast (nothing for a stateless optimizer).

    ``zero_grad_step=False`` (ours): no step; the root's ``state_dict()`` is loaded on every rank, a
    stateless optimizer's hyper-parameters included, and trainable parameters without a gradient get a
    zero one when the state was empty (what a script can observe of Horovod's step). The project's
    trainer uses it: restored weights are loaded before this call, and a step would move them.
    """
    if zero_grad_step:
        impl().broadcast_optimizer_state(optimizer, root_rank, model=model)
        return
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    if not optimizer.state:
        _zero_missing_grads(optimizer)
    if impl().size() == 1:
        return
    state = broadcast_object(_cpu_state_dict(optimizer) if impl().rank() == root_rank else None, root_rank,
                             name="broadcast_optimizer_state")
    optimizer.load_state_dict(state)  # casts state tensors to each param's device/dtype


def _zero_missing_grads(optimizer: torch.optim.Optimizer) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)


def _cpu_state_dict(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    sd = optimizer.state_dict()
    sd["state"] = {k: {n: (v.detach().cpu() if torch.is_tensor(v) else v) for n, v in s.items()}
                   for k, s in sd["state"].items()}
    return sd


def DistributedOptimizer(optimizer: torch.optim.Optimizer,
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: Compressor = Compression.none, backward_passes_per_step: int = 1,
                         op: str = Average, gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups: Any = None, sparse_as_dense: bool = False,
                         process_set: ProcessSet = global_process_set,
                         row_sparse: Iterable[torch.Tensor] = (),
                         reduce_to: Mapping[torch.Tensor, int] | None = None) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so gradients are averaged over ranks (Horovod's arguments and meaning).

    ``row_sparse`` (ours, not Horovod's): parameters, typically embedding tables, whose gradients are
    averaged in ``synchronize()`` over only the rows some rank touched (exact;
    clipbert_legacy.compat.hvd.row_sparse).
    ``reduce_to`` (ours; torch backend only): parameter -> rank; each such gradient is averaged onto
    that rank alone (``dist.reduce``) and set to None on the others after ``synchronize()`` (ZeRO
    stage 2, ``clipbert_legacy.training.zero``). Real Horovod has no reduce-to-one-rank in its optimizer
    hooks.
    """
    kwargs: dict[str, Any] = {}
    if reduce_to is not None:
        if backend_name() != "torch":
            raise ValueError("DistributedOptimizer(reduce_to=...) needs the torch.distributed backend: "
                             "launch with torchrun and dist_backend=torch")
        kwargs["reduce_to"] = reduce_to
    if backward_passes_per_step <= 0:
        raise ValueError(f"backward_passes_per_step must be > 0, got {backward_passes_per_step}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    return impl().DistributedOptimizer(
        optimizer, named_parameters=named_parameters, compression=compression,
        backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
        sparse_as_dense=sparse_as_dense, process_set=process_set, row_sparse=tuple(row_sparse), **kwargs)
