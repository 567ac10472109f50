"""torchvision.ops: box operations in plain torch (``nms`` exact, O(N^2) memory, at most 20k boxes a call);
ROI pooling is a clear error."""
import torch

from clipbert_legacy.legacy.shims._box_ops import batched_nms, box_area, box_iou, nms
from clipbert_legacy.legacy.shims._unsupported import unsupported_class, unsupported_function

__all__ = ["nms", "batched_nms", "box_area", "box_iou", "box_convert", "clip_boxes_to_image",
           "remove_small_boxes", "roi_align", "RoIAlign", "roi_pool", "RoIPool", "ps_roi_align",
           "MultiScaleRoIAlign", "deform_conv2d", "DeformConv2d", "sigmoid_focal_loss"]

_ROI = "ROI pooling (a detector operation)"
roi_align = unsupported_function("torchvision.ops.roi_align", _ROI)
roi_pool = unsupported_function("torchvision.ops.roi_pool", _ROI)
ps_roi_align = unsupported_function("torchvision.ops.ps_roi_align", _ROI)
RoIAlign = unsupported_class("torchvision.ops.RoIAlign", _ROI, bases=(torch.nn.Module,))
RoIPool = unsupported_class("torchvision.ops.RoIPool", _ROI, bases=(torch.nn.Module,))
MultiScaleRoIAlign = unsupported_class("torchvision.ops.MultiScaleRoIAlign", _ROI, bases=(torch.nn.Module,))
deform_conv2d = unsupported_function("torchvision.ops.deform_conv2d", "deformable convolution")
DeformConv2d = unsupported_class("torchvision.ops.DeformConv2d", "deformable convolution",
                                 bases=(torch.nn.Module,))
sigmoid_focal_loss = unsupported_function("torchvision.ops.sigmoid_focal_loss", "detector losses")

_FORMATS = ("xyxy", "xywh", "cxcywh")


def box_convert(boxes, in_fmt, out_fmt):
    """(N, 4) boxes between ``xyxy``, ``xywh`` and ``cxcywh``."""
    if in_fmt not in _FORMATS or out_fmt not in _FORMATS:
        raise ValueError(f"box_convert {in_fmt!r} -> {out_fmt!r}: formats are {', '.join(_FORMATS)}")
    if in_fmt == out_fmt:
        return boxes.clone()
    a, b, c, d = boxes.unbind(-1)
    if in_fmt == "xywh":
        a, b, c, d = a, b, a + c, b + d
    elif in_fmt == "cxcywh":
        a, b, c, d = a - c / 2, b - d / 2, a + c / 2, b + d / 2
    if out_fmt == "xywh":
        return torch.stack((a, b, c - a, d - b), dim=-1)
    if out_fmt == "cxcywh":
        return torch.stack(((a + c) / 2, (b + d) / 2, c - a, d - b), dim=-1)
    return torch.stack((a, b, c, d), dim=-1)


def clip_boxes_to_image(boxes, size):
    """xyxy boxes clamped to an image of ``(height, width)``."""
    h, w = size
    x = boxes[..., 0::2].clamp(min=0, max=w)
    y = boxes[..., 1::2].clamp(min=0, max=h)
    return torch.stack((x, y), dim=-1).reshape(boxes.shape)


def remove_small_boxes(boxes, min_size):
    """Indices of the xyxy boxes whose sides are both at least ``min_size``."""
    ws, hs = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    return torch.where((ws >= min_size) & (hs >= min_size))[0]
