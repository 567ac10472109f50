"""Checkpoint files: fp32 model weights per step and an atomically written restore file (what is in the
restore file and when it is written: ``clipbert_legacy.training.checkpointer.Checkpointer``).

* ``ckpt/model_step_{N}.pt``: flat ``{key: cpu tensor}`` of the model with float tensors in fp32
  (under amp O2 the fp32 master weights, not the fp16 copies ClipBERT saved).
* ``ckpt/restore.pt``: everything an exact resume needs (``Checkpointer.save_restore``); written to a
  temp file, fsynced, the previous file kept as ``restore_backup.pt``, then renamed into place. A
  crash at any moment leaves a loadable restore.pt or backup. ClipBERT retried 10 times and then
  silently swallowed errors; here a failed save raises, and an unreadable restore file falls back
  to the backup with a warning, or raises if nothing can be read. Both are read with
  ``weights_only=True`` (clipbert_legacy.utils.safe_load): a file naming anything else (a planted payload)
  stops the run with one line, without falling back.
"""
import contextlib
import logging
import math
import os

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.utils.errors import CheckpointError, UnsafeFileError, write_error
from clipbert_legacy.utils.safe_load import torch_load
from clipbert_legacy.utils.safe_open import open_inside

logger = logging.getLogger(__name__)

RESTORE, BACKUP = "restore.pt", "restore_backup.pt"


