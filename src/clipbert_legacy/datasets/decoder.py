"""Sparse frame sampling from in-memory video bytes with PyAV, frame-exact with ClipBERT.

ClipBERT's decoder (adapted from SlowFast) picks frames in two steps: a clip window in native
frame units is converted to pts, the container seeks to the keyframe before it and decodes only
that window (plus the first frame past its end), then `temporal_sampling` picks `num_frames`
indices over the decoded window. This module keeps that selection exactly (same frames, same random
draws) but, unlike ClipBERT, raises `VideoDecodeError` with a machine-readable `reason` instead of swallowing
every exception, so datasets can report *why* a video failed. The legacy `(None, max_pts)`
contract lives in `clipbert_legacy.datasets.dataset_base.extract_frames_from_video_binary`.

Two implementations of the same selection:
- `decode_clip` (reference, used by the legacy function): ClipBERT's algorithm step by step.
- `decode_clips(..., fast=True)` (datasets): plans every clip window first (same random draws),
  demuxes only around the windows (packet_window.py: from ClipBERT's seek point until no later
  packet can still fall in the window) to know ClipBERT's decoded window and the picked frames, then
  decodes only those frames and the reference frames they depend on, from the packets in memory
  (non-reference frames skipped with `skip_frame=NONREF`, no second seek, nearby clips sharing one
  segment), and copies the RGB frames once into the (N, H, W, 3) buffer it returns as an
  (N, 3, H, W) view. Tests assert it returns the reference's frames, and decode-everything's, bit
  for bit; any clip it cannot serve falls back to the reference.

Fixes over ClipBERT (documented, only where ClipBERT failed): a container whose stream reports
`frames == 0` is decoded in full (decode-all path) instead of failing with ZeroDivisionError;
the duration safeguard reads packet timestamps instead of decoding the whole stream (same max pts).

Bounded memory (ClipBERT held every decoded frame of the window, i.e. of the whole video on the
decode-all path that MKV/WebM take, and decoded frames of any size): a frame larger than
`max_frame_pixels` (width x height from the container header, checked before anything is decoded; the
decoder's own `max_pixels` guards a header that lies) is refused with reason 'too_large', and a window
keeps at most `WINDOW_KEEP_BYTES` of decoded frames: a longer one is decoded once for its timestamps
and again for the picked frames only (:func:`decode_window`; same frames).
"""
import math
import random

import numpy as np
import torch
from av.video.reformatter import VideoReformatter

from clipbert_legacy.config.options import FRAME_SAMPLING_STRATEGIES as SAMPLING_STRATEGIES
from clipbert_legacy.config.options import MAX_FRAME_PIXELS
from clipbert_legacy.datasets.packet_window import (
    SEEK_MARGIN,
    decode_segment,
    last_packet_pts,
    scan_windows,
    tail_max_pts,
)
from clipbert_legacy.datasets.video_open import (  # noqa: F401 (the decoder's public names, kept here)
    StreamInfo,
    VideoDecodeError,
    check_frame,
    decoder_max_pixels,
    open_container,
    stream_info,
)

WINDOW_KEEP_BYTES = 64 * 2 ** 20  # decoded frames a window keeps before it re-decodes for the picks
_THREE_CLIPS = ("start", "middle", "end")


def get_start_end_idx(video_size, clip_size, clip_idx, num_clips):
    """ClipBERT's clip window in frame units: start uniform-random (clip_idx -1) or delta*idx/n."""
    delta = max(video_size - clip_size, 0)
    if clip_idx == -1:
        start_idx = random.uniform(0, delta)
    else:
        start_idx = delta * clip_idx / num_clips
    end_idx = start_idx + clip_size - 1
    return start_idx, end_idx


def temporal_sampling_indices(n_frames, start_idx, end_idx, num_samples):
    """Indices ClipBERT's temporal_sampling picks: float32 linspace, clamp, truncate."""
    index = torch.linspace(start_idx, end_idx, num_samples)
    index = torch.clamp(index, 0, n_frames - 1).long()
    return index.tolist()


