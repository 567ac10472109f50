"""Checked stand-ins for the numpy globals a pickled file of weights names
(``clipbert_legacy.utils.safe_load``).

numpy's own unpickling trusts its input: ``dtype.__setstate__`` accepts any fields and flags (a float32
dtype can be told it holds Python objects, after which array bytes are read as object pointers), and
``_reconstruct`` allocates whatever shape it is given. The stand-ins below accept what ``pickle.dumps``
of a numeric or string array writes and nothing more, and build the array from the bytes the file holds
(so its size is bounded by the file's):

* :class:`DTypeSpec` (``numpy.dtype``): a dtype of kind b/i/u/f/c/S/U, no fields, no sub-array;
* :func:`reconstruct` (``numpy.core.multiarray._reconstruct``) -> an empty :class:`ArraySpec`, which
  ``__setstate__`` (pickle's BUILD) fills from ``(version, shape, dtype, fortran, bytes)``;
* :func:`scalar` (``numpy.core.multiarray.scalar``) and :func:`frombuffer`
  (``numpy.core.numeric._frombuffer``, protocol 5).

:func:`resolve` then replaces every spec in the loaded object by the ndarray / dtype it stands for.
"""
from __future__ import annotations

import math
from pickle import UnpicklingError

import numpy as np

_KINDS = "biufcSU"  # bool, int, uint, float, complex, bytes, str: no object, void, datetime
_ENDIAN = ("<", ">", "|", "=")


def _checked_dtype(spec) -> np.dtype:
    if isinstance(spec, bytes):
        spec = spec.decode("latin1")
    if not isinstance(spec, str) or len(spec) > 16:
        raise UnpicklingError(f"numpy dtype {str(spec)[:40]!r} is not a plain dtype name")
    try:
        dt = np.dtype(spec)
    except (TypeError, ValueError, SyntaxError) as e:
        raise UnpicklingError(f"numpy dtype {spec!r}: {e}") from e
    if dt.kind not in _KINDS or dt.hasobject or dt.fields is not None or dt.subdtype is not None:
        raise UnpicklingError(f"numpy dtype {spec!r} is not a number or string dtype")
    return dt


class DTypeSpec:
    """``numpy.dtype(spec, align, copy)`` as pickled; :meth:`__setstate__` checks numpy's state tuple
    (byte order and item size only: no fields, sub-array or flags)."""

    def __init__(self, spec, _align=False, _copy=True):  # a fresh dtype is made either way
        self.dtype = _checked_dtype(spec)

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) not in (8, 9) or state[2:5] != (None, None, None):
            raise UnpicklingError("numpy dtype state with fields or a sub-array")
        endian, elsize = state[1], state[5]
        if endian not in _ENDIAN or elsize not in (-1, self.dtype.itemsize):
            raise UnpicklingError(f"numpy dtype state: byte order {endian!r}, item size {elsize!r}")
        if endian in ("<", ">"):
            self.dtype = self.dtype.newbyteorder(endian)


def _dtype(spec) -> np.dtype:
    if not isinstance(spec, DTypeSpec):
        raise UnpicklingError(f"an array's dtype is a {type(spec).__name__}, not a numpy dtype")
    return spec.dtype


def _shape(shape) -> tuple[int, ...]:
    if not isinstance(shape, tuple) or len(shape) > 32 or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
        raise UnpicklingError(f"array shape {str(shape)[:60]} is not a tuple of sizes")
    return shape


def _buffer(raw) -> bytes | bytearray | memoryview:
    if isinstance(raw, str):  # Python 2 pickles, read as latin-1 text (numpy does the same)
        return raw.encode("latin1")
    if isinstance(raw, (bytes, bytearray)):
        return raw
    if isinstance(raw, memoryview):
        return raw.cast("B")
    raise UnpicklingError(f"array data is a {type(raw).__name__}, not bytes (object arrays are not loaded)")


def _array(raw, dt: np.dtype, shape, order: str = "C") -> np.ndarray:
    shape, buf = _shape(shape), _buffer(raw)
    n = math.prod(shape)
    if n * dt.itemsize != len(buf):
        raise UnpicklingError(f"array of shape {shape} and dtype {dt} needs {n * dt.itemsize} bytes, the "
                              f"file holds {len(buf)}")
    return np.frombuffer(buf, dtype=dt, count=n).reshape(shape, order=order).copy(order="K")


class ArraySpec:
    """An ndarray being unpickled: :func:`reconstruct` makes it empty, pickle's BUILD calls
    :meth:`__setstate__` with numpy's ``(version, shape, dtype, is_fortran, data)``."""

    array: np.ndarray | None = None

    def __setstate__(self, state):
        if not isinstance(state, tuple) or len(state) not in (4, 5):
            raise UnpicklingError("numpy array state is not (version, shape, dtype, fortran, data)")
        shape, dtype, fortran, raw = state[-4:]
        self.array = _array(raw, _dtype(dtype), shape, order="F" if fortran else "C")


def reconstruct(subtype, shape, typecode):
    """``numpy.core.multiarray._reconstruct(ndarray, (0,), b'b')``, the only call numpy pickles write."""
    if subtype is not ArraySpec or shape != (0,) or typecode not in (b"b", "b"):
        call = (getattr(subtype, "__name__", subtype), shape, typecode)
        raise UnpicklingError(f"numpy _reconstruct{call!s:.80} is not a plain ndarray")
    return ArraySpec()


def scalar(dtype, raw=None):
    """``numpy.core.multiarray.scalar(dtype, data)``: one number or string from its bytes."""
    return _array(raw, _dtype(dtype), ())[()]


def frombuffer(buf, dtype, shape, order):
    """``numpy.core.numeric._frombuffer`` (pickle protocol 5 writes arrays with it)."""
    if order not in ("C", "F"):
        raise UnpicklingError(f"array order {order!r}")
    return _array(buf, _dtype(dtype), shape, order=order)


def resolve(obj, _memo=None):
    """``obj`` with every :class:`ArraySpec` / :class:`DTypeSpec` in its dicts, lists and tuples replaced
    by the ndarray / dtype it stands for (dicts and lists changed in place, so their type and attributes
    stay); an array never filled is a ValueError. Each object is resolved once (``_memo``, by id): a
    structure that shares its parts (pickle's memo makes ``t = (t, t)`` 40 levels deep in 237 bytes) costs
    its distinct objects, not its 2**40 paths, and keeps its sharing."""
    memo = {} if _memo is None else _memo
    if id(obj) in memo:
        return memo[id(obj)]
    if isinstance(obj, ArraySpec):
        if obj.array is None:
            raise ValueError("a numpy array without data")
        out = obj.array
    elif isinstance(obj, DTypeSpec):
        out = obj.dtype
    elif isinstance(obj, (dict, list)):
        memo[id(obj)] = obj  # before its items: a list that holds itself ends here
        for k, v in list(obj.items() if isinstance(obj, dict) else enumerate(obj)):
            obj[k] = resolve(v, memo)
        out = obj
    elif isinstance(obj, tuple):
        items = [resolve(v, memo) for v in obj]
        out = tuple(items) if any(a is not b for a, b in zip(items, obj)) else obj
    else:
        return obj
    memo[id(obj)] = out
    return out
