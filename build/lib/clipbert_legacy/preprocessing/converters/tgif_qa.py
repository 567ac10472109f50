"""TGIF-QA converter: `Train_/Test_{frameqa,action,transition}_question.csv` -> {task}_{split}.jsonl.

Raw files are tab-separated with a header (github.com/YunseokJANG/tgif-qa, dataset/):
  frameqa:           gif_name, question, answer, type (0..3), vid_id, key, description
  action/transition: gif_name, question, a1..a5, answer (0-based option index), vid_id, key
`vid_id` (FRAMEQA12, ACTION5) identifies a question; a repeated one is an error. Output rows are
what the video-QA dataset reads: frameqa {question, answer, answer_type, gif_name} with type
0/1/2/3 = object/number/color/location; action/transition {question, options[5], answer, gif_name}.
gif_name is the LMDB key (the .gif file stem).

Splits: TGIF-QA has train and test only, and ClipBERT's val files are not public. {task}_val.jsonl
holds `val_ratio` of the training GIFs (seeded, whole GIFs, so no GIF is in both), or with 0 the test
rows. Answer vocabulary: ClipBERT's `frameqa_trainval_ans2label.json` came from the training file
(train+val) and its config sets num_labels = max(len, 1540); the default keeps the 1,540 most
frequent training answers; training rows with other answers are left out of {task}_train.jsonl
(ClipBERT's loader raised KeyError on them) and counted.
"""
import random

from clipbert_legacy.evaluation.qa import QA_ANSWER_TYPES
from clipbert_legacy.preprocessing.converters.common import (
    answer_vocab,
    check_unique,
    in_vocab,
    int_of,
    read_table,
    text_of,
)

TASKS = ("frameqa", "action", "transition")
FRAMEQA_TYPES = QA_ANSWER_TYPES["frameqa"]  # by the csv's type 0..3
DEFAULT_TOP_K = 1540


def _row(task, r, where):
    q = {"question": text_of(r, "question", where)}
    if task == "frameqa":
        q["answer"] = text_of(r, "answer", where)
        q["answer_type"] = FRAMEQA_TYPES[int_of(r["type"], where, "type", 0, 3)]
    else:
        q["options"] = [r[f"a{i}"].strip() for i in range(1, 6)]
        q["answer"] = int_of(r["answer"], where, "answer", 0, 4)
    q["gif_name"] = text_of(r, "gif_name", where)
    return q


def convert_file(task, path):
    """Rows of one TGIF-QA csv, in file order."""
    if task not in TASKS:
        raise ValueError(f"TGIF-QA task {task!r} must be one of {TASKS}")
    cols = ("gif_name", "question", "answer") + (("type",) if task == "frameqa" else
                                                 tuple(f"a{i}" for i in range(1, 6)))
    table = read_table(path, cols, "\t")
    check_unique([(w, r["vid_id"].strip()) for w, r in table if r.get("vid_id", "").strip()], "vid_id")
    rows = [_row(task, r, w) for w, r in table]
    if not rows:
        raise ValueError(f"{path}: no rows after the header")
    return rows


def split_val(rows, val_ratio, seed=42):
    """(train, val): `val_ratio` of the GIFs (seeded) with all their questions go to val."""
    if not 0 <= val_ratio < 1:
        raise ValueError(f"val_ratio must be in [0, 1), got {val_ratio}")
    gifs = sorted({r["gif_name"] for r in rows})
    n_val = int(round(len(gifs) * val_ratio))
    val_gifs = set(random.Random(seed).sample(gifs, n_val))
    return ([r for r in rows if r["gif_name"] not in val_gifs],
            [r for r in rows if r["gif_name"] in val_gifs])


def convert_tgif_qa(task, train_csv, test_csv, val_ratio=0.0, top_k=DEFAULT_TOP_K, seed=42):
    """({"train", "val", "test"}: rows, ans2label or None for action/transition, n_left_out): frameqa
    training rows whose answer is outside the vocabulary are left out of train (counted); val/test
    keep every row."""
    full_train, test = convert_file(task, train_csv), convert_file(task, test_csv)
    train, val = split_val(full_train, val_ratio, seed)
    ans2label, n_left_out = None, 0
    if task == "frameqa":
        ans2label = answer_vocab([r["answer"] for r in full_train], top_k)
        train, n_left_out = in_vocab(train, ans2label)
    return {"train": train, "val": val if val else list(test), "test": test}, ans2label, n_left_out
