"""Peer decoders for bench_decoders.py, run in the throw-away peer environment (its own CPU torch,
torchcodec, decord, OpenCV), since torchcodec cannot be imported beside every torch build.

Reads a JSON job on stdin: {"rounds": R, "videos": [{"name", "path", "keyframes": [frame index],
"requests": {req: [frame index]}}]}; writes JSON on stdout: {peer: {"skipped": reason} | {video name:
{req: {"cpu_ms", "wall_ms", "sha1"}}}}. Times are the best of R rounds (CPU: time.process_time, one
thread), opening the video from bytes in memory each time (OpenCV: from the file, which it needs).
sha1 is over the (H, W, 3) RGB frames in request order.

Every peer gets its best call: the requested indices sorted and de-duplicated (8 random clips come
in random order and may overlap; a decoder handed them unsorted seeks back and forth), and the frames
put back in request order afterwards (inside the timing). OpenCV cannot be told what to fetch, so it
seeks (`CAP_PROP_POS_FRAMES`) only when a keyframe lies between its position and the next frame, and
otherwise reads on (`grab`), which decodes what a seek would decode again; the keyframe positions
come with the job (OpenCV does not expose them).
"""
import hashlib
import io
import json
import os
import sys
import time

import numpy as np


def _sha1(frames_hwc):
    return hashlib.sha1(np.ascontiguousarray(frames_hwc, dtype=np.uint8).tobytes()).hexdigest()


def _sorted_unique(idx):
    """(sorted distinct indices, positions that put their frames back in request order)."""
    uniq = np.unique(np.asarray(idx, dtype=np.int64))
    return uniq, np.searchsorted(uniq, idx)


def _torchcodec(seek_mode):
    import torch
    from torchcodec.decoders import VideoDecoder
    torch.set_num_threads(1)

    def run(data, path, idx, keyframes):
        uniq, back = _sorted_unique(idx)
        dec = VideoDecoder(data, seek_mode=seek_mode, num_ffmpeg_threads=1, dimension_order="NHWC")
        return dec.get_frames_at(uniq.tolist()).data.numpy()[back]
    return run


def _decord():
    import decord

    def run(data, path, idx, keyframes):
        uniq, back = _sorted_unique(idx)
        vr = decord.VideoReader(io.BytesIO(data), ctx=decord.cpu(0), num_threads=1)
        return vr.get_batch(uniq.tolist()).asnumpy()[back]
    return run


def _opencv():
    import bisect

    import cv2
    cv2.setNumThreads(1)

    def run(data, path, idx, keyframes):
        uniq, back = _sorted_unique(idx)
        cap = cv2.VideoCapture(path, cv2.CAP_FFMPEG, [cv2.CAP_PROP_N_THREADS, 1])
        out, pos = [], 0  # pos: the frame the next read returns
        for i in uniq.tolist():
            if i < pos or bisect.bisect_right(keyframes, i) > bisect.bisect_right(keyframes, pos):
                cap.set(cv2.CAP_PROP_POS_FRAMES, i)  # a keyframe in between (or behind): seek
            else:
                for _ in range(i - pos):
                    cap.grab()
            ok, bgr = cap.read()
            if not ok:
                raise RuntimeError(f"OpenCV could not read frame {i}")
            out.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
            pos = i + 1
        cap.release()
        return np.stack(out)[back]
    return run


PEERS = {
    "torchcodec_exact": lambda: _torchcodec("exact"),
    "torchcodec_approx": lambda: _torchcodec("approximate"),
    "decord": _decord,
    "opencv": _opencv,
}


def _measure(run, data, path, idx, keyframes, rounds):
    best_cpu = best_wall = float("inf")
    frames = None
    for _ in range(rounds):
        c, w = time.process_time(), time.perf_counter()
        frames = run(data, path, idx, keyframes)
        best_cpu = min(best_cpu, time.process_time() - c)
        best_wall = min(best_wall, time.perf_counter() - w)
    return {"cpu_ms": 1e3 * best_cpu, "wall_ms": 1e3 * best_wall, "sha1": _sha1(frames)}


def _bench_peer(make, job):
    try:
        run = make()
    except Exception as e:  # ImportError, missing FFmpeg shared libraries (OSError/RuntimeError)
        return {"skipped": f"cannot import: {type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    out = {}
    for v in job["videos"]:
        with open(v["path"], "rb") as f:
            data = f.read()
        try:
            out[v["name"]] = {req: _measure(run, data, v["path"], idx, v["keyframes"], job["rounds"])
                              for req, idx in v["requests"].items()}
        except Exception as e:
            out[v["name"]] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
    return out


def main():
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    job = json.load(sys.stdin)
    json.dump({name: _bench_peer(make, job) for name, make in PEERS.items()
               if name in job.get("peers", PEERS)}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
