"""detectron2.data.transforms: importable for forks that name them at module level; detector augmentation
is not provided (each name is a clear error when used)."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_class, unsupported_function

_WHAT = "detector data augmentation"
_CLASSES = ["Transform", "TransformList", "NoOpTransform", "HFlipTransform", "VFlipTransform", "CropTransform",
            "ResizeTransform", "ExtentTransform", "RotationTransform", "BlendTransform", "TransformGen",
            "ResizeShortestEdge", "RandomFlip", "RandomCrop", "RandomExtent", "RandomContrast",
            "RandomBrightness", "RandomSaturation", "RandomLighting", "RandomRotation", "Resize"]
_FUNCTIONS = ["apply_transform_gens"]

for _name in _CLASSES:
    globals()[_name] = unsupported_class(f"detectron2.data.transforms.{_name}", _WHAT)
for _name in _FUNCTIONS:
    globals()[_name] = unsupported_function(f"detectron2.data.transforms.{_name}", _WHAT)

__all__ = _CLASSES + _FUNCTIONS
