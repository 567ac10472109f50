"""Resize / pad / normalise video frames with ClipBERT's semantics (torch only, no torchvision).

Frames are float (T, 3, H, W) in [0, 255], RGB. ClipBERT resizes the longer side to
`max_img_size` (also upscaling), zero-pads right/bottom to a square, and later subtracts
`img_pixel_mean` (RGB order) / divides by `img_pixel_std` on the device.

`ImageResize` / `ImagePad` are ClipBERT's classes (the reference). The datasets use
:class:`PaddedFrames` (decoded uint8 frames, resized and padded straight into the batch by
:func:`write_resized`): ``img_resize="exact"`` gives ClipBERT's float values bit for bit (the same
torch kernel on a channels-last copy, one frame at a time, into the batch), ``"uint8"`` resizes with
torch's uint8 kernel and keeps the batch uint8 until the device (4x fewer bytes; pixels differ from
the exact ones by about one level at most, see docs/benchmarks_loader.md).
"""
import torch
import torch.nn.functional as F

from clipbert_legacy.config.options import IMG_RESIZE_MODES


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


def resize_and_pad(frames, max_img_size, img_resize="exact"):
    """uint8/float (T, 3, H, W) -> (T, 3, max, max): ClipBERT's per-video pipeline steps 3-5
    (float for "exact", bit-equal to ``ImagePad(ImageResize(frames.float()))``; uint8 for "uint8")."""
    return PaddedFrames(frames, max_img_size, img_resize).tensor()


def write_resized(out, frames, max_img_size, img_resize="exact"):
    """Resize (T, 3, H, W) frames so the longer side is `max_img_size` and write them, zero-padded
    right and bottom, into `out` (T, 3, max, max) (ClipBERT's steps 3-5; any strides on both sides).

    "exact": float32, bit-equal to ``ImagePad(ImageResize(frames.float()))``: torch's bilinear kernel
    gives the same values on a channels-last input (tests/test_image_ops.py checks it on this machine)
    and runs twice as fast there; one frame at a time, so the temporaries stay small (a fresh 30 MB
    tensor per video page-faults on every write). "uint8": torch's uint8 bilinear kernel (fixed-point
    weights, rounded: at most about one level from the exact values), 3-4x faster again. The mode is
    :class:`PaddedFrames`' (which checks it); anything but "uint8" is "exact" here.
    """
    h, w = get_resize_size(frames, max_img_size)
    same = tuple(frames.shape[-2:]) == (h, w)
    out[..., h:, :].zero_()
    out[..., :h, w:].zero_()
    dst = out[..., :h, :w]
    if img_resize == "uint8":
        src = frames if frames.dtype == torch.uint8 else frames.round().clamp(0, 255).to(torch.uint8)
        src = src.contiguous(memory_format=torch.channels_last)  # one kernel path whatever the strides
        dst.copy_(src if same else F.interpolate(src, size=(h, w), mode="bilinear", align_corners=False))
        return out
    for t in range(frames.shape[0]):  # (1, 3, H, W) channels-last float: small, reused by malloc
        x = frames[t:t + 1].to(torch.float32, memory_format=torch.channels_last)
        dst[t].copy_(x[0] if same else F.interpolate(x, size=(h, w), mode="bilinear", align_corners=False)[0])
    return out


class PaddedFrames:
    """Decoded frames (uint8 (T, 3, H, W), any strides) and the square they become: ClipBERT's resize
    and pad, done when the batch is assembled (:func:`clipbert_legacy.datasets.collate.stack_visual`).

    Why deferred: resizing into a fresh tensor per video, stacking the batch and then moving it to
    shared memory wrote every batch three times (a 448 px float video is 38 MB); the collator writes
    each video once, straight into the batch, which it allocates in shared memory in a worker.
    A dataset item carries this small object instead of the padded tensor until then.
    """

    def __init__(self, frames, size, img_resize="exact"):
        if img_resize not in IMG_RESIZE_MODES:  # the one check past the config's choices: every item is one
            raise ValueError(f"img_resize={img_resize!r} must be one of {IMG_RESIZE_MODES}")
        if frames.dim() != 4 or frames.shape[1] != 3:
            raise ValueError(f"frames must be (T, 3, H, W), got shape {tuple(frames.shape)}")
        self.frames, self.size, self.img_resize = frames, int(size), img_resize

    @property
    def shape(self):
        return torch.Size((self.frames.shape[0], 3, self.size, self.size))

    @property
    def dtype(self):
        return torch.uint8 if self.img_resize == "uint8" else torch.float32

    def write_into(self, out):
        return write_resized(out, self.frames, self.size, self.img_resize)

    def tensor(self):
        """The padded frames as a new tensor (T, 3, size, size) (float32, or uint8 for "uint8")."""
        return self.write_into(torch.empty(self.shape, dtype=self.dtype))