def _window_pass(container, start_pts, end_pts, buffer_size, keep_bytes=None, wanted=None,
                 stop_when_kept=False):
    """One decode of ClipBERT's window: seek to the keyframe before start_pts, frames with pts >= start,
    up to the first `buffer_size` (min 1) past end. Returns ({pts: frame} kept, sorted window pts,
    whether every frame is kept, whether a pts came twice). Keeps the frames whose pts is in `wanted`
    (`stop_when_kept`: stop once all are), or every frame while they fit in `keep_bytes`."""
    stream = container.streams.video[0]
    seek_offset = max(start_pts - SEEK_MARGIN, 0)
    try:
        container.seek(seek_offset, any_frame=False, backward=True, stream=stream)
    except Exception as e:
        raise VideoDecodeError("decode_failed",
                               f"seek to pts {seek_offset} failed: {type(e).__name__}: {e}") from e
    kept, seen, n_frames, size, complete, buffer_count = {}, set(), 0, 0, wanted is None, 0
    try:
        for frame in container.decode(video=0):
            if frame.pts is None or frame.pts < start_pts:
                continue
            seen.add(frame.pts)
            n_frames += 1
            if wanted is not None:
                if frame.pts in wanted:
                    kept[frame.pts] = frame  # a later frame with the same pts wins, as in ClipBERT
                    if stop_when_kept and len(kept) == len(wanted):
                        break
            elif complete:
                kept[frame.pts] = frame
                size += sum(p.buffer_size for p in frame.planes)
                if size > keep_bytes:
                    kept, complete = {}, False
            if frame.pts > end_pts:
                buffer_count += 1
                if buffer_count >= buffer_size:
                    break
    except Exception as e:
        if not seen:
            raise VideoDecodeError("decode_failed", f"decoding failed: {type(e).__name__}: {e}") from e
        # ClipBERT also lost the whole video here; we keep the frames decoded before the corruption
    return kept, sorted(seen), complete, n_frames > len(seen)


def decode_window(container, start_pts, end_pts, pick, buffer_size=0, keep_bytes=None):
    """ClipBERT's decoded window (frames with pts in [start, end] plus the first `buffer_size`, min 1,
    past end, sorted by pts) and `pick(n)` -> the indices taken from it. Returns (the picked frames,
    the window's length); ([], 0) for an empty window.

    Memory is bounded by what the sampling needs: a window whose frames pass `keep_bytes` (a whole
    MKV/WebM on the decode-all path, whose frame count is unknown until it is decoded) is decoded
    once for its timestamps only, then again keeping only the picked frames (the same frames).
    `keep_bytes` defaults to WINDOW_KEEP_BYTES."""
    keep_bytes = WINDOW_KEEP_BYTES if keep_bytes is None else keep_bytes
    kept, pts, complete, repeats = _window_pass(container, start_pts, end_pts, buffer_size, keep_bytes)
    if not pts:
        return [], 0
    idx = pick(len(pts))
    if not complete:
        # without repeated pts (the last frame of a pts wins) the pass can stop at the last wanted frame
        kept = _window_pass(container, start_pts, end_pts, buffer_size, wanted={pts[i] for i in idx},
                            stop_when_kept=not repeats)[0]
        if any(pts[i] not in kept for i in idx):
            raise VideoDecodeError("decode_failed", "decoding the window again gave other frames")
    return [kept[pts[i]] for i in idx], len(pts)


def stream_max_pts(container):
    """Largest packet pts of the video stream (same value as the max decoded frame pts)."""
    stream = container.streams.video[0]
    max_pts = 0
    try:
        container.seek(0, any_frame=False, backward=True, stream=stream)
        for packet in container.demux(stream):
            if packet.pts is not None:
                max_pts = max(max_pts, packet.pts)
    except Exception as e:
        raise VideoDecodeError("decode_failed", f"reading packets failed: {type(e).__name__}: {e}") from e
    return max_pts


def plan_window(info, num_frames, target_fps, clip_idx, num_clips, safeguard_duration, video_max_pts,
                max_pts_fn, sampling_rate=1):
    """Selective path of ClipBERT's pyav_decode: the clip's (start_pts, end_pts, video_max_pts).
    `max_pts_fn()` gives the stream's largest pts, or any lower bound of it that is >= 80% of the
    duration (only called for the safeguard, which only compares it with 80% of the duration).

    The returned video_max_pts is the duration the window was computed with, on every selective
    decode as in ClipBERT: the stream's duration, or with the safeguard the given video_max_pts or the
    largest pts when that is below 80% of the duration. Passed back in, it spares the pts scan."""
    duration, frames_length = info.duration, info.frames_length
    if safeguard_duration:
        if video_max_pts:
            duration = video_max_pts
        else:
            max_pts = max_pts_fn()
            if max_pts < 0.8 * duration:
                duration = max_pts
    video_max_pts = duration
    clip_size = sampling_rate * num_frames / target_fps * info.fps
    if clip_idx == -2:
        clip_size = frames_length
        start_idx, end_idx = get_start_end_idx(frames_length, clip_size, 0, 1)
    else:
        start_idx, end_idx = get_start_end_idx(frames_length, clip_size, clip_idx, num_clips)
    timebase = duration / frames_length
    return int(start_idx * timebase), int(end_idx * timebase), video_max_pts


