"""detectron2's ``ImageList``: images of different sizes padded into one (N, C, H, W) tensor."""
import torch
from torch.nn import functional as F

__all__ = ["ImageList"]


class ImageList:
    def __init__(self, tensor, image_sizes):
        self.tensor, self.image_sizes = tensor, list(image_sizes)

    def __len__(self):
        return len(self.image_sizes)

    def __getitem__(self, idx):
        h, w = self.image_sizes[idx]
        return self.tensor[idx, ..., :h, :w]

    def to(self, *args, **kwargs):
        return ImageList(self.tensor.to(*args, **kwargs), self.image_sizes)

    @property
    def device(self):
        return self.tensor.device

    @staticmethod
    def from_tensors(tensors, size_divisibility=0, pad_value=0.0):
        """Pad (C, H, W) tensors bottom-right to a common size (a multiple of ``size_divisibility``)."""
        max_h = max(t.shape[-2] for t in tensors)
        max_w = max(t.shape[-1] for t in tensors)
        if size_divisibility > 1:
            s = size_divisibility
            max_h, max_w = (max_h + s - 1) // s * s, (max_w + s - 1) // s * s
        padded = [F.pad(t, (0, max_w - t.shape[-1], 0, max_h - t.shape[-2]), value=pad_value)
                  for t in tensors]
        return ImageList(torch.stack(padded).contiguous(), [tuple(t.shape[-2:]) for t in tensors])
