"""The one module-level amp state (apex kept the same in ``apex.amp._amp_state``) and logging helpers.

Every other module of the package reads and writes this single ``_amp_state`` object; the package
re-exports it as ``amp._amp_state`` (tests reset it in place with ``amp._amp_state.__init__()``).
"""
from __future__ import annotations

import logging
import os

import torch

logger = logging.getLogger(__package__)  # "src.compat.amp", as when amp was a single module


class _AmpState:
    def __init__(self) -> None:
        self.opt_properties = None      # None until initialize() is called at all
        self.loss_scalers = None        # None until an enabled initialize() ran
        self.verbosity = 1
        self.min_loss_scale = None
        self.max_loss_scale = 2. ** 24
        self.backend = None             # None (native) or the delegated apex.amp module
        self.skipped_steps = 0
        self.warned_cpu_fp16 = False


_amp_state = _AmpState()


def _rank0() -> bool:
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank() == 0
    except Exception:  # pragma: no cover
        pass
    return int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0"))) == 0


def _maybe_log(msg: str, *args: object) -> None:
    if _amp_state.verbosity > 0 and _rank0():
        logger.info(msg, *args)
