"""detectron2's norm layers: ``FrozenBatchNorm2d`` is the project's (same buffers and keys), ``get_norm``
maps detectron2's norm names to modules."""
from torch import nn

from clipbert_legacy.legacy.shims._unsupported import unsupported_class
from clipbert_legacy.modeling.backbone import FrozenBatchNorm2d

__all__ = ["FrozenBatchNorm2d", "get_norm", "NaiveSyncBatchNorm", "BatchNorm2d"]

BatchNorm2d = nn.BatchNorm2d
NaiveSyncBatchNorm = unsupported_class("detectron2.layers.NaiveSyncBatchNorm",
                                       "use norm 'SyncBN' (torch's SyncBatchNorm) or 'FrozenBN'",
                                       bases=(nn.BatchNorm2d,))


def get_norm(norm, out_channels):
    """``"BN" | "SyncBN" | "FrozenBN" | "GN" | "nnSyncBN" | "" | None | callable`` -> a norm module or
    None."""
    if norm is None or norm == "":
        return None
    if callable(norm):
        return norm(out_channels)
    makers = {
        "BN": nn.BatchNorm2d,
        "SyncBN": nn.SyncBatchNorm,
        "nnSyncBN": nn.SyncBatchNorm,
        "FrozenBN": FrozenBatchNorm2d,
        "GN": lambda channels: nn.GroupNorm(32, channels),
    }
    if norm not in makers:
        raise ValueError(f"detectron2 norm {norm!r} is not known; use one of {sorted(makers)} or ''")
    return makers[norm](out_channels)
