"""detectron2's ``Backbone``: a module returning a dict of named feature maps, with their ``ShapeSpec``s."""
from torch import nn

from ...layers import ShapeSpec

__all__ = ["Backbone"]


class Backbone(nn.Module):
    """Subclasses set ``_out_features``, ``_out_feature_channels`` and ``_out_feature_strides``."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        raise NotImplementedError(f"{type(self).__name__}.forward: a Backbone subclass implements it")

    @property
    def size_divisibility(self):
        return 0

    def output_shape(self):
        """``{name: ShapeSpec(channels, stride)}`` of each output feature."""
        return {name: ShapeSpec(channels=self._out_feature_channels[name],
                                stride=self._out_feature_strides[name]) for name in self._out_features}
