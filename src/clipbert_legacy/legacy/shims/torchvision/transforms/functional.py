"""torchvision.transforms.functional on PIL and torch: the conversions, resizing, cropping, padding, flips and
normalisation that video-and-language forks (and transformers' image processors) call, with torchvision's
rules (a resize to an int matches the shorter edge; a crop past the border is zero padded; a float tensor
becomes a PIL image by ``mul(255).byte()``). Colour jitter and affine warps are one clear error."""
import numbers
from enum import Enum

import numpy as np
import torch
from PIL import Image, ImageOps
from torch.nn import functional as F

from clipbert_legacy.legacy.shims._unsupported import unsupported_function

__all__ = ["InterpolationMode", "to_tensor", "pil_to_tensor", "to_pil_image", "normalize", "resize", "crop",
           "center_crop", "resized_crop", "pad", "hflip", "vflip", "convert_image_dtype", "get_image_size",
           "get_dimensions", "rgb_to_grayscale", "to_grayscale", "adjust_brightness", "adjust_contrast",
           "adjust_saturation", "adjust_hue", "rotate", "affine", "perspective", "gaussian_blur"]


class InterpolationMode(Enum):
    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


_PIL_MODES = {InterpolationMode.NEAREST: Image.NEAREST, InterpolationMode.NEAREST_EXACT: Image.NEAREST,
              InterpolationMode.BILINEAR: Image.BILINEAR, InterpolationMode.BICUBIC: Image.BICUBIC,
              InterpolationMode.BOX: Image.BOX, InterpolationMode.HAMMING: Image.HAMMING,
              InterpolationMode.LANCZOS: Image.LANCZOS}
_FROM_PIL = {v: k for k, v in reversed(list(_PIL_MODES.items()))}

_WHAT = "colour and geometric augmentation"
adjust_brightness = unsupported_function("torchvision.transforms.functional.adjust_brightness", _WHAT)
adjust_contrast = unsupported_function("torchvision.transforms.functional.adjust_contrast", _WHAT)
adjust_saturation = unsupported_function("torchvision.transforms.functional.adjust_saturation", _WHAT)
adjust_hue = unsupported_function("torchvision.transforms.functional.adjust_hue", _WHAT)
rotate = unsupported_function("torchvision.transforms.functional.rotate", _WHAT)
affine = unsupported_function("torchvision.transforms.functional.affine", _WHAT)
perspective = unsupported_function("torchvision.transforms.functional.perspective", _WHAT)
gaussian_blur = unsupported_function("torchvision.transforms.functional.gaussian_blur", _WHAT)


def _interpolation(mode):
    """An InterpolationMode from itself, its value or a PIL constant (torchvision's older API)."""
    if isinstance(mode, InterpolationMode):
        return mode
    if isinstance(mode, str):
        return InterpolationMode(mode)
    if mode in _FROM_PIL:
        return _FROM_PIL[mode]
    raise TypeError(f"interpolation {mode!r}: give a torchvision InterpolationMode (or a PIL "
                    "resample constant)")


def _is_pil(img):
    return isinstance(img, Image.Image)


def get_dimensions(img):
    """``[channels, height, width]``."""
    if _is_pil(img):
        return [len(img.getbands()), img.height, img.width]
    return [1 if img.dim() == 2 else img.shape[-3], img.shape[-2], img.shape[-1]]


def get_image_size(img):
    """``[width, height]``."""
    _, h, w = get_dimensions(img)
    return [w, h]


def pil_to_tensor(pic):
    """A PIL image as a (C, H, W) tensor of its own dtype (no scaling)."""
    if not _is_pil(pic):
        raise TypeError(f"pil_to_tensor takes a PIL image, got {type(pic).__name__}")
    array = np.array(pic, copy=True)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def to_tensor(pic):
    """PIL image or (H, W[, C]) ndarray -> (C, H, W) float tensor; 8-bit values are divided by 255."""
    if isinstance(pic, np.ndarray):
        array = pic[:, :, None] if pic.ndim == 2 else pic
        tensor = torch.from_numpy(np.ascontiguousarray(array.transpose(2, 0, 1)))
        return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor
    tensor = pil_to_tensor(pic.convert("RGB") if pic.mode in ("P", "CMYK", "YCbCr") else pic)
    if pic.mode == "1":
        return tensor.float()
    return tensor.float().div(255) if tensor.dtype == torch.uint8 else tensor.float()


