"""torch backend: ``broadcast_optimizer_state`` as Horovod 0.28.1 does it (``horovod/torch/functions.py``).

So a script ported from Horovod gets Horovod's numbers under torchrun too:

* an optimizer whose state is empty first takes one step with zero gradients: every trainable
  parameter's ``.grad`` is replaced by zeros (sparse for ``SparseAdam``, and for ``SGD`` over the sparse
  embeddings of ``model``) and left there; a ``DistributedOptimizer`` steps its wrapped optimizer without
  reducing. Adam's step counter becomes 1; weight decay and momentum apply once;
* a state still empty after that step (a stateless optimizer: plain SGD) ends the call: nothing is
  broadcast, not even the hyper-parameters;
* otherwise every state tensor is broadcast in place (named ``<state key>.<occurrence>``), and the
  hyper-parameters of each param group and the non-tensor state values travel as one object.

The cleaner variant (the root's ``state_dict()`` loaded everywhere, no step) is the front's
``zero_grad_step=False`` (``hvd.functions``).
"""
from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import torch

from clipbert_legacy.compat.hvd.torch_backend.objects import broadcast_object, broadcast_parameters
from clipbert_legacy.compat.hvd.torch_backend.state import STATE

# The classes DistributedOptimizer makes: stepping them would reduce gradients (a collective), so the
# zero step calls the wrapped optimizer's step, as Horovod's function does for its own class.
_DISTRIBUTED_MODULES = ("clipbert_legacy.compat.hvd.torch_backend.optimizer", "horovod.torch.optimizer")


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int, model: Any = None) -> None:
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _zero_step(optimizer, _sparse_param_ids(model))
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:  # stateless: Horovod broadcasts nothing
        return
    tensors, scalars, assign = _split_state(optimizer, state_dict)
    if STATE.process.get("size", 1) > 1:
        broadcast_parameters(tensors, root_rank)
        scalars = broadcast_object(scalars, root_rank, name="broadcast_optimizer_state.scalars")
    for key, value in scalars.items():
        assign[key](value)


def _sparse_param_ids(model: Any) -> set[int]:
    if not model:
        return set()
    return {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding) and m.sparse
            for p in m.parameters()}


def _zero_step(optimizer: torch.optim.Optimizer, sparse_ids: set[int]) -> None:
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam) or (
                        isinstance(optimizer, torch.optim.SGD) and id(p) in sparse_ids):
                    p.grad = p.grad.to_sparse()
    if type(optimizer).__module__ in _DISTRIBUTED_MODULES:
        super(optimizer.__class__, optimizer).step()
    else:
        optimizer.step()


def _split_state(optimizer: torch.optim.Optimizer, state_dict: dict) -> tuple[list, dict, dict]:
    """(named state tensors, non-tensor values by key, key -> how to store the root's value). The state
    dicts of ``state_dict()`` are the optimizer's own, so in-place broadcasts and the assignments reach it."""
    tensors: list[tuple[str, torch.Tensor]] = []
    scalars: dict[str, Any] = {}
    assign: dict[str, Callable[[Any], None]] = {}
    occurrences: collections.Counter = collections.Counter()
    for index, group in enumerate(state_dict["param_groups"]):
        for option, value in group.items():
            if option != "params":
                key = f"{option}.{index}"
                scalars[key] = value
                assign[key] = _setter(optimizer.param_groups[index], option)
        for pid in group["params"]:
            if pid not in state_dict["state"]:  # no gradient (requires_grad False): nothing to send
                continue
            param_state = state_dict["state"][pid]
            for name, value in param_state.items():
                occurrences[name] += 1
                key = f"{name}.{occurrences[name]}"
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    scalars[key] = value
                    assign[key] = _setter(param_state, name)
    return tensors, scalars, assign


def _setter(target: dict, key: str) -> Callable[[Any], None]:
    def set_value(value: Any) -> None:
        target[key] = value
    return set_value
