"""VQA accuracy (ClipBERT's ``evaluate_vqa``): a predicted answer scores ``labels.get(answer, 0)``, the
question's soft score ``min(#humans / 3, 1)``; reported overall and per answer type, in percent.

``eval_vqa(predictions, gts)``:

* ``predictions``: ``[{"question_id", "answer": str or None}]`` (None: no prediction, e.g. non-finite
  logits; scores 0); repeated question ids keep the first.
* ``gts``: ``{question_id: {"labels": {answer: score}, "answer_type": str or None}}``.
* returns ``{"overall_acc", "<type>_acc"..., "ratios": {"<type>_ratio": [%, count]}}``; only types
  that occur are listed (ClipBERT gave NaN for a type without questions).
"""
from collections.abc import Iterable, Mapping
from typing import Any

from clipbert_legacy.evaluation.qa import _dedupe

VQA_ANSWER_TYPES = ("yes/no", "number", "other")


def _tally(predictions, gts):
    preds = _dedupe(predictions)
    if not preds:
        raise ValueError("eval_vqa: no predictions to evaluate")
    total, per_type = 0.0, {}
    for p in preds:
        q = p["question_id"]
        if q not in gts:
            raise ValueError(f"eval_vqa: question_id {q!r} has no ground truth")
        gt = gts[q]
        score = float(gt["labels"].get(p["answer"], 0.0)) if p["answer"] is not None else 0.0
        total += score
        t = gt.get("answer_type")
        if t is not None:
            c = per_type.setdefault(t, [0.0, 0])
            c[0] += score
            c[1] += 1
    return len(preds), total, per_type


def eval_vqa(predictions: Iterable[Mapping[str, Any]], gts: Mapping[Any, Mapping[str, Any]]) -> dict:
    """VQA accuracy in percent, unrounded (module docstring)."""
    n, total, per_type = _tally(predictions, gts)
    out = {"overall_acc": 100.0 * total / n}
    ratios = {}
    order = [t for t in VQA_ANSWER_TYPES if t in per_type] + sorted(set(per_type) - set(VQA_ANSWER_TYPES))
    for t in order:
        s, m = per_type[t]
        out[f"{t}_acc"] = 100.0 * s / m
        ratios[f"{t}_ratio"] = [100.0 * m / n, m]
    if ratios:
        out["ratios"] = ratios
    return out


def vqa_scores(predictions: Iterable[Mapping[str, Any]], gts: Mapping[Any, Mapping[str, Any]]) -> dict:
    """``scores.json``: :func:`eval_vqa` with percentages rounded to 2 decimals (ClipBERT's
    ``get_rounded_percentage``) and the number of questions scored."""
    m = eval_vqa(predictions, gts)
    out = {k: round(v, 2) for k, v in m.items() if k != "ratios"}
    if "ratios" in m:
        out["ratios"] = {k: [round(p, 2), c] for k, (p, c) in m["ratios"].items()}
    out["n_questions"] = sum(1 for _ in _dedupe(predictions))
    return out

