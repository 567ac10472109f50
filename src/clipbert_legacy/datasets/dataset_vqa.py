"""VQA 2.0 on images (ClipBERT's ``dataset_vqa``): soft-score targets, image loading, collation.

An annotation row is ``{question, image_id, question_id[, labels][, answers][, answer_type]}``:
``labels`` is ClipBERT's ``{answer: soft score}``; without it, ``answers`` (the raw human answers of
VQA 2.0, usually 10) gives ``labels`` by :func:`answer_scores` (``min(#humans / 3, 1)``). Images are
the LMDB values under ``str(image_id)``, kept as stored (JPEG/PNG bytes), decoded with PIL and fed
as a 1-frame clip through the same resize / pad / normalise path as video frames.

Differences from ClipBERT: an answer missing from ``ans2label`` leaves the target at 0 (logged with
its count) instead of a ``KeyError``; accuracy still uses the full ``labels``, so such a question's
best score is what the vocabulary allows, as in the official VQA evaluation.
"""
import io
import logging
from collections import Counter

import torch

from clipbert_legacy.config.options import MAX_FRAME_PIXELS
from clipbert_legacy.datasets.collate import CollatorBase, stack_visual, tokenize
from clipbert_legacy.datasets.data_utils import flat_list_of_lists
from clipbert_legacy.datasets.dataset_base import VideoDatasetBase
from clipbert_legacy.datasets.decoder import VideoDecodeError

logger = logging.getLogger(__name__)

def vqa_score(n_humans):
    """VQA accuracy of an answer given by ``n_humans`` annotators: ``min(n / 3, 1)``."""
    return min(n_humans / 3.0, 1.0)


def answer_scores(human_answers):
    """``{answer: min(#humans / 3, 1)}`` from the human answers of one question."""
    return {a: vqa_score(n) for a, n in Counter(human_answers).items()}


def build_ans2label(rows, min_count=1, top_k=None):
    """The answer vocabulary from training rows: answers with a positive score in at least
    ``min_count`` questions, most frequent first (ties alphabetical), at most ``top_k``."""
    counts = Counter(a for r in rows for a, s in row_labels(r).items() if s > 0)
    answers = sorted((a for a, n in counts.items() if n >= min_count), key=lambda a: (-counts[a], a))
    return {a: i for i, a in enumerate(answers[:top_k] if top_k else answers)}


def best_constant_answer(label_dicts):
    """``(answer, accuracy %)`` of the one answer that, given to every question, scores best: the
    baseline a model beats only by looking at the image and the question."""
    totals, n = Counter(), 0
    for labels in label_dicts:
        n += 1
        for a, s in labels.items():
            totals[a] += float(s)
    if not totals:
        raise ValueError("best_constant_answer: no labeled questions")
    answer = min(totals, key=lambda a: (-totals[a], a))
    return answer, 100.0 * totals[answer] / n


def row_labels(row):
    """``labels`` of a row, else :func:`answer_scores` of its ``answers``, else ``{}``."""
    if row.get("labels") is not None:
        return row["labels"]
    if row.get("answers") is not None:
        return answer_scores(row["answers"])
    return {}


def mk_vqa_examples(rows, path="<jsonl>"):
    """jsonl rows -> [{question, img_id, question_id, labels (None if unlabeled), answer_type}]."""
    out, seen = [], set()
    for i, r in enumerate(rows):
        qid = r["question_id"]
        if qid in seen:
            raise ValueError(f"{path}: row {i + 1}: question_id {qid!r} is not unique")
        seen.add(qid)
        labels = r.get("labels")
        if labels is None and r.get("answers") is not None:
            if not isinstance(r["answers"], list):
                raise ValueError(f"{path}: row {i + 1}: 'answers' must be a list of strings")
            labels = answer_scores(r["answers"])
        if labels is not None and not (isinstance(labels, dict) and all(
                isinstance(v, (int, float)) and 0 <= v <= 1 for v in labels.values())):
            raise ValueError(f"{path}: row {i + 1}: 'labels' must be {{answer: score in [0, 1]}}, "
                             f"got {labels!r}")
        out.append({"question": r["question"], "img_id": str(r["image_id"]), "question_id": qid,
                    "labels": labels, "answer_type": r.get("answer_type")})
    return out


def vqa_target(labels, ans2label):
    """Float target over the vocabulary: each known answer's soft score (ClipBERT's scatter)."""
    target = torch.zeros(len(ans2label))
    for ans, score in labels.items():
        if ans in ans2label:
            target[ans2label[ans]] = float(score)
    return target


