"""torchvision.utils: ``make_grid`` and ``save_image`` (a batch of images tiled into one, as torchvision)."""
import math

import numpy as np
import torch
from PIL import Image

__all__ = ["make_grid", "save_image"]


def make_grid(tensor, nrow=8, padding=2, normalize=False, value_range=None, scale_each=False, pad_value=0.0):
    """(B, C, H, W) images (or a list of (C, H, W)) tiled ``nrow`` per row with ``padding`` pixels between."""
    if isinstance(tensor, (list, tuple)):
        tensor = torch.stack(list(tensor))
    if tensor.dim() == 2:
        tensor = tensor.unsqueeze(0)
    if tensor.dim() == 3:
        tensor = tensor.unsqueeze(0)
    if tensor.size(1) == 1:
        tensor = torch.cat((tensor, tensor, tensor), 1)
    if normalize:
        tensor = tensor.clone()
        parts = tensor if scale_each else [tensor]
        for t in parts:
            lo, hi = value_range if value_range is not None else (float(t.min()), float(t.max()))
            t.clamp_(min=lo, max=hi).sub_(lo).div_(max(hi - lo, 1e-5))
    if tensor.size(0) == 1:
        return tensor.squeeze(0)
    nmaps = tensor.size(0)
    xmaps = min(nrow, nmaps)
    ymaps = int(math.ceil(float(nmaps) / xmaps))
    height, width = int(tensor.size(2) + padding), int(tensor.size(3) + padding)
    grid = tensor.new_full((tensor.size(1), height * ymaps + padding, width * xmaps + padding), pad_value)
    k = 0
    for y in range(ymaps):
        for x in range(xmaps):
            if k >= nmaps:
                break
            grid[:, y * height + padding:(y + 1) * height, x * width + padding:(x + 1) * width] = tensor[k]
            k += 1
    return grid


def save_image(tensor, fp, format=None, **kwargs):
    """``make_grid(tensor, **kwargs)`` written as an 8-bit image (values in [0, 1] -> [0, 255], rounded)."""
    grid = make_grid(tensor, **kwargs)
    array = grid.mul(255).add_(0.5).clamp_(0, 255).permute(1, 2, 0).to("cpu", torch.uint8).numpy()
    Image.fromarray(np.ascontiguousarray(array)).save(fp, format=format)
