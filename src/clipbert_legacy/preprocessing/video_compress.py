"""Re-encode a video before it goes into the LMDB: lower frame rate, smaller short side, cut length.

Training samples a few frames per clip at low fps (ClipBERT: 1-2 fps, 448 px), so storing 30 fps
full-resolution sources makes every decode and every byte of I/O mostly wasted; CLIP4Clip and
Singularity preprocess to ~2-3 fps with a 224-360 px short side for the same reason. Output is
H.264 (libx264), yuv420p, even width and height (4:2:0 needs them), audio dropped.
"""
import io
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Optional

import av


@dataclass(frozen=True)
class CompressSettings:
    """fps: keep at most this many frames per second (None: every frame); short_side: downscale so
    the shorter side is at most this (never upscales); max_seconds: keep only the first seconds;
    crf: x264 quality (lower = better, bigger); preset: x264 speed/size trade-off."""
    fps: Optional[float] = None
    short_side: Optional[int] = None
    max_seconds: Optional[float] = None
    crf: int = 23
    preset: str = "veryfast"

    def as_dict(self):
        return asdict(self)


def output_size(width, height, short_side=None):
    """(w, h) scaled so min(w, h) <= short_side, aspect kept, both rounded to even numbers >= 2."""
    scale = 1.0
    if short_side and min(width, height) > short_side:
        scale = short_side / min(width, height)
    return (max(2, int(round(width * scale / 2)) * 2), max(2, int(round(height * scale / 2)) * 2))


def _source_rate(stream):
    rate = stream.average_rate or stream.guessed_rate or stream.base_rate
    return Fraction(rate) if rate else Fraction(25)


def _kept_frames(container, settings, src_rate):
    """Yield (seconds since the first frame, frame) for the frames to keep."""
    step = 1.0 / settings.fps if settings.fps else 0.0
    t0, next_t = None, 0.0
    for i, frame in enumerate(container.decode(video=0)):
        t = frame.time if frame.time is not None else i / float(src_rate)
        t0 = t if t0 is None else t0
        t -= t0
        if settings.max_seconds is not None and t >= settings.max_seconds:
            break
        if t + 1e-6 >= next_t:
            yield t, frame
            next_t = (next_t + step) if step else 0.0
            while step and next_t <= t:  # source slower than the target rate: no frame duplication
                next_t += step


def compress_video(data, settings):
    """mp4 bytes of `data` re-encoded by `settings`; ValueError when there is no decodable frame."""
    with av.open(io.BytesIO(bytes(data))) as src:
        if not src.streams.video:
            raise ValueError("no video stream")
        in_stream = src.streams.video[0]
        src_rate = _source_rate(in_stream)
        rate = Fraction(settings.fps).limit_denominator(1001) if settings.fps else src_rate
        buf, n, last_pts = io.BytesIO(), 0, -1
        with av.open(buf, "w", format="mp4") as dst:
            out = None
            for t, frame in _kept_frames(src, settings, src_rate):
                if out is None:
                    out = dst.add_stream("libx264", rate=rate)
                    out.width, out.height = output_size(frame.width, frame.height, settings.short_side)
                    out.pix_fmt = "yuv420p"
                    out.options = {"crf": str(settings.crf), "preset": settings.preset, "threads": "1"}
                img = frame.reformat(width=out.width, height=out.height, format="yuv420p")
                last_pts = max(last_pts + 1, int(round(t * rate)))
                img.pts, img.time_base = last_pts, Fraction(1) / rate
                for packet in out.encode(img):
                    dst.mux(packet)
                n += 1
            if out is None:
                raise ValueError("no decodable frame")
            for packet in out.encode():
                dst.mux(packet)
    return buf.getvalue()
