"""Which backend ``clipbert_legacy.compat.hvd`` runs on: the front's state, in one object.

A leaf module (imports no backend), so the front modules (``hvd``, ``hvd.api``, ``hvd.functions``,
``hvd.process_sets``, ``hvd.sync_bn``) can all reach the chosen backend without importing each other.
Each backend keeps its own state in one object too (``torch_backend.state.STATE``; the Horovod
backend's is Horovod's own).
"""
from __future__ import annotations

from dataclasses import dataclass

from clipbert_legacy.compat.hvd.backend import Backend

BACKENDS = ("auto", "horovod", "torch")


@dataclass
class FrontState:
    """``requested``: ``set_backend()``'s choice; ``name``: 'horovod' | 'torch' once initialised;
    ``impl``: the initialised backend module."""

    requested: str | None = None
    name: str | None = None
    impl: Backend | None = None


STATE = FrontState()


class NotInitializedError(ValueError):
    """A collective or query was called before ``hvd.init()``."""


def impl() -> Backend:
    """The initialised backend module (``hvd.horovod_backend`` or ``hvd.torch_backend``)."""
    if STATE.impl is None:
        raise NotInitializedError("hvd has not been initialized; call hvd.init() first")
    return STATE.impl


def backend_name() -> str | None:
    """'horovod' or 'torch' once initialised; None before."""
    return STATE.name
