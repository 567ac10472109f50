"""detectron2.layers: ShapeSpec, FrozenBatchNorm2d, Conv2d, get_norm, nms; ROI ops are clear errors."""
from clipbert_legacy.legacy.shims._box_ops import batched_nms, nms
from clipbert_legacy.legacy.shims._unsupported import unsupported_class, unsupported_function

from .batch_norm import FrozenBatchNorm2d, NaiveSyncBatchNorm, get_norm
from .shape_spec import ShapeSpec
from .wrappers import BatchNorm2d, Conv2d, ConvTranspose2d, Linear, cat, interpolate, nonzero_tuple

__all__ = ["ShapeSpec", "FrozenBatchNorm2d", "NaiveSyncBatchNorm", "get_norm", "BatchNorm2d", "Conv2d",
           "ConvTranspose2d", "Linear", "cat", "interpolate", "nonzero_tuple", "nms", "batched_nms",
           "ROIAlign", "roi_align", "ROIAlignRotated", "roi_align_rotated", "ROIPool", "DeformConv",
           "ModulatedDeformConv", "nms_rotated", "batched_nms_rotated", "paste_masks_in_image"]

_ROI = "ROI feature pooling, a detector operation"
ROIAlign = unsupported_class("detectron2.layers.ROIAlign", _ROI)
ROIAlignRotated = unsupported_class("detectron2.layers.ROIAlignRotated", _ROI)
ROIPool = unsupported_class("detectron2.layers.ROIPool", _ROI)
roi_align = unsupported_function("detectron2.layers.roi_align", _ROI)
roi_align_rotated = unsupported_function("detectron2.layers.roi_align_rotated", _ROI)
DeformConv = unsupported_class("detectron2.layers.DeformConv", "deformable convolution (a CUDA kernel)")
ModulatedDeformConv = unsupported_class("detectron2.layers.ModulatedDeformConv",
                                        "deformable convolution (a CUDA kernel)")
nms_rotated = unsupported_function("detectron2.layers.nms_rotated", "rotated boxes")
batched_nms_rotated = unsupported_function("detectron2.layers.batched_nms_rotated", "rotated boxes")
paste_masks_in_image = unsupported_function("detectron2.layers.paste_masks_in_image", "instance masks")
