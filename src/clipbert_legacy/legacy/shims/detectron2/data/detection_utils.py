"""detectron2.data.detection_utils: importable (ClipBERT's grid-feats mapper imports it as ``utils``); its
functions prepare detector training data and are each a clear error when called."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_function

_WHAT = "detector data preparation"
_FUNCTIONS = ["read_image", "check_image_size", "transform_instance_annotations", "annotations_to_instances",
              "filter_empty_instances", "gen_crop_transform_with_instance", "transform_proposals",
              "build_transform_gen", "create_keypoint_hflip_indices", "check_metadata_consistency",
              "annotations_to_instances_rotated", "transform_keypoint_annotations", "convert_PIL_to_numpy"]

for _name in _FUNCTIONS:
    globals()[_name] = unsupported_function(f"detectron2.data.detection_utils.{_name}", _WHAT)


class SizeMismatchError(ValueError):
    """An image's size differs from the size its dataset dict states."""


__all__ = _FUNCTIONS + ["SizeMismatchError"]
