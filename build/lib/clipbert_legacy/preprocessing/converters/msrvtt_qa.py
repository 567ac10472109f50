"""MSRVTT-QA converter: `train_qa.json`/`val_qa.json`/`test_qa.json` -> {split}.jsonl + train_ans2label.json.

Raw entries: {"id", "video_id" (int, or "videoN"), "question", "answer", "category_id"}. Output rows
are what the video-QA dataset reads: {question, answer, answer_type, video_id}, video_id the LMDB
key "video{N}" (MSRVTT's file stem). answer_type is the question word (what/who/how/where/when, the
types ClipBERT reports; "other" otherwise). ClipBERT's answer vocabulary: the 1,500 most frequent
*training* answers (`train_ans2label.json`, num_labels = max(len, 1500)). Training rows with an
answer outside it are left out of train.jsonl (ClipBERT's loader raised KeyError on them) and counted;
val/test rows with such answers stay and count as wrong.
"""
from clipbert_legacy.evaluation.qa import QA_ANSWER_TYPES
from clipbert_legacy.preprocessing.converters.common import (
    answer_vocab,
    check_unique,
    in_vocab,
    need,
    read_json_items,
    text_of,
)

ANSWER_TYPES = QA_ANSWER_TYPES["msrvtt_qa"]  # the question words
DEFAULT_TOP_K = 1500


def video_key(value, where):
    """MSRVTT-QA's integer video id -> "video{N}" (already "videoN" strings pass through)."""
    if isinstance(value, bool):
        raise ValueError(f"{where}: video_id must be an integer or 'videoN', got {value!r}")
    if isinstance(value, int) and value >= 0:
        return f"video{value}"
    if isinstance(value, str) and value.strip():
        s = value.strip()
        return f"video{s}" if s.isdigit() else s
    raise ValueError(f"{where}: video_id must be an integer or 'videoN', got {value!r}")


def answer_type(question):
    first = question.split()[0].lower() if question.split() else ""
    return first if first in ANSWER_TYPES else "other"


def convert_split(path):
    """Rows of one MSRVTT-QA json file, in file order; duplicate `id`s fail with both lines."""
    rows, ids = [], []
    for where, e in read_json_items(path, id_keys=("id", "video_id")):
        need(e, where, ("question", "answer", "video_id"))
        q = text_of(e, "question", where)
        answer = e["answer"]
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"{where}: field 'answer' must be a non-empty string, got {answer!r}")
        rows.append({"question": q, "answer": answer.strip(), "answer_type": answer_type(q),
                     "video_id": video_key(e["video_id"], where)})
        if "id" in e:
            ids.append((where, e["id"]))
    check_unique(ids, "id")
    if not rows:
        raise ValueError(f"{path}: no entries")
    return rows


def convert_msrvtt_qa(paths, top_k=DEFAULT_TOP_K):
    """paths: {split: json path} (train required). Returns ({split: rows}, ans2label, n_left_out):
    training rows whose answer is outside the vocabulary are left out (ClipBERT's loader cannot map
    them to a label), val/test rows are all kept (such answers count as wrong there)."""
    if "train" not in paths:
        raise ValueError("MSRVTT-QA needs train_qa.json (the answer vocabulary comes from it)")
    out = {split: convert_split(p) for split, p in paths.items()}
    ans2label = answer_vocab([r["answer"] for r in out["train"]], top_k)
    out["train"], n_left_out = in_vocab(out["train"], ans2label)
    return out, ans2label, n_left_out
