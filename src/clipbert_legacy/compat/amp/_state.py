"""The one module-level amp state (apex kept the same in ``apex.amp._amp_state``), logging helpers and
the error types legacy code may catch.

Every other module of the package reads and writes this single ``_amp_state`` object; the package
re-exports it as ``amp._amp_state`` (tests reset it in place with ``amp._amp_state.__init__()``, which
also removes O1's patches of torch functions).
"""
from __future__ import annotations

import logging

import torch

from clipbert_legacy.compat.launcher_env import launcher_rank

logger = logging.getLogger(__package__)  # "clipbert_legacy.compat.amp", as when amp was a single module


class _AmpState:
    def __init__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle is not None:  # a reset must not leave O1's patched torch functions behind
            handle.uninstall()
        self.opt_properties = None      # None until initialize() is called at all
        self.loss_scalers = None        # None until an enabled initialize() ran
        self.verbosity = 1
        self.min_loss_scale = None
        self.max_loss_scale = 2. ** 24
        self.backend = None             # None (native) or the delegated apex.amp module
        self.skipped_steps = 0
        self.warned_cpu_fp16 = False
        self.handle = None              # O1's cast handle (amp._casts.CastHandle) while at O1


_amp_state = _AmpState()


class LossIdError(IndexError, ValueError):
    """``scale_loss(loss_id=...)`` outside ``range(num_losses)``. apex indexed its list of scalers and
    raised IndexError; ValueError is kept as a base for callers of earlier versions of this package."""


class OptimizerNotInitializedError(AttributeError, RuntimeError):
    """An optimizer that never went through ``amp.initialize`` was given to ``scale_loss``. apex failed
    with AttributeError (no ``_amp_stash``); RuntimeError is kept as a base for earlier callers."""


def _rank0() -> bool:
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank() == 0
    except Exception:  # pragma: no cover
        pass
    return launcher_rank() == 0


def _maybe_log(msg: str, *args: object) -> None:
    if _amp_state.verbosity > 0 and _rank0():
        logger.info(msg, *args)


def log_overflow(loss_id: int, new_scale: float) -> None:
    """apex's skip message, on every rank (apex printed it wherever a step was skipped), at WARNING so
    that it shows with logging's defaults; ``verbosity=0`` silences it as in apex."""
    if _amp_state.verbosity > 0:
        logger.warning("Gradient overflow.  Skipping step, loss scaler %d reducing loss scale to %s",
                       loss_id, new_scale)
