"""detectron2's mask and keypoint heads are not provided: their registries exist (a fork may register into
them at import), building one is one clear error."""
from typing import NoReturn

from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided, unsupported_class

from ...utils.registry import Registry

__all__ = ["ROI_MASK_HEAD_REGISTRY", "build_mask_head", "BaseMaskRCNNHead", "ROI_KEYPOINT_HEAD_REGISTRY",
           "build_keypoint_head", "BaseKeypointRCNNHead"]

ROI_MASK_HEAD_REGISTRY = Registry("ROI_MASK_HEAD")
ROI_KEYPOINT_HEAD_REGISTRY = Registry("ROI_KEYPOINT_HEAD")
BaseMaskRCNNHead = unsupported_class("detectron2.modeling.roi_heads.BaseMaskRCNNHead", "mask heads",
                                     bases=(nn.Module,))
BaseKeypointRCNNHead = unsupported_class("detectron2.modeling.roi_heads.BaseKeypointRCNNHead",
                                         "keypoint heads", bases=(nn.Module,))


def build_mask_head(cfg, input_shape) -> NoReturn:
    raise not_provided("detectron2.modeling.roi_heads.build_mask_head", "mask heads (MODEL.MASK_ON)")


def build_keypoint_head(cfg, input_shape) -> NoReturn:
    raise not_provided("detectron2.modeling.roi_heads.build_keypoint_head",
                       "keypoint heads (MODEL.KEYPOINT_ON)")