def decode_image(data, max_pixels=MAX_FRAME_PIXELS):
    """Image bytes -> uint8 (1, 3, H, W) RGB; raises VideoDecodeError (the datasets' bad-item path).
    An image above `max_pixels` (0: Pillow's own limit only) is 'too_large', from its header."""
    import numpy as np
    from PIL import Image, UnidentifiedImageError
    if not data:
        raise VideoDecodeError("empty", "empty image bytes")
    try:
        with Image.open(io.BytesIO(data)) as img:
            w, h = img.size
            if max_pixels and w * h > max_pixels:
                raise VideoDecodeError("too_large", f"image size {w}x{h} ({w * h} pixels) is above "
                                                    f"max_frame_pixels={max_pixels}")
            arr = np.asarray(img.convert("RGB"))
    except Image.DecompressionBombError as e:
        raise VideoDecodeError("too_large", f"PIL refuses the image ({e})") from None
    except (UnidentifiedImageError, OSError, ValueError) as e:
        raise VideoDecodeError("decode_failed", f"PIL cannot decode the image ({e})") from None
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).unsqueeze(0)


class VQADataset(VideoDatasetBase):
    """One item = one image with its question group (``max_n_example_per_group`` in training, 1 in
    evaluation). Bad images follow the video rules: replaced in training, reported in evaluation.

    Args: datalist [(img_id, [example])], img_lmdb_dir, ans2label, return_label; others see
    VideoDatasetBase (fps / num_frm / clips are not used: an image is one frame).
    Item: {vid (1, 3, S, S), examples [{q_str, question_id, label (K,) or None}], n_examples, vid_id}.
    """

    def __init__(self, datalist, img_lmdb_dir, ans2label, return_label=True, **kw):
        kw.setdefault("name", "vqa")
        super().__init__(datalist, img_lmdb_dir, **kw)
        if not ans2label:
            raise ValueError("VQA needs a non-empty ans2label (ans2label_path)")
        self.ans2label, self.return_label = ans2label, return_label
        self.label2ans = {v: k for k, v in ans2label.items()}
        self.qid2data = {e["question_id"]: e for _, g in datalist for e in g}
        unknown = Counter(a for e in self.qid2data.values() for a in (e["labels"] or {})
                          if a not in ans2label)
        if unknown and return_label:
            logger.warning("%s: %d answer occurrence(s) are not in ans2label (target 0 for them), e.g. %s",
                           self.name, sum(unknown.values()), [a for a, _ in unknown.most_common(5)])

    def __len__(self):
        return len(self.datalist)

    def load_video(self, vid_id):
        try:
            data = self.store.get(vid_id)
        except KeyError as e:
            raise VideoDecodeError("missing_key", e.args[0]) from None
        img = decode_image(data, self.max_frame_pixels)
        h, w = img.shape[-2:]
        if not (1 / 5 < h / w < 5):
            raise VideoDecodeError("aspect_ratio", f"image size {h}x{w}: aspect ratio outside (1/5, 5)")
        return self.padded(img)

    def _example(self, d):
        label = None
        if self.return_label and d["labels"] is not None:
            label = vqa_target(d["labels"], self.ans2label)
        return {"q_str": d["question"], "question_id": d["question_id"], "label": label}

    def _build(self, index):
        img_id, examples = self.datalist[index]
        frames, reason = self.try_load_video(img_id)
        if frames is None:
            return None, (img_id, reason)
        exs = [self._example(e) for e in examples]
        return {"vid": frames, "examples": exs, "n_examples": len(exs), "vid_id": img_id}, None

    def __getitem__(self, index):
        return self.load_item(index, self._build)


class VQACollator(CollatorBase):
    """visual_inputs (B, 1, 3, S, S), text_input_ids/mask (N, L), labels (N, K) float or None,
    question_ids, n_examples_list (questions per image), bad_videos."""

    def collate_items(self, items, bad):
        exs = flat_list_of_lists([d["examples"] for d in items])
        ids, mask = tokenize(self.tokenizer, [e["q_str"] for e in exs], self.max_txt_len)
        labels = torch.stack([e["label"] for e in exs]) if exs[0]["label"] is not None else None
        return {"visual_inputs": stack_visual(items), "text_input_ids": ids, "text_input_mask": mask,
                "labels": labels, "question_ids": [e["question_id"] for e in exs],
                "n_examples_list": [d["n_examples"] for d in items],
                "vid_ids": [d["vid_id"] for d in items], "bad_videos": bad}
