"""Peak memory of one 2-frame sample from hostile or unbounded videos (issue 38, items 5-6).

Each measurement runs in a fresh subprocess (peak RSS = ``VmHWM`` after the sample; ``base`` = the same
process after its imports, before the video is decoded):

- ``720p.mp4``   3000 frames of 720p H.264 (the baseline: its header gives the frame count)
- ``720p.mkv``   the same packets remuxed into Matroska (no frame count: ClipBERT's decode-all path)
- ``8192.mp4``   10 frames of 8192x8192 H.264 (refused from its header by the default max_frame_pixels)

and each video twice: ``ours`` (clipbert_legacy.datasets.decoder as it is) and ``unbounded`` (the same decoder
with the window budget and the size limit turned off: what ClipBERT's decoder did, keeping every frame
of the window). Printed: the peak, the growth over the base, seconds, the outcome, and the ratios the
issue asks for: MKV/mp4 peak (target <= 2) and the 8192x8192 peak (target: refused or < 1.5 GB).

    python benchmarks/bench_decoder_memory.py [--frames 3000] [--skip-unbounded]

Videos are cached in ~/.cache/clipbert-legacy/bench_videos (the 8192x8192 encode takes ~1.5 GB and
~15 s once).
"""
import argparse
import io
import json
import math
import os
import subprocess
import sys

import av
import numpy as np

CACHE = os.path.join(os.path.expanduser("~/.cache/clipbert-legacy"), "bench_videos")

WORKER = r"""
import io, json, math, random, sys, time
import clipbert_legacy.datasets.decoder as dec
path, mode = sys.argv[1], sys.argv[2]
data = open(path, "rb").read()
def kb():  # this process's peak RSS (ru_maxrss would include the parent's: Linux keeps it across exec)
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
base = kb()
limit = dec.MAX_FRAME_PIXELS
if mode == "unbounded":
    dec.WINDOW_KEEP_BYTES, limit = math.inf, 0
random.seed(0)
t = time.perf_counter()
try:
    frames = dec.decode_clips(data, num_frames=2, target_fps=1, sampling_strategy="rand",
                              max_frame_pixels=limit)
    outcome = "decoded %s" % (tuple(frames.shape),)
except dec.VideoDecodeError as e:
    outcome = "refused (%s): %s" % (e.reason, e)
print(json.dumps({"base_mb": base / 1024, "peak_mb": kb() / 1024, "s": time.perf_counter() - t,
                  "outcome": outcome}))
"""


def _frames(w, h, n):
    """A slowly moving box over a fixed texture: small to encode, every frame different."""
    rng = np.random.default_rng(0)
    bg = np.kron(rng.integers(60, 190, (h // 16 + 1, w // 16 + 1, 1)).astype(np.uint8),
                 np.ones((16, 16, 3), np.uint8))[:h, :w]
    for t in range(n):
        f = bg.copy()
        x = int((w - 64) * (0.5 + 0.5 * math.sin(t / 40)))
        f[h // 2 - 32: h // 2 + 32, x:x + 64] = (230, 40, 40)
        yield f


def _encode(path, w, h, n, fmt="mp4", preset="veryfast"):
    buf = io.BytesIO()
    with av.open(buf, "w", format=fmt) as c:
        s = c.add_stream("libx264", rate=30)
        s.width, s.height, s.pix_fmt = w, h, "yuv420p"
        s.options = {"preset": preset, "crf": "28"}
        for img in _frames(w, h, n):
            for p in s.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                c.mux(p)
        for p in s.encode():
            c.mux(p)
    _write(path, buf.getvalue())


def _remux(src, path, fmt):
    """The same H.264 packets in another container."""
    buf = io.BytesIO()
    with av.open(src) as inp, av.open(buf, "w", format=fmt) as out:
        ist = inp.streams.video[0]
        ost = out.add_stream_from_template(ist)
        for p in inp.demux(ist):
            if p.dts is None:
                continue
            p.stream = ost
            out.mux(p)
    _write(path, buf.getvalue())


def _write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def videos(n_frames):
    mp4 = os.path.join(CACHE, f"mem_720p_{n_frames}.mp4")
    mkv = mp4[:-4] + ".mkv"
    big = os.path.join(CACHE, "mem_8192x8192_10.mp4")
    if not os.path.exists(mp4):
        _encode(mp4, 1280, 720, n_frames)
    if not os.path.exists(mkv):
        _remux(mp4, mkv, "matroska")
    if not os.path.exists(big):
        _encode(big, 8192, 8192, 10, preset="ultrafast")
    return {"720p.mp4": mp4, "720p.mkv": mkv, "8192.mp4": big}


def measure(path, mode):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join((os.path.join(repo, "src"), repo,
                                           os.environ.get("PYTHONPATH", ""))))
    out = subprocess.run([sys.executable, "-c", WORKER, path, mode], capture_output=True, text=True, env=env,
                         timeout=1800)
    if out.returncode:
        return {"peak_mb": float("nan"), "base_mb": float("nan"), "s": float("nan"),
                "outcome": f"worker failed (rc {out.returncode}): {out.stderr.strip().splitlines()[-1:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--frames", type=int, default=3000, help="frames of the 720p videos")
    ap.add_argument("--skip-unbounded", action="store_true", help="measure only ours (the unbounded MKV and "
                    "8192x8192 runs take several GB)")
    ap.add_argument("--json", help="write the results here too")
    a = ap.parse_args(argv)
    vids = videos(a.frames)
    modes = ["ours"] if a.skip_unbounded else ["ours", "unbounded"]
    res = {}
    print(f"{'video':10} {'mode':10} {'size':>9} {'peak MB':>8} {'+base MB':>8} {'s':>6}  outcome")
    for name, path in vids.items():
        for mode in modes:
            r = res[(name, mode)] = measure(path, mode)
            print(f"{name:10} {mode:10} {os.path.getsize(path) / 1024:7.0f}KB {r['peak_mb']:8.0f} "
                  f"{r['peak_mb'] - r['base_mb']:8.0f} {r['s']:6.2f}  {r['outcome'][:90]}", flush=True)
    for mode in modes:
        mkv, mp4 = res[("720p.mkv", mode)], res[("720p.mp4", mode)]
        print(f"{mode}: MKV/mp4 peak RSS ratio {mkv['peak_mb'] / mp4['peak_mb']:.2f} (target <= 2); growth "
              f"ratio {(mkv['peak_mb'] - mkv['base_mb']) / max(mp4['peak_mb'] - mp4['base_mb'], 1):.2f}; "
              f"8192x8192: {res[('8192.mp4', mode)]['peak_mb']:.0f} MB peak (target: refused or < 1536 MB)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({f"{k[0]} {k[1]}": v for k, v in res.items()}, f, indent=1)


if __name__ == "__main__":
    main()
