"""torchvision.transforms.v2: ``functional`` and the v1 classes under their v2 names."""
from ..transforms import (
    CenterCrop,
    Compose,
    Lambda,
    Normalize,
    Pad,
    RandomCrop,
    RandomHorizontalFlip,
    RandomResizedCrop,
    RandomVerticalFlip,
    Resize,
)
from . import functional

__all__ = ["functional", "CenterCrop", "Compose", "Lambda", "Normalize", "Pad", "RandomCrop",
           "RandomHorizontalFlip", "RandomResizedCrop", "RandomVerticalFlip", "Resize"]
