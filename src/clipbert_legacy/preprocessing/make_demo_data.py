"""Deterministic synthetic video-text dataset that a small model can learn (quickstart/demo).

Each video (libx264 mp4, default 64x64, 30 frames at 10 fps) shows one coloured shape over a
random grey texture. The shape starts near the centre and moves left/right/up/down or stays
still; colour x shape x motion = 6 x 3 x 5 = 90 combinations. Output under --output_dir:

    vis_db/                          LMDB, key = clip name, value = mp4 bytes
    txt/retrieval_{split}.jsonl      {caption, clip_name}                       (1 caption per video)
    txt/frameqa_{split}.jsonl        {question, answer, answer_type, gif_name}  (color + object)
    txt/action_{split}.jsonl         {question, options[5], answer:int, gif_name} (motion, 5-way)
    txt/mc_{split}.jsonl             {qid, clip_name, options[5 captions], answer:int} (val/test)
    txt/attributes_{split}.jsonl     {clip_name, color, shape, motion}           (CNN pretraining labels)
    txt/ans2label.json               frameqa answers -> label ids
    stats.json                       sizes and chance baselines
    pretrained/cnn_tiny_grid.pth     the demo's pretrained tiny grid CNN
    (clipbert_legacy.preprocessing.pretrain_demo_cnn;
                                     the command line does this step, ~1 min; --cnn_pretrain_steps 0 skips it)

Val/test videos use distinct combinations (up to 90), so every caption matches one video.
Motion is only visible across frames: the shape starts within a few pixels of the centre.

    python -m clipbert_legacy.preprocessing.make_demo_data --output_dir data/demo \
        --n_train 1800 --n_val 90 --n_test 90
"""
import argparse
import io
import json
import os
import sys
import time
from collections import Counter
from multiprocessing import Pool

import av
import numpy as np

from clipbert_legacy.preprocessing.demo_vocab import (
    COLORS,
    COMBOS,
    MOTION_OPTIONS,
    MOTIONS,
    SHAPES,
    caption_for,
)


def encode_mp4(frames, fps=10, codec="libx264", size=None, gop=None, crf=20, preset="veryfast",
               x264_params="", container_format="mp4"):
    """Encode an iterable of uint8 (H, W, 3) RGB frames into mp4 bytes with PyAV (`x264_params`:
    extra libx264 options such as "scenecut=0" for a fixed keyframe interval; `container_format`
    "matroska" or "webm" (with codec "libvpx") for the containers that give no frame count)."""
    frames = iter(frames)
    first = next(frames)
    h, w = first.shape[:2] if size is None else (size[1], size[0])
    buf = io.BytesIO()
    with av.open(buf, "w", format=container_format) as container:
        stream = container.add_stream(codec, rate=fps)
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        if codec == "libx264":
            # builds must be deterministic: one encoder thread (threaded x264 output varies run to run)
            # and x264's C code paths: with its SIMD (asm) paths 1-4 of the 1,980 demo clips came out
            # differently from run to run even single-threaded (measured with this PyAV's x264).
            # The demo clips are tiny, so both cost little.
            params = ":".join(filter(None, ["asm=0", x264_params]))
            stream.options = {"crf": str(crf), "preset": preset, "threads": "1", "x264-params": params}
        else:
            stream.bit_rate = 4_000_000
        if gop:
            stream.codec_context.gop_size = gop
        for img in _chain(first, frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(img), format="rgb24")
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return buf.getvalue()


def _chain(first, rest):
    yield first
    yield from rest


