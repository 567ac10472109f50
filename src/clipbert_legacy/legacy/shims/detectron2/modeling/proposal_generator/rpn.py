"""detectron2's RPN as built: ``anchor_generator.cell_anchors.*`` and the head's ``conv``,
``objectness_logits`` and ``anchor_deltas`` (so a detectron2 / ClipBERT checkpoint loads key for key);
proposing boxes is detector use and is one clear error."""
from typing import NoReturn

from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided

from ...utils.registry import Registry, lookup
from ..anchor_generator import build_anchor_generator
from ..matcher import Matcher
from .build import PROPOSAL_GENERATOR_REGISTRY

__all__ = ["RPN_HEAD_REGISTRY", "StandardRPNHead", "RPN", "build_rpn_head"]

RPN_HEAD_REGISTRY = Registry("RPN_HEAD")


def build_rpn_head(cfg, input_shape):
    return lookup(RPN_HEAD_REGISTRY, cfg.MODEL.RPN.HEAD_NAME, "MODEL.RPN.HEAD_NAME")(cfg, input_shape)


@RPN_HEAD_REGISTRY.register()
class StandardRPNHead(nn.Module):
    """3x3 conv, then 1x1 convs for objectness (A) and box deltas (A * 4) per location."""

    def __init__(self, cfg, input_shape):
        super().__init__()
        channels = {s.channels for s in input_shape}
        if len(channels) != 1:
            raise ValueError(f"RPN head: every input feature needs the same channels, got {sorted(channels)}")
        in_channels = channels.pop()
        anchors = build_anchor_generator(cfg, input_shape)
        num_anchors = set(anchors.num_cell_anchors)
        if len(num_anchors) != 1:
            raise ValueError("RPN head: every feature map needs the same number of cell anchors")
        num_anchors = num_anchors.pop()
        self.conv = nn.Conv2d(in_channels, in_channels, kernel_size=3, stride=1, padding=1)
        self.objectness_logits = nn.Conv2d(in_channels, num_anchors, kernel_size=1, stride=1)
        self.anchor_deltas = nn.Conv2d(in_channels, num_anchors * anchors.box_dim, kernel_size=1, stride=1)
        for layer in (self.conv, self.objectness_logits, self.anchor_deltas):
            nn.init.normal_(layer.weight, std=0.01)
            nn.init.constant_(layer.bias, 0)

    def forward(self, features) -> NoReturn:
        raise not_provided("detectron2.modeling.proposal_generator.rpn.StandardRPNHead.forward",
                           "region proposals")


@PROPOSAL_GENERATOR_REGISTRY.register()
class RPN(nn.Module):
    def __init__(self, cfg, input_shape):
        super().__init__()
        rpn = cfg.MODEL.RPN
        self.min_box_side_len = cfg.MODEL.PROPOSAL_GENERATOR.MIN_SIZE
        self.in_features = list(rpn.IN_FEATURES)
        missing = [f for f in self.in_features if f not in input_shape]
        if missing:
            raise ValueError(f"MODEL.RPN.IN_FEATURES={self.in_features}: the backbone has no "
                             f"{missing} output "
                             f"(MODEL.RESNETS.OUT_FEATURES={sorted(input_shape)})")
        self.nms_thresh = rpn.NMS_THRESH
        self.batch_size_per_image = rpn.BATCH_SIZE_PER_IMAGE
        self.positive_fraction = rpn.POSITIVE_FRACTION
        self.smooth_l1_beta = rpn.SMOOTH_L1_BETA
        self.loss_weight = rpn.LOSS_WEIGHT
        self.pre_nms_topk = {True: rpn.PRE_NMS_TOPK_TRAIN, False: rpn.PRE_NMS_TOPK_TEST}
        self.post_nms_topk = {True: rpn.POST_NMS_TOPK_TRAIN, False: rpn.POST_NMS_TOPK_TEST}
        self.boundary_threshold = rpn.BOUNDARY_THRESH
        shapes = [input_shape[f] for f in self.in_features]
        self.anchor_generator = build_anchor_generator(cfg, shapes)
        self.anchor_matcher = Matcher(rpn.IOU_THRESHOLDS, rpn.IOU_LABELS, allow_low_quality_matches=True)
        self.rpn_head = build_rpn_head(cfg, shapes)

    def forward(self, images, features, gt_instances=None) -> NoReturn:
        raise not_provided("detectron2.modeling.proposal_generator.rpn.RPN.forward", "region proposals")
