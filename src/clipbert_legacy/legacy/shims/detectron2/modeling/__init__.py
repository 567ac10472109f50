"""detectron2.modeling: build_model -> GeneralizedRCNN over the project's ResNet, the registries,
ShapeSpec."""
from ..layers import ShapeSpec
from .anchor_generator import ANCHOR_GENERATOR_REGISTRY, build_anchor_generator
from .backbone import (
    BACKBONE_REGISTRY,
    FPN,
    Backbone,
    ResNet,
    ResNetBlockBase,
    build_backbone,
    build_resnet_backbone,
    make_stage,
)
from .meta_arch import META_ARCH_REGISTRY, GeneralizedRCNN, ProposalNetwork, build_model
from .poolers import ROIPooler
from .proposal_generator import PROPOSAL_GENERATOR_REGISTRY, RPN_HEAD_REGISTRY, build_proposal_generator
from .roi_heads import (
    ROI_BOX_HEAD_REGISTRY,
    ROI_HEADS_REGISTRY,
    ROI_KEYPOINT_HEAD_REGISTRY,
    ROI_MASK_HEAD_REGISTRY,
    ROIHeads,
    StandardROIHeads,
    build_box_head,
    build_keypoint_head,
    build_mask_head,
    build_roi_heads,
)

__all__ = ["ShapeSpec", "ANCHOR_GENERATOR_REGISTRY", "build_anchor_generator", "BACKBONE_REGISTRY", "FPN",
           "Backbone", "ResNet", "ResNetBlockBase", "build_backbone", "build_resnet_backbone", "make_stage",
           "META_ARCH_REGISTRY", "GeneralizedRCNN", "ProposalNetwork", "build_model", "ROIPooler",
           "PROPOSAL_GENERATOR_REGISTRY", "RPN_HEAD_REGISTRY", "build_proposal_generator",
           "ROI_BOX_HEAD_REGISTRY", "ROI_HEADS_REGISTRY", "ROI_KEYPOINT_HEAD_REGISTRY",
           "ROI_MASK_HEAD_REGISTRY",
           "ROIHeads", "StandardROIHeads", "build_box_head", "build_keypoint_head", "build_mask_head",
           "build_roi_heads"]