def _background(rng, size):
    base = rng.uniform(90, 150)
    cells = max(2, size // 8)
    noise = rng.uniform(-28, 28, (cells, cells))
    tex = np.kron(noise, np.ones((size // cells + 1, size // cells + 1)))[:size, :size]
    yy, xx = np.mgrid[:size, :size]
    period = rng.uniform(6, 14)
    angle = rng.uniform(0, np.pi)
    stripes = 10 * np.sin((xx * np.cos(angle) + yy * np.sin(angle)) * 2 * np.pi / period)
    gray = np.clip(base + tex + stripes, 0, 255)
    tint = rng.uniform(-8, 8, 3)
    return np.clip(gray[..., None] + tint, 0, 255).astype(np.uint8)


def _shape_mask(shape, cx, cy, r, size):
    yy, xx = np.mgrid[:size, :size]
    if shape == "square":
        return (np.abs(xx - cx) <= r) & (np.abs(yy - cy) <= r)
    if shape == "circle":
        return (xx - cx) ** 2 + (yy - cy) ** 2 <= r ** 2
    # upward triangle: apex at top, base at the bottom
    top, bottom = cy - r, cy + r
    frac = np.clip((yy - top) / max(2 * r, 1), 0, 1)
    return (yy >= top) & (yy <= bottom) & (np.abs(xx - cx) <= frac * r * 1.1)


def render_video(color, shape, motion, seed, size=64, n_frames=30):
    """Frames (n_frames, size, size, 3) uint8 of one clip; fully determined by the arguments."""
    rng = np.random.default_rng(seed)
    bg = _background(rng, size)
    rgb = np.clip(np.array(COLORS[color]) + rng.uniform(-15, 15, 3), 0, 255).astype(np.uint8)
    r = rng.uniform(0.13, 0.18) * size
    cx0 = size / 2 + rng.uniform(-0.05, 0.05) * size
    cy0 = size / 2 + rng.uniform(-0.05, 0.05) * size
    dist = rng.uniform(0.28, 0.33) * size
    dx, dy = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1), "still": (0, 0)}[motion]
    frames = []
    for t in range(n_frames):
        a = t / max(n_frames - 1, 1)
        frame = bg.copy()
        frame[_shape_mask(shape, cx0 + dx * dist * a, cy0 + dy * dist * a, r, size)] = rgb
        frames.append(frame)
    return np.stack(frames)


def _split_combos(n, rng):
    """Combination index per video: concatenated permutations, so the first 90 are distinct and
    every combination occurs equally often (+-1)."""
    out = []
    while len(out) < n:
        perm = rng.permutation(len(COMBOS)).tolist()
        out.extend(perm)
    return out[:n]


def _encode_job(job):
    name, combo, seed, size, n_frames, fps = job
    return name, encode_mp4(render_video(*combo, seed=seed, size=size, n_frames=n_frames), fps=fps)


def make_split(split, n, seed, split_id):
    rng = np.random.default_rng([seed, split_id])
    combo_ids = _split_combos(n, rng)
    videos = []
    for i, cid in enumerate(combo_ids):
        color, shape, motion = COMBOS[cid]
        videos.append({"clip_name": f"demo_{split}_{i:05d}", "color": color, "shape": shape,
                       "motion": motion, "seed": int(rng.integers(2 ** 31)), "template": int(rng.integers(3)),
                       "option_perm": rng.permutation(5).tolist(),
                       "mc_perm": rng.permutation(5).tolist(),
                       "mc_neg": [int(x) for x in rng.integers(0, 10 ** 6, 4)]})
    return videos


def _mc_caption_options(v):
    """True caption + 4 captions that differ in exactly one attribute (colour, shape or motion)."""
    c, s, m = v["color"], v["shape"], v["motion"]
    colors = [x for x in COLORS if x != c]
    shapes = [x for x in SHAPES if x != s]
    motions = [x for x in MOTIONS if x != m]
    k = v["mc_neg"]
    negs = [(colors[k[0] % 5], s, m), (c, shapes[k[1] % 2], m), (c, s, motions[k[2] % 4]),
            (c, s, motions[(k[2] + 1 + k[3] % 3) % 4])]
    options = [caption_for(c, s, m, 0)] + [caption_for(*x, 0) for x in negs]
    ordered = [options[i] for i in v["mc_perm"]]
    return ordered, v["mc_perm"].index(0)


def annotations(videos, split):
    ret, qa, action, mc, attrs = [], [], [], [], []
    for qid, v in enumerate(videos):
        c, s, m, name = v["color"], v["shape"], v["motion"], v["clip_name"]
        attrs.append({"clip_name": name, "color": c, "shape": s, "motion": m})
        ret.append({"caption": caption_for(c, s, m, v["template"]), "clip_name": name})
        qa.append({"question": f"what color is the {s}?", "answer": c, "answer_type": "color",
                   "gif_name": name})
        qa.append({"question": f"what shape is the {c} object?", "answer": s, "answer_type": "object",
                   "gif_name": name})
        opts = [MOTION_OPTIONS[MOTIONS[i]] for i in v["option_perm"]]
        action.append({"question": f"where does the {c} {s} go?", "options": opts,
                       "answer": opts.index(MOTION_OPTIONS[m]), "gif_name": name})
        if split != "train":
            options, answer = _mc_caption_options(v)
            mc.append({"qid": qid, "clip_name": name, "options": options, "answer": answer})
    return ret, qa, action, mc, attrs


def _write_jsonl(path, rows):
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")


def build_demo_data(output_dir, n_train=1800, n_val=90, n_test=90, seed=42, img_size=64, n_frames=30,
                    fps=10, num_workers=2, log=print):
    """Write the demo dataset; returns the stats dict (also saved as stats.json)."""
    if img_size % 2:
        raise ValueError(f"--img_size must be even for yuv420p, got {img_size}")
    lmdb_dir, txt_dir = os.path.join(output_dir, "vis_db"), os.path.join(output_dir, "txt")
    if os.path.isdir(lmdb_dir) and os.listdir(lmdb_dir):
        raise FileExistsError(f"{lmdb_dir} already exists and is not empty; pick a new --output_dir")
    os.makedirs(txt_dir, exist_ok=True)
    t0 = time.time()
    splits = {"train": make_split("train", n_train, seed, 0), "val": make_split("val", n_val, seed, 1),
              "test": make_split("test", n_test, seed, 2)}
    _write_videos(lmdb_dir, splits, img_size, n_frames, fps, num_workers)
    stats = {"n_videos": {k: len(v) for k, v in splits.items()}, "img_size": img_size,
             "n_frames": n_frames, "fps": fps, "n_combinations": len(COMBOS), "seed": seed}
    answers = sorted(set(COLORS) | set(SHAPES))
    ans2label = {a: i for i, a in enumerate(answers)}
    with open(os.path.join(txt_dir, "ans2label.json"), "w") as f:
        json.dump(ans2label, f, indent=1)
    stats.update(_write_annotations(txt_dir, splits))
    stats["n_answers"] = len(ans2label)
    stats["build_seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(output_dir, "stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    n_videos = sum(len(v) for v in splits.values())
    log(f"demo data: {n_videos} videos in {stats['build_seconds']} s -> {output_dir}")
    return stats


def _write_videos(lmdb_dir, splits, img_size, n_frames, fps, num_workers):
    """Render and encode every video of every split into the LMDB (in order, whatever the workers)."""
    from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
    jobs = [(v["clip_name"], (v["color"], v["shape"], v["motion"]), v["seed"], img_size, n_frames, fps)
            for vids in splits.values() for v in vids]
    with LMDBWriter(lmdb_dir) as writer:
        if num_workers > 1:
            with Pool(num_workers) as pool:
                for name, data in pool.imap(_encode_job, jobs, chunksize=16):
                    writer.put(name, data)
        else:
            for job in jobs:
                writer.put(*_encode_job(job))


def _write_annotations(txt_dir, splits):
    """Write every split's jsonl files; returns {split: chance baselines} for the val/test splits
    (the frame-QA majority answer is the training split's, so ``splits`` must start with train)."""
    baselines = {}
    train_qa_answers = Counter()
    for split, vids in splits.items():
        ret, qa, action, mc, attrs = annotations(vids, split)
        _write_jsonl(os.path.join(txt_dir, f"attributes_{split}.jsonl"), attrs)
        _write_jsonl(os.path.join(txt_dir, f"retrieval_{split}.jsonl"), ret)
        _write_jsonl(os.path.join(txt_dir, f"frameqa_{split}.jsonl"), qa)
        _write_jsonl(os.path.join(txt_dir, f"action_{split}.jsonl"), action)
        if mc:
            _write_jsonl(os.path.join(txt_dir, f"mc_{split}.jsonl"), mc)
        if split == "train":
            train_qa_answers.update(d["answer"] for d in qa)
            continue
        majority = train_qa_answers.most_common(1)[0][0] if train_qa_answers else qa[0]["answer"]
        baselines[split] = _split_baselines(vids, ret, qa, action, majority)
    return baselines


def _best_constant_acc(rows):
    """Accuracy (%) of always giving the most frequent answer of ``rows``."""
    return round(100.0 * Counter(d["answer"] for d in rows).most_common(1)[0][1] / len(rows), 2)


def _split_baselines(vids, ret, qa, action, majority):
    by_type = {}
    for t in ("color", "object"):
        tq = [d for d in qa if d["answer_type"] == t]
        top = Counter(d["answer"] for d in tq).most_common(1)[0][1] if tq else 0
        by_type[t] = round(100.0 * top / max(len(tq), 1), 2)
    return {
        "retrieval_r1_chance": round(100.0 / len(ret), 2) if ret else None,
        "retrieval_r5_chance": round(100.0 * min(5, len(ret)) / len(ret), 2) if ret else None,
        "distinct_combinations": len({(v["color"], v["shape"], v["motion"]) for v in vids}),
        "distinct_captions": len({d["caption"] for d in ret}),
        "frameqa_majority_acc": round(100.0 * sum(d["answer"] == majority for d in qa) / len(qa), 2),
        "frameqa_best_constant_acc": _best_constant_acc(qa),
        "frameqa_per_type_best_constant_acc": by_type,
        "action_chance_acc": 20.0,
        "action_majority_index_acc": _best_constant_acc(action),
        "mc_chance_acc": 20.0,
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--output_dir", required=True)
    p.add_argument("--n_train", type=int, default=1800)
    p.add_argument("--n_val", type=int, default=90)
    p.add_argument("--n_test", type=int, default=90)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--img_size", type=int, default=64, help="frame width = height (even)")
    p.add_argument("--n_frames", type=int, default=30)
    p.add_argument("--fps", type=int, default=10)
    p.add_argument("--num_workers", type=int, default=2)
    p.add_argument("--cnn_pretrain_steps", type=int, default=500,
                   help="steps of the demo CNN pretraining (pretrained/cnn_tiny_grid.pth, which the demo "
                        "configs load as cnn_weights_path); 0 skips it")
    a = p.parse_args(argv)
    try:
        stats = build_demo_data(a.output_dir, a.n_train, a.n_val, a.n_test, a.seed, a.img_size,
                                a.n_frames, a.fps, a.num_workers)
        if a.cnn_pretrain_steps > 0:
            from clipbert_legacy.preprocessing.pretrain_demo_cnn import pretrain_demo_cnn
            stats["cnn_pretrain"] = pretrain_demo_cnn(a.output_dir, steps=a.cnn_pretrain_steps, seed=a.seed)
            with open(os.path.join(a.output_dir, "stats.json"), "w") as f:
                json.dump(stats, f, indent=1)
    except (ValueError, FileExistsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
