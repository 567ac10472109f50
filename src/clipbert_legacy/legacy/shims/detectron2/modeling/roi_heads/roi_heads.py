"""detectron2's ROI heads as built (commit ffff8ac's attributes, so a fork's subclass, like ClipBERT's
``AttributeStandardROIHeads``, finds what it reads): ``ROIHeads``, ``Res5ROIHeads`` (``res5`` from the
project's bottleneck blocks + ``box_predictor``) and ``StandardROIHeads`` (``box_pooler``, ``box_head``,
``box_predictor``). The modules and their keys are detectron2's; running the heads on proposals is detector
use and is one clear error."""
from typing import NoReturn

from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided

from ...layers import ShapeSpec
from ...utils.registry import Registry, lookup
from ..backbone.resnet import BottleneckBlock, make_stage
from ..matcher import Matcher
from ..poolers import ROIPooler
from .box_head import build_box_head
from .fast_rcnn import FastRCNNOutputLayers
from .mask_head import build_mask_head

__all__ = ["ROI_HEADS_REGISTRY", "ROIHeads", "Res5ROIHeads", "StandardROIHeads", "build_roi_heads",
           "select_foreground_proposals"]

ROI_HEADS_REGISTRY = Registry("ROI_HEADS")
_WHERE = "detectron2.modeling.roi_heads"


def build_roi_heads(cfg, input_shape):
    """The heads named by ``MODEL.ROI_HEADS.NAME`` (a fork's registered class included)."""
    return lookup(ROI_HEADS_REGISTRY, cfg.MODEL.ROI_HEADS.NAME, "MODEL.ROI_HEADS.NAME")(cfg, input_shape)


def select_foreground_proposals(proposals, bg_label):
    """Per image, the proposals whose ``gt_classes`` is neither -1 nor ``bg_label``, and that mask."""
    fg_proposals, fg_masks = [], []
    for proposals_per_image in proposals:
        gt_classes = proposals_per_image.gt_classes
        fg_mask = (gt_classes != -1) & (gt_classes != bg_label)
        fg_proposals.append(proposals_per_image[fg_mask.nonzero().squeeze(1)])
        fg_masks.append(fg_mask)
    return fg_proposals, fg_masks


class ROIHeads(nn.Module):
    def __init__(self, cfg, input_shape):
        super().__init__()
        h = cfg.MODEL.ROI_HEADS
        self.batch_size_per_image = h.BATCH_SIZE_PER_IMAGE
        self.positive_sample_fraction = h.POSITIVE_FRACTION
        self.in_features = h.IN_FEATURES
        self.num_classes = h.NUM_CLASSES
        self.proposal_append_gt = h.PROPOSAL_APPEND_GT
        missing = [f for f in self.in_features if f not in input_shape]
        if missing:
            raise ValueError(f"MODEL.ROI_HEADS.IN_FEATURES={list(self.in_features)}: the backbone has no "
                             f"{missing} output (MODEL.RESNETS.OUT_FEATURES={sorted(input_shape)})")
        self.proposal_matcher = Matcher(h.IOU_THRESHOLDS, h.IOU_LABELS, allow_low_quality_matches=False)

    def label_and_sample_proposals(self, proposals, targets) -> NoReturn:
        raise not_provided(f"{_WHERE}.ROIHeads.label_and_sample_proposals", "detector training")

    def forward(self, images, features, proposals, targets=None) -> NoReturn:
        raise not_provided(f"{_WHERE}.{type(self).__name__}.forward", "running ROI heads on proposals")

    def forward_with_given_boxes(self, features, instances) -> NoReturn:
        raise not_provided(f"{_WHERE}.{type(self).__name__}.forward_with_given_boxes", "box inference")


