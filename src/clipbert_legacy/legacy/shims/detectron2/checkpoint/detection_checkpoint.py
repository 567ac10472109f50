"""detectron2's ``DetectionCheckpointer`` (fvcore's ``Checkpointer`` + detectron2's file formats) reading
every
file through the project's safe loaders (clipbert_legacy.utils.safe_load): ``.pth`` with
``torch.load(weights_only=True)``, ``.pkl`` (detectron2 model-zoo and Caffe2 / Detectron weights) with the
restricted unpickler. A file that names code to run is refused with one line; nothing in it runs.

Caffe2 names (``res2_0_branch2a_w``, ...) are renamed to detectron2's by the project's converter
(``clipbert_legacy.modeling.backbone.convert_c2_names``) and, as detectron2 does for ``.pkl`` files,
matched to
the model by suffix (``stem.conv1.weight`` -> ``backbone.stem.conv1.weight``). Keys are then loaded where name
and shape agree (``clipbert_legacy.utils.load_save.load_state_dict_with_mismatch``: one table of what did
not).
"""
import logging
import os

import numpy as np
import torch

from clipbert_legacy.modeling.backbone import convert_c2_names
from clipbert_legacy.utils.errors import CheckpointError
from clipbert_legacy.utils.load_save import load_state_dict_with_mismatch
from clipbert_legacy.utils.safe_load import load_pickle_weights, torch_load

__all__ = ["DetectionCheckpointer", "Checkpointer", "align_by_suffix", "DETECTRON2_URL", "cache_dir"]

logger = logging.getLogger(__name__)

DETECTRON2_URL = "https://dl.fbaipublicfiles.com/detectron2/"
_FIX = "use weights as their publisher released them, or re-save the state dict with torch.save"


def cache_dir() -> str:
    """Where detectron2 / fvcore put downloaded weights: ``$FVCORE_CACHE`` or ``~/.torch/fvcore_cache``."""
    return os.path.expanduser(os.getenv("FVCORE_CACHE", "~/.torch/fvcore_cache"))


def _local_path(path: str) -> str:
    """``detectron2://X`` as the file detectron2 would have downloaded to its cache; the layer downloads
    nothing."""
    if not path.startswith("detectron2://"):
        return path
    rel = path[len("detectron2://"):]
    cached = os.path.join(cache_dir(), "detectron2", rel)
    if os.path.isfile(cached):
        return cached
    raise CheckpointError(f"{path}: not in the local cache ({cached}); the legacy layer downloads nothing: "
                          f"fetch {DETECTRON2_URL}{rel} to that path (or give a local path)")


def _to_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    array = np.asarray(value)
    if array.dtype.kind not in "biufc":
        return None
    return torch.from_numpy(np.ascontiguousarray(array))


def _read_pkl(path: str) -> dict:
    """detectron2's ``.pkl`` handling: a detectron2-format file (``model`` + ``__author__``) keeps its names;
    anything else is Caffe2 blobs (``blobs`` or top level) without the ``*_momentum`` entries."""
    data = load_pickle_weights(path, _FIX)
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a {type(data).__name__}, not a mapping of weights")
    if isinstance(data.get("model"), dict) and "__author__" in data:
        logger.info("Reading a file from '%s'", data["__author__"])
        return {**data, "matching_heuristics": True}
    blobs = data.get("blobs", data)
    if not isinstance(blobs, dict):
        raise CheckpointError(f"{path}: 'blobs' is a {type(blobs).__name__}, not a mapping of weights")
    blobs = {k: v for k, v in blobs.items() if not str(k).endswith("_momentum")}
    return {"model": blobs, "__author__": "Caffe2", "matching_heuristics": True}


def align_by_suffix(model_keys, checkpoint: dict) -> dict:
    """detectron2's matching heuristic: each model key takes the longest checkpoint key that equals it or is a
    ``.``-separated suffix of it; a checkpoint key that would fill two model keys fills none (ambiguous)."""
    chosen = {}
    for mk in model_keys:
        found = [ck for ck in checkpoint if mk == ck or mk.endswith("." + ck)]
        if found:
            chosen[mk] = max(found, key=len)
    used = {}
    for mk, ck in chosen.items():
        used.setdefault(ck, []).append(mk)
    ambiguous = {ck for ck, mks in used.items() if len(mks) > 1}
    for ck in sorted(ambiguous):
        logger.warning("checkpoint key %s matches %d model keys (%s, ...): not loaded", ck, len(used[ck]),
                       used[ck][0])
    return {mk: checkpoint[ck] for mk, ck in chosen.items() if ck not in ambiguous}


