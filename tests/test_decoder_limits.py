"""Bounded decoding (issue 38, items 5-6): frames above ``max_frame_pixels`` are refused from the header
before anything is decoded (reason 'too_large'); a video whose container gives no frame count (MKV,
WebM: ClipBERT's decode-all path) is decoded keeping only the picked frames, with ClipBERT's frame choice;
the bad-video policy (training replaces, evaluation lists) applies to both. The memory figures for the
real sizes (8192x8192 H.264, a 720p MKV of 3000 frames) are measured by benchmarks/bench_decoder_memory.py.
"""
import io
import logging
import math
import random

import av
import pytest
import torch
from torch.utils.data import DataLoader

import clipbert_legacy.datasets.decoder as decoder
from clipbert_legacy.config import with_defaults
from clipbert_legacy.datasets.build import build_retrieval_datasets
from clipbert_legacy.datasets.dataset_base import extract_frames_from_video_binary
from clipbert_legacy.datasets.dataset_retrieval import VideoRetrievalCollator, VideoRetrievalDataset
from clipbert_legacy.datasets.dataset_video_qa import VideoQACollator, VideoQADataset
from clipbert_legacy.datasets.dataset_vqa import decode_image
from clipbert_legacy.datasets.decoder import VideoDecodeError, decode_clips, decode_window, open_container
from clipbert_legacy.datasets.loaders import PrefetchLoader
from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4
from clipbert_legacy.training.data import ResumableDistributedSampler, build_train_dataloader
from tests.hostile_files import mp4_with_inband_size_change
from tests.test_datasets import TOK_DIR, _retrieval_groups
from tests.test_decoder import indexed_frames, read_index

CONTAINERS = [("matroska", "libx264"), ("webm", "libvpx"), ("webm", "libvpx-vp9")]


def encode(n, container_format="mp4", codec="libx264", size=64, fps=30):
    return encode_mp4(indexed_frames(n, size), fps=fps, codec=codec, size=(size, size), gop=12,
                      container_format=container_format)


@pytest.fixture(scope="module", params=CONTAINERS, ids=[f"{f}-{c}" for f, c in CONTAINERS])
def unbounded30(request):
    fmt, codec = request.param
    data = encode(30, fmt, codec)
    st = av.open(io.BytesIO(data)).streams.video[0]
    assert st.frames == 0 and st.duration is None  # ClipBERT's decode-all path
    return data


def clipbert_decode_all(data, num_frames, target_fps, clip_idx, num_clips=None):
    """ClipBERT's decoder.decode on a container without duration, written out: every frame decoded
    and kept by pts, then get_start_end_idx + temporal_sampling over all of them."""
    c = av.open(io.BytesIO(data))
    fps = float(c.streams.video[0].average_rate)
    by_pts = {f.pts: f for f in c.decode(video=0) if f.pts is not None}
    frames = [by_pts[p] for p in sorted(by_pts)]
    n = len(frames)
    clip_size = n if clip_idx == -2 else num_frames / target_fps * fps
    delta = max(n - clip_size, 0)
    start = random.uniform(0, delta) if clip_idx == -1 else delta * clip_idx / (num_clips or 1)
    index = torch.clamp(torch.linspace(start, start + clip_size - 1, num_frames), 0, n - 1).long()
    return [read_index(torch.from_numpy(frames[i].to_ndarray(format="rgb24")).permute(2, 0, 1))
            for i in index]


def picks(frames):
    return [read_index(f) for f in frames]


# decode-all picks on 30 frames at 30 fps (the selective path picks [7], [4, 23], [7, 26] for the
# middle and end rows: ClipBERT's two paths truncate the window start differently)
DECODE_ALL_30 = [({"sampling_strategy": "uniform", "num_frames": 4, "target_fps": 3}, [0, 9, 19, 29]),
                 ({"sampling_strategy": "start", "num_frames": 2, "target_fps": 3}, [0, 19]),
                 ({"sampling_strategy": "middle", "num_frames": 1, "target_fps": 3}, [6]),
                 ({"sampling_strategy": "middle", "num_frames": 2, "target_fps": 3}, [3, 22]),
                 ({"sampling_strategy": "end", "num_frames": 2, "target_fps": 3}, [6, 25]),
                 ({"sampling_strategy": "middle", "num_frames": 8, "target_fps": 2}, [0, 17] + [29] * 6)]