@ROI_HEADS_REGISTRY.register()
class Res5ROIHeads(ROIHeads):
    """The C4 heads: ROI pooling, then a res5 stage, then the box predictor."""

    def __init__(self, cfg, input_shape):
        super().__init__(cfg, input_shape)
        if len(self.in_features) != 1:
            raise ValueError(f"Res5ROIHeads takes one input feature, MODEL.ROI_HEADS.IN_FEATURES has "
                             f"{list(self.in_features)}")
        box = cfg.MODEL.ROI_BOX_HEAD
        self.mask_on = cfg.MODEL.MASK_ON
        if cfg.MODEL.KEYPOINT_ON:
            raise ValueError("Res5ROIHeads has no keypoint head (MODEL.KEYPOINT_ON must be False)")
        self.pooler = ROIPooler(output_size=box.POOLER_RESOLUTION,
                                scales=(1.0 / input_shape[self.in_features[0]].stride,),
                                sampling_ratio=box.POOLER_SAMPLING_RATIO, pooler_type=box.POOLER_TYPE)
        self.res5, out_channels = self._build_res5_block(cfg)
        self.box_predictor = FastRCNNOutputLayers(cfg, ShapeSpec(channels=out_channels, height=1, width=1))
        if self.mask_on:
            size = box.POOLER_RESOLUTION
            self.mask_head = build_mask_head(cfg, ShapeSpec(channels=out_channels, width=size, height=size))

    def _build_res5_block(self, cfg):
        r = cfg.MODEL.RESNETS
        factor = 2 ** 3  # res5 has 8x the channels of res2
        out_channels = r.RES2_OUT_CHANNELS * factor
        if r.DEFORM_ON_PER_STAGE[-1]:
            raise not_provided(f"{_WHERE}.Res5ROIHeads with a deformable res5",
                               "MODEL.RESNETS.DEFORM_ON_PER_STAGE")
        blocks = make_stage(BottleneckBlock, 3, first_stride=2, in_channels=out_channels // 2,
                            bottleneck_channels=r.NUM_GROUPS * r.WIDTH_PER_GROUP * factor,
                            out_channels=out_channels, num_groups=r.NUM_GROUPS, norm=r.NORM,
                            stride_in_1x1=r.STRIDE_IN_1X1)
        return nn.Sequential(*blocks), out_channels

    def _shared_roi_transform(self, features, boxes) -> NoReturn:
        raise not_provided(f"{_WHERE}.Res5ROIHeads._shared_roi_transform", "ROI pooling")


@ROI_HEADS_REGISTRY.register()
class StandardROIHeads(ROIHeads):
    """Separate box (and mask / keypoint) heads on pooled features."""

    def __init__(self, cfg, input_shape):
        super().__init__(cfg, input_shape)
        self._init_box_head(cfg, input_shape)
        self._init_mask_head(cfg, input_shape)
        self._init_keypoint_head(cfg, input_shape)

    def _init_box_head(self, cfg, input_shape):
        box = cfg.MODEL.ROI_BOX_HEAD
        self.train_on_pred_boxes = box.TRAIN_ON_PRED_BOXES
        in_channels = {input_shape[f].channels for f in self.in_features}
        if len(in_channels) != 1:
            raise ValueError(f"StandardROIHeads: the input features have different "
                             f"channels {sorted(in_channels)}")
        in_channels = in_channels.pop()
        self.box_pooler = ROIPooler(output_size=box.POOLER_RESOLUTION,
                                    scales=tuple(1.0 / input_shape[k].stride for k in self.in_features),
                                    sampling_ratio=box.POOLER_SAMPLING_RATIO, pooler_type=box.POOLER_TYPE)
        self.box_head = build_box_head(cfg, ShapeSpec(channels=in_channels, height=box.POOLER_RESOLUTION,
                                                      width=box.POOLER_RESOLUTION))
        self.box_predictor = FastRCNNOutputLayers(cfg, self.box_head.output_shape)

    def _init_mask_head(self, cfg, input_shape):
        self.mask_on = cfg.MODEL.MASK_ON
        if self.mask_on:
            raise not_provided(f"{_WHERE}.StandardROIHeads mask head", "MODEL.MASK_ON=True")

    def _init_keypoint_head(self, cfg, input_shape):
        self.keypoint_on = cfg.MODEL.KEYPOINT_ON
        if self.keypoint_on:
            raise not_provided(f"{_WHERE}.StandardROIHeads keypoint head", "MODEL.KEYPOINT_ON=True")

    def _forward_box(self, features, proposals) -> NoReturn:
        raise not_provided(f"{_WHERE}.StandardROIHeads._forward_box", "running the box head on proposals")
