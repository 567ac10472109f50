"""Reading pickled files (``torch.save`` checkpoints, detectron2 ``.pkl`` weights) without running code
from them and in memory bounded by their size.

Unpickling calls whatever function a file names (``os.system`` ...), so a checkpoint is only as safe as
the loader. Every pickled file the project reads goes through this module:

* :func:`torch_load`: ``torch.load(..., weights_only=True)``: tensors, numbers, strings and plain
  containers. ``weights_only`` is given explicitly, and torch lets ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``
  override only a call that leaves it unset (torch/serialization.py), so the environment cannot turn
  it off. A zip archive with compressed records is refused: torch writes them stored, and inflates a
  deflated record in memory (a 5 KB file can claim gigabytes). ``numpy_arrays=True`` (restore files
  written before the RNG states were plain values) admits numpy arrays and scalars as well, rebuilt by
  :mod:`clipbert_legacy.utils.safe_numpy` (never numpy's own unpickling code).
* :func:`load_pickle_weights`: detectron2 / grid-feat / Detectron ``.pkl`` weights: numpy arrays,
  dtypes, scalars and plain containers (the globals of :data:`PICKLE_GLOBALS`), nothing else; a file
  over :data:`MAX_PICKLE_BYTES` is refused before it is read.

A refusal is one :class:`UnsafeFileError` line naming the file and what it asked for.
"""
from __future__ import annotations

import collections
import os
import pickle
import re
import zipfile

import torch

from clipbert_legacy.utils import safe_numpy
from clipbert_legacy.utils.errors import CheckpointError, UnsafeFileError

__all__ = ["torch_load", "load_pickle_weights", "check_torch_archive", "MAX_PICKLE_BYTES", "PICKLE_GLOBALS"]

MAX_PICKLE_BYTES = 4 * 2 ** 30
"""A ``.pkl`` is read whole into memory (about twice its size at the peak). The weights of the models this
project builds (ResNet-50 grid features, BERT-base) are a few hundred MB: 4 GB leaves a wide margin and
keeps a planted file from taking the machine's memory."""


def _latin1(text, encoding="latin1", errors="strict"):
    """``_codecs.encode`` as Python 3 pickles (protocol 2) use it for ``bytes``: latin-1 only."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1") or errors != "strict":
        raise pickle.UnpicklingError(f"_codecs.encode({type(text).__name__}, {encoding!r}) is not a bytes "
                                     f"literal")
    return text.encode("latin1")


def _empty_bytes(*args):
    """``bytes()`` as protocols 0-2 write an empty ``bytes`` (``bytes(n)`` would allocate n zeros)."""
    if args:
        raise pickle.UnpicklingError(f"bytes{args!s:.40} is not an empty bytes literal")
    return b""


PICKLE_GLOBALS = {
    **{(f"numpy.{core}.multiarray", "_reconstruct"): safe_numpy.reconstruct for core in ("core", "_core")},
    **{(f"numpy.{core}.multiarray", "scalar"): safe_numpy.scalar for core in ("core", "_core")},
    **{(f"numpy.{core}.numeric", "_frombuffer"): safe_numpy.frombuffer for core in ("core", "_core")},
    ("numpy", "ndarray"): safe_numpy.ArraySpec,
    ("numpy", "dtype"): safe_numpy.DTypeSpec,
    ("_codecs", "encode"): _latin1,
    **{(builtins, "bytes"): _empty_bytes for builtins in ("builtins", "__builtin__")},
    ("collections", "OrderedDict"): collections.OrderedDict,
}
"""The globals a ``.pkl`` of weights may name (numpy 1.x writes ``numpy.core``, 2.x ``numpy._core``), each
mapped to a checked stand-in: arrays and scalars of numbers and strings, built from the bytes in the file."""


def _refusal(path: str, what: str, fix: str) -> UnsafeFileError:
    return UnsafeFileError(f"{path} was refused: it asks for {what}, which a file of weights or training "
                           f"state never needs (loading it could run code); {fix}")


class _WeightsUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only :data:`PICKLE_GLOBALS`."""

    def __init__(self, f, path: str, fix: str):
        super().__init__(f, encoding="latin1")  # Python 2 pickles (Detectron, Caffe2) hold latin-1 str
        self.path, self.fix = path, fix

    def find_class(self, module, name):
        found = PICKLE_GLOBALS.get((module, name))
        if found is None:
            raise _refusal(self.path, f"the global {module}.{name}", self.fix)
        return found

    def persistent_load(self, pid):
        raise _refusal(self.path, f"a persistent object ({str(pid)[:60]})", self.fix)


