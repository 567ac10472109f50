"""Opening a video for decoding: the container (FFmpeg's probe skipped for H.264 mp4), its stream
facts, and the limits checked before and while frames are decoded (sample tables out of proportion to
the file, frames above ``max_frame_pixels``). :class:`VideoDecodeError` names why a video is bad.
``clipbert_legacy.datasets.decoder`` decodes the frames it picks from what this module opens.
"""
import io
from dataclasses import dataclass

import av

from clipbert_legacy.config.options import MAX_FRAME_PIXELS
from clipbert_legacy.datasets.mp4_claims import ImplausibleIndex, check_sample_tables


class VideoDecodeError(Exception):
    """A video could not yield frames. `reason` is one of REASONS; str() is a one-line message."""

    REASONS = ("empty", "open_failed", "no_video_stream", "decode_failed", "no_frames",
               "too_short", "too_large", "aspect_ratio", "missing_key", "bad_index")

    def __init__(self, reason, message):
        assert reason in self.REASONS, reason
        super().__init__(message)
        self.reason = reason


@dataclass
class StreamInfo:
    """Container metadata ClipBERT's decoder relies on (values as PyAV reports them)."""
    fps: float
    frames_length: int
    duration: object  # int (stream time_base units) or None


def _is_iso_bmff(buf):
    """Whether the bytes start with an ISO base media 'ftyp' box (mp4, mov, 3gp): FFmpeg's mov demuxer."""
    return isinstance(buf, (bytes, bytearray, memoryview)) and bytes(buf[4:8]) == b"ftyp"


# Probe options for ISO BMFF H.264: FFmpeg's stream probe reads packets and decodes frames until it knows
# the pixel format and the reordering delay (7 frames of a stream without B-frames: ~10 ms at 720p); the
# mp4 header already gives the decoder what it needs (avcC, and the delay from the ctts box), and the
# decoder learns the pixel format from the first frame it decodes. `noparse`: no H.264 parser per packet
# (a third of the demuxer's time; it re-derives what the mov index gives). Packets and frames: tested equal.
_LIGHT_PROBE = {"container_options": {"probesize": "32", "analyzeduration": "0", "fflags": "+noparse"},
                "stream_options": [{"skip_frame": "all"}] * 8}


def _open_mp4(stream_io, limit):
    """mp4/mov bytes with FFmpeg's mov demuxer (the one its format probe picks for them); H.264
    streams without FFmpeg's stream probe (see _LIGHT_PROBE), anything else with it."""
    container = av.open(stream_io, format="mp4", metadata_errors="ignore", options=limit, **_LIGHT_PROBE)
    video = container.streams.video
    cc = video[0].codec_context if video else None
    if cc is not None and cc.name == "h264" and cc.width > 0 and cc.height > 0:
        return container
    container.close()
    stream_io.seek(0)
    return av.open(stream_io, format="mp4", metadata_errors="ignore", options=limit)


def open_container(video_bytes, multi_thread_decode=False, max_frame_pixels=MAX_FRAME_PIXELS):
    """Open bytes (or a file-like object) with PyAV; raise VideoDecodeError('empty'|'open_failed'|
    'no_video_stream'|'too_large'). A frame size above `max_frame_pixels` (0: no limit) is refused from
    the header before any frame is decoded, and the decoder refuses larger frames too."""
    if isinstance(video_bytes, (bytes, bytearray, memoryview)):
        if len(video_bytes) == 0:
            raise VideoDecodeError("empty", "video has 0 bytes")
        stream_io = io.BytesIO(video_bytes)
    else:
        stream_io = video_bytes
        if hasattr(stream_io, "getbuffer") and stream_io.getbuffer().nbytes == 0:
            raise VideoDecodeError("empty", "video has 0 bytes")
    limit = {"max_pixels": str(decoder_max_pixels(max_frame_pixels))} if max_frame_pixels else None
    container = None
    # bytes themselves, not stream_io.getbuffer(): on BytesIO(bytes) that copies the whole file
    head = video_bytes if stream_io is not video_bytes else getattr(stream_io, "getbuffer", lambda: None)()
    if head is not None:  # FFmpeg's mov demuxer takes files without 'ftyp' too: every buffer is checked
        try:
            check_sample_tables(head)
        except ImplausibleIndex as e:
            raise VideoDecodeError("bad_index", f"the container's sample tables are out of proportion to its "
                                                f"{len(head)} bytes: {e}") from None
    if _is_iso_bmff(head):
        try:  # the demuxer FFmpeg's probe picks for these files anyway; skipping the probe saves ~0.5 ms
            container = _open_mp4(stream_io, limit)
        except Exception:
            stream_io.seek(0)
    try:
        container = container or av.open(stream_io, metadata_errors="ignore", options=limit)
    except Exception as e:  # PyAV raises many FFmpeg error types (InvalidDataError, EOFError, ...)
        raise VideoDecodeError("open_failed", f"cannot open video container: {type(e).__name__}: {e}") from e
    if not container.streams.video:
        container.close()
        raise VideoDecodeError("no_video_stream", "container has no video stream")
    cc = container.streams.video[0].codec_context
    if max_frame_pixels and cc.width * cc.height > max_frame_pixels:
        container.close()
        raise VideoDecodeError("too_large", f"frame size {cc.width}x{cc.height} ({cc.width * cc.height} "
                                            f"pixels) is above max_frame_pixels={max_frame_pixels}")
    if limit:
        cc.options = limit
    if multi_thread_decode:
        container.streams.video[0].thread_type = "AUTO"
    else:  # one thread: FFmpeg's default (0: one per core) starts slice threads on every open (~0.1 ms)
        cc.thread_count = 1
    return container


def decoder_max_pixels(max_frame_pixels):
    """FFmpeg's ``max_pixels`` for a limit of ``max_frame_pixels``: FFmpeg checks its aligned buffer size
    (a 96x96 frame is checked as 128x128), so the limit gets an eighth and 128K pixels of slack (it was twice
    the limit); every decoded frame is then checked exactly (:func:`check_frame`)."""
    return int(max_frame_pixels) + int(max_frame_pixels) // 8 + 2 ** 17


def check_frame(width, height, max_frame_pixels):
    """VideoDecodeError('too_large') for a decoded frame above ``max_frame_pixels`` (0: no limit): the
    header's size is checked before decoding, but an in-band SPS can change the size in the stream."""
    if max_frame_pixels and width * height > max_frame_pixels:
        raise VideoDecodeError("too_large", f"a decoded frame is {width}x{height} ({width * height} pixels), "
                                            f"above max_frame_pixels={max_frame_pixels} (the size changes "
                                            f"inside the stream)")


def stream_info(container):
    st = container.streams.video[0]
    fps = float(st.average_rate) if st.average_rate else 0.0
    if fps <= 0 and st.guessed_rate:
        fps = float(st.guessed_rate)
    return StreamInfo(fps=fps, frames_length=int(st.frames or 0), duration=st.duration)
