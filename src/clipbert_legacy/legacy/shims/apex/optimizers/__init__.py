"""``apex.optimizers``: apex's fused optimizers as torch optimizers behind apex's signatures."""
from .fused_adam import FusedAdam
from .fused_lamb import FusedLAMB
from .fused_sgd import FusedSGD

__all__ = ["FusedAdam", "FusedLAMB", "FusedSGD"]
