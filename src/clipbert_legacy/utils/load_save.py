"""Checkpoint loading that tolerates partial matches and says exactly what did not match.

ClipBERT's ``load_state_dict_with_mismatch`` loaded keys whose name and shape matched and only logged
the rest line by line; shape mismatches were easy to miss. This version loads the same way and logs one
table of every missing, unexpected, shape-mismatched and deliberately ignored key, and returns the
lists so callers (and tests) can act on them.
"""
import logging
import os
from dataclasses import dataclass, field

import numpy as np
import torch

from clipbert_legacy.utils.errors import CheckpointError, one_line, shown
from clipbert_legacy.utils.safe_load import load_pickle_weights, torch_load
from clipbert_legacy.utils.safe_open import ends_on_sigterm, open_regular

logger = logging.getLogger(__name__)

__all__ = ["LoadSummary", "load_state_dict_file", "unwrap_state_dict", "load_state_dict_with_mismatch",
           "check_weights_match"]

_WRAPPER_KEYS = ("model", "state_dict", "model_state_dict", "module", "blobs")  # blobs: Caffe2 .pkl


@dataclass
class LoadSummary:
    """What happened to each key. ``mismatched`` holds (key, checkpoint shape, model shape)."""
    loaded: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    unexpected: list = field(default_factory=list)
    mismatched: list = field(default_factory=list)
    ignored: list = field(default_factory=list)
    shapes: dict = field(default_factory=dict, repr=False)  # key -> shape, for the table
    ignored_prefix: dict = field(default_factory=dict, repr=False)  # key -> ignore prefix it matched

    def __getitem__(self, name):  # dict-style access for legacy callers
        return getattr(self, name)

    def add_ignored(self, keys, shapes=None, prefix=None):
        for k in keys:
            self.ignored.append(k)
            self.shapes[k] = (shapes or {}).get(k)
            if prefix:
                self.ignored_prefix[k] = prefix

    def _ignored_rows(self):
        """One row per ignore prefix (a ClipBERT checkpoint has ~100 detector-head keys), else per key."""
        rows, counts = [], {}
        for k in self.ignored:
            p = self.ignored_prefix.get(k)
            if p is None:
                rows.append(("ignored (unused)", k, _fmt(self.shapes.get(k)), "-"))
            else:
                counts[p] = counts.get(p, 0) + 1
        rows += [("ignored (unused)", f"{p}* ({n} key{'s' if n > 1 else ''})", "-", "-")
                 for p, n in counts.items()]
        return rows

    def as_dict(self):
        return {k: list(getattr(self, k)) for k in
                ("loaded", "missing", "unexpected", "mismatched", "ignored")}

    def table(self):
        """One row per key that was not loaded: status | key | checkpoint shape | model shape."""
        sh = self.shapes
        rows = ([("shape mismatch", k, _fmt(a), _fmt(b)) for k, a, b in self.mismatched]
                + [("missing in checkpoint", k, "-", _fmt(sh.get(k))) for k in self.missing]
                + [("unexpected (not in model)", k, _fmt(sh.get(k)), "-") for k in self.unexpected]
                + self._ignored_rows())
        head = (f"loaded {len(self.loaded)} keys; {len(self.missing)} missing, "
                f"{len(self.unexpected)} unexpected, {len(self.mismatched)} shape-mismatched, "
                f"{len(self.ignored)} ignored")
        if not rows:
            return head
        cols = ("status", "key", "checkpoint", "model")
        widths = [max(len(cols[i]), *(len(r[i]) for r in rows)) for i in range(4)]
        line = lambda r: " | ".join(str(c).ljust(w) for c, w in zip(r, widths))  # noqa: E731
        sep = "-+-".join("-" * w for w in widths)
        return "\n".join([head, line(cols), sep] + [line(r) for r in rows])


def _fmt(shape):
    return "x".join(str(s) for s in shape) if shape is not None else "?"


def _shape(v):
    return tuple(v.shape) if hasattr(v, "shape") else None


def load_state_dict_file(path):
    """Read a state dict from .safetensors, .pt/.pth/.bin (torch.save) or .pkl (detectron2 pickle), in
    both cases without running code from the file (clipbert_legacy.utils.safe_load):
    ``torch.load(weights_only=True)``,
    and for .pkl an unpickler that admits numpy arrays and plain containers only."""
    if not os.path.lexists(path):
        raise FileNotFoundError(f"checkpoint file {path!r} does not exist; check the *_weights_path option")
    if path.endswith(".safetensors"):
        return _load_safetensors(path)
    if path.endswith(".pkl"):
        data = unwrap_state_dict(load_pickle_weights(path), path)
        return {k: torch.as_tensor(np.asarray(v)) for k, v in data.items()
                if isinstance(v, (np.ndarray, np.generic)) and np.asarray(v).dtype.kind in "biufc"}
    return torch_load(path, "re-save it as a plain state dict (torch.save(model.state_dict(), ...)) where it "
                            "was made, or use the file as its publisher released it")