def load_pickle_weights(path: str, fix: str = "use the file as its publisher released it, or convert it "
                                              "to .safetensors / a torch.save'd state dict"):
    """The object pickled in ``path`` (a detectron2-style ``{"model": {name: ndarray}, ...}``), numpy
    arrays in it as ndarrays. Refuses (one :class:`UnsafeFileError` line) any other global and a file
    over :data:`MAX_PICKLE_BYTES`; a corrupt file is a :class:`CheckpointError`."""
    size = os.path.getsize(path)
    if size > MAX_PICKLE_BYTES:
        raise UnsafeFileError(f"{path} is {size / 2 ** 30:.1f} GB, more than a .pkl of weights may be "
                              f"({MAX_PICKLE_BYTES // 2 ** 30} GB: it is read whole into memory); convert it "
                              f"to .safetensors or a torch.save'd state dict")
    with open(path, "rb") as f:
        try:
            obj = _WeightsUnpickler(f, path, fix).load()
        except UnsafeFileError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
                KeyError, MemoryError, UnicodeError) as e:
            raise CheckpointError(f"{path} is not a readable pickle of weights ({type(e).__name__}: "
                                  f"{str(e)[:200]}); it may be truncated or not a .pkl of weights") from e
    return _resolved(obj, path)


def _resolved(obj, path: str):
    try:
        return safe_numpy.resolve(obj)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path} is not a readable pickle of weights ({str(e)[:200]})") from e


# ------------------------------------------------------------------------------------------ torch.load
_TORCH_NUMPY = [(v, f"{m}.{n}") for (m, n), v in PICKLE_GLOBALS.items() if m.startswith("numpy")]


def check_torch_archive(path: str) -> None:
    """A torch zip archive whose records are all stored uncompressed, as ``torch.save`` writes them (a
    legacy, non-zip save passes). Refuses a compressed record: torch would inflate it in memory."""
    if not zipfile.is_zipfile(path):
        return
    try:
        with zipfile.ZipFile(path) as z:
            packed = [i.filename for i in z.infolist() if i.compress_type != zipfile.ZIP_STORED]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # torch.load reports the damage
    if packed:
        raise UnsafeFileError(f"{path} was refused: its record {packed[0]} is compressed, which torch.save "
                              f"never writes (torch would inflate it in memory, without a bound); re-save it "
                              f"with torch.save")


_GLOBAL_IN_MESSAGE = re.compile(r"GLOBAL ([\w.]+)")


def _refused_globals(path: str, allowed: set[str], message: str) -> list[str]:
    """The globals of ``path`` that weights-only loading refuses, by full name (torch's message drops
    ``builtins.``); from its message where the file cannot be scanned (a legacy, non-zip save)."""
    try:
        names = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except Exception:  # not a zip archive, or damaged: torch's message has the name
        names = _GLOBAL_IN_MESSAGE.findall(message)
    return [n for n in names if n not in allowed]


def torch_load(path: str, fix: str, numpy_arrays: bool = False):
    """``torch.load(path, map_location="cpu", weights_only=True)`` (see the module docstring). A file that
    names anything else is one :class:`UnsafeFileError` line naming ``path``, the refused globals and
    ``fix``; other failures (truncated, not a checkpoint) propagate as torch raises them."""
    check_torch_archive(path)
    allowed = _TORCH_NUMPY if numpy_arrays else []
    try:
        with torch.serialization.safe_globals(allowed):
            obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        refused = _refused_globals(path, {name for _, name in allowed}, str(e))
        if refused:
            raise _refusal(path, f"the global {', '.join(refused[:3])}", fix) from e
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "WeightsUnpickler error" in ln), lines[-1] if lines else "")
        raise _refusal(path, f"something beyond tensors and plain values ({detail[:200]})", fix) from e
    return _resolved(obj, path) if numpy_arrays else obj
