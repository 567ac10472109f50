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
  over :data:`MAX_PICKLE_BYTES` is refused before it is read. Python's pure unpickler runs it (its memo
  is a dict: the C unpickler grows its memo array to any index a ``LONG_BINPUT`` names, 32 GB for one
  opcode), with a budget of :data:`MAX_PICKLE_OPS` opcodes and BUILD only onto the numpy stand-ins.

Time and memory are bounded by the file, whatever its structure: only regular files are opened (a FIFO
or a device is refused without blocking: :mod:`clipbert_legacy.utils.safe_open`), a zip archive is parsed by
Python's ``zipfile`` first and given to torch only when every record is stored, the pickle record is at
most :data:`MAX_PICKLE_RECORD` and the central directory parses cleanly (torch's reader ignores fields
``zipfile`` refuses), and the loaded object is walked once (:func:`check_tree`): a structure that shares
its parts so that it unfolds to more than :data:`MAX_TREE_NODES` nodes, nests deeper than
:data:`MAX_TREE_DEPTH` or holds itself is refused before anything walks it path by path. SIGTERM ends a
process that is loading (:func:`clipbert_legacy.utils.safe_open.ends_on_sigterm`).

A refusal is one :class:`UnsafeFileError` line naming the file and what it asked for; a file that is
damaged (truncated, lying sizes, not a checkpoint) is one :class:`CheckpointError` line naming it.
"""
from __future__ import annotations

import collections
import os
import pickle
import re
import zipfile
from struct import error as struct_error
from typing import NoReturn

import torch

from clipbert_legacy.utils import safe_numpy
from clipbert_legacy.utils.errors import CheckpointError, UnsafeFileError, one_line
from clipbert_legacy.utils.safe_open import ends_on_sigterm, open_regular

__all__ = ["torch_load", "load_pickle_weights", "check_torch_archive", "check_tree", "MAX_PICKLE_BYTES",
           "PICKLE_GLOBALS", "MAX_TREE_NODES", "MAX_TREE_DEPTH", "MAX_PICKLE_OPS", "MAX_PICKLE_RECORD"]

MAX_TREE_NODES = 5_000_000
"""Nodes (containers, keys and values) a loaded object may have when every shared part is counted once per
place it appears, i.e. what a walk through it visits. A restore file of BERT-base with its AdamW state
has a few thousand; a file of weights two per array."""
MAX_TREE_DEPTH = 64
"""Nesting a loaded object may have (a restore file has 5 levels)."""
MAX_PICKLE_OPS = 2_000_000
"""Opcodes a ``.pkl`` of weights may have (a detectron2 R-101 file has about 20 per array: 20,000 in all)
so the objects it builds stay bounded (an empty list per opcode would otherwise cost ~60x the file)."""
MAX_PICKLE_RECORD = 16 * 2 ** 20
"""Size of the pickle record (``<archive>/data.pkl``) of a torch zip archive: it holds the structure, the
tensors are records of their own (a restore file of BERT-base with its AdamW state: 83 KB, so 16 MB fits
~40,000 parameter tensors). torch's weights-only unpickler builds at most ~30 bytes of objects per byte of it
(an empty list per two bytes), and the node walk then bounds what anything else does with them."""

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


def _counted(op):
    def run(self):
        self.ops += 1
        if self.ops > MAX_PICKLE_OPS:
            raise UnsafeFileError(f"{self.path} was refused: it has more than {MAX_PICKLE_OPS:,} pickle "
                                  f"opcodes, far more than a file of weights needs (its objects could take "
                                  f"unbounded memory); {self.fix}")
        return op(self)
    return run


def _load_build(self):
    """pickle's BUILD (``obj.__setstate__(state)`` or ``obj.__dict__.update(state)``) onto a numpy stand-in
    this unpickler made, never onto a function or class of :data:`PICKLE_GLOBALS` (whose attributes a file
    could otherwise set for the rest of the process)."""
    state = self.stack.pop()
    inst = self.stack[-1]
    if type(inst) not in (safe_numpy.ArraySpec, safe_numpy.DTypeSpec):
        raise _refusal(self.path, f"attributes set on a {type(inst).__name__} (pickle BUILD)", self.fix)
    inst.__setstate__(state)


class _WeightsUnpickler(pickle._Unpickler):
    """Python's pure ``pickle._Unpickler`` (a dict memo) that resolves only :data:`PICKLE_GLOBALS`, counts
    its opcodes (:data:`MAX_PICKLE_OPS`) and BUILDs only onto the numpy stand-ins."""

    dispatch = {code: _counted(op) for code, op in pickle._Unpickler.dispatch.items()}
    dispatch[pickle.BUILD[0]] = _counted(_load_build)

    def __init__(self, f, path: str, fix: str):
        super().__init__(f, encoding="latin1")  # Python 2 pickles (Detectron, Caffe2) hold latin-1 str
        self.path, self.fix, self.ops = path, fix, 0

    def find_class(self, module, name):
        found = PICKLE_GLOBALS.get((module, name))
        if found is None:
            raise _refusal(self.path, f"the global {module}.{name}", self.fix)
        return found

    def persistent_load(self, pid) -> NoReturn:
        raise _refusal(self.path, f"a persistent object ({str(pid)[:60]})", self.fix)


def load_pickle_weights(path: str, fix: str = "use the file as its publisher released it, or convert it "
                                              "to .safetensors / a torch.save'd state dict"):
    """The object pickled in ``path`` (a detectron2-style ``{"model": {name: ndarray}, ...}``), numpy
    arrays in it as ndarrays. Refuses (one :class:`UnsafeFileError` line) any other global and a file
    over :data:`MAX_PICKLE_BYTES`; a corrupt file is a :class:`CheckpointError`."""
    with open_regular(path) as f, ends_on_sigterm():
        size = os.fstat(f.fileno()).st_size
        if size > MAX_PICKLE_BYTES:
            raise UnsafeFileError(f"{path} is {size / 2 ** 30:.1f} GB, more than a .pkl of weights may be "
                                  f"({MAX_PICKLE_BYTES // 2 ** 30} GB: it is read whole into memory); "
                                  f"convert it to .safetensors or a torch.save'd state dict")
        try:
            obj = _WeightsUnpickler(f, path, fix).load()
        except UnsafeFileError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
                KeyError, MemoryError, UnicodeError, OverflowError, RecursionError, struct_error) as e:
            raise CheckpointError(f"{path} is not a readable pickle of weights ({type(e).__name__}: "
                                  f"{str(e)[:200]}); it may be truncated or not a .pkl of weights") from e
        return _resolved(obj, path, fix)


def _resolved(obj, path: str, fix: str):
    check_tree(obj, path, fix)
    try:
        return safe_numpy.resolve(obj)
    except (ValueError, RecursionError) as e:
        raise CheckpointError(f"{path} is not a readable pickle of weights ({str(e)[:200]})") from e


_CONTAINERS = (dict, list, tuple, set, frozenset)


def _children(node):
    if isinstance(node, dict):
        return [*node.keys(), *node.values()]
    return node


def check_tree(obj, path: str, fix: str = "") -> None:
    """Refuse (one :class:`UnsafeFileError` line) a loaded object that unfolds to more than
    :data:`MAX_TREE_NODES` nodes (each shared container counted at every place it appears: what a walk
    that does not remember what it saw visits), nests deeper than :data:`MAX_TREE_DEPTH`, or holds itself.
    Costs one visit per distinct container and one step per reference to it (both bounded by the file)."""
    unfolded: dict[int, int] = {}  # id -> nodes of its subtree, unfolded
    on_path: set[int] = set()
    stack = [(obj, 0, False)] if isinstance(obj, _CONTAINERS) else []
    why = None
    while stack and why is None:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            n = 1 + sum(unfolded.get(id(c), 1) for c in _children(node))
            unfolded[key] = n
            if n > MAX_TREE_NODES:
                why = (f"a structure of more than {MAX_TREE_NODES:,} nodes once its shared parts are "
                       f"unfolded (a few bytes can describe 2**40 paths)")
            continue
        if key in unfolded:
            continue
        if key in on_path:
            why = "a structure that contains itself"
        elif depth >= MAX_TREE_DEPTH:
            why = f"a structure nested more than {MAX_TREE_DEPTH} levels deep"
        else:
            on_path.add(key)
            stack.append((node, depth, True))
            stack.extend((c, depth + 1, False) for c in _children(node)
                         if isinstance(c, _CONTAINERS) and id(c) not in unfolded)
    if why is not None:
        raise UnsafeFileError(f"{path} was refused: it holds {why}, which no file of weights or training "
                              f"state has{'; ' + fix if fix else ''}")


# ------------------------------------------------------------------------------------------ torch.load
_TORCH_NUMPY = [(v, f"{m}.{n}") for (m, n), v in PICKLE_GLOBALS.items() if m.startswith("numpy")]


_ZIP_MAGIC = b"PK\x03\x04"  # what torch.load looks for to read a file as a zip archive


def check_torch_archive(f, path: str) -> None:
    """``f`` (a file object of ``path``) is a torch zip archive as ``torch.save`` writes it, or a legacy
    (non-zip) save. torch reads a file as a zip archive when it starts with a local header, with a reader
    that inflates compressed records in memory and ignores fields Python's ``zipfile`` checks; so such a
    file is given to torch only when ``zipfile`` parses its central directory, every record is stored
    uncompressed with its sizes equal, and the pickle record is at most :data:`MAX_PICKLE_RECORD`."""
    f.seek(0)
    head = f.read(4)
    f.seek(0)
    if head != _ZIP_MAGIC:
        return
    try:
        with zipfile.ZipFile(f) as z:
            infos = z.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError, NotImplementedError,
            UnicodeError) as e:
        raise CheckpointError(f"{path} is not an archive torch.save writes: its zip directory does not parse "
                              f"({one_line(e)[:200]}); it may be truncated or damaged (torch's own reader "
                              f"would skip what does not parse and could inflate what it finds)") from None
    finally:
        f.seek(0)
    for i in infos:
        if i.compress_type != zipfile.ZIP_STORED:
            raise UnsafeFileError(f"{path} was refused: its record {i.filename} is compressed, which "
                                  f"torch.save never writes (torch would inflate it in memory, without a "
                                  f"bound); re-save it with torch.save")
        if i.compress_size != i.file_size:
            raise CheckpointError(f"{path} is damaged: its record {i.filename} claims {i.file_size} bytes "
                                  f"but holds {i.compress_size}")
        if i.filename.endswith(".pkl") and i.file_size > MAX_PICKLE_RECORD:
            raise UnsafeFileError(f"{path} was refused: its pickle record {i.filename} has {i.file_size} "
                                  f"bytes, more than the structure of a checkpoint needs "
                                  f"({MAX_PICKLE_RECORD} bytes: tensors are records of their own); re-save "
                                  f"it as a plain state dict")


_GLOBAL_IN_MESSAGE = re.compile(r"GLOBAL ([\w.]+)")


def _refused_globals(f, allowed: set[str], message: str) -> list[str]:
    """The globals of the archive ``f`` that weights-only loading refuses, by full name (torch's message
    drops ``builtins.``); from its message where the file cannot be scanned (a legacy, non-zip save)."""
    try:
        f.seek(0)
        names = torch.serialization.get_unsafe_globals_in_checkpoint(f)
    except Exception:  # not a zip archive, or damaged: torch's message has the name
        names = _GLOBAL_IN_MESSAGE.findall(message)
    return [n for n in names if n not in allowed]


def torch_load(path: str, fix: str, numpy_arrays: bool = False, follow_symlinks: bool = True):
    """``torch.load(path, map_location="cpu", weights_only=True)`` (see the module docstring) of a regular
    file (``follow_symlinks=False``: not a symbolic link either, for the run's own files). A file that
    names anything else is one :class:`UnsafeFileError` line naming ``path``, the refused globals and
    ``fix``; a file torch cannot read (truncated, lying sizes, not a checkpoint) one
    :class:`CheckpointError` line naming it."""
    with open_regular(path, follow_symlinks) as f, ends_on_sigterm():
        check_torch_archive(f, path)
        allowed = _TORCH_NUMPY if numpy_arrays else []
        try:
            with torch.serialization.safe_globals(allowed):
                obj = torch.load(f, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            refused = _refused_globals(f, {name for _, name in allowed}, str(e))
            if refused:
                raise _refusal(path, f"the global {', '.join(refused[:3])}", fix) from e
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            detail = next((ln for ln in lines if "WeightsUnpickler error" in ln), lines[-1] if lines else "")
            raise _refusal(path, f"something beyond tensors and plain values ({detail[:200]})", fix) from e
        except (UnsafeFileError, KeyboardInterrupt):
            raise
        except Exception as e:  # torch raises RuntimeError, EOFError, ValueError, ... for damage
            raise CheckpointError(f"{path} is unreadable ({one_line(e)[:300]}); it may be truncated or not a "
                                  f"torch.save file") from e
        if numpy_arrays:
            return _resolved(obj, path, fix)
        check_tree(obj, path, fix)
        return obj
