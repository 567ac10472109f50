"""torch backend: ``hvd.start_timeline`` / ``stop_timeline`` as a torch.profiler Chrome trace.

Horovod's timeline is a Chrome-trace JSON of its collectives, written by rank 0. Here the same calls
run ``torch.profiler`` (CPU, and CUDA when present) on every rank and rank 0 writes the trace to
``file_path`` at ``stop_timeline()``: each negotiated operation appears as ``hvd.<KIND> <name>`` on its
process set's executor thread (the gap from the caller's submit to it is the negotiation), the
gradient buckets as gloo/NCCL ops, next to everything else the profiler records. ``HOROVOD_TIMELINE=<file>``
starts one at ``hvd.init()`` and ``shutdown()`` stops it (``DYNAMIC``: only the calls); ``mark_cycles``
has nothing to mark (no cycles here) and is ignored. A second ``start_timeline`` writes the first file
and starts the next, as Horovod switches files.
"""
from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from clipbert_legacy.compat.hvd.torch_backend.state import STATE

_T: dict[str, Any] = STATE.timeline


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:  # noqa: ARG001 (Horovod's signature)
    if _T["prof"] is not None:
        stop_timeline()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, **_all_threads())
    prof.__enter__()
    _T.update(prof=prof, path=file_path)


def _all_threads() -> dict:
    """Record every thread (the collectives run on the process sets' executor threads); a torch
    without that option records the calling thread only."""
    try:
        return {"experimental_config": torch._C._profiler._ExperimentalConfig(profile_all_threads=True)}
    except (AttributeError, TypeError):
        return {}


def stop_timeline() -> None:
    prof, path = _T["prof"], _T["path"]
    if prof is None:
        return
    _T.update(prof=None, path=None)
    prof.__exit__(None, None, None)
    if _T["rank"] == 0:
        prof.export_chrome_trace(path)


def start_from_env(rank: int) -> None:
    """``hvd.init()``: ``HOROVOD_TIMELINE=<file>`` starts a timeline at once."""
    _T["rank"] = rank
    path = os.environ.get("HOROVOD_TIMELINE", "")
    if path and path != "DYNAMIC":
        start_timeline(path)


def span(kind: str, name: str) -> contextlib.AbstractContextManager:
    """The trace entry of one operation (nothing when no timeline runs)."""
    if _T["prof"] is None:
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"hvd.{kind} {name}")