class Checkpointer:
    """fvcore's ``Checkpointer`` API: ``load``, ``resume_or_load``, ``has_checkpoint``, ``save``,
    ``get_checkpoint_file``, ``tag_last_checkpoint``; ``checkpointables`` (optimizer, scheduler, ...) are
    saved with the model and restored from a file that has them."""

    def __init__(self, model, save_dir="", *, save_to_disk=True, **checkpointables):
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            model = model.module
        self.model = model
        self.checkpointables = dict(checkpointables)
        self.save_dir = save_dir
        self.save_to_disk = save_to_disk
        self.logger = logger
        self.last_summary = None

    # ---------------------------------------------------------------------------------------------- reading
    def _load_file(self, path: str) -> dict:
        if path.endswith(".pkl"):
            return _read_pkl(path)
        loaded = torch_load(path, _FIX)
        if not isinstance(loaded, dict):
            raise CheckpointError(f"{path} holds a {type(loaded).__name__}, not a state dict")
        return loaded if isinstance(loaded.get("model"), dict) else {"model": loaded}

    def _load_model(self, checkpoint: dict, source: str):
        state = checkpoint.pop("model")
        if checkpoint.get("__author__") == "Caffe2":
            state, unused = convert_c2_names(state)
            if unused:
                logger.info("%s: %d Caffe2 blobs that are not ResNet weights were not renamed (e.g. %s)",
                            source, len(unused), ", ".join(sorted(unused)[:4]))
        tensors = {k: t for k, t in ((k, _to_tensor(v)) for k, v in state.items()) if t is not None}
        tensors = {(k[len("module."):] if k.startswith("module.") else k): v for k, v in tensors.items()}
        if checkpoint.pop("matching_heuristics", False):
            tensors = align_by_suffix(list(self.model.state_dict()), tensors)
        self.last_summary = load_state_dict_with_mismatch(self.model, tensors, source=source)
        return self.last_summary

    def load(self, path: str, checkpointables=None) -> dict:
        """Load ``path`` into the model (and the named checkpointables, all by default); returns the file's
        remaining entries (e.g. ``iteration``). An empty path loads nothing, as detectron2."""
        if not path:
            logger.info("No checkpoint found. Initializing model from scratch")
            return {}
        local = _local_path(path)
        if not os.path.isfile(local):
            raise CheckpointError(f"checkpoint {path} does not exist; check the path (MODEL.WEIGHTS or the "
                                  f"argument given)")
        logger.info("Loading checkpoint from %s", path)
        checkpoint = self._load_file(local)
        self._load_model(checkpoint, local)
        for key in (self.checkpointables if checkpointables is None else checkpointables):
            if key in checkpoint and key in self.checkpointables:
                logger.info("Loading %s from %s", key, path)
                self.checkpointables[key].load_state_dict(checkpoint.pop(key))
        return checkpoint

    def has_checkpoint(self) -> bool:
        return os.path.exists(os.path.join(self.save_dir, "last_checkpoint"))

    def get_checkpoint_file(self) -> str:
        try:
            with open(os.path.join(self.save_dir, "last_checkpoint")) as f:
                last = f.read().strip()
        except OSError:
            return ""
        return os.path.join(self.save_dir, last)

    def resume_or_load(self, path: str, *, resume: bool = True) -> dict:
        """``resume`` and a ``last_checkpoint`` in ``save_dir``: load that with its checkpointables; else
        load ``path`` (the model only)."""
        if resume and self.has_checkpoint():
            return self.load(self.get_checkpoint_file())
        return self.load(path, checkpointables=[])

    # ---------------------------------------------------------------------------------------------- writing
    def save(self, name: str, **kwargs) -> None:
        """``<save_dir>/<name>.pth`` with the model, the checkpointables and ``kwargs``; tags it last."""
        if not self.save_dir or not self.save_to_disk:
            return
        data = {"model": self.model.state_dict(),
                **{k: obj.state_dict() for k, obj in self.checkpointables.items()}, **kwargs}
        os.makedirs(self.save_dir, exist_ok=True)
        basename = f"{name}.pth"
        torch.save(data, os.path.join(self.save_dir, basename))
        self.tag_last_checkpoint(basename)

    def tag_last_checkpoint(self, last_filename_basename: str) -> None:
        with open(os.path.join(self.save_dir, "last_checkpoint"), "w") as f:
            f.write(last_filename_basename)


class DetectionCheckpointer(Checkpointer):
    """detectron2's checkpointer (the ``.pkl`` formats above); ``save_dir`` and checkpointables as
    fvcore's."""

    def __init__(self, model, save_dir="", *, save_to_disk=None, **checkpointables):
        super().__init__(model, save_dir, save_to_disk=True if save_to_disk is None else save_to_disk,
                         **checkpointables)
