"""The exception classes of ``horovod.torch``, one class whichever backend runs.

With Horovod installed they are Horovod's own (``horovod.common.exceptions``, pure Python), so
``except hvd.HorovodInternalError`` catches what Horovod raises under ``horovodrun`` and what the torch
backend raises under ``torchrun`` alike; without Horovod, classes of the same names and bases.
"""
from __future__ import annotations

try:
    from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt
except ImportError:  # Horovod not installed: the torch backend alone
    class HorovodInternalError(RuntimeError):
        """A collective operation failed (a mismatch between ranks, a lost peer); elastic training
        treats it as recoverable."""

    class HostsUpdatedInterrupt(RuntimeError):
        """The set of hosts of an elastic job changed."""

        def __init__(self, skip_sync: bool) -> None:
            super().__init__()
            self.skip_sync = skip_sync

__all__ = ["HorovodInternalError", "HostsUpdatedInterrupt"]
