"""detectron2's ``BoxMode`` (absolute XYXY / XYWH conversion), ``Boxes`` (an (N, 4) tensor of xyxy boxes) and
``pairwise_iou``: the plain box bookkeeping a fork's data code does. Relative and rotated modes are one clear
error."""
from enum import IntEnum

import numpy as np
import torch

from clipbert_legacy.legacy.shims._box_ops import box_iou
from clipbert_legacy.legacy.shims._unsupported import not_provided

__all__ = ["BoxMode", "Boxes", "pairwise_iou"]


class BoxMode(IntEnum):
    XYXY_ABS = 0
    XYWH_ABS = 1
    XYXY_REL = 2
    XYWH_REL = 3
    XYWHA_ABS = 4

    @staticmethod
    def convert(box, from_mode, to_mode):
        """``box`` (a list / tuple of 4, or an (N, 4) array / tensor) from one absolute mode to the other,
        in the type it came in."""
        if from_mode == to_mode:
            return box
        modes = {BoxMode.XYXY_ABS, BoxMode.XYWH_ABS}
        if from_mode not in modes or to_mode not in modes:
            raise not_provided("detectron2.structures.BoxMode.convert",
                               f"{BoxMode(from_mode).name} -> {BoxMode(to_mode).name}: relative or "
                               "rotated boxes")
        original = type(box)
        single = isinstance(box, (list, tuple))
        arr = torch.tensor(box, dtype=torch.float64)[None] if single else (
            torch.from_numpy(np.asarray(box)).clone() if isinstance(box, np.ndarray) else box.clone())
        if to_mode == BoxMode.XYXY_ABS:
            arr[:, 2] += arr[:, 0]
            arr[:, 3] += arr[:, 1]
        else:
            arr[:, 2] -= arr[:, 0]
            arr[:, 3] -= arr[:, 1]
        if single:
            return original(arr.flatten().tolist())
        return arr.numpy() if isinstance(box, np.ndarray) else arr


class Boxes:
    """(N, 4) float boxes (x1, y1, x2, y2)."""

    def __init__(self, tensor):
        device = tensor.device if isinstance(tensor, torch.Tensor) else torch.device("cpu")
        tensor = torch.as_tensor(tensor, dtype=torch.float32, device=device)
        if tensor.numel() == 0:
            tensor = tensor.reshape(0, 4)
        if tensor.dim() != 2 or tensor.size(-1) != 4:
            raise ValueError(f"Boxes takes an (N, 4) tensor, got shape {tuple(tensor.shape)}")
        self.tensor = tensor

    def clone(self):
        return Boxes(self.tensor.clone())

    def to(self, *args, **kwargs):
        return Boxes(self.tensor.to(*args, **kwargs))

    @property
    def device(self):
        return self.tensor.device

    def area(self):
        b = self.tensor
        return (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])

    def clip(self, box_size):
        """Clamp to an image of ``(height, width)``, in place."""
        h, w = box_size
        self.tensor[:, 0].clamp_(min=0, max=w)
        self.tensor[:, 1].clamp_(min=0, max=h)
        self.tensor[:, 2].clamp_(min=0, max=w)
        self.tensor[:, 3].clamp_(min=0, max=h)

    def nonempty(self, threshold=0.0):
        b = self.tensor
        return ((b[:, 2] - b[:, 0]) > threshold) & ((b[:, 3] - b[:, 1]) > threshold)

    def get_centers(self):
        return (self.tensor[:, :2] + self.tensor[:, 2:]) / 2

    def __getitem__(self, item):
        if isinstance(item, int):
            return Boxes(self.tensor[item].view(1, -1))
        return Boxes(self.tensor[item])

    def __len__(self):
        return self.tensor.shape[0]

    def __iter__(self):
        yield from self.tensor

    def __repr__(self):
        return f"Boxes({self.tensor})"

    @classmethod
    def cat(cls, boxes_list):
        if not boxes_list:
            return cls(torch.empty(0, 4))
        return cls(torch.cat([b.tensor for b in boxes_list], dim=0))


def pairwise_iou(boxes1: Boxes, boxes2: Boxes) -> torch.Tensor:
    """(N, M) IoU between two ``Boxes``."""
    return box_iou(boxes1.tensor, boxes2.tensor)
