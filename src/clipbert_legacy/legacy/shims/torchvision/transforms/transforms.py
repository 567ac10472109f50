"""torchvision's transform classes over :mod:`.functional`, drawing their random parameters as torchvision
does (``torch.rand`` / ``torch.randint`` / ``torch.empty().uniform_``, in the same order), so a seeded run
draws the same crops and flips."""
import math
import numbers

import torch
from torch import nn

from clipbert_legacy.legacy.shims._unsupported import unsupported_class

from . import functional as F
from .functional import InterpolationMode

__all__ = ["Compose", "ToTensor", "PILToTensor", "ToPILImage", "ConvertImageDtype", "Normalize", "Resize",
           "CenterCrop", "RandomCrop", "RandomResizedCrop", "RandomHorizontalFlip", "RandomVerticalFlip",
           "Pad", "Lambda", "RandomApply", "RandomChoice", "RandomOrder", "Grayscale", "InterpolationMode",
           "ColorJitter", "RandomRotation", "RandomAffine", "GaussianBlur", "RandomGrayscale"]

_WHAT = "colour and geometric augmentation"
ColorJitter = unsupported_class("torchvision.transforms.ColorJitter", _WHAT, bases=(nn.Module,))
RandomRotation = unsupported_class("torchvision.transforms.RandomRotation", _WHAT, bases=(nn.Module,))
RandomAffine = unsupported_class("torchvision.transforms.RandomAffine", _WHAT, bases=(nn.Module,))
GaussianBlur = unsupported_class("torchvision.transforms.GaussianBlur", _WHAT, bases=(nn.Module,))


def _pair(size, name):
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    if len(size) == 1:
        return int(size[0]), int(size[0])
    if len(size) != 2:
        raise ValueError(f"{name}: size {size} must be one number or (height, width)")
    return int(size[0]), int(size[1])


class Compose:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, img):
        for t in self.transforms:
            img = t(img)
        return img

    def __repr__(self):
        return "Compose(" + "".join(f"\n    {t}" for t in self.transforms) + "\n)"


class ToTensor:
    def __call__(self, pic):
        return F.to_tensor(pic)


class PILToTensor:
    def __call__(self, pic):
        return F.pil_to_tensor(pic)


class ToPILImage:
    def __init__(self, mode=None):
        self.mode = mode

    def __call__(self, pic):
        return F.to_pil_image(pic, self.mode)


class ConvertImageDtype(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, image):
        return F.convert_image_dtype(image, self.dtype)


class Lambda:
    def __init__(self, lambd):
        if not callable(lambd):
            raise TypeError(f"Lambda takes a callable, got {type(lambd).__name__}")
        self.lambd = lambd

    def __call__(self, img):
        return self.lambd(img)


class Normalize(nn.Module):
    def __init__(self, mean, std, inplace=False):
        super().__init__()
        self.mean, self.std, self.inplace = mean, std, inplace

    def forward(self, tensor):
        return F.normalize(tensor, self.mean, self.std, self.inplace)

    def __repr__(self):
        return f"Normalize(mean={self.mean}, std={self.std})"


