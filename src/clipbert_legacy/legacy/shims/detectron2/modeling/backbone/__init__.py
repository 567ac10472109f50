"""detectron2.modeling.backbone: Backbone, BACKBONE_REGISTRY, build_backbone, the ResNet backbone."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_class, unsupported_function

from .backbone import Backbone
from .build import BACKBONE_REGISTRY, build_backbone
from .resnet import BasicStem, BottleneckBlock, ResNet, ResNetBlockBase, build_resnet_backbone, make_stage

__all__ = ["Backbone", "BACKBONE_REGISTRY", "build_backbone", "ResNet", "ResNetBlockBase", "BottleneckBlock",
           "BasicStem", "make_stage", "build_resnet_backbone", "FPN", "build_resnet_fpn_backbone"]

FPN = unsupported_class("detectron2.modeling.backbone.FPN", "feature pyramids", bases=(Backbone,))
build_resnet_fpn_backbone = unsupported_function("detectron2.modeling.backbone.build_resnet_fpn_backbone",
                                                 "feature pyramids")
