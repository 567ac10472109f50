"""detectron2.structures: BoxMode, Boxes, Instances, ImageList, pairwise_iou work; masks, keypoints and
rotated boxes are importable and a clear error when used."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_class, unsupported_function

from .boxes import Boxes, BoxMode, pairwise_iou
from .image_list import ImageList
from .instances import Instances

__all__ = ["Boxes", "BoxMode", "pairwise_iou", "ImageList", "Instances", "BitMasks", "PolygonMasks",
           "polygons_to_bitmask", "Keypoints", "RotatedBoxes", "heatmaps_to_keypoints"]

BitMasks = unsupported_class("detectron2.structures.BitMasks", "instance masks")
PolygonMasks = unsupported_class("detectron2.structures.PolygonMasks", "instance masks")
polygons_to_bitmask = unsupported_function("detectron2.structures.polygons_to_bitmask", "instance masks")
Keypoints = unsupported_class("detectron2.structures.Keypoints", "keypoints")
heatmaps_to_keypoints = unsupported_function("detectron2.structures.heatmaps_to_keypoints", "keypoints")
RotatedBoxes = unsupported_class("detectron2.structures.RotatedBoxes", "rotated boxes")