def _atomic_write(path: str, write, keep_previous_as: str | None = None, need_bytes: int = 0) -> None:
    """``write(f)`` into a temp file, fsynced, renamed into place (the previous file first renamed to
    ``keep_previous_as`` when given). A failed write (full disk, quota) removes the temp file, leaves
    the previous file as it was and raises a one-line :class:`OutputWriteError` naming the path, the
    free space and the space needed (``need_bytes``)."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        # never through a link planted at the temp name; the renames replace names, never follow them
        with os.fdopen(open_inside(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if keep_previous_as is not None and os.path.lexists(path):
            os.replace(path, keep_previous_as)
        os.replace(tmp, path)
    except UnsafeFileError:
        raise
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise write_error(path, e, need_bytes=need_bytes) from e


def atomic_torch_save(obj, path, keep_previous_as=None):
    """``torch.save(obj)`` written atomically (:func:`_atomic_write`); the peers of a multi-process run
    allow the save to take long (``hvd.busy``: the torch backend's watchdog)."""
    with hvd.busy():
        _atomic_write(path, lambda f: torch.save(obj, f), keep_previous_as, tensor_bytes(obj))


def atomic_write_text(path: str, text: str) -> None:
    """``text`` written atomically (:func:`_atomic_write`): a full disk never leaves a cut file behind."""
    _atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def model_step_path(ckpt_dir: str, step: int) -> str:
    """``ckpt_dir/model_step_{step}.pt``: the one place that name is built."""
    return os.path.join(ckpt_dir, f"model_step_{step}.pt")


def saved_model_steps(ckpt_dir: str) -> list[int]:
    """Steps of the ``model_step_N.pt`` files in ``ckpt_dir``, ascending ([] if it does not exist)."""
    if not os.path.isdir(ckpt_dir):
        return []
    names = (f[len("model_step_"):-len(".pt")] for f in os.listdir(ckpt_dir)
             if f.startswith("model_step_") and f.endswith(".pt"))
    return sorted(int(n) for n in names if n.isdigit())


def tensor_bytes(obj) -> int:
    """The bytes of the tensors in ``obj`` (dicts, lists, tuples): about the size of its save."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def fp32_state_dict(model, masters_by_name=None):
    """Model state as CPU tensors, floats in fp32; ``masters_by_name`` overrides params (amp O2)."""
    out = {}
    for k, v in model.state_dict().items():
        v = v.detach()
        if k in (masters_by_name or {}):
            v = masters_by_name[k].detach()
        out[k] = (v.float() if v.is_floating_point() else v).cpu().clone()
    return out


def all_finite(state_dict: dict) -> bool:
    """No nan/inf in any floating-point tensor of ``state_dict``."""
    return all(bool(torch.isfinite(v).all()) for v in state_dict.values()
               if torch.is_tensor(v) and v.is_floating_point())


class ModelSaver:
    def __init__(self, ckpt_dir):
        self.dir = ckpt_dir
        os.makedirs(ckpt_dir, exist_ok=True)

    def path(self, step):
        return model_step_path(self.dir, step)

    def save(self, state_dict, step):
        p = self.path(step)
        atomic_torch_save(state_dict, p)
        return p

    def saved_steps(self) -> list[int]:
        """Steps of the ``model_step_N.pt`` files in the directory, ascending."""
        return saved_model_steps(self.dir)

    def save_best(self, state_dict):
        p = os.path.join(self.dir, "model_best.pt")
        atomic_torch_save(state_dict, p)
        return p


def load_model_weights(model, state_dict: dict, path: str, fix: str) -> None:
    """``model.load_state_dict(state_dict)`` (strict), or one :class:`CheckpointError` line naming
    ``path``, what does not fit (missing, unexpected, other shapes; first examples) and ``fix``,
    instead of torch's multi-line size-mismatch report."""
    own = model.state_dict()
    if not isinstance(state_dict, dict):
        raise CheckpointError(f"{path} holds a {type(state_dict).__name__}, not model weights; {fix}")
    bad = next((k for k in state_dict if not isinstance(k, str)), None)
    if bad is not None:
        raise CheckpointError(f"{path} is not model weights: its key {str(bad)[:60]!r} is a "
                              f"{type(bad).__name__}, not a parameter name; {fix}")
    missing = [k for k in own if k not in state_dict]
    unexpected = [k for k in state_dict if k not in own]
    shapes = [f"{k} {tuple(state_dict[k].shape)} vs {tuple(v.shape)} here" for k, v in own.items()
              if k in state_dict and torch.is_tensor(state_dict[k]) and state_dict[k].shape != v.shape]
    if missing or unexpected or shapes:
        parts = [f"{len(x)} {what} (e.g. {', '.join(x[:2])})" for x, what in
                 ((missing, "missing"), (unexpected, "unexpected"), (shapes, "of another shape")) if x]
        raise CheckpointError(f"{path} does not fit this model: keys {'; '.join(parts)}; it was written by "
                              f"another model or config; {fix}")
    model.load_state_dict(state_dict)


def checkpoints_to_keep(steps: list[int], history: dict[int, float], mode: str, keep_last_k: int,
                        keep_top_k: int, protect: set[int]) -> set[int]:
    """Which of the saved ``model_step_{steps}.pt`` to keep: the ``keep_last_k`` latest, the
    ``keep_top_k`` best by ``history`` ({step: validation metric}, ``mode`` max|min), the latest and
    ``protect`` (the best); -1 for both keeps everything (ClipBERT kept every file)."""
    if keep_last_k == -1 and keep_top_k == -1:
        return set(steps)
    steps = sorted(steps)
    keep = set(protect) | set(steps[-1:])
    if keep_last_k > 0:
        keep |= set(steps[-keep_last_k:])
    if keep_top_k > 0:
        scored = [s for s in steps if s in history and math.isfinite(history[s])]
        scored.sort(key=lambda s: history[s], reverse=mode == "max")
        keep |= set(scored[:keep_top_k])
    return keep & set(steps)


_REFUSED_FIX = (f"this project writes restore files of tensors and plain values only; if you did not put it "
                f"there, delete {RESTORE} and {BACKUP} in that folder, or rerun with --existing_run restart")


class TrainingRestorer:
    """Reads/writes ``restore.pt`` (and its backup) in ``ckpt_dir``."""

    def __init__(self, ckpt_dir):
        self.dir = ckpt_dir
        self.path = os.path.join(ckpt_dir, RESTORE)
        self.backup = os.path.join(ckpt_dir, BACKUP)
        self.loaded_from: str | None = None  # the file load() returned

    def exists(self):
        return os.path.lexists(self.path) or os.path.lexists(self.backup)

    def save(self, state):
        os.makedirs(self.dir, exist_ok=True)
        atomic_torch_save(state, self.path, keep_previous_as=self.backup)

    def load(self):
        """The newest readable restore state, or None when there is none (fresh run)."""
        errors = []
        for p in (self.path, self.backup):
            if not os.path.lexists(p):
                continue
            try:
                # numpy: RNG states written before; never through a link (the run writes none there)
                state = torch_load(p, _REFUSED_FIX, numpy_arrays=True, follow_symlinks=False)
                if not isinstance(state, dict) or "global_step" not in state:
                    raise ValueError("not a restore file (no global_step)")
            except UnsafeFileError:
                raise  # not damage: someone else's file; neither it nor the backup is trusted to resume
            except Exception as e:  # a truncated/corrupt file: try the backup
                logger.warning("restore file %s is unreadable (%s); trying the backup", p, e)
                errors.append(str(e) if str(e).startswith(p) else f"{p}: {e}")
                continue
            if p == self.backup:
                logger.warning("resuming from the backup restore file %s", p)
            self.loaded_from = p
            return state
        if errors:
            raise CheckpointError("cannot resume: no readable restore file (" + "; ".join(errors) +
                                  "); delete them, or rerun with --existing_run restart, to start again")
        return None
