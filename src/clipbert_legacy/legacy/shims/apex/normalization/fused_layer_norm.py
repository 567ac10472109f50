"""``apex.normalization.fused_layer_norm``: the layer-norm modules forks import by this path."""
from clipbert_legacy.compat.layer_norm import FusedLayerNorm, MixedFusedLayerNorm

__all__ = ["FusedLayerNorm", "MixedFusedLayerNorm"]
