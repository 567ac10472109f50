"""O1: apex's cast lists installed process-wide while amp is initialized at O1, and the user registry.

``activate()`` (called by ``initialize`` at O1) replaces, in ``torch.nn.functional``, ``torch`` and
``torch.Tensor``, every listed function by a wrapper: fp16 list -> fp32 arguments become fp16 (casts of
fp32 Parameters cached until the ``scale_loss`` exit), fp32 list -> fp16 arguments become fp32, promote
lists -> fp32 when fp16 and fp32 tensors meet; in-place variants of fp32-list functions refuse fp16
tensors, other in-place methods take ``self``'s dtype, ``F.binary_cross_entropy`` refuses fp16 input,
and the RNN functions run in fp16. Functions registered with ``register_half_function`` /
``register_float_function`` / ``register_promote_function`` are wrapped first, so their rule wins over
a list's. ``deactivate()`` (every later ``initialize``, and resetting ``amp._amp_state``) restores the
original functions.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from clipbert_legacy.compat.amp import _cast_lists as lists
from clipbert_legacy.compat.amp._casts import (
    CastHandle,
    cast_wrapper,
    err_if_any_half_wrapper,
    err_if_arg0_half_wrapper,
    match_arg0_wrapper,
    promote_wrapper,
    sequence_promote_wrapper,
    to_float,
    to_half,
)
from clipbert_legacy.compat.amp._state import _amp_state

# (module, name) -> "half" | "float"; (module, name) -> None (an ordered set). Kept across initialize
# calls: apex's registrations stayed in force once applied (its patches were never removed).
_USER_CASTS: dict[tuple[Any, str], str] = {}
_USER_PROMOTES: dict[tuple[Any, str], None] = {}


def _check_has(module: Any, name: str) -> None:
    if not hasattr(module, name):
        raise ValueError(f"No function named {name} in module {module}.")


def register_half_function(module: Any, name: str) -> None:
    """Run ``module.name`` in fp16 under O1 (call before ``amp.initialize``)."""
    _check_has(module, name)
    _USER_CASTS[(module, name)] = "half"


def register_float_function(module: Any, name: str) -> None:
    """Run ``module.name`` in fp32 under O1, e.g. ``amp.register_float_function(torch, 'sigmoid')``."""
    _check_has(module, name)
    _USER_CASTS[(module, name)] = "float"


def register_promote_function(module: Any, name: str) -> None:
    """Cast fp16 arguments of ``module.name`` to fp32 under O1 when fp16 and fp32 tensors meet."""
    _check_has(module, name)
    _USER_PROMOTES[(module, name)] = None


def half_function(fn: Callable) -> Callable:
    """Decorator: under O1 the function's floating arguments are cast to fp16 (else unchanged)."""
    return cast_wrapper(fn, to_half, try_caching=True)


def float_function(fn: Callable) -> Callable:
    """Decorator: under O1 the function's floating arguments are cast to fp32 (else unchanged)."""
    return cast_wrapper(fn, to_float)


def promote_function(fn: Callable) -> Callable:
    """Decorator: under O1 fp16 arguments become fp32 when fp16 and fp32 tensors meet."""
    return promote_wrapper(fn)


# ------------------------------------------------------------------------------------ install
def _patch_all(h: CastHandle, owner: Any, names, make: Callable[[Callable, str], Callable]) -> None:
    for name in names:
        if hasattr(owner, name):
            h.patch(owner, name, make(getattr(owner, name), name))


def _tensor_names(own, torch_names):
    return tuple(own) + tuple(n for n in torch_names if hasattr(torch.Tensor, n))


def _install_user_registry(h: CastHandle) -> None:
    for (module, name), kind in _USER_CASTS.items():
        cast, cache = (to_half, True) if kind == "half" else (to_float, False)
        h.patch(module, name, cast_wrapper(getattr(module, name), cast, cache))
    for module, name in _USER_PROMOTES:
        h.patch(module, name, promote_wrapper(getattr(module, name)))


def _install_lists(h: CastHandle) -> None:
    half = lambda fn, _: cast_wrapper(fn, to_half, try_caching=True)  # noqa: E731
    flt = lambda fn, _: cast_wrapper(fn, to_float)  # noqa: E731
    tensor_fp16 = _tensor_names(lists.TENSOR_FP16, lists.TORCH_FP16)
    tensor_fp32 = _tensor_names(lists.TENSOR_FP32, lists.TORCH_FP32)
    for owner, fp16, fp32 in ((F, lists.F_FP16, lists.F_FP32),
                              (torch, lists.TORCH_FP16, lists.TORCH_FP32),
                              (torch.Tensor, tensor_fp16, tensor_fp32)):
        _patch_all(h, owner, fp16, half)
        _patch_all(h, owner, fp32, flt)
    promote = lambda fn, _: promote_wrapper(fn)  # noqa: E731
    _patch_all(h, torch, lists.TORCH_PROMOTE, promote)
    _patch_all(h, torch, lists.TORCH_SEQUENCE_PROMOTE, lambda fn, _: sequence_promote_wrapper(fn))
    _patch_all(h, torch.Tensor, _tensor_names(lists.TENSOR_PROMOTE, lists.TORCH_PROMOTE), promote)


def _install_inplace_rules(h: CastHandle) -> None:
    tensor_fp32 = _tensor_names(lists.TENSOR_FP32, lists.TORCH_FP32)
    _patch_all(h, torch, [n + "_" for n in lists.TORCH_FP32],
               lambda fn, n: err_if_any_half_wrapper(fn, f"Cannot call in-place function {n} with fp16 "
                                                         "arguments."))
    _patch_all(h, torch.Tensor, [n + "_" for n in tensor_fp32], err_if_arg0_half_wrapper)
    matched = [n + "_" for n in _tensor_names(lists.TENSOR_FP16, lists.TORCH_FP16)
               + _tensor_names(lists.TENSOR_PROMOTE, lists.TORCH_PROMOTE)]
    _patch_all(h, torch.Tensor, matched + list(lists.TENSOR_INPLACE_OPERATORS),
               lambda fn, _: match_arg0_wrapper(fn))
    for name, message in lists.F_BANNED.items():
        _patch_all(h, F, [name], lambda fn, _, m=message: err_if_any_half_wrapper(fn, m))


class _RNNFunctions:
    """Stands in for ``torch._VF`` inside ``torch.nn.modules.rnn``: the RNN functions run in fp16 (inputs,
    hidden states and weights cast), everything else is the real ``_VF``."""

    def __init__(self, real: Any) -> None:
        self._real = real
        for name in lists.RNN_FUNCTIONS:
            if hasattr(real, name):
                setattr(self, name, cast_wrapper(getattr(real, name), to_half, try_caching=True))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def activate() -> CastHandle:
    """Install O1's patches (the registry first, then the lists) and make them the active handle."""
    deactivate()
    h = CastHandle()
    _amp_state.handle = h
    _install_user_registry(h)
    _install_lists(h)
    _install_inplace_rules(h)
    rnn = torch.nn.modules.rnn
    h.patch(rnn, "_VF", _RNNFunctions(rnn._VF))
    return h


def deactivate() -> None:
    """Restore every function O1 replaced (no-op when O1 is not active)."""
    h = _amp_state.handle
    if h is not None:
        h.uninstall()
        _amp_state.handle = None


def clear_cache() -> None:
    """Drop the cached fp16 weight casts (every ``scale_loss`` exit, as apex)."""
    if _amp_state.handle is not None:
        _amp_state.handle.cache.clear()
