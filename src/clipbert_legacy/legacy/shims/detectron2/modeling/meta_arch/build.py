"""detectron2's ``META_ARCH_REGISTRY`` and ``build_model(cfg)``."""
import logging

import torch

from ...utils.registry import Registry, lookup

__all__ = ["META_ARCH_REGISTRY", "build_model"]

logger = logging.getLogger(__name__)

META_ARCH_REGISTRY = Registry("META_ARCH")


def build_model(cfg):
    """The model named by ``MODEL.META_ARCHITECTURE`` (``GeneralizedRCNN``) on ``MODEL.DEVICE``. A CUDA device
    on a machine without one leaves the model on the CPU, with one log line (a legacy script run with
    --cpu)."""
    model = lookup(META_ARCH_REGISTRY, cfg.MODEL.META_ARCHITECTURE, "MODEL.META_ARCHITECTURE")(cfg)
    device = torch.device(cfg.MODEL.DEVICE)
    if device.type == "cuda" and not torch.cuda.is_available():
        logger.warning("MODEL.DEVICE=%r but this machine has no CUDA device: the model stays on the CPU",
                       cfg.MODEL.DEVICE)
        return model
    return model.to(device)
