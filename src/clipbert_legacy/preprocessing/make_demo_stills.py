"""The demo's still-image caption data, for image-text pretraining (and VQA-style questions) on CPU.

    python -m clipbert_legacy.preprocessing.make_demo_stills --output_dir data/demo \
        [--n_train 1200 --n_val 60]

Writes ``OUTPUT/stills_db`` (an LMDB of PNG images: one frame of a shape on a textured background, the
same renderer as the demo videos, with seeds of their own so no still is a frame of a retrieval
video) and ``OUTPUT/txt/stills_{train,val}.jsonl`` rows ``{caption, image_id}`` with two captions per
image that name its colour and shape (never a motion: a still shows none). Pretraining on them and
fine-tuning video retrieval from that checkpoint is ClipBERT's point in miniature: what is learnt
from images transfers to video.
"""
import argparse
import io
import json
import os

import numpy as np

from clipbert_legacy.preprocessing.demo_vocab import COLORS, SHAPES
from clipbert_legacy.preprocessing.make_demo_data import render_video

TEMPLATES = ("a {color} {shape}", "there is a {color} {shape} in the picture", "a {shape} coloured {color}")
SPLIT_SEEDS = {"train": 101, "val": 102}


def png_bytes(frame) -> bytes:
    from PIL import Image
    buf = io.BytesIO()
    Image.fromarray(frame).save(buf, format="PNG")
    return buf.getvalue()


def make_stills(split, n, size, seed):
    """[(image_id, png bytes, [caption, caption])] of one split, every colour/shape pair in turn."""
    rng = np.random.default_rng([seed, SPLIT_SEEDS[split]])
    combos = [(c, s) for c in COLORS for s in SHAPES]
    out = []
    for i in range(n):
        color, shape = combos[(i + int(rng.integers(len(combos)))) % len(combos)]
        frame = render_video(color, shape, "still", seed=int(rng.integers(2 ** 31)), size=size, n_frames=1)[0]
        picks = rng.choice(len(TEMPLATES), 2, replace=False)
        caps = [TEMPLATES[t].format(color=color, shape=shape) for t in picks]
        out.append((f"demo_still_{split}_{i:05d}", png_bytes(frame), caps))
    return out


def build_demo_stills(output_dir, n_train=1200, n_val=60, size=64, seed=42, log=print):
    """Write the stills store and annotations; returns {split: n_images}."""
    from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
    db = os.path.join(output_dir, "stills_db")
    if os.path.isdir(db) and os.listdir(db):
        raise FileExistsError(f"{db} already exists and is not empty; delete it or pick another --output_dir")
    os.makedirs(os.path.join(output_dir, "txt"), exist_ok=True)
    counts = {}
    with LMDBWriter(db) as writer:
        for split, n in (("train", n_train), ("val", n_val)):
            stills = make_stills(split, n, size, seed)
            with open(os.path.join(output_dir, "txt", f"stills_{split}.jsonl"), "w") as f:
                for image_id, data, caps in stills:
                    writer.put(image_id, data)
                    f.writelines(json.dumps({"caption": c, "image_id": image_id}) + "\n" for c in caps)
            counts[split] = n
    log(f"demo stills: {counts} images (2 captions each) -> {db}")
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--output_dir", default="data/demo")
    ap.add_argument("--n_train", type=int, default=1200)
    ap.add_argument("--n_val", type=int, default=60)
    ap.add_argument("--img_size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args(argv)
    build_demo_stills(a.output_dir, a.n_train, a.n_val, a.img_size, a.seed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
