"""detectron2's ``GeneralizedRCNN`` as built: ``backbone`` (the project's ResNet), ``proposal_generator`` and
``roi_heads`` (detectron2's modules and keys), pixel mean / std as plain attributes (not state-dict keys,
as at
commit ffff8ac). ClipBERT calls ``model.backbone(x)`` and ``model.roi_heads.<its own method>`` directly; the
detector's own forward is one clear error."""
from typing import NoReturn

import torch
from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided, unsupported_class

from ..backbone import build_backbone
from ..proposal_generator import build_proposal_generator
from ..roi_heads import build_roi_heads
from .build import META_ARCH_REGISTRY

__all__ = ["GeneralizedRCNN", "ProposalNetwork"]

_WHERE = "detectron2.modeling.meta_arch.rcnn"


@META_ARCH_REGISTRY.register()
class GeneralizedRCNN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        if len(cfg.MODEL.PIXEL_MEAN) != len(cfg.MODEL.PIXEL_STD):
            raise ValueError(f"MODEL.PIXEL_MEAN has {len(cfg.MODEL.PIXEL_MEAN)} values, MODEL.PIXEL_STD "
                             f"{len(cfg.MODEL.PIXEL_STD)}: give one per channel")
        self.backbone = build_backbone(cfg)
        self.proposal_generator = build_proposal_generator(cfg, self.backbone.output_shape())
        self.roi_heads = build_roi_heads(cfg, self.backbone.output_shape())
        self.vis_period = cfg.VIS_PERIOD
        self.input_format = cfg.INPUT.FORMAT
        channels = len(cfg.MODEL.PIXEL_MEAN)
        self.pixel_mean = torch.tensor(cfg.MODEL.PIXEL_MEAN, dtype=torch.float32).view(channels, 1, 1)
        self.pixel_std = torch.tensor(cfg.MODEL.PIXEL_STD, dtype=torch.float32).view(channels, 1, 1)

    @property
    def device(self):
        return next(self.parameters()).device

    def normalizer(self, x):
        """``(x - PIXEL_MEAN) / PIXEL_STD`` per channel."""
        return (x - self.pixel_mean.to(x)) / self.pixel_std.to(x)

    def forward(self, batched_inputs) -> NoReturn:
        raise not_provided(f"{_WHERE}.GeneralizedRCNN.forward",
                           "running the detector; call model.backbone(x)")

    def inference(self, batched_inputs, detected_instances=None, do_postprocess=True) -> NoReturn:
        raise not_provided(f"{_WHERE}.GeneralizedRCNN.inference", "running the detector")

    def preprocess_image(self, batched_inputs) -> NoReturn:
        raise not_provided(f"{_WHERE}.GeneralizedRCNN.preprocess_image",
                           "detector input batching (ImageList)")


ProposalNetwork = unsupported_class(f"{_WHERE}.ProposalNetwork", "a proposal-only detector",
                                    bases=(nn.Module,))
