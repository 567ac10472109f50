"""detectron2's thin layer wrappers: ``Conv2d`` with ``norm`` / ``activation`` (the project's Conv2dNorm,
so keys are ``<conv>.weight``, ``<conv>.norm.*``), ``Linear``, ``ConvTranspose2d``, ``interpolate``,
``cat``."""
import torch
from torch import nn
from torch.nn import functional as F

from clipbert_legacy.modeling.backbone import Conv2dNorm

__all__ = ["Conv2d", "Linear", "ConvTranspose2d", "BatchNorm2d", "interpolate", "cat", "nonzero_tuple"]

Linear = nn.Linear
ConvTranspose2d = nn.ConvTranspose2d
BatchNorm2d = nn.BatchNorm2d
interpolate = F.interpolate


class Conv2d(Conv2dNorm):
    """``nn.Conv2d`` + optional ``norm`` module + optional ``activation`` callable, as detectron2's."""

    def __init__(self, *args, **kwargs):
        norm = kwargs.pop("norm", None)
        activation = kwargs.pop("activation", None)
        super().__init__(*args, norm=norm, **kwargs)
        self.activation = activation

    def forward(self, x):
        x = super().forward(x)
        return self.activation(x) if self.activation is not None else x


def cat(tensors, dim=0):
    """``torch.cat`` that returns a single tensor as is (no copy), as detectron2's."""
    assert isinstance(tensors, (list, tuple))
    return tensors[0] if len(tensors) == 1 else torch.cat(tensors, dim)


def nonzero_tuple(x):
    """``x.nonzero(as_tuple=True)``."""
    return x.nonzero(as_tuple=True)
