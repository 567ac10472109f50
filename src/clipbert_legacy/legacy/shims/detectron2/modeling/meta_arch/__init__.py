"""detectron2.modeling.meta_arch: META_ARCH_REGISTRY, build_model, GeneralizedRCNN (built, its parts run)."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_class

from .build import META_ARCH_REGISTRY, build_model
from .rcnn import GeneralizedRCNN, ProposalNetwork

__all__ = ["META_ARCH_REGISTRY", "build_model", "GeneralizedRCNN", "ProposalNetwork", "RetinaNet",
           "SemanticSegmentor", "PanopticFPN"]

RetinaNet = unsupported_class("detectron2.modeling.meta_arch.RetinaNet", "a one-stage detector")
SemanticSegmentor = unsupported_class("detectron2.modeling.meta_arch.SemanticSegmentor",
                                      "semantic segmentation")
PanopticFPN = unsupported_class("detectron2.modeling.meta_arch.PanopticFPN", "panoptic segmentation")
