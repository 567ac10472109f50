"""torch backend: process sets as process groups, each with its own negotiation.

Every set (the global one included) gets a process group for its negotiated operations, run by its
executor thread, and a second one for ``DistributedOptimizer``'s fused gradient buckets, run by the
training thread: two threads never share a group, so neither can reorder the other's collectives.
The global set's fused group is the default group (``dist.init_process_group``'s). A set of one rank
needs no group and negotiates locally. Creating a group is collective over all ranks, so every rank
registers every set, members or not, in the same order (Horovod's rule for ``add_process_set``).
"""
from __future__ import annotations

import datetime
from typing import Any

import torch
import torch.distributed as dist

from clipbert_legacy.compat import launcher_env
from clipbert_legacy.compat.hvd.process_sets import ProcessSet, global_process_set
from clipbert_legacy.compat.hvd.torch_backend.controller import Controller, LocalController
from clipbert_legacy.compat.hvd.torch_backend.execute import Place, execute
from clipbert_legacy.compat.hvd.torch_backend.state import STATE

_STORE_WAIT = datetime.timedelta(days=7)  # executor / coordinator waits block; shutdown ends them via the log


class TorchSet:
    """One registered process set, seen from this rank."""

    def __init__(self, set_id: int, ranks: list[int], rank: int, group: Any, fused_group: Any,
                 controller: Any) -> None:
        self.id, self.ranks, self.rank = set_id, ranks, rank
        self.group, self.fused_group, self.controller = group, fused_group, controller
        cuda = _S["device"].split(":")[1] if _S["device"].startswith("cuda:") else None
        self.place = Place(ranks, rank, group, None if cuda is None else int(cuda)) if rank in ranks else None

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def member(self) -> bool:
        return self.rank in self.ranks


_S: dict[str, Any] = STATE.sets


def device() -> str:
    """The default group's device: where the fused gradient buckets and join headers travel."""
    return _S["device"]


def negotiated_backend() -> str:
    """CPU tensors over gloo, CUDA tensors over NCCL when this torch has both."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def _store() -> Any:
    addr, port = launcher_env.store_address()
    return dist.TCPStore(addr, port, is_master=False, timeout=_STORE_WAIT)


def start(rank: int, size: int, generation: int, fused_device: str) -> None:
    """Register the global set (called by ``init``, after the default group exists)."""
    run = f"{launcher_env.torchrun_run_id()}/{launcher_env.torchrun_restart_count()}"
    _S.update(sets={}, next_id=1, prefix=f"clipbert/hvd/{run}/{generation}/", rank=rank, size=size,
              device=fused_device)
    ranks = list(range(size))
    group = dist.new_group(ranks, backend=negotiated_backend()) if size > 1 else None
    _S["sets"][0] = _make(0, ranks, group, fused_group=None)
    global_process_set.ranks = ranks


def _make(set_id: int, ranks: list[int], group: Any, fused_group: Any) -> TorchSet:
    rank = _S["rank"]
    tset = TorchSet(set_id, ranks, rank, group, fused_group, None)
    if tset.member:
        def run(resp: dict, req: Any) -> Any:
            return execute(resp, req, tset.place)
        tset.controller = (LocalController(rank, run) if len(ranks) == 1 else
                           Controller(rank, ranks, f"{_S['prefix']}ps{set_id}/", _store, run))
    return tset


def add(process_set: ProcessSet) -> ProcessSet:
    """Register ``process_set`` on this rank (collective: every rank, same order)."""
    ranks = list(process_set.ranks or [])
    if not ranks or len(set(ranks)) != len(ranks) or ranks[0] < 0 or ranks[-1] >= _S["size"]:
        raise ValueError(f"{process_set}: ranks must be distinct, in 0..{_S['size'] - 1}, and not empty")
    if any(s.ranks == ranks for s in _S["sets"].values()):
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    group = fused = None
    if len(ranks) > 1:
        group = dist.new_group(ranks, backend=negotiated_backend())
        fused = dist.new_group(ranks)
    set_id = _S["next_id"]
    _S["next_id"] += 1
    _S["sets"][set_id] = _make(set_id, ranks, group, fused)
    process_set.process_set_id, process_set._backend = set_id, _S["sets"][set_id]
    return process_set


def remove(process_set: ProcessSet) -> bool:
    tset = _S["sets"].pop(process_set.process_set_id, None)
    if tset is None:
        return False
    if tset.controller is not None:
        tset.controller.close()
    release(tset)
    return True


def lookup(process_set: ProcessSet) -> TorchSet:
    """The registered set behind ``process_set`` (the global set for id 0)."""
    tset = _S["sets"].get(process_set.process_set_id)
    if tset is None:
        raise ValueError(f"{process_set} is not registered: call hvd.add_process_set first")
    return tset


def member(process_set: ProcessSet) -> TorchSet:
    """``lookup``, for an operation this rank takes part in."""
    tset = lookup(process_set)
    if not tset.member:
        raise ValueError(f"rank {_S['rank']} is not in {process_set}: only its ranks may run its collectives")
    return tset


def announce_leave() -> None:
    """At exit: tell every set's coordinator this rank is leaving, without waiting for the others."""
    for tset in list(_S["sets"].values()):
        if tset.controller is not None:
            tset.controller.announce_leave()


def stop_threads(timeout: float = 10.0) -> bool:
    """At exit: end every set's threads on this rank now (see ``Controller.stop_threads``)."""
    ended = True
    for tset in list(_S["sets"].values()):
        if isinstance(tset.controller, Controller):
            ended = tset.controller.stop_threads(timeout) and ended
    return ended


def close_all(timeout: float = 10.0) -> None:
    """Leave every set (``shutdown``): the global set last."""
    for set_id in sorted(_S["sets"], reverse=True):
        tset = _S["sets"].pop(set_id)
        if tset.controller is not None:
            tset.controller.close(timeout)
        release(tset)


def release(tset: TorchSet) -> None:
    """Drop the set's process groups: the controller's ``run`` closure makes the set a reference
    cycle, which would keep both groups (and their gloo threads) alive into interpreter finalization."""
    tset.group = tset.fused_group = tset.place = tset.controller = None