def to_pil_image(pic, mode=None):
    """(C, H, W) tensor or (H, W, C) ndarray -> PIL image; floats become ``mul(255).byte()``, as
    torchvision."""
    if isinstance(pic, torch.Tensor):
        if pic.dim() == 2:
            pic = pic.unsqueeze(0)
        if pic.is_floating_point() and mode != "F":
            pic = pic.mul(255).byte()
        array = pic.permute(1, 2, 0).cpu().numpy()
    else:
        array = pic[:, :, None] if pic.ndim == 2 else pic
    if array.shape[2] == 1:
        array = array[:, :, 0]
    return Image.fromarray(np.ascontiguousarray(array), mode=mode)


def normalize(tensor, mean, std, inplace=False):
    """``(tensor - mean) / std`` per channel of a float (..., C, H, W) tensor."""
    if not tensor.is_floating_point():
        raise TypeError(f"normalize takes a float tensor, got {tensor.dtype}")
    mean = torch.as_tensor(mean, dtype=tensor.dtype, device=tensor.device)
    std = torch.as_tensor(std, dtype=tensor.dtype, device=tensor.device)
    if (std == 0).any():
        raise ValueError(f"normalize: std {std.tolist()} has a zero, which would divide by zero")
    out = tensor if inplace else tensor.clone()
    return out.sub_(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))


def _resize_size(h, w, size, max_size):
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return int(size[0]), int(size[1])
    requested = int(size[0] if isinstance(size, (list, tuple)) else size)
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = requested, int(requested * long / short)
    if max_size is not None:
        if max_size <= requested:
            raise ValueError(f"max_size={max_size} must be larger than the requested size {requested}")
        if new_long > max_size:
            new_short, new_long = int(max_size * new_short / new_long), max_size
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    return new_h, new_w


def resize(img, size, interpolation=InterpolationMode.BILINEAR, max_size=None, antialias=True):
    """Resize to ``size`` (h, w), or the shorter edge to ``size`` keeping the aspect ratio (the longer edge at
    most ``max_size``). PIL images resize with PIL; tensors with ``F.interpolate`` (antialiased for
    bilinear / bicubic unless ``antialias=False``)."""
    mode = _interpolation(interpolation)
    _, h, w = get_dimensions(img)
    new_h, new_w = _resize_size(h, w, size, max_size)
    if (new_h, new_w) == (h, w):
        return img
    if _is_pil(img):
        return img.resize((new_w, new_h), _PIL_MODES[mode])
    if mode not in (InterpolationMode.NEAREST, InterpolationMode.NEAREST_EXACT, InterpolationMode.BILINEAR,
                    InterpolationMode.BICUBIC):
        raise ValueError(f"resize of a tensor with {mode.name}: use NEAREST, NEAREST_EXACT, BILINEAR "
                         "or BICUBIC")
    batch = img.reshape(-1, *img.shape[-3:]) if img.dim() >= 3 else img[None, None]
    dtype = batch.dtype
    smooth = mode in (InterpolationMode.BILINEAR, InterpolationMode.BICUBIC)
    # as torchvision: uint8 stays uint8 for nearest and for bilinear on the CPU (torch's uint8 kernel); any
    # other integer case is computed in float32, then rounded (bicubic clamped first)
    native = batch.is_floating_point() or not smooth or (
        dtype == torch.uint8 and mode == InterpolationMode.BILINEAR and batch.device.type == "cpu")
    x = batch if native else batch.float()
    out = F.interpolate(x, size=(new_h, new_w), mode=mode.value, align_corners=False if smooth else None,
                        antialias=bool(antialias) and smooth)
    if not native:
        if mode == InterpolationMode.BICUBIC:
            out = out.clamp(0, 255)
        out = out.round().to(dtype)
    return out.reshape(*img.shape[:-2], new_h, new_w)


def crop(img, top, left, height, width):
    """The (height, width) window at (top, left); the part outside the image is zero."""
    if _is_pil(img):
        return img.crop((left, top, left + width, top + height))
    _, h, w = get_dimensions(img)
    right, bottom = left + width, top + height
    out = img[..., max(top, 0):min(bottom, h), max(left, 0):min(right, w)]
    pads = [max(-left, 0), max(right - w, 0), max(-top, 0), max(bottom - h, 0)]
    return F.pad(out, pads, value=0) if any(pads) else out


