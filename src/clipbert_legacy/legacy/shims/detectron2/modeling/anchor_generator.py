"""detectron2's ``DefaultAnchorGenerator`` as built by the RPN: its cell anchors are (persistent) buffers,
``cell_anchors.<i>``, so they are part of a detectron2 model's state dict and of ClipBERT's checkpoints.
Generating anchors over an image is detector use and is one clear error."""
import math
from typing import NoReturn

import torch
from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided

from ..utils.registry import Registry, lookup

__all__ = ["ANCHOR_GENERATOR_REGISTRY", "DefaultAnchorGenerator", "build_anchor_generator", "BufferList"]

ANCHOR_GENERATOR_REGISTRY = Registry("ANCHOR_GENERATOR")


class BufferList(nn.Module):
    """Tensors registered as buffers ``0``, ``1``, ... (moved with the module, saved in its state dict)."""

    def __init__(self, buffers=None):
        super().__init__()
        for i, buffer in enumerate(buffers or []):
            self.register_buffer(str(i), buffer)

    def __len__(self):
        return len(self._buffers)

    def __iter__(self):
        return iter(self._buffers.values())


def generate_cell_anchors(sizes=(32, 64, 128, 256, 512), aspect_ratios=(0.5, 1, 2)):
    """(len(sizes) * len(aspect_ratios), 4) anchors (x0, y0, x1, y1) centred on 0, sizes outer, ratios
    inner."""
    anchors = []
    for size in sizes:
        area = size ** 2.0
        for ratio in aspect_ratios:
            w = math.sqrt(area / ratio)
            h = ratio * w
            anchors.append([-w / 2.0, -h / 2.0, w / 2.0, h / 2.0])
    return torch.tensor(anchors)


@ANCHOR_GENERATOR_REGISTRY.register()
class DefaultAnchorGenerator(nn.Module):
    def __init__(self, cfg, input_shape):
        super().__init__()
        sizes = [list(s) for s in cfg.MODEL.ANCHOR_GENERATOR.SIZES]
        ratios = [list(a) for a in cfg.MODEL.ANCHOR_GENERATOR.ASPECT_RATIOS]
        self.strides = [s.stride for s in input_shape]
        self.offset = cfg.MODEL.ANCHOR_GENERATOR.OFFSET
        if not 0.0 <= self.offset < 1.0:
            raise ValueError(f"MODEL.ANCHOR_GENERATOR.OFFSET={self.offset} must be in [0, 1)")
        self.num_features = len(self.strides)
        sizes = sizes * self.num_features if len(sizes) == 1 else sizes
        ratios = ratios * self.num_features if len(ratios) == 1 else ratios
        if not len(sizes) == len(ratios) == self.num_features:
            raise ValueError(f"MODEL.ANCHOR_GENERATOR: {len(sizes)} size lists and {len(ratios)} ratio "
                             f"lists for "
                             f"{self.num_features} feature maps")
        self.cell_anchors = BufferList([generate_cell_anchors(s, a).float() for s, a in zip(sizes, ratios)])

    @property
    def box_dim(self):
        return 4

    @property
    def num_cell_anchors(self):
        return [len(a) for a in self.cell_anchors]

    def forward(self, features) -> NoReturn:
        raise not_provided("detectron2.modeling.anchor_generator.DefaultAnchorGenerator.forward",
                           "anchors over an image")


def build_anchor_generator(cfg, input_shape):
    """The generator named by ``cfg.MODEL.ANCHOR_GENERATOR.NAME``."""
    name = cfg.MODEL.ANCHOR_GENERATOR.NAME
    return lookup(ANCHOR_GENERATOR_REGISTRY, name, "MODEL.ANCHOR_GENERATOR.NAME")(cfg, input_shape)
