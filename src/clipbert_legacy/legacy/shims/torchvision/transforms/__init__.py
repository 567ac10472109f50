"""torchvision.transforms: the transform classes and ``functional`` on PIL and torch; ``v2.functional`` for
transformers' image processors."""
from . import functional
from .transforms import (
    CenterCrop,
    ColorJitter,
    Compose,
    ConvertImageDtype,
    GaussianBlur,
    Grayscale,
    InterpolationMode,
    Lambda,
    Normalize,
    Pad,
    PILToTensor,
    RandomAffine,
    RandomApply,
    RandomChoice,
    RandomCrop,
    RandomGrayscale,
    RandomHorizontalFlip,
    RandomOrder,
    RandomResizedCrop,
    RandomRotation,
    RandomVerticalFlip,
    Resize,
    ToPILImage,
    ToTensor,
)

__all__ = ["functional", "CenterCrop", "ColorJitter", "Compose", "ConvertImageDtype", "GaussianBlur",
           "Grayscale", "InterpolationMode", "Lambda", "Normalize", "Pad", "PILToTensor", "RandomAffine",
           "RandomApply", "RandomChoice", "RandomCrop", "RandomGrayscale", "RandomHorizontalFlip",
           "RandomOrder", "RandomResizedCrop", "RandomRotation", "RandomVerticalFlip", "Resize", "ToPILImage",
           "ToTensor"]