def pick_in_window(n_window, clip_idx, num_frames, target_fps, fps, sampling_rate=1):
    """Indices into the decoded window (selective path re-windows with clip (0, 1))."""
    clip_size = n_window if clip_idx == -2 else sampling_rate * num_frames / target_fps * fps
    start_idx, end_idx = get_start_end_idx(n_window, clip_size, 0, 1)
    return temporal_sampling_indices(n_window, start_idx, end_idx, num_frames)


def _is_selective(info):
    return info.duration is not None and info.frames_length > 0


def decode_clip(container, num_frames, target_fps, clip_idx, num_clips=None,
                safeguard_duration=False, video_max_pts=None, sampling_rate=1, info=None,
                min_video_frames=1):
    """Decode one clip exactly like ClipBERT's `decoder.decode` (pyav backend): the reference.

    clip_idx: -1 random window, -2 whole video ("uniform"), k >= 0 the k-th of `num_clips`
    evenly spaced windows. Returns (uint8 array (T, H, W, 3) RGB, video_max_pts); raises
    VideoDecodeError. The container can be reused for further clips.
    """
    assert clip_idx >= -2, clip_idx
    info = info or stream_info(container)
    if not _is_selective(info):  # no duration or no frame count: ClipBERT's decode-all path
        call = {"clip_idx": clip_idx, "num_clips": num_clips}
        clips = decode_all_path(container, info, [call], num_frames, target_fps, sampling_rate,
                                min_video_frames)
        return _stack(clips[0]), None
    start_pts, end_pts, video_max_pts = plan_window(
        info, num_frames, target_fps, clip_idx, num_clips, safeguard_duration, video_max_pts,
        lambda: stream_max_pts(container), sampling_rate)
    frames, _ = decode_window(container, start_pts, end_pts, lambda n: pick_in_window(
        n, clip_idx, num_frames, target_fps, info.fps, sampling_rate))
    if not frames:
        err = VideoDecodeError("no_frames", f"no frames decoded in pts window [{start_pts}, {end_pts}]")
        err.video_max_pts = video_max_pts  # ClipBERT returned (None, video_max_pts) here
        raise err
    return _stack([f.to_ndarray(format="rgb24") for f in frames]), video_max_pts


def decode_all_path(container, info, calls, num_frames, target_fps, sampling_rate=1, min_video_frames=1):
    """ClipBERT's decode-all path (the header gives no duration or no frame count: MKV, WebM,
    elementary streams): each clip of `calls` ({clip_idx, num_clips}) is chosen over all the video's
    frames, in call order (the same random draws). One bounded decode (:func:`decode_window`) serves
    every clip. Returns per clip a list of uint8 (H, W, 3) frames."""
    def pick(n):
        if n < min_video_frames:  # length unknown from metadata: count decoded
            raise VideoDecodeError("too_short", f"video has {n} frame(s), fewer than "
                                                f"min_video_frames={min_video_frames}")
        idx = []
        for c in calls:
            clip_size = n if c["clip_idx"] == -2 else sampling_rate * num_frames / target_fps * info.fps
            start_idx, end_idx = get_start_end_idx(n, clip_size, c["clip_idx"], c.get("num_clips") or 1)
            idx += temporal_sampling_indices(n, start_idx, end_idx, num_frames)
        return idx

    frames, _ = decode_window(container, 0, math.inf, pick)
    if not frames:
        err = VideoDecodeError("no_frames", "no frames decoded")
        err.video_max_pts = None
        raise err
    rgb = {}
    arrs = [rgb[id(f)] if id(f) in rgb else rgb.setdefault(id(f), f.to_ndarray(format="rgb24"))
            for f in frames]
    return [arrs[k * num_frames:(k + 1) * num_frames] for k in range(len(calls))]


