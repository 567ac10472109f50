"""``apex.normalization``: FusedLayerNorm / MixedFusedLayerNorm from ``clipbert_legacy.compat.layer_norm``
(apex's fused kernel where it is importable and the input is on CUDA, else ``F.layer_norm``; same keys)."""
from .fused_layer_norm import FusedLayerNorm, MixedFusedLayerNorm

__all__ = ["FusedLayerNorm", "MixedFusedLayerNorm"]
