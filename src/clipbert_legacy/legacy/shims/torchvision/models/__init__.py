"""torchvision.models: not provided. Each constructor is a clear error that points to the project's ResNet
(``clipbert_legacy.modeling.backbone.build_resnet``: detectron2's layer names, so torchvision weights need
renaming, as ClipBERT's ``convert_torchvision_ckpt_to_detectron2`` does)."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_function

_WHAT = ("torchvision's model zoo; for a ResNet backbone use clipbert_legacy.modeling.backbone.build_resnet "
         "('resnet50' / 'resnet101', detectron2 layer names)")
_NAMES = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "resnext101_32x8d",
          "wide_resnet50_2", "wide_resnet101_2", "vgg16", "mobilenet_v2", "efficientnet_b0", "vit_b_16",
          "get_model", "list_models"]

for _name in _NAMES:
    globals()[_name] = unsupported_function(f"torchvision.models.{_name}", _WHAT)

__all__ = list(_NAMES)