def strategy_to_clip(sampling_strategy):
    """ClipBERT's get_video_decoding_kwargs for num_clips=None: strategy -> (clip_idx, num_clips)."""
    if sampling_strategy == "rand":
        return -1, None
    if sampling_strategy in _THREE_CLIPS:
        return _THREE_CLIPS.index(sampling_strategy), 3
    if sampling_strategy == "uniform":
        return -2, None
    raise ValueError(f"frm_sampling_strategy={sampling_strategy!r} is not one of {SAMPLING_STRATEGIES}")


def _safeguard_max_pts(container, duration):
    """The stream's largest pts as the duration safeguard needs it: a lower bound of it is enough when
    that is already >= 80% of the duration (the safeguard then keeps the duration, whatever the true
    maximum): the last packet's pts (one packet), else the last GOP's maximum, else the full scan."""
    for lower_bound in (last_packet_pts, tail_max_pts):
        try:
            pts = lower_bound(container)
        except Exception:
            continue
        if pts is not None and duration is not None and pts >= 0.8 * duration:
            return pts
    return stream_max_pts(container)


def _rgb_converter(max_frame_pixels=MAX_FRAME_PIXELS):
    """frame -> uint8 (H, W, 3) RGB, `frame.to_ndarray(format="rgb24")`'s pixels through one single-threaded
    swscale context per request (to_ndarray makes one, with a thread per core, per frame: 40 of 70 us);
    a frame above ``max_frame_pixels`` is refused before it is converted (:func:`check_frame`)."""
    reformatter = VideoReformatter()

    def convert(frame):
        check_frame(frame.width, frame.height, max_frame_pixels)
        return reformatter.reformat(frame, format="rgb24", threads=1).to_ndarray()
    return convert


def _decode_fast(container, info, plans, num_frames, target_fps, max_frame_pixels=MAX_FRAME_PIXELS):
    """plans: [(clip_idx, start_pts, end_pts)] -> per clip a list of uint8 (H, W, 3) frames, or None
    where the fast path could not serve the clip (the caller runs the reference for it)."""
    try:
        segments, windows = scan_windows(container, [(s, e) for _, s, e in plans])
    except Exception:  # UnsafeStream, or a corrupt stream: the reference path reports what happened
        return [None] * len(plans)
    picks = []
    for (clip_idx, _, _), (seg, window) in zip(plans, windows):
        idx = pick_in_window(len(window), clip_idx, num_frames, target_fps, info.fps) if window else []
        picks.append((seg, [window[i] for i in idx]))
    cc = container.streams.video[0].codec_context
    got = [{} for _ in segments]
    convert = _rgb_converter(max_frame_pixels)
    try:
        for n, seg in enumerate(segments):
            wanted = [p for s, ps in picks if s == n for p in ps]
            got[n] = decode_segment(cc, seg, wanted, convert)
    except VideoDecodeError:
        raise  # a frame above max_frame_pixels: the video is bad whatever path decodes it
    except Exception:
        pass  # corrupt stream: the reference path decides what happened
    return [[got[s][p] for p in ps] if ps and all(p in got[s] for p in ps) else None
            for s, ps in picks]


def _decode_planned_clips(container, info, calls, num_frames, target_fps, max_frame_pixels=MAX_FRAME_PIXELS):
    """The fast path of :func:`decode_clips`: plan every window first (same random draws, in clip
    order, as the reference), decode only the picked frames, and run the reference path for any clip
    the fast path could not serve (same window)."""
    plans, video_max_pts = [], None
    for c in calls:
        start_pts, end_pts, video_max_pts = plan_window(
            info, num_frames, target_fps, c["clip_idx"], c["num_clips"],
            c.get("safeguard_duration", False), video_max_pts,
            lambda: _safeguard_max_pts(container, info.duration))
        plans.append((c["clip_idx"], start_pts, end_pts))
    clips = _decode_fast(container, info, plans, num_frames, target_fps, max_frame_pixels)
    for k, arr in enumerate(clips):
        if arr is None:  # reference path for this clip, same window
            clip_idx, start_pts, end_pts = plans[k]
            frames, _ = decode_window(container, start_pts, end_pts, lambda n, c=clip_idx: pick_in_window(
                n, c, num_frames, target_fps, info.fps))
            if not frames:
                raise VideoDecodeError("no_frames", f"no frames decoded in pts window "
                                                    f"[{start_pts}, {end_pts}]")
            clips[k] = [f.to_ndarray(format="rgb24") for f in frames]
    return clips


