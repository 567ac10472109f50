"""``horovod.torch.mpi_ops``: the collectives and world queries, by the names Horovod's module has."""
from clipbert_legacy.compat import hvd as _hvd

__all__ = [name for name in _hvd.__all__ if name not in (
    "DistributedOptimizer", "broadcast_parameters", "broadcast_optimizer_state", "broadcast_object",
    "allgather_object", "SyncBatchNorm", "Compression", "set_backend", "backend_name")]
globals().update({name: getattr(_hvd, name) for name in __all__})