@pytest.mark.parametrize("keep_bytes", [None, 0], ids=["default", "two-pass"])
def test_unbounded_containers_pick_clipbert_frames(unbounded30, keep_bytes, monkeypatch):
    if keep_bytes is not None:  # every window decoded twice: timestamps, then the picks only
        monkeypatch.setattr(decoder, "WINDOW_KEEP_BYTES", keep_bytes)
    for kw, expected in DECODE_ALL_30:
        for fast in (True, False):
            assert picks(decode_clips(unbounded30, fast=fast, **kw)) == expected, (kw, fast)
        frames, max_pts = extract_frames_from_video_binary(io.BytesIO(unbounded30), **kw)
        assert picks(frames) == expected and max_pts is None, kw
    for seed in range(5):  # random clips: the same draws as ClipBERT's
        random.seed(seed)
        ours = picks(decode_clips(unbounded30, 2, 3, n_clips=3, sampling_strategy="rand"))
        random.seed(seed)
        ref = [i for _ in range(3) for i in clipbert_decode_all(unbounded30, 2, 3, -1)]
        assert ours == ref, seed
    ours = picks(decode_clips(unbounded30, 2, 3, n_clips=4, mode="uniform"))
    assert ours == [i for k in range(4) for i in clipbert_decode_all(unbounded30, 2, 3, k, 4)]


def test_long_windows_give_the_same_frames_decoded_twice(monkeypatch):
    """mp4 (selective path, reference decode) with B-frames: a window over the keep budget is decoded
    twice; the frames equal those of the one-pass decode."""
    data = encode_mp4(indexed_frames(120), fps=30, codec="libx264", size=(64, 64), gop=30)
    requests = [{"sampling_strategy": "uniform", "num_frames": 5},
                {"sampling_strategy": "middle", "num_frames": 3},
                {"n_clips": 4, "mode": "uniform", "num_frames": 2}]
    one_pass = [decode_clips(data, target_fps=1, fast=False, **kw) for kw in requests]
    monkeypatch.setattr(decoder, "WINDOW_KEEP_BYTES", 0)
    for kw, expected in zip(requests, one_pass):
        assert torch.equal(decode_clips(data, target_fps=1, fast=False, **kw), expected), kw


class _CountingContainer:
    """A container whose decoded frames count themselves alive (the frames a decode holds at once)."""

    def __init__(self, container):
        self._c, self.live, self.peak = container, 0, 0

    def __getattr__(self, name):
        return getattr(self._c, name)

    def decode(self, **kw):
        for f in self._c.decode(**kw):
            yield _Tracked(f, self)


class _Tracked:
    def __init__(self, frame, owner):
        self.frame, self.owner = frame, owner
        self.pts, self.planes = frame.pts, frame.planes
        owner.live += 1
        owner.peak = max(owner.peak, owner.live)

    def __del__(self):
        self.owner.live -= 1


