"""``horovod.torch``: the project's Horovod API (``clipbert_legacy.compat.hvd``) over torch.distributed.

Served where Horovod is not installed, and under torchrun even where it is: Horovod's own ``hvd.init()``
in a torchrun process sees a world of one in every process (each rank would silently train its own copy).
Under horovodrun the installed Horovod is used (this module is not served). ``hvd.init()`` then forms the
world that torchrun started (gloo on CPU, nccl on GPU): every name of horovod.torch 0.28.1.
"""
import logging

from clipbert_legacy.compat import hvd as _hvd
from clipbert_legacy.compat.launcher_env import under_torchrun

__all__ = list(_hvd.__all__)
globals().update({name: getattr(_hvd, name) for name in __all__})

if not _hvd.is_initialized():
    _hvd.set_backend("torch")
if under_torchrun():
    logging.getLogger("clipbert_legacy.legacy").info(
        "legacy layer: started by torchrun: horovod.torch is clipbert_legacy.compat.hvd over "
        "torch.distributed")