def _as_tchw(clips, max_frame_pixels=MAX_FRAME_PIXELS):
    """Copy the clips' (H, W, 3) frames once into one (N, H, W, 3) buffer and return it as a
    (N, 3, H, W) view: a channel-first copy costs more than the RGB conversion itself at 720p, and
    the consumers (resize, float conversion, collate) read any stride."""
    return torch.from_numpy(_stack([f for clip in clips for f in clip], max_frame_pixels)).permute(0, 3, 1, 2)


def _stack(frames, max_frame_pixels=MAX_FRAME_PIXELS):
    """np.stack of (H, W, 3) frames; a frame above ``max_frame_pixels`` (an in-band size change the header
    did not show) and frames of different sizes (the size changes inside the stream) make a bad video,
    not a crash."""
    for f in frames:
        check_frame(f.shape[1], f.shape[0], max_frame_pixels)
    sizes = {f.shape[:2] for f in frames}
    if len(sizes) > 1:
        raise VideoDecodeError("decode_failed", "the frame size changes inside the video: "
                                                + ", ".join(f"{w}x{h}" for h, w in sorted(sizes)))
    return np.stack(frames)


def decode_clips(video_bytes, num_frames, target_fps, n_clips=1, mode="strategy",
                 sampling_strategy="rand", min_video_frames=1, multi_thread_decode=False, fast=True,
                 max_frame_pixels=MAX_FRAME_PIXELS):
    """Decode `n_clips` clips of one video with a single open container -> uint8 (n*T, 3, H, W).

    mode "strategy": each clip chosen by `sampling_strategy` independently (ClipBERT's
    single clip and `_load_video_multi_clips_random`); mode "uniform": clip k of n evenly
    spaced windows with the duration safeguard (ClipBERT's `_load_video_multi_clips_uniform`).
    A video whose stream reports fewer than `min_video_frames` frames raises reason 'too_short', one
    with frames above `max_frame_pixels` (0: no limit) 'too_large' before anything is decoded.
    fast=True decodes only the picked frames and their references (same frames as the reference
    path, which `fast=False` runs; any clip the fast path cannot serve falls back to it).
    """
    if mode not in ("strategy", "uniform"):
        raise ValueError(f"mode={mode!r} must be 'strategy' or 'uniform'")
    container = open_container(video_bytes, multi_thread_decode, max_frame_pixels)
    try:
        info = stream_info(container)
        n_total = info.frames_length
        if min_video_frames > 1 and 0 < n_total < min_video_frames:
            raise VideoDecodeError("too_short", f"video has {n_total} frame(s), fewer than "
                                                f"min_video_frames={min_video_frames}")
        if mode == "uniform":
            calls = [{"clip_idx": k, "num_clips": n_clips, "safeguard_duration": True}
                     for k in range(n_clips)]
        else:
            clip_idx, num_clips = strategy_to_clip(sampling_strategy)
            calls = [{"clip_idx": clip_idx, "num_clips": num_clips} for _ in range(n_clips)]
        clips = [None] * n_clips
        if not _is_selective(info):
            clips = decode_all_path(container, info, calls, num_frames, target_fps,
                                    min_video_frames=min_video_frames)
        elif fast:
            clips = _decode_planned_clips(container, info, calls, num_frames, target_fps, max_frame_pixels)
        else:
            video_max_pts = None
            for k, c in enumerate(calls):
                if "safeguard_duration" in c:
                    c["video_max_pts"] = video_max_pts
                clips[k], vmp = decode_clip(container, num_frames, target_fps, info=info,
                                            min_video_frames=min_video_frames, **c)
                if "safeguard_duration" in c:
                    video_max_pts = vmp
    finally:
        container.close()
    return _as_tchw(clips, max_frame_pixels)


def decode_all_frames(video_bytes):
    """Every frame of the video as uint8 (N, 3, H, W) RGB: the dense baseline for benchmarks."""
    container = open_container(video_bytes)
    try:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    finally:
        container.close()
    if not frames:
        raise VideoDecodeError("no_frames", "video decoded to 0 frames")
    return _as_tchw([frames])
