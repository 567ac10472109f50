"""torchvision.transforms.v2.functional: the names transformers' image processors import (``tvF``), over the
v1 functions; ``to_image`` / ``to_dtype`` / ``grayscale_to_rgb`` as v2 defines them."""
import numpy as np
import torch

from ..functional import (
    InterpolationMode,
    center_crop,
    convert_image_dtype,
    crop,
    gaussian_blur,
    get_dimensions,
    get_image_size,
    hflip,
    normalize,
    pad,
    pil_to_tensor,
    resize,
    resized_crop,
    rgb_to_grayscale,
    to_pil_image,
    to_tensor,
    vflip,
)

__all__ = ["InterpolationMode", "center_crop", "convert_image_dtype", "crop", "gaussian_blur",
           "get_dimensions", "get_image_size", "get_size", "hflip", "normalize", "pad", "pil_to_tensor",
           "resize", "resized_crop", "rgb_to_grayscale", "to_pil_image", "to_tensor", "vflip", "to_image",
           "to_dtype", "to_dtype_image", "grayscale_to_rgb", "horizontal_flip", "vertical_flip"]

horizontal_flip, vertical_flip = hflip, vflip


def get_size(img):
    """``[height, width]`` (v2's order)."""
    _, h, w = get_dimensions(img)
    return [h, w]


def to_image(inpt):
    """PIL image, (H, W[, C]) ndarray or tensor -> a (C, H, W) tensor of the input's dtype (no scaling)."""
    if isinstance(inpt, np.ndarray):
        array = inpt[:, :, None] if inpt.ndim == 2 else inpt
        return torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1).contiguous()
    if isinstance(inpt, torch.Tensor):
        return inpt
    return pil_to_tensor(inpt)


def to_dtype(inpt, dtype=torch.float, scale=False):
    """Cast; with ``scale`` the value range follows the dtype (uint8 255 <-> float 1.0)."""
    return convert_image_dtype(inpt, dtype) if scale else inpt.to(dtype)


to_dtype_image = to_dtype


def grayscale_to_rgb(inpt):
    """A one-channel image repeated to three channels (a three-channel one unchanged)."""
    if not isinstance(inpt, torch.Tensor):
        return inpt.convert("RGB")
    return inpt if inpt.shape[-3] == 3 else inpt.repeat_interleave(3, dim=-3)
