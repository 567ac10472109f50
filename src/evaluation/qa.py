"""Video-QA accuracy, overall and per answer type (ClipBERT's ``evaluate_tgif_qa`` numbers).

``eval_qa(predictions, gts, label2ans=None)``:

* ``predictions``: ``[{"question_id", "answer"}]`` (answer = label index or answer string);
  repeated question ids (DistributedSampler padding) keep the first prediction.
* ``gts``: ``{question_id: {"answer": ..., "answer_type": str (optional)}}``. With ``label2ans``
  (open-ended tasks) integer predictions are mapped to answer strings before comparing; action and
  transition compare option indices.
* returns ``{"overall_acc": %, "<type>_acc": %, ..., "ratios": {"<type>_ratio": [fraction, count]}}``
  in percent, unrounded. Only types that occur are reported (ClipBERT gave 0, VQA NaN, for empty
  types). A predicted question without ground truth raises ValueError.
"""
from collections.abc import Iterable, Mapping
from typing import Any, Optional

from src.utils.distributed import all_gather_list


def _dedupe(predictions):
    seen, out = set(), []
    for p in predictions:
        q = p["question_id"]
        if q not in seen:
            seen.add(q)
            out.append(p)
    return out


def eval_qa(predictions: Iterable[Mapping[str, Any]], gts: Mapping[Any, Mapping[str, Any]],
            label2ans: Optional[Mapping[int, str]] = None) -> dict[str, Any]:
    """Overall and per-answer-type accuracy in percent (see the module docstring for the formats)."""
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
            ans = label2ans[ans]
        ok = ans == gt["answer"]
        n_correct += ok
        t = gt.get("answer_type")
        if t is not None:
            c = per_type.setdefault(t, [0, 0])
            c[0] += ok
            c[1] += 1
    n = len(preds)
    out = {"overall_acc": 100.0 * n_correct / n}
    ratios = {}
    for t in sorted(per_type):
        c, m = per_type[t]
        out[f"{t}_acc"] = 100.0 * c / m
        ratios[f"{t}_ratio"] = [m / n, m]
    if ratios:
        out["ratios"] = ratios
    return out


def gather_qa_results(local_predictions: list[dict]) -> list[dict]:
    """Every rank's predictions, concatenated in rank order and de-duplicated by question id."""
    out = []
    for part in all_gather_list(local_predictions):
        out.extend(part)
    return _dedupe(out)
