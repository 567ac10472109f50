"""``horovod.torch.compression``: ``Compression`` (none / fp16) and ``Compressor``."""
from clipbert_legacy.compat.hvd.compression import Compression, Compressor

__all__ = ["Compression", "Compressor"]
