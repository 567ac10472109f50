"""Pretrain the demo's tiny grid CNN on the demo videos' attribute labels (colour, shape, motion).

ClipBERT never trains its CNN from scratch: it starts from a ResNet-50 whose grid features were
pretrained on Visual Genome objects and attributes (``detectron2_weights_path``), and its transformer
from BERT. The demo does the same in miniature, because a randomly initialised CNN learns too
slowly through a pretrained transformer for a CPU budget: ``configs/demo_qa_action.json`` (225 steps,
``horovodrun -np 2``) ends at 20.0% val accuracy (chance; loss ln 5) with ``--cnn_weights_path ''``
and at 100.0% from this pretrained CNN.

What it does: decode ``num_frm`` frames of every training video once (ClipBERT's ``uniform``
sampling, resized and zero-padded like the task datasets), run the ``tiny`` backbone + a throwaway
grid encoder per frame, mean-pool over time as ClipBERT's visual embedding does, and train three
linear heads on the flattened grid (colour, shape, motion; motion is visible only through where the
shape sits in the time-averaged grid, exactly what the downstream model sees). Only the backbone is
saved, as a detectron2-style checkpoint (``{"model": {"backbone.stem.conv1.weight": ...}}``); the
task model's ``grid_encoder`` starts fresh, as in ClipBERT. Labels: ``txt/attributes_{split}.jsonl``
written by :mod:`clipbert_legacy.preprocessing.make_demo_data`; only the train split is learned from, the val
split is reported.

    python -m clipbert_legacy.preprocessing.pretrain_demo_cnn --data_dir data/demo
    # -> data/demo/pretrained/cnn_tiny_grid.pth (+ cnn_tiny_grid.json with the val accuracies)
"""
import argparse
import json
import logging
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from clipbert_legacy.datasets.decoder import VideoDecodeError, decode_clips
from clipbert_legacy.datasets.image_ops import ImageNorm, resize_and_pad
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.datasets.lmdb_store import LMDBStore
from clipbert_legacy.modeling.backbone import GridFeatBackbone, build_resnet
from clipbert_legacy.preprocessing.demo_vocab import COLORS, MOTIONS, SHAPES

logger = logging.getLogger(__name__)

__all__ = ["ATTRIBUTES", "WEIGHTS_NAME", "decode_split", "AttributeProbe", "pretrain_demo_cnn"]

ATTRIBUTES = {"color": list(COLORS), "shape": list(SHAPES), "motion": list(MOTIONS)}
WEIGHTS_NAME = os.path.join("pretrained", "cnn_tiny_grid.pth")
# ImageNet statistics in RGB order: the demo configs' img_pixel_mean / img_pixel_std
PIXEL_MEAN, PIXEL_STD = (123.675, 116.28, 103.53), (58.395, 57.12, 57.375)


def decode_split(data_dir, split, num_frm=3, fps=1, max_img_size=128):
    """(uint8 frames (N, T, 3, S, S), {attribute: long labels (N,)}) of one split.

    Raises ValueError naming the video when one does not decode (the demo data is ours: a failure
    means a broken build, not something to skip).
    """
    path = os.path.join(data_dir, "txt", f"attributes_{split}.jsonl")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path} not found: {data_dir} is not demo data, or was built before "
                                "make_demo_data wrote attribute labels; rebuild it into an empty directory "
                                "with "
                                "python -m clipbert_legacy.preprocessing.make_demo_data --output_dir DIR")
    rows = load_jsonl(path, required_fields=("clip_name",) + tuple(ATTRIBUTES))
    store = LMDBStore(os.path.join(data_dir, "vis_db"))
    frames = []
    for r in rows:
        try:
            clip = decode_clips(store.get(r["clip_name"]), num_frames=num_frm, target_fps=fps,
                                sampling_strategy="uniform")
        except (VideoDecodeError, KeyError) as e:
            raise ValueError(f"{data_dir}/vis_db: video {r['clip_name']!r} does not decode ({e}); rebuild "
                             "the demo data with "
                             "python -m clipbert_legacy.preprocessing.make_demo_data") from None
        frames.append(resize_and_pad(clip, max_img_size).round().clamp(0, 255).to(torch.uint8))
    labels = {}
    for name, values in ATTRIBUTES.items():
        unknown = sorted({r[name] for r in rows} - set(values))
        if unknown:
            raise ValueError(f"attributes_{split}.jsonl: unknown {name} value(s) {unknown}; "
                             f"expected {values}")
        labels[name] = torch.tensor([values.index(r[name]) for r in rows], dtype=torch.long)
    return torch.stack(frames), labels