def test_decode_all_window_holds_only_the_picked_frames(monkeypatch):
    """A 300-frame MKV: ClipBERT held all 300 decoded frames; the bounded window holds what fits in
    WINDOW_KEEP_BYTES (here 4 frames' worth) and then only the picked ones."""
    data = encode(300, "matroska")
    frame_bytes = sum(p.buffer_size for p in next(av.open(io.BytesIO(data)).decode(video=0)).planes)
    monkeypatch.setattr(decoder, "WINDOW_KEEP_BYTES", 4 * frame_bytes)
    container = _CountingContainer(open_container(data))
    got, n = decode_window(container, 0, math.inf, lambda n: [0, n // 2, n - 1])
    assert n == 300 and [read_index(torch.from_numpy(f.frame.to_ndarray(format="rgb24")).permute(2, 0, 1))
                         for f in got] == [0, 150, 299]
    assert container.peak <= 4 + 3 + 1, container.peak
    # one-pass windows within the budget keep every frame of the window, as before
    monkeypatch.setattr(decoder, "WINDOW_KEEP_BYTES", 400 * frame_bytes)
    container = _CountingContainer(open_container(data))
    got, n = decode_window(container, 0, math.inf, lambda n: [5])
    assert n == 300 and container.peak == 300


@pytest.mark.parametrize("fmt,codec", [("mp4", "libx264"), ("matroska", "libx264"), ("webm", "libvpx")])
def test_frames_above_the_limit_are_refused(fmt, codec):
    data = encode_mp4(indexed_frames(10, 96), fps=30, codec=codec, size=(96, 96), container_format=fmt)
    with pytest.raises(VideoDecodeError) as e:
        decode_clips(data, 2, 3, max_frame_pixels=96 * 96 - 1)
    assert e.value.reason == "too_large"
    assert str(e.value) == "frame size 96x96 (9216 pixels) is above max_frame_pixels=9215"
    frames, _ = extract_frames_from_video_binary(io.BytesIO(data), num_frames=2)  # the default limit
    assert frames.shape == (2, 3, 96, 96)
    assert decode_clips(data, 2, 3, max_frame_pixels=96 * 96).shape == (2, 3, 96, 96)
    assert decode_clips(data, 2, 3, max_frame_pixels=0).shape == (2, 3, 96, 96)  # 0: no limit
    assert decoder.MAX_FRAME_PIXELS == with_defaults({}, "retrieval").max_frame_pixels == 7680 * 4320


def _header_says_64_frames_are_512():
    """An MKV whose header (and first 5 frames) say 64x64 and whose next 5 frames are 512x512: the
    header check cannot see them, the decoder's own max_pixels must refuse them."""
    return mp4_with_inband_size_change(64, 512, 5, 5, fmt="matroska")


def test_a_header_that_lies_about_the_size_does_not_get_big_frames_through():
    data = _header_says_64_frames_are_512()
    c = av.open(io.BytesIO(data))
    assert (c.streams.video[0].codec_context.width, c.streams.video[0].codec_context.height) == (64, 64)
    assert {f.width for f in c.decode(video=0)} == {64, 512}
    frames = decode_clips(data, 4, 1, sampling_strategy="uniform", max_frame_pixels=64 * 64 * 4)
    assert frames.shape == (4, 3, 64, 64)  # the frames before the refused ones, as for a corrupt tail
    with pytest.raises(VideoDecodeError, match="the frame size changes inside the video: 64x64, 512x512"):
        decode_clips(data, 4, 1, sampling_strategy="uniform", max_frame_pixels=0)


def test_images_above_the_limit_are_refused():
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (120, 80), (10, 20, 30)).save(buf, format="PNG")
    assert decode_image(buf.getvalue(), 120 * 80).shape == (1, 3, 80, 120)
    with pytest.raises(VideoDecodeError, match=r"image size 120x80 \(9600 pixels\) is above "
                                               r"max_frame_pixels=9599") as e:
        decode_image(buf.getvalue(), 120 * 80 - 1)
    assert e.value.reason == "too_large"


@pytest.fixture(scope="module")
def size_store(tmp_path_factory):
    """Two 32x32 videos (mp4, MKV) and a 64x64 one, for a dataset limit of 32x32 pixels."""
    path = str(tmp_path_factory.mktemp("sizes") / "db")
    with LMDBWriter(path) as w:
        w.put("small_mp4", encode(20, size=32))
        w.put("small_mkv", encode(20, "matroska", size=32))
        w.put("big", encode(20, size=64))
    return path


def test_training_replaces_too_large_videos_and_logs_them(size_store, caplog):
    from clipbert_legacy.datasets.build import load_tokenizer
    keys = ["small_mp4", "small_mkv", "big"]
    ds = VideoRetrievalDataset(_retrieval_groups(keys), size_store, itm_neg_size=1, fps=2, num_frm=2,
                               max_img_size=32, is_train=True, name="rt", max_frame_pixels=32 * 32)
    loader = build_train_dataloader(ds, ResumableDistributedSampler(len(ds), seed=1), 3,
                                    VideoRetrievalCollator(load_tokenizer(TOK_DIR), 12))
    caplog.set_level(logging.INFO)
    seen = [v for b in PrefetchLoader(loader, None, device="cpu") for v in b["vid_ids"]]
    assert len(seen) == 3 and set(seen) <= {"small_mp4", "small_mkv"}
    text = caplog.text
    assert ("bad video 'big' (too_large): frame size 64x64 (4096 pixels) is above max_frame_pixels=1024"
            in text)
    assert "1 bad video load(s) replaced (too_large=1): big" in text


def test_evaluation_lists_too_large_videos(size_store):
    from clipbert_legacy.datasets.build import load_tokenizer
    groups = [(k, [{"question": "what color?", "vid_id": k, "answer": "red", "question_id": i,
                    "answer_type": "color"}]) for i, k in enumerate(["small_mp4", "big", "small_mkv"])]
    ds = VideoQADataset("frameqa", groups, size_store, ans2label={"red": 0}, fps=2, num_frm=2,
                        max_img_size=32, n_clips=1, clip_mode="uniform", is_train=False,
                        skip_bad_videos=True, max_frame_pixels=32 * 32)
    loader = DataLoader(ds, 2, collate_fn=VideoQACollator(load_tokenizer(TOK_DIR), 12, "frameqa"))
    qids = [q for b in PrefetchLoader(loader, None, device="cpu") for q in b["question_ids"]]
    assert qids == [0, 2] and ds.last_pass_bad == [("big", "too_large")]


def test_the_config_option_reaches_the_datasets(tmp_path):
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    from tests.test_datasets import _cfg
    build_demo_data(str(tmp_path), n_train=4, n_val=2, n_test=2, img_size=32, n_frames=8, num_workers=1,
                    log=lambda *_: None)
    cfg = with_defaults(_cfg(str(tmp_path), max_frame_pixels=12345), "retrieval")
    ds, _ = build_retrieval_datasets(cfg, "train")
    assert ds.max_frame_pixels == 12345
