"""The torch backend's state, in one object (:data:`STATE`).

A leaf module: every module of the backend keeps its part here (under a short local alias, e.g.
``_S = STATE.process``), so what a process holds between ``init()`` and ``shutdown()`` (its rank and
groups, the registered process sets, the outstanding handles, the optimizers, the timeline, the peer
watchdog) is one object to read, and re-initialisation starts from what ``shutdown()`` left.
"""
from __future__ import annotations

import itertools
import threading
import weakref
from dataclasses import dataclass, field
from typing import Any


def _process() -> dict[str, Any]:
    return {"rank": 0, "size": 1, "local_rank": 0, "local_size": 1, "group": False, "device": "cpu",
            "failed": False, "generation": 0}


def _sets() -> dict[str, Any]:
    return {"sets": {}, "next_id": 1, "prefix": "", "rank": 0, "size": 1, "device": "cpu"}


def _watchdog() -> dict[str, Any]:
    return {"store": None, "rank": 0, "thread": None, "stop": threading.Event(), "prefix": "", "busy": 0}


@dataclass
class TorchBackendState:
    """``process``: rank, world, local share, the default group, the device collectives run on, whether a
    collective failed, the init generation (``__init__``); ``sets``: the registered process sets and their
    store prefix (``sets``); ``handles`` / ``next_handle`` / ``handles_lock``: outstanding async
    operations (``ops``); ``optimizers``: the global set's DistributedOptimizers in creation order
    (``optimizer``); ``timeline``: the running timeline writer (``timeline``); ``watchdog`` /
    ``watchdog_lock``: the peer watchdog's store client and thread (``peer_watchdog``)."""

    process: dict[str, Any] = field(default_factory=_process)
    sets: dict[str, Any] = field(default_factory=_sets)
    handles: dict[int, Any] = field(default_factory=dict)
    next_handle: itertools.count = field(default_factory=lambda: itertools.count(1))
    handles_lock: threading.Lock = field(default_factory=threading.Lock)
    optimizers: list[weakref.ref] = field(default_factory=list)
    timeline: dict[str, Any] = field(default_factory=lambda: {"writer": None, "rank": 0, "atexit": False})
    watchdog: dict[str, Any] = field(default_factory=_watchdog)
    watchdog_lock: threading.Lock = field(default_factory=threading.Lock)


STATE = TorchBackendState()