class Resize(nn.Module):
    def __init__(self, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
        super().__init__()
        self.size, self.max_size, self.antialias = size, max_size, antialias
        self.interpolation = F._interpolation(interpolation)

    def forward(self, img):
        return F.resize(img, self.size, self.interpolation, self.max_size, self.antialias)

    def __repr__(self):
        return f"Resize(size={self.size}, interpolation={self.interpolation.value})"


class CenterCrop(nn.Module):
    def __init__(self, size):
        super().__init__()
        self.size = _pair(size, "CenterCrop")

    def forward(self, img):
        return F.center_crop(img, self.size)


class Pad(nn.Module):
    def __init__(self, padding, fill=0, padding_mode="constant"):
        super().__init__()
        self.padding, self.fill, self.padding_mode = padding, fill, padding_mode

    def forward(self, img):
        return F.pad(img, self.padding, self.fill, self.padding_mode)


class RandomCrop(nn.Module):
    def __init__(self, size, padding=None, pad_if_needed=False, fill=0, padding_mode="constant"):
        super().__init__()
        self.size = _pair(size, "RandomCrop")
        self.padding, self.pad_if_needed = padding, pad_if_needed
        self.fill, self.padding_mode = fill, padding_mode

    @staticmethod
    def get_params(img, output_size):
        _, h, w = F.get_dimensions(img)
        th, tw = output_size
        if h < th or w < tw:
            raise ValueError(f"RandomCrop: crop size {(th, tw)} is larger than the image {(h, w)}")
        if w == tw and h == th:
            return 0, 0, h, w
        i = torch.randint(0, h - th + 1, size=(1,)).item()
        j = torch.randint(0, w - tw + 1, size=(1,)).item()
        return i, j, th, tw

    def forward(self, img):
        if self.padding is not None:
            img = F.pad(img, self.padding, self.fill, self.padding_mode)
        _, h, w = F.get_dimensions(img)
        if self.pad_if_needed and w < self.size[1]:
            img = F.pad(img, [self.size[1] - w, 0], self.fill, self.padding_mode)
        if self.pad_if_needed and h < self.size[0]:
            img = F.pad(img, [0, self.size[0] - h], self.fill, self.padding_mode)
        return F.crop(img, *self.get_params(img, self.size))


class RandomResizedCrop(nn.Module):
    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0),
                 interpolation=InterpolationMode.BILINEAR, antialias=True):
        super().__init__()
        self.size = _pair(size, "RandomResizedCrop")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            raise ValueError(f"RandomResizedCrop: scale {scale} and ratio {ratio} must be (min, max)")
        self.scale, self.ratio, self.antialias = scale, ratio, antialias
        self.interpolation = F._interpolation(interpolation)

    @staticmethod
    def get_params(img, scale, ratio):
        """(top, left, height, width): up to 10 random tries at an area in ``scale`` and an aspect ratio in
        ``ratio`` (log-uniform), else the centre crop clamped to ``ratio``."""
        _, height, width = F.get_dimensions(img)
        area = height * width
        log_ratio = torch.log(torch.tensor(ratio))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
            aspect_ratio = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                i = torch.randint(0, height - h + 1, size=(1,)).item()
                j = torch.randint(0, width - w + 1, size=(1,)).item()
                return i, j, h, w
        in_ratio = float(width) / float(height)
        if in_ratio < min(ratio):
            w, h = width, int(round(width / min(ratio)))
        elif in_ratio > max(ratio):
            h, w = height, int(round(height * max(ratio)))
        else:
            w, h = width, height
        return (height - h) // 2, (width - w) // 2, h, w

    def forward(self, img):
        i, j, h, w = self.get_params(img, self.scale, self.ratio)
        return F.resized_crop(img, i, j, h, w, self.size, self.interpolation, antialias=self.antialias)


class RandomHorizontalFlip(nn.Module):
    def __init__(self, p=0.5):
        super().__init__()
        self.p = p

    def forward(self, img):
        return F.hflip(img) if torch.rand(1) < self.p else img


class RandomVerticalFlip(nn.Module):
    def __init__(self, p=0.5):
        super().__init__()
        self.p = p

    def forward(self, img):
        return F.vflip(img) if torch.rand(1) < self.p else img


class RandomApply(nn.Module):
    def __init__(self, transforms, p=0.5):
        super().__init__()
        self.transforms, self.p = transforms, p

    def forward(self, img):
        if self.p < torch.rand(1):
            return img
        for t in self.transforms:
            img = t(img)
        return img


class RandomChoice:
    def __init__(self, transforms, p=None):
        self.transforms, self.p = list(transforms), p

    def __call__(self, *args):
        n = len(self.transforms)
        weights = torch.ones(n) if self.p is None else torch.tensor(self.p, dtype=torch.float)
        return self.transforms[int(torch.multinomial(weights, 1))](*args)


class RandomOrder:
    def __init__(self, transforms):
        self.transforms = list(transforms)

    def __call__(self, img):
        for i in torch.randperm(len(self.transforms)).tolist():
            img = self.transforms[i](img)
        return img


class Grayscale(nn.Module):
    def __init__(self, num_output_channels=1):
        super().__init__()
        self.num_output_channels = num_output_channels

    def forward(self, img):
        return F.rgb_to_grayscale(img, self.num_output_channels)


class RandomGrayscale(nn.Module):
    def __init__(self, p=0.1):
        super().__init__()
        self.p = p

    def forward(self, img):
        channels, _, _ = F.get_dimensions(img)
        return F.rgb_to_grayscale(img, channels) if torch.rand(1) < self.p else img
