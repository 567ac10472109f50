"""py-lmdb's second ``lmdb.open`` of one directory in one process, as 1.x allowed it.

py-lmdb 3.0 raises "The environment ... is already open in this process" where 1.4 and 1.6 opened it
again; ClipBERT-lineage code opens a video LMDB once per loader (train, val, inference). With the layer, a
read-only ``lmdb.open`` of a directory this process already has open returns that open ``Environment``
(reading through it is what the second handle would have done). A writable second open goes to lmdb as
before (and gets its error). The environment is shared: ``close()`` through one holder closes it for all.
Applied only to py-lmdb 2 and later.
"""
from __future__ import annotations

import logging
import os

logger = logging.getLogger("clipbert_legacy.legacy")


def _alive(env) -> bool:
    try:
        env.flags()
        return True
    except Exception:  # lmdb.Error: the environment was closed
        return False


def make_open(real_open):
    opened: dict[str, object] = {}

    def open_reusing(path, *args, **kwargs):
        """``lmdb.open``, reusing this process's open environment for a read-only re-open."""
        key = os.path.realpath(os.fspath(path))
        env = opened.get(key)
        if env is not None and kwargs.get("readonly", False) and _alive(env):
            logger.debug("legacy layer: lmdb %s already open in this process; reusing it", key)
            return env
        env = real_open(path, *args, **kwargs)
        opened[key] = env
        return env

    open_reusing.__wrapped__ = real_open
    return open_reusing


def patch_lmdb(module) -> None:
    version = getattr(module, "__version__", "0")
    major = int(version.split(".")[0]) if version.split(".")[0].isdigit() else 0
    if major >= 2 and not hasattr(module.open, "__wrapped__"):
        module.open = make_open(module.open)


PATCHES = (("lmdb", patch_lmdb),)
