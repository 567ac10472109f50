"""detectron2's ``Box2BoxTransform``: its weights (they size the box predictor); applying deltas is detector
use and is one clear error."""
import math
from typing import NoReturn

from clipbert_legacy.legacy.shims._unsupported import not_provided

__all__ = ["Box2BoxTransform"]

_DEFAULT_SCALE_CLAMP = math.log(1000.0 / 16)


class Box2BoxTransform:
    def __init__(self, weights, scale_clamp=_DEFAULT_SCALE_CLAMP):
        self.weights = tuple(weights)
        self.scale_clamp = scale_clamp

    def get_deltas(self, src_boxes, target_boxes) -> NoReturn:
        raise not_provided("detectron2.modeling.box_regression.Box2BoxTransform.get_deltas", "box regression")

    def apply_deltas(self, deltas, boxes) -> NoReturn:
        raise not_provided("detectron2.modeling.box_regression.Box2BoxTransform.apply_deltas",
                           "box regression")
