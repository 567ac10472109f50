"""detectron2.modeling.roi_heads: the registries, ROIHeads / Res5ROIHeads / StandardROIHeads (built with
detectron2's modules and keys), box heads, FastRCNNOutputLayers; running them on proposals is a clear
error."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_class

from .box_head import ROI_BOX_HEAD_REGISTRY, FastRCNNConvFCHead, build_box_head
from .fast_rcnn import FastRCNNOutputLayers
from .mask_head import (
    ROI_KEYPOINT_HEAD_REGISTRY,
    ROI_MASK_HEAD_REGISTRY,
    BaseKeypointRCNNHead,
    BaseMaskRCNNHead,
    build_keypoint_head,
    build_mask_head,
)
from .roi_heads import (
    ROI_HEADS_REGISTRY,
    Res5ROIHeads,
    ROIHeads,
    StandardROIHeads,
    build_roi_heads,
    select_foreground_proposals,
)

__all__ = ["ROI_HEADS_REGISTRY", "ROIHeads", "Res5ROIHeads", "StandardROIHeads", "build_roi_heads",
           "select_foreground_proposals", "ROI_BOX_HEAD_REGISTRY", "FastRCNNConvFCHead", "build_box_head",
           "FastRCNNOutputLayers", "ROI_MASK_HEAD_REGISTRY", "build_mask_head", "BaseMaskRCNNHead",
           "ROI_KEYPOINT_HEAD_REGISTRY", "build_keypoint_head", "BaseKeypointRCNNHead", "CascadeROIHeads",
           "RROIHeads"]

CascadeROIHeads = unsupported_class("detectron2.modeling.roi_heads.CascadeROIHeads", "cascade detector heads",
                                    bases=(StandardROIHeads,))
RROIHeads = unsupported_class("detectron2.modeling.roi_heads.RROIHeads", "rotated-box detector heads",
                              bases=(StandardROIHeads,))