def center_crop(img, output_size):
    """The centred window of ``output_size`` (int or (h, w)); top / left rounded as torchvision."""
    if isinstance(output_size, numbers.Number):
        output_size = (int(output_size), int(output_size))
    elif len(output_size) == 1:
        output_size = (output_size[0], output_size[0])
    th, tw = output_size
    _, h, w = get_dimensions(img)
    if tw > w or th > h:
        pads = [(tw - w) // 2 if tw > w else 0, (th - h) // 2 if th > h else 0,
                (tw - w + 1) // 2 if tw > w else 0, (th - h + 1) // 2 if th > h else 0]
        img = pad(img, pads, fill=0)
        _, h, w = get_dimensions(img)
        if (h, w) == (th, tw):
            return img
    return crop(img, int(round((h - th) / 2.0)), int(round((w - tw) / 2.0)), th, tw)


def resized_crop(img, top, left, height, width, size, interpolation=InterpolationMode.BILINEAR,
                 antialias=True):
    return resize(crop(img, top, left, height, width), size, interpolation, antialias=antialias)


def _pad4(padding):
    if isinstance(padding, numbers.Number):
        return [int(padding)] * 4
    padding = [int(p) for p in padding]
    if len(padding) == 1:
        return padding * 4
    if len(padding) == 2:
        return [padding[0], padding[1], padding[0], padding[1]]
    if len(padding) == 4:
        return padding
    raise ValueError(f"padding {padding}: give 1, 2 or 4 numbers (left, top, right, bottom)")


_NP_MODES = {"edge": "edge", "reflect": "reflect", "symmetric": "symmetric"}


def pad(img, padding, fill=0, padding_mode="constant"):
    """Pad (left, top, right, bottom); ``padding_mode`` constant (``fill``), edge, reflect or symmetric."""
    left, top, right, bottom = _pad4(padding)
    if padding_mode not in ("constant", *_NP_MODES):
        raise ValueError(f"padding_mode {padding_mode!r}: one of constant, edge, reflect, symmetric")
    if _is_pil(img):
        if padding_mode == "constant":
            bands = len(img.getbands())
            if isinstance(fill, numbers.Number) and bands > 1:  # a number fills every band, as torchvision
                fill = (int(fill),) * bands
            return ImageOps.expand(img, border=(left, top, right, bottom), fill=fill)
        array = np.asarray(img)
        widths = ((top, bottom), (left, right)) + (((0, 0),) if array.ndim == 3 else ())
        return Image.fromarray(np.pad(array, widths, mode=_NP_MODES[padding_mode]), mode=img.mode)
    if padding_mode == "constant":
        return F.pad(img, [left, right, top, bottom], mode="constant", value=fill)
    array = img.cpu().numpy()
    widths = [(0, 0)] * (array.ndim - 2) + [(top, bottom), (left, right)]
    return torch.from_numpy(np.pad(array, widths, mode=_NP_MODES[padding_mode])).to(img.device)


def hflip(img):
    return img.transpose(Image.FLIP_LEFT_RIGHT) if _is_pil(img) else img.flip(-1)


def vflip(img):
    return img.transpose(Image.FLIP_TOP_BOTTOM) if _is_pil(img) else img.flip(-2)


def convert_image_dtype(image, dtype=torch.float):
    """Cast keeping the value range: ints scale to [0, 1] floats and back, as torchvision."""
    if image.dtype == dtype:
        return image
    if image.is_floating_point():
        if torch.empty(0, dtype=dtype).is_floating_point():
            return image.to(dtype)
        eps = 1e-3
        max_val = float(torch.iinfo(dtype).max)
        return image.mul(max_val + 1.0 - eps).to(dtype)
    input_max = float(torch.iinfo(image.dtype).max)
    if torch.empty(0, dtype=dtype).is_floating_point():
        return image.to(dtype).div(input_max)
    output_max = float(torch.iinfo(dtype).max)
    if input_max > output_max:
        factor = int((input_max + 1) // (output_max + 1))
        return torch.div(image, factor, rounding_mode="floor").to(dtype)
    factor = int((output_max + 1) // (input_max + 1))
    return image.to(dtype).mul(factor)


def rgb_to_grayscale(img, num_output_channels=1):
    """ITU-R 601-2 luma (0.2989 R + 0.587 G + 0.114 B), as torchvision; PIL images through
    ``convert("L")``."""
    if num_output_channels not in (1, 3):
        raise ValueError(f"num_output_channels={num_output_channels}: 1 or 3")
    if _is_pil(img):
        gray = img.convert("L")
        return gray if num_output_channels == 1 else Image.merge("RGB", [gray, gray, gray])
    r, g, b = img.unbind(dim=-3)
    gray = (0.2989 * r + 0.587 * g + 0.114 * b).to(img.dtype).unsqueeze(dim=-3)
    return gray.expand(img.shape) if num_output_channels == 3 else gray


to_grayscale = rgb_to_grayscale
