"""O1's casts: the cast handle (on/off switch, cache of fp16 weight casts, record of patched functions)
and the wrappers that O1 puts around torch functions (apex's ``wrap.py`` rules).

Only fp16 <-> fp32 conversions happen: a "half" cast turns fp32 tensors into fp16 and a "float" cast
turns fp16 tensors into fp32; float64, bfloat16 and non-floating tensors pass unchanged (apex also
cast float64 down, see the package docstring). Tensors are cast on whatever device they live on.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from clipbert_legacy.compat.amp._state import _amp_state

_MISSING = object()


class CastHandle:
    """The switch the O1 wrappers consult, the cache of fp16 casts of fp32 Parameters (cleared at every
    ``scale_loss`` exit, as apex did) and the functions O1 replaced (restored by :meth:`uninstall`)."""

    def __init__(self) -> None:
        self.active = True
        self.cache: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = {}
        self.patched: list[tuple[Any, str, Any]] = []

    def patch(self, owner: Any, name: str, new: Any) -> None:
        self.patched.append((owner, name, vars(owner).get(name, _MISSING)))
        setattr(owner, name, new)

    def uninstall(self) -> None:
        """Put every patched function back (in reverse order, so stacked patches unwind)."""
        for owner, name, previous in reversed(self.patched):
            if previous is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, previous)
        self.patched = []
        self.cache.clear()
        self.active = False


def active_handle() -> CastHandle | None:
    h = _amp_state.handle
    return h if h is not None and h.active else None


@contextlib.contextmanager
def disable_casts() -> Iterator[None]:
    """apex's ``amp.disable_casts()``: inside the block O1's wrappers call the original functions.
    Without O1 (apex: AttributeError) it is an empty block."""
    h = _amp_state.handle
    if h is None:
        yield
        return
    previous, h.active = h.active, False
    try:
        yield
    finally:
        h.active = previous


# ------------------------------------------------------------------------------------ casting
def _nested(x: Any) -> bool:
    return isinstance(x, (list, tuple))


def is_fp(x: Any) -> bool:
    """A floating tensor, or a list/tuple made only of floating tensors (apex's is_fp_tensor)."""
    if _nested(x):
        return all(is_fp(y) for y in x)
    return isinstance(x, torch.Tensor) and x.is_floating_point()


def _rebuild(x, items):
    return type(x)(*items) if hasattr(x, "_fields") else type(x)(items)


def to_half(x: Any) -> Any:
    if _nested(x):
        return _rebuild(x, [to_half(y) for y in x])
    return x.half() if x.dtype == torch.float32 else x


def to_float(x: Any) -> Any:
    if _nested(x):
        return _rebuild(x, [to_float(y) for y in x])
    return x.float() if x.dtype == torch.float16 else x


def _cached(handle: CastHandle, x: torch.Tensor, cast: Callable) -> torch.Tensor:
    """``cast(x)``, reused while ``x`` (an fp32 Parameter) is unchanged: apex cached weight casts until
    the ``scale_loss`` exit; the version check also drops a cast once the weight was written."""
    if not (isinstance(x, torch.nn.Parameter) and x.dtype == torch.float32):
        return cast(x)
    entry = handle.cache.get(id(x))
    if entry is not None:
        param, version, y = entry
        stale = torch.is_grad_enabled() and x.requires_grad != y.requires_grad  # apex's rule
        if param is x and version == x._version and not stale:
            return y
    y = cast(x)
    handle.cache[id(x)] = (x, x._version, y)
    return y


def _cast_value(handle, x, cast, try_caching):
    if not is_fp(x):
        return x
    if _nested(x):
        return _rebuild(x, [_cast_value(handle, y, cast, try_caching) for y in x])
    return _cached(handle, x, cast) if try_caching else cast(x)


def _cast_all(handle, cast, args, kwargs, try_caching=False):
    new_args = [_cast_value(handle, a, cast, try_caching) for a in args]
    new_kwargs = {k: _cast_value(handle, v, cast, try_caching) for k, v in kwargs.items()}
    return new_args, new_kwargs


def _dtypes(values, out: set) -> set:
    for x in values:
        if _nested(x):
            _dtypes(x, out)
        elif isinstance(x, torch.Tensor) and x.is_floating_point():
            out.add(x.dtype)
    return out


def _mixed(*values) -> bool:
    """fp16 and fp32 tensors meet (what apex's promote lists cast to fp32)."""
    found = _dtypes(values, set())
    return torch.float16 in found and torch.float32 in found


# ----------------------------------------------------------------------------------- wrappers
def cast_wrapper(orig: Callable, cast: Callable, try_caching: bool = False) -> Callable:
    """Whitelist/blacklist function: every floating argument cast by ``cast`` first."""
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        h = active_handle()
        if h is None:
            return orig(*args, **kwargs)
        args, kwargs = _cast_all(h, cast, args, kwargs, try_caching)
        return orig(*args, **kwargs)
    return wrapper


def promote_wrapper(orig: Callable) -> Callable:
    """Promote list: when fp16 and fp32 tensors meet, the fp16 ones become fp32."""
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        h = active_handle()
        if h is None or not _mixed(args, tuple(kwargs.values())):
            return orig(*args, **kwargs)
        args, kwargs = _cast_all(h, to_float, args, kwargs)
        return orig(*args, **kwargs)
    return wrapper


def sequence_promote_wrapper(orig: Callable) -> Callable:
    """``torch.cat`` / ``torch.stack``: the promote rule over the tensors of the sequence argument."""
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        h = active_handle()
        seq = args[0] if args else kwargs.get("tensors")
        if h is None or not _nested(seq) or not _mixed(seq):
            return orig(*args, **kwargs)
        cast = [to_float(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in seq]
        if args:
            return orig(cast, *args[1:], **kwargs)
        return orig(**{**kwargs, "tensors": cast})
    return wrapper


def match_arg0_wrapper(orig: Callable) -> Callable:
    """In-place method: the other floating arguments take the dtype of ``self`` (fp16 or fp32)."""
    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        h = active_handle()
        dtype = self.dtype if isinstance(self, torch.Tensor) else None
        if h is None or dtype not in (torch.float16, torch.float32):
            return orig(self, *args, **kwargs)
        args, kwargs = _cast_all(h, to_half if dtype == torch.float16 else to_float, args, kwargs)
        return orig(self, *args, **kwargs)
    return wrapper


def err_if_any_half_wrapper(orig: Callable, message: str) -> Callable:
    """Banned function / in-place blacklist function: NotImplementedError on any fp16 argument (apex
    raised this even inside ``disable_casts()``)."""
    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        if _amp_state.handle is not None and torch.float16 in _dtypes((args, tuple(kwargs.values())), set()):
            raise NotImplementedError(message)
        return orig(*args, **kwargs)
    return wrapper


def err_if_arg0_half_wrapper(orig: Callable, name: str) -> Callable:
    """In-place blacklist method: NotImplementedError on an fp16 ``self``, else fp32 arguments."""
    @functools.wraps(orig)
    def wrapper(self, *args, **kwargs):
        if _amp_state.handle is not None and isinstance(self, torch.Tensor) and self.dtype == torch.float16:
            raise NotImplementedError(f"Cannot call in-place method {name} on fp16 Tensors.")
        h = active_handle()
        if h is not None:
            args, kwargs = _cast_all(h, to_float, args, kwargs)
        return orig(self, *args, **kwargs)
    return wrapper
