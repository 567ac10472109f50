"""detectron2's ``FastRCNNOutputLayers``: ``cls_score`` (num_classes + 1) and ``bbox_pred`` linear layers,
built
from the config or from explicit arguments (``@configurable``); its forward (two linear layers) runs, its
losses and box inference are detector use and are one clear error."""
from typing import NoReturn

import torch
from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided, unsupported_class, unsupported_function

from ...config import configurable
from ...layers import Linear, ShapeSpec
from ..box_regression import Box2BoxTransform

__all__ = ["FastRCNNOutputLayers", "FastRCNNOutputs", "fast_rcnn_inference"]

_WHERE = "detectron2.modeling.roi_heads.fast_rcnn"
FastRCNNOutputs = unsupported_class(f"{_WHERE}.FastRCNNOutputs", "Fast R-CNN losses")
fast_rcnn_inference = unsupported_function(f"{_WHERE}.fast_rcnn_inference", "box inference")


class FastRCNNOutputLayers(nn.Module):
    @configurable
    def __init__(self, input_shape, box2box_transform, num_classes, cls_agnostic_bbox_reg=False,
                 smooth_l1_beta=0.0, test_score_thresh=0.0, test_nms_thresh=0.5, test_topk_per_image=100):
        super().__init__()
        if isinstance(input_shape, int):
            input_shape = ShapeSpec(channels=input_shape)
        input_size = input_shape.channels * (input_shape.width or 1) * (input_shape.height or 1)
        self.cls_score = Linear(input_size, num_classes + 1)
        num_bbox_reg_classes = 1 if cls_agnostic_bbox_reg else num_classes
        self.bbox_pred = Linear(input_size, num_bbox_reg_classes * len(box2box_transform.weights))
        nn.init.normal_(self.cls_score.weight, std=0.01)
        nn.init.normal_(self.bbox_pred.weight, std=0.001)
        for layer in (self.cls_score, self.bbox_pred):
            nn.init.constant_(layer.bias, 0)
        self.box2box_transform = box2box_transform
        self.smooth_l1_beta = smooth_l1_beta
        self.test_score_thresh, self.test_nms_thresh = test_score_thresh, test_nms_thresh
        self.test_topk_per_image = test_topk_per_image

    @classmethod
    def from_config(cls, cfg, input_shape):
        return {
            "input_shape": input_shape,
            "box2box_transform": Box2BoxTransform(weights=cfg.MODEL.ROI_BOX_HEAD.BBOX_REG_WEIGHTS),
            "num_classes": cfg.MODEL.ROI_HEADS.NUM_CLASSES,
            "cls_agnostic_bbox_reg": cfg.MODEL.ROI_BOX_HEAD.CLS_AGNOSTIC_BBOX_REG,
            "smooth_l1_beta": cfg.MODEL.ROI_BOX_HEAD.SMOOTH_L1_BETA,
            "test_score_thresh": cfg.MODEL.ROI_HEADS.SCORE_THRESH_TEST,
            "test_nms_thresh": cfg.MODEL.ROI_HEADS.NMS_THRESH_TEST,
            "test_topk_per_image": cfg.TEST.DETECTIONS_PER_IMAGE,
        }

    def forward(self, x):
        """(scores (N, K + 1), proposal deltas (N, K * 4)) of per-region features."""
        if x.dim() > 2:
            x = torch.flatten(x, start_dim=1)
        return self.cls_score(x), self.bbox_pred(x)

    def losses(self, predictions, proposals) -> NoReturn:
        raise not_provided(f"{_WHERE}.FastRCNNOutputLayers.losses", "Fast R-CNN losses")

    def inference(self, predictions, proposals) -> NoReturn:
        raise not_provided(f"{_WHERE}.FastRCNNOutputLayers.inference", "box inference")

    def predict_boxes_for_gt_classes(self, predictions, proposals) -> NoReturn:
        raise not_provided(f"{_WHERE}.FastRCNNOutputLayers.predict_boxes_for_gt_classes", "box regression")

    def predict_boxes(self, predictions, proposals) -> NoReturn:
        raise not_provided(f"{_WHERE}.FastRCNNOutputLayers.predict_boxes", "box regression")

    def predict_probs(self, predictions, proposals) -> NoReturn:
        raise not_provided(f"{_WHERE}.FastRCNNOutputLayers.predict_probs", "box inference")
