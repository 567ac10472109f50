"""Which backend ``clipbert_legacy.compat.hvd`` runs on, shared by its front modules.

A leaf module (imports no backend), so the front modules (``hvd``, ``_hvd_api``, ``_hvd_functions``,
``_hvd_process_sets``, ``_hvd_sync_bn``) can all reach the chosen backend without importing each other.
"""
from __future__ import annotations

from typing import Any

BACKENDS = ("auto", "horovod", "torch")

# requested: set_backend()'s choice; name: 'horovod' | 'torch' once initialised; impl: the backend module
STATE: dict[str, Any] = {"requested": None, "name": None, "impl": None}


class NotInitializedError(ValueError):
    """A collective or query was called before ``hvd.init()``."""


def impl() -> Any:
    """The initialised backend module (``_hvd_horovod`` or ``_hvd_torch``)."""
    if STATE["impl"] is None:
        raise NotInitializedError("hvd has not been initialized; call hvd.init() first")
    return STATE["impl"]


def backend_name() -> str | None:
    """'horovod' or 'torch' once initialised; None before."""
    return STATE["name"]
