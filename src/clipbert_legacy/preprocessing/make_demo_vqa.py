"""VQA demo data: single frames of the synthetic demo videos with colour / shape questions.

Reads what ``make_demo_data`` wrote (``vis_db`` and ``txt/attributes_{split}.jsonl``) and writes, next to it::

    vqa_img_db/                LMDB, key = image id, value = JPEG bytes of one frame of each video
    txt/vqa_{split}.jsonl      {question, image_id, question_id, answers [10], labels, answer_type}
    txt/vqa_ans2label.json     the answer vocabulary of the training answers
    vqa_stats.json             sizes, and per val/test split the best constant answer's VQA accuracy

Each image gets three questions: "what color is the {shape}?" and "what shape is the {color} object?"
(type other) and "is the {shape} {colour}?" (yes/no, the colour true half the time). Ten simulated
annotators answer each: 7 to 10 give the true answer, the rest a confusable one (blue/cyan,
red/purple, green/yellow, square/circle/triangle, yes/no), so the soft scores ``min(#humans / 3, 1)``
of the second answer are 0, 1/3, 2/3 or 1, as in VQA 2.0. Images, like the videos, are disjoint
between splits; everything is seeded (the same command writes the same files).

    python -m clipbert_legacy.preprocessing.make_demo_vqa --data_dir data/demo
"""
import argparse
import io
import json
import os
import sys

import av
import numpy as np

from clipbert_legacy.datasets.dataset_vqa import answer_scores, best_constant_answer, build_ans2label
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.datasets.lmdb_store import LMDBStore
from clipbert_legacy.preprocessing.demo_vocab import COLORS

SPLITS = ("train", "val", "test")
N_HUMANS = 10
CONFUSED = {"blue": "cyan", "cyan": "blue", "red": "purple", "purple": "red", "green": "yellow",
            "yellow": "green", "square": "circle", "circle": "triangle", "triangle": "square",
            "yes": "no", "no": "yes"}


def frame_jpeg(video_bytes, index, quality=95):
    """JPEG bytes of frame ``index`` (clamped to the last frame) of an mp4."""
    from PIL import Image
    with av.open(io.BytesIO(video_bytes)) as container:
        frame = None
        for i, f in enumerate(container.decode(video=0)):
            frame = f
            if i >= index:
                break
    if frame is None:
        raise ValueError("the video has no frames")
    buf = io.BytesIO()
    Image.fromarray(frame.to_ndarray(format="rgb24")).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def _humans(truth, rng):
    n_true = int(rng.integers(7, N_HUMANS + 1))
    return [truth] * n_true + [CONFUSED[truth]] * (N_HUMANS - n_true)


def questions_for(attrs, image_id, qid0, rng):
    """The three VQA rows of one image (``attrs``: its video's colour and shape)."""
    c, s = attrs["color"], attrs["shape"]
    asked = c if rng.random() < 0.5 else str(rng.choice([x for x in COLORS if x != c]))
    qs = [(f"what color is the {s}?", c, "other"), (f"what shape is the {c} object?", s, "other"),
          (f"is the {s} {asked}?", "yes" if asked == c else "no", "yes/no")]
    rows = []
    for j, (q, truth, typ) in enumerate(qs):
        answers = _humans(truth, rng)
        rows.append({"question": q, "image_id": image_id, "question_id": qid0 + j, "answers": answers,
                     "labels": answer_scores(answers), "answer_type": typ})
    return rows


def build_demo_vqa(data_dir, seed=42, n_frames=None, log=print):
    """Write the VQA demo files under ``data_dir``; returns the stats (also ``vqa_stats.json``)."""
    from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
    img_dir = os.path.join(data_dir, "vqa_img_db")
    if os.path.isdir(img_dir) and os.listdir(img_dir):
        raise FileExistsError(f"{img_dir} already exists and is not empty; remove it to rebuild")
    videos = LMDBStore(os.path.join(data_dir, "vis_db"))
    if n_frames is None:
        with open(os.path.join(data_dir, "stats.json")) as f:
            n_frames = json.load(f)["n_frames"]
    rows = {}
    with LMDBWriter(img_dir) as writer:
        for k, split in enumerate(SPLITS):
            rng = np.random.default_rng([seed, 7, k])
            rows[split] = []
            for i, a in enumerate(load_jsonl(os.path.join(data_dir, "txt", f"attributes_{split}.jsonl"))):
                image_id = f"{a['clip_name']}_frame"
                writer.put(image_id, frame_jpeg(videos.get(a["clip_name"]), int(rng.integers(n_frames))))
                rows[split].extend(questions_for(a, image_id, (k + 1) * 1_000_000 + 3 * i, rng))
    return _write_annotations(data_dir, rows, log)


def _write_annotations(data_dir, rows, log):
    txt_dir = os.path.join(data_dir, "txt")
    for split, split_rows in rows.items():
        with open(os.path.join(txt_dir, f"vqa_{split}.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in split_rows)
    ans2label = build_ans2label(rows["train"])
    with open(os.path.join(txt_dir, "vqa_ans2label.json"), "w") as f:
        json.dump(ans2label, f, indent=1)
    stats = {"n_images": {s: len(r) // 3 for s, r in rows.items()},
             "n_questions": {s: len(r) for s, r in rows.items()}, "n_answers": len(ans2label)}
    for split in ("val", "test"):
        answer, acc = best_constant_answer(r["labels"] for r in rows[split])
        per_type = {}
        for t in ("yes/no", "other"):
            of_type = [r["labels"] for r in rows[split] if r["answer_type"] == t]
            per_type[t] = round(best_constant_answer(of_type)[1], 2)
        stats[split] = {"best_constant_answer": answer, "best_constant_acc": round(acc, 2),
                        "best_constant_acc_per_type": per_type}
    with open(os.path.join(data_dir, "vqa_stats.json"), "w") as f:
        json.dump(stats, f, indent=1)
    log(f"demo VQA: {sum(stats['n_questions'].values())} questions on {sum(stats['n_images'].values())} "
        f"images, {len(ans2label)} answers -> {data_dir}")
    return stats


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True, help="the make_demo_data output (vis_db, txt/attributes_*)")
    p.add_argument("--seed", type=int, default=42)
    a = p.parse_args(argv)
    try:
        stats = build_demo_vqa(a.data_dir, a.seed)
    except (ValueError, FileExistsError, FileNotFoundError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(stats, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
