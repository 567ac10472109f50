"""Process sets (``hvd.ProcessSet``, ``add_process_set``, ``remove_process_set``), as in Horovod 0.28.1.

A process set is a subset of the ranks that runs collectives on its own: ``hvd.allreduce(t,
process_set=s)`` reduces over the ranks of ``s`` only. The object here is the same on both backends;
the backend keeps its own handle in ``_backend`` (Horovod's ``ProcessSet`` under ``horovodrun``, a
pair of process groups under ``torchrun``). Adding and removing a set is collective: every rank calls
it, in the same order, with the same ranks (as Horovod requires). MPI communicators are not accepted:
neither backend is built on MPI here.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from clipbert_legacy.compat.hvd.state import impl


class ProcessSet:
    """A set of ranks; ``process_set_id`` is set once it is registered (``add_process_set`` or
    ``hvd.init(process_sets=[...])``)."""

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Sequence[int]) -> None:
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet takes a list of ranks; MPI communicators need Horovod built with "
                             f"MPI, which this one is not (got {type(ranks_or_comm).__name__})") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError(f"ProcessSet ranks must be integers, got {ranks_or_comm!r}")
        self.ranks = ranks
        self._backend: Any = None

    def _invalidate(self) -> None:
        self.process_set_id = None
        self._backend = None

    def size(self) -> int | None:
        """Number of ranks in the set, or None if it is not registered."""
        return None if self.process_set_id is None else impl().process_set_size(self)

    def rank(self) -> int | None:
        """This process's rank within the set (the position of ``hvd.rank()`` in ``ranks``), or None."""
        return None if self.process_set_id is None else impl().process_set_rank(self)

    def included(self) -> bool | None:
        """Whether this process belongs to the set (None before ``ranks`` is known)."""
        if self.ranks is None:
            return None
        return impl().rank() in self.ranks

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def add_process_set(process_set: ProcessSet | Sequence[int]) -> ProcessSet:
    """Register a new process set (collective: every rank calls it with the same ranks) and return it."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.process_set_id is not None:
        raise ValueError(f"{process_set} is already registered")
    return impl().add_process_set(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister ``process_set`` (collective); False for the global set or an unregistered one."""
    if process_set.process_set_id in (None, 0):
        return False
    removed = impl().remove_process_set(process_set)
    process_set._invalidate()
    return removed