def _load_safetensors(path: str) -> dict:
    """A ``.safetensors`` file (a regular file: clipbert_legacy.utils.safe_open); whatever ``safetensors``
    refuses (a header that lies, offsets out of the file, a truncated file) is one CheckpointError line."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file
    with open_regular(path):
        pass  # refuses a FIFO or a device before safetensors maps it
    try:
        with ends_on_sigterm():
            return load_file(path, device="cpu")
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"{path} is not a readable .safetensors file ({one_line(e)[:300]}); it may be "
                              f"truncated or damaged: download or convert it again") from e


def unwrap_state_dict(obj, source: str = "<state dict>"):
    """Strip the usual wrappers ({'model': sd}, {'state_dict': sd}, restore.pt's model_state_dict). What is
    left must map names (strings) to values, else one :class:`CheckpointError` line naming ``source``."""
    while isinstance(obj, dict):
        inner = next((obj[k] for k in _WRAPPER_KEYS if isinstance(obj.get(k), dict)), None)
        if inner is None or any(isinstance(v, torch.Tensor) for v in obj.values()):
            break
        obj = inner
    if not isinstance(obj, dict):
        raise CheckpointError(f"{source} holds a {type(obj).__name__}, not a state dict (a mapping name -> "
                              f"tensor); give a file of model weights")
    bad = next((k for k in obj if not isinstance(k, str)), None)
    if bad is not None:
        raise CheckpointError(f"{source} is not a state dict: its key {shown(bad)} is a "
                              f"{type(bad).__name__}, not a parameter name; give a file of model weights")
    return obj


def load_state_dict_with_mismatch(model, loaded_state_dict_or_path, ignore_prefixes=(),
                                  log_level=logging.INFO, source=None):
    """Load keys present in both with equal shapes (strict=False); log a table of everything else.

    ignore_prefixes: checkpoint keys starting with one of these are dropped on purpose (e.g. ClipBERT's
    unused detector RPN/ROI heads) and listed as "ignored" rather than "unexpected".
    source: name shown in the log for an in-memory state dict (e.g. the file it came from).
    Returns a :class:`LoadSummary`.
    """
    if isinstance(loaded_state_dict_or_path, (str, os.PathLike)):
        source = os.fspath(loaded_state_dict_or_path)
        loaded = unwrap_state_dict(load_state_dict_file(source), source)
    else:
        source = source or "<state dict>"
        loaded = unwrap_state_dict(loaded_state_dict_or_path, source)
    own = model.state_dict()
    summary = LoadSummary()
    to_load = {}
    for k, v in loaded.items():
        prefix = next((p for p in ignore_prefixes if k.startswith(p)), None)
        if prefix is not None:
            summary.add_ignored([k], {k: _shape(v)}, prefix=prefix)
        elif k not in own:
            summary.unexpected.append(k)
            summary.shapes[k] = _shape(v)
        elif _shape(v) != tuple(own[k].shape):
            summary.mismatched.append((k, _shape(v), tuple(own[k].shape)))
        else:
            to_load[k] = v
    for k, v in own.items():
        if k not in loaded:
            summary.missing.append(k)
            summary.shapes[k] = tuple(v.shape)
    model.load_state_dict(to_load, strict=False)
    summary.loaded = sorted(to_load)
    logger.log(log_level, "load_state_dict_with_mismatch(%s from %s):\n%s",
               type(model).__name__, source, summary.table())
    return summary


MIN_MATCHED_FRACTION = 0.5
"""A weights file that initialises less than this share of the module it is for is another model's (the
demo's BERT and CNN files initialise about 90%: the rest is the visual embeddings and the head)."""


def check_weights_match(summary: LoadSummary, module, path: str, option: str, allow: bool = False) -> None:
    """One :class:`CheckpointError` line when ``path`` (given as ``option``) matched no key, or fewer than
    :data:`MIN_MATCHED_FRACTION` of ``module``'s: training would go on from random weights with rc 0.
    ``allow`` (``--allow_unmatched_weights 1``) keeps ClipBERT's behaviour: the load table is logged."""
    n_model = len(module.state_dict())
    if allow or (summary.loaded and len(summary.loaded) >= MIN_MATCHED_FRACTION * n_model):
        return
    in_file = summary.unexpected + [m[0] for m in summary.mismatched] + summary.ignored
    raise CheckpointError(
        f"{option} {path} does not fit this model: {len(summary.loaded)} of the model's {n_model} keys "
        f"matched (file keys e.g. {in_file[:3]}; model keys e.g. {summary.missing[:3]}; "
        f"{len(summary.mismatched)} of another shape); give weights of this model (cnn_type, model_config), "
        f"or --allow_unmatched_weights 1 to start the rest from random weights")
