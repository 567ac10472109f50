"""Resize / pad / normalise video frames with ClipBERT's semantics (torch only, no torchvision).

Frames are float (T, 3, H, W) in [0, 255], RGB. ClipBERT resizes the longer side to
`max_img_size` (also upscaling), zero-pads right/bottom to a square, and later subtracts
`img_pixel_mean` (RGB order) / divides by `img_pixel_std` on the device.
"""
import torch
import torch.nn.functional as F


def get_resize_size(image, max_size):
    """(new_h, new_w) with the longer side == max_size and the other int(max_size * short / long)."""
    if isinstance(image, torch.Tensor):
        height, width = image.shape[-2:]
    else:  # PIL image
        width, height = image.size
    if height >= width:
        new_height, new_width = max_size, max_size * (width * 1. / height)
    else:
        new_width, new_height = max_size, max_size * (height * 1. / width)
    return int(new_height), int(new_width)


class ImageResize:
    """Resize so the longer side is `max_size` (ClipBERT: F.interpolate, align_corners=False)."""

    def __init__(self, max_size, interpolation="bilinear"):
        if not isinstance(max_size, int) or max_size <= 0:
            raise ValueError(f"max_img_size must be a positive int, got {max_size!r}")
        self.max_size = max_size
        self.interpolation = interpolation

    def __call__(self, img):
        if isinstance(img, torch.Tensor):
            size = get_resize_size(img, self.max_size)
            if tuple(img.shape[-2:]) == size:
                return img
            squeeze = img.dim() == 3
            x = img.unsqueeze(0) if squeeze else img
            kw = {} if self.interpolation == "nearest" else {"align_corners": False}
            x = F.interpolate(x.float(), size=size, mode=self.interpolation, **kw)
            return x.squeeze(0) if squeeze else x
        from PIL import Image  # PIL images only (ClipBERT's image path)
        h, w = get_resize_size(img, self.max_size)
        return img.resize((w, h), Image.BILINEAR)


class ImagePad:
    """Pad right and bottom with `fill` up to (max_h, max_w) (ClipBERT's ImagePad for tensors).

    As in ClipBERT the paddings are ``(0, max_w - w, 0, max_h - h)`` handed to ``F.pad``: a target
    smaller than the image gives a negative padding, which crops the right/bottom to (max_h, max_w).
    """

    def __init__(self, max_w, max_h, fill=0, padding_mode="constant"):
        self.max_w, self.max_h, self.fill, self.padding_mode = max_w, max_h, fill, padding_mode

    def __call__(self, img):
        h, w = img.shape[-2:]
        pad_w, pad_h = self.max_w - w, self.max_h - h
        if pad_w == 0 and pad_h == 0:
            return img
        return F.pad(img, (0, pad_w, 0, pad_h), mode=self.padding_mode, value=self.fill)


class ImageNorm:
    """Subtract mean / divide std per channel of (B, T, 3, H, W) in place (ClipBERT semantics).

    Divides by 255 first only if the input max is > 1 and all means are <= 1, so the shipped
    config (mean [123.675, 116.28, 103.53], std [1, 1, 1]) subtracts the mean from raw pixels.
    Mean/std are in the channel order of the tensor (RGB); the CNN flips to BGR afterwards.
    """

    def __init__(self, mean, std):
        if mean is None or std is None or len(mean) != 3 or len(std) != 3:
            raise ValueError(f"img_pixel_mean/img_pixel_std must be 3 numbers each, got {mean!r}/{std!r}")
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 1, 3, 1, 1)
        self._cache = {}

    def _stats(self, img):
        key = (img.device, img.dtype)
        if key not in self._cache:
            self._cache[key] = (self.mean.to(img.device, img.dtype), self.std.to(img.device, img.dtype))
        return self._cache[key]

    def __call__(self, img):
        mean, std = self._stats(img)
        shape = (1,) * (img.dim() - 3) + (3, 1, 1)
        mean, std = mean.view(shape), std.view(shape)
        if torch.max(img) > 1 and self.mean.max() <= 1:
            img.div_(255.)
        return img.sub_(mean).div_(std)


def resize_and_pad(frames, max_img_size):
    """uint8/float (T, 3, H, W) -> float (T, 3, max, max): ClipBERT's per-video pipeline steps 3-5."""
    x = ImageResize(max_img_size, "bilinear")(frames.to(torch.float32, memory_format=torch.contiguous_format))
    return ImagePad(max_img_size, max_img_size)(x)
