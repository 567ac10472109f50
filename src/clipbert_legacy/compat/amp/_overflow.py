"""Overflow handling: one decision for all ranks (the local non-finite flag is all-reduced over
``clipbert_legacy.compat.hvd``, ``horovod.torch`` or ``torch.distributed``), and the count of skipped
steps."""
from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

from clipbert_legacy.compat.amp._state import _amp_state


def _active_collective() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """A function all-reducing (sum) a flag tensor across ranks, or None when single-process."""
    if os.environ.get("AMP_SYNC_OVERFLOW", "1") == "0":
        return None
    # Looked up in sys.modules, not imported: amp must not pull in a distributed backend by itself.
    hvd = sys.modules.get("clipbert_legacy.compat.hvd")
    if hvd is not None and getattr(hvd, "is_initialized", lambda: False)():
        if hvd.size() > 1:
            return lambda t: hvd.allreduce(t, op=hvd.Sum, name="amp.overflow")
        return None
    hh = sys.modules.get("horovod.torch")
    if hh is not None:
        try:
            if hh.size() > 1:
                return lambda t: hh.allreduce(t, op=hh.Sum, name="amp.overflow")
            return None
        except Exception:  # not initialised
            pass
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        def reduce(t):
            dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
            buf = t.to(dev)
            dist.all_reduce(buf)
            return buf
        return reduce
    return None


def _any_overflow(found_inf: dict[torch.device, torch.Tensor]) -> bool:
    """True when any rank found a non-finite gradient (a collective when several ranks run)."""
    total = None
    for t in found_inf.values():
        total = t.cpu() if total is None else total + t.cpu()
    reduce = _active_collective()
    if reduce is not None:  # every rank must take part, overflowed or not
        local = total if total is not None else torch.zeros(1)
        total = reduce(local)
    return total is not None and float(total.sum()) > 0


def num_skipped_steps() -> int:
    """How many optimizer steps were skipped for gradient overflow since import (all optimizers)."""
    return _amp_state.skipped_steps
