"""torchvision.io: ``read_video`` / ``read_video_timestamps`` through PyAV (torchvision's own "pyav" backend
did the same), ``read_image`` / ``decode_image`` through PIL. Decoded frames are bounded: a call whose frames
would pass :data:`MAX_DECODED_BYTES` is refused with one line (give a shorter ``start_pts``..``end_pts``)."""
import io as _io
from enum import Enum
from fractions import Fraction

import av
import numpy as np
import torch
from PIL import Image

from clipbert_legacy.config.options import MAX_FRAME_PIXELS
from clipbert_legacy.legacy.shims._unsupported import unsupported_function

__all__ = ["read_video", "read_video_timestamps", "read_image", "decode_image", "read_file", "ImageReadMode",
           "write_video", "write_jpeg", "write_png", "encode_jpeg", "encode_png", "MAX_DECODED_BYTES"]

MAX_DECODED_BYTES = 8 * 2 ** 30
"""read_video returns every frame of its range at once; more than 8 GB of frames is refused, not allocated."""

_WRITE = "writing images and video (use PIL or PyAV directly)"
write_video = unsupported_function("torchvision.io.write_video", _WRITE)
write_jpeg = unsupported_function("torchvision.io.write_jpeg", _WRITE)
write_png = unsupported_function("torchvision.io.write_png", _WRITE)
encode_jpeg = unsupported_function("torchvision.io.encode_jpeg", _WRITE)
encode_png = unsupported_function("torchvision.io.encode_png", _WRITE)


class ImageReadMode(Enum):
    UNCHANGED = 0
    GRAY = 1
    GRAY_ALPHA = 2
    RGB = 3
    RGB_ALPHA = 4


_PIL_MODE = {ImageReadMode.GRAY: "L", ImageReadMode.GRAY_ALPHA: "LA", ImageReadMode.RGB: "RGB",
             ImageReadMode.RGB_ALPHA: "RGBA"}


def read_file(path):
    """The file's bytes as a uint8 tensor."""
    with open(path, "rb") as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)


def decode_image(input, mode=ImageReadMode.UNCHANGED, apply_exif_orientation=False):
    """Encoded image bytes (a uint8 tensor) or a path -> a (C, H, W) uint8 tensor (PIL decodes it)."""
    if isinstance(mode, str):
        mode = ImageReadMode[mode.upper()]
    if isinstance(input, torch.Tensor):
        image = Image.open(_io.BytesIO(input.numpy().tobytes()))
    else:
        image = Image.open(input)
    if apply_exif_orientation:
        from PIL import ImageOps
        image = ImageOps.exif_transpose(image)
    if mode != ImageReadMode.UNCHANGED:
        image = image.convert(_PIL_MODE[mode])
    array = np.array(image)
    if array.ndim == 2:
        array = array[:, :, None]
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def read_image(path, mode=ImageReadMode.UNCHANGED, apply_exif_orientation=False):
    return decode_image(path, mode, apply_exif_orientation)


def _open(filename):
    try:
        return av.open(filename, metadata_errors="ignore", options={"max_pixels": str(2 * MAX_FRAME_PIXELS)})
    except (av.FFmpegError, OSError) as e:
        raise RuntimeError(f"torchvision.io: cannot open video {filename}: {e}") from e


def _to_pts(value, unit, stream):
    if value is None:
        return None
    if unit == "sec":
        return int(Fraction(value) / stream.time_base) if stream.time_base else int(value)
    if unit != "pts":
        raise ValueError(f"pts_unit={unit!r}: 'pts' or 'sec'")
    return int(value)


def read_video_timestamps(filename, pts_unit="pts"):
    """(the pts of every video frame, in ``pts_unit``; the average frame rate)."""
    with _open(filename) as container:
        if not container.streams.video:
            return [], None
        stream = container.streams.video[0]
        pts = sorted(packet.pts for packet in container.demux(stream) if packet.pts is not None)
        fps = float(stream.average_rate) if stream.average_rate else None
        if pts_unit == "sec":
            pts = [float(p * stream.time_base) for p in pts]
        return pts, fps


def read_video(filename, start_pts=0, end_pts=None, pts_unit="pts", output_format="THWC"):
    """(video frames (T, H, W, 3) uint8 in ``output_format``, audio (empty: not decoded here), info with
    ``video_fps``) of the frames whose pts lie in [start_pts, end_pts]."""
    if output_format not in ("THWC", "TCHW"):
        raise ValueError(f"output_format={output_format!r}: 'THWC' or 'TCHW'")
    frames, info, total = [], {}, 0
    with _open(filename) as container:
        if container.streams.video:
            stream = container.streams.video[0]
            start, end = _to_pts(start_pts, pts_unit, stream), _to_pts(end_pts, pts_unit, stream)
            if stream.average_rate:
                info["video_fps"] = float(stream.average_rate)
            for frame in container.decode(stream):
                if frame.pts is not None and frame.pts < start:
                    continue
                if end is not None and frame.pts is not None and frame.pts > end:
                    break
                total += frame.width * frame.height * 3
                if total > MAX_DECODED_BYTES:
                    raise ValueError(f"read_video({filename}): the frames asked for pass "
                                     f"{MAX_DECODED_BYTES // 2 ** 30} GB; read a shorter range "
                                     "(start_pts/end_pts)")
                frames.append(frame.to_ndarray(format="rgb24"))
    video = torch.from_numpy(np.stack(frames)) if frames else torch.empty((0, 1, 1, 3), dtype=torch.uint8)
    if output_format == "TCHW":
        video = video.permute(0, 3, 1, 2)
    return video, torch.empty((1, 0), dtype=torch.float32), info
