"""detectron2's ``ShapeSpec``: the channels / height / width / stride of a feature map, any of them None."""
from collections import namedtuple

__all__ = ["ShapeSpec"]


class ShapeSpec(namedtuple("_ShapeSpec", ["channels", "height", "width", "stride"])):
    """``ShapeSpec(channels=2048, stride=32)``; unset fields are None, as in detectron2."""

    def __new__(cls, channels=None, height=None, width=None, stride=None):
        return super().__new__(cls, channels, height, width, stride)
