"""Video-QA accuracy, overall and per answer type (ClipBERT's ``evaluate_tgif_qa`` numbers).

``eval_qa(predictions, gts, label2ans=None)`` (validation metrics):

* ``predictions``: ``[{"question_id", "answer"}]`` (answer = label index or answer string);
  repeated question ids (DistributedSampler padding) keep the first prediction.
* ``gts``: ``{question_id: {"answer": ..., "answer_type": str (optional)}}``. With ``label2ans``
  (open-ended tasks) integer predictions are mapped to answer strings before comparing; action and
  transition compare option indices.
* returns ``{"overall_acc": %, "<type>_acc": %, ..., "ratios": {"<type>_ratio": [%, count]}}``
  in percent, unrounded. Only types that occur are reported (ClipBERT gave 0, VQA NaN, for empty
  types). A predicted question without ground truth raises ValueError.

``qa_scores(predictions, gts, label2ans=None, answer_types=None)`` is ``scores.json`` as ClipBERT's
``run_video_qa.validate`` wrote it from the per-rank ``evaluate_tgif_qa`` results, key order and
float rounding included: ``{"ratios": {"<type>_ratio": [%, count], ...}, "overall_acc": %,
"<type>_acc": %, ...}`` with percentages ``round(100 * fraction, 2)``, every answer type of the task
listed (an empty one as ``0`` and ``[0.0, 0]``), no ``ratios`` for action/transition. It is
computed over the de-duplicated predictions of all ranks, i.e. as one ClipBERT process holding them
all (ClipBERT counted DistributedSampler's padded duplicates in its denominators).
"""
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

from clipbert_legacy.utils.distributed import all_gather_list


def _dedupe(predictions):
    seen, out = set(), []
    for p in predictions:
        q = p["question_id"]
        if q not in seen:
            seen.add(q)
            out.append(p)
    return out


# ClipBERT's answer types of the open-ended tasks, in the order its scores list them
QA_ANSWER_TYPES = {"frameqa": ("object", "number", "color", "location"),
                   "msrvtt_qa": ("what", "who", "how", "where", "when")}


def _tally(predictions, gts, label2ans):
    """(n, n_correct, {answer_type: [correct, count]}) over the de-duplicated predictions."""
    preds = _dedupe(predictions)
    if not preds:
        raise ValueError("eval_qa: no predictions to evaluate")
    n_correct, per_type = 0, {}
    for p in preds:
        q = p["question_id"]
        if q not in gts:
            raise ValueError(f"eval_qa: question_id {q!r} has no ground truth")
        gt = gts[q]
        ans = p["answer"]
        if label2ans is not None and isinstance(ans, int):
            ans = label2ans.get(ans)  # -1 (non-finite logits, see evaluation.predictions): no answer
        ok = ans == gt["answer"]
        n_correct += ok
        t = gt.get("answer_type")
        if t is not None:
            c = per_type.setdefault(t, [0, 0])
            c[0] += ok
            c[1] += 1
    return len(preds), n_correct, per_type


def eval_qa(predictions: Iterable[Mapping[str, Any]], gts: Mapping[Any, Mapping[str, Any]],
            label2ans: Optional[Mapping[int, str]] = None) -> dict[str, Any]:
    """Overall and per-answer-type accuracy in percent (see the module docstring for the formats)."""
    n, n_correct, per_type = _tally(predictions, gts, label2ans)
    out = {"overall_acc": 100.0 * n_correct / n}
    ratios = {}
    for t in sorted(per_type):
        c, m = per_type[t]
        out[f"{t}_acc"] = 100.0 * c / m
        ratios[f"{t}_ratio"] = [100.0 * m / n, m]
    if ratios:
        out["ratios"] = ratios
    return out


def _rounded_percentage(fraction):
    return round(fraction * 100, 2)


def qa_scores(predictions: Iterable[Mapping[str, Any]], gts: Mapping[Any, Mapping[str, Any]],
              label2ans: Optional[Mapping[int, str]] = None,
              answer_types: Optional[Sequence[str]] = None) -> dict[str, Any]:
    """``scores.json`` exactly as ClipBERT wrote it (module docstring). ``answer_types``: the task's
    types in ClipBERT's order (``QA_ANSWER_TYPES[task]``); types found beyond them follow, sorted."""
    n, n_correct, per_type = _tally(predictions, gts, label2ans)
    types = list(answer_types or [])
    types += sorted(t for t in per_type if t not in types)
    out = {}
    if types:  # ClipBERT: ratios[type] = [round(100 * count / n, 2), count], listed first
        out["ratios"] = {f"{t}_ratio": [_rounded_percentage(1. * per_type.get(t, [0, 0])[1] / n),
                                        per_type.get(t, [0, 0])[1]] for t in types}
    # ClipBERT: acc = np.mean(correct), gathered as acc * n_rank summed, then / n (same float steps)
    out["overall_acc"] = _rounded_percentage(n_correct / n * n * 1. / n)
    for t in types:
        c, m = per_type.get(t, [0, 0])
        out[f"{t}_acc"] = _rounded_percentage(c / m * m * 1. / m) if m else _rounded_percentage(0)
    return out


def gather_qa_results(local_predictions: list[dict]) -> list[dict]:
    """Every rank's predictions, concatenated in rank order and de-duplicated by question id."""
    out = []
    for part in all_gather_list(local_predictions):
        out.extend(part)
    return _dedupe(out)
