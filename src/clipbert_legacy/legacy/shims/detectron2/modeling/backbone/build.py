"""detectron2's ``BACKBONE_REGISTRY`` and ``build_backbone(cfg)``."""
from ...layers import ShapeSpec
from ...utils.registry import Registry, lookup
from .backbone import Backbone

__all__ = ["BACKBONE_REGISTRY", "build_backbone"]

BACKBONE_REGISTRY = Registry("BACKBONE")
BACKBONE_REGISTRY.__doc__ = "Backbone builders, called as fn(cfg, input_shape) -> Backbone."


def build_backbone(cfg, input_shape=None):
    """The backbone named by ``cfg.MODEL.BACKBONE.NAME`` (``build_resnet_backbone``)."""
    if input_shape is None:
        input_shape = ShapeSpec(channels=len(cfg.MODEL.PIXEL_MEAN))
    backbone = lookup(BACKBONE_REGISTRY, cfg.MODEL.BACKBONE.NAME, "MODEL.BACKBONE.NAME")(cfg, input_shape)
    if not isinstance(backbone, Backbone):
        raise TypeError(f"MODEL.BACKBONE.NAME={cfg.MODEL.BACKBONE.NAME!r} built a {type(backbone).__name__}, "
                        f"not a detectron2 Backbone")
    return backbone