class AttributeProbe(nn.Module):
    """Grid CNN -> mean over frames -> one linear head per attribute on the flattened grid."""

    def __init__(self, grid_cells, hidden_size=384, input_format="BGR"):
        super().__init__()
        self.cnn = GridFeatBackbone(build_resnet("tiny"), hidden_size, input_format=input_format)
        self.heads = nn.ModuleDict({k: nn.Linear(grid_cells * hidden_size, len(v))
                                    for k, v in ATTRIBUTES.items()})

    def forward(self, frames):
        pooled = self.cnn(frames).mean(1).flatten(1)  # (B, h*w*d), temporal mean as ClipBERT
        return {k: head(pooled) for k, head in self.heads.items()}


def _normalise(frames_uint8, norm):
    return norm(frames_uint8.float())  # (B, T, 3, S, S), new tensor: normalised in place


@torch.no_grad()
def _accuracy(model, frames, labels, norm, batch_size=64):
    model.eval()
    hits = dict.fromkeys(ATTRIBUTES, 0)
    for i in range(0, len(frames), batch_size):
        out = model(_normalise(frames[i:i + batch_size], norm))
        for k in hits:
            hits[k] += int((out[k].argmax(-1) == labels[k][i:i + batch_size]).sum())
    model.train()
    return {k: round(100.0 * v / max(len(frames), 1), 2) for k, v in hits.items()}


def pretrain_demo_cnn(data_dir, out_path=None, steps=500, batch_size=16, lr=1e-3, weight_decay=1e-4,
                      num_frm=3, fps=1, max_img_size=128, seed=42, log=print):
    """Train the probe, save the backbone; returns the stats dict (also written next to the weights).

    Deterministic for a given seed and thread count (single process, no data workers).
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps} and {batch_size}")
    out_path = out_path or os.path.join(data_dir, WEIGHTS_NAME)
    t0 = time.time()
    torch.manual_seed(seed)
    train_x, train_y = decode_split(data_dir, "train", num_frm, fps, max_img_size)
    val_x, val_y = decode_split(data_dir, "val", num_frm, fps, max_img_size)
    t_decode = time.time() - t0
    norm = ImageNorm(PIXEL_MEAN, PIXEL_STD)
    with torch.no_grad():
        probe_input = torch.zeros(1, 1, 3, max_img_size, max_img_size)
        probe_grid = GridFeatBackbone(build_resnet("tiny"), 8)(probe_input)
    model = AttributeProbe(probe_grid.shape[2] * probe_grid.shape[3])
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    gen = torch.Generator().manual_seed(seed)
    n = len(train_x)
    for step in range(1, steps + 1):
        idx = torch.randint(0, n, (batch_size,), generator=gen)
        out = model(_normalise(train_x[idx], norm))
        loss = sum(F.cross_entropy(out[k], train_y[k][idx]) for k in ATTRIBUTES)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % max(1, steps // 5) == 0 or step == steps:
            log(f"cnn pretrain step {step}/{steps}: loss {loss.item():.3f}")
    stats = {"steps": steps, "batch_size": batch_size, "lr": lr, "num_frm": num_frm, "fps": fps,
             "max_img_size": max_img_size, "seed": seed, "n_train_videos": n,
             "train_acc": _accuracy(model, train_x, train_y, norm),
             "val_acc": _accuracy(model, val_x, val_y, norm),
             "chance_acc": {k: round(100.0 / len(v), 2) for k, v in ATTRIBUTES.items()},
             "decode_seconds": round(t_decode, 1), "seconds": round(time.time() - t0, 1)}
    backbone = {f"backbone.{k}": v.detach().float().clone()
                for k, v in model.cnn.feature.backbone.state_dict().items()}
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp"
    torch.save({"model": backbone, "meta": {"source": "clipbert_legacy.preprocessing.pretrain_demo_cnn",
                                             "cnn_type": "tiny", **stats}}, tmp)
    os.replace(tmp, out_path)
    with open(os.path.splitext(out_path)[0] + ".json", "w") as f:
        json.dump(stats, f, indent=1)
    log(f"cnn pretrain: val accuracy {json.dumps(stats['val_acc'])} "
        f"(chance {json.dumps(stats['chance_acc'])}) in {stats['seconds']} s -> {out_path}")
    return stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True, help="output_dir of make_demo_data")
    p.add_argument("--out", default=None, help=f"weights file (default DATA_DIR/{WEIGHTS_NAME})")
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--max_img_size", type=int, default=128)
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args(argv)
    try:
        pretrain_demo_cnn(a.data_dir, a.out, steps=a.steps, batch_size=a.batch_size, lr=a.lr,
                          max_img_size=a.max_img_size, seed=a.seed)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
