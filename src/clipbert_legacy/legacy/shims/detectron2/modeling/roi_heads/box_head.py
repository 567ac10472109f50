"""detectron2's box heads: ``FastRCNNConvFCHead`` (``conv<k>`` 3x3 convs with norm + ReLU, then ``fc<k>``
linear + ReLU), its registry and ``build_box_head``. Its forward is plain layers and runs."""
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ...layers import Conv2d, Linear, ShapeSpec, get_norm
from ...utils.registry import Registry, lookup

__all__ = ["ROI_BOX_HEAD_REGISTRY", "FastRCNNConvFCHead", "build_box_head"]

ROI_BOX_HEAD_REGISTRY = Registry("ROI_BOX_HEAD")


def _msra_fill(module):
    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    if module.bias is not None:
        nn.init.constant_(module.bias, 0)


def _xavier_fill(module):
    nn.init.kaiming_uniform_(module.weight, a=1)
    if module.bias is not None:
        nn.init.constant_(module.bias, 0)


@ROI_BOX_HEAD_REGISTRY.register()
class FastRCNNConvFCHead(nn.Module):
    def __init__(self, cfg, input_shape: ShapeSpec):
        super().__init__()
        h = cfg.MODEL.ROI_BOX_HEAD
        if h.NUM_CONV + h.NUM_FC <= 0:
            raise ValueError("FastRCNNConvFCHead needs MODEL.ROI_BOX_HEAD.NUM_CONV + NUM_FC > 0")
        self._output_size = (input_shape.channels, input_shape.height, input_shape.width)
        self.conv_norm_relus, self.fcs = [], []
        for k in range(h.NUM_CONV):
            conv = Conv2d(self._output_size[0], h.CONV_DIM, kernel_size=3, padding=1, bias=not h.NORM,
                          norm=get_norm(h.NORM, h.CONV_DIM), activation=F.relu)
            self.add_module(f"conv{k + 1}", conv)
            self.conv_norm_relus.append(conv)
            self._output_size = (h.CONV_DIM, self._output_size[1], self._output_size[2])
        for k in range(h.NUM_FC):
            fc = Linear(int(np.prod(self._output_size)), h.FC_DIM)
            self.add_module(f"fc{k + 1}", fc)
            self.fcs.append(fc)
            self._output_size = h.FC_DIM
        for layer in self.conv_norm_relus:
            _msra_fill(layer)
        for layer in self.fcs:
            _xavier_fill(layer)

    def forward(self, x):
        for layer in self.conv_norm_relus:
            x = layer(x)
        if self.fcs:
            if x.dim() > 2:
                x = torch.flatten(x, start_dim=1)
            for layer in self.fcs:
                x = F.relu(layer(x))
        return x

    @property
    def output_shape(self):
        o = self._output_size
        if isinstance(o, int):
            return ShapeSpec(channels=o)
        return ShapeSpec(channels=o[0], height=o[1], width=o[2])


def build_box_head(cfg, input_shape):
    """The head named by ``MODEL.ROI_BOX_HEAD.NAME``."""
    head = lookup(ROI_BOX_HEAD_REGISTRY, cfg.MODEL.ROI_BOX_HEAD.NAME, "MODEL.ROI_BOX_HEAD.NAME")
    return head(cfg, input_shape)
