"""Multiple-choice accuracy (MSRVTT-MC, TGIF action/transition): argmax over the options.

ClipBERT reported ``mc_accuracy`` as the string ``f"{100*acc:.2f}"`` and compared ``set(gt)`` with
``set(pred)`` after a JSON round trip, which failed for int question ids under several GPUs. Here
question ids are compared as strings, the accuracy is a float (``format_mc_accuracy`` gives the legacy
string for ``mc_test_scores.json``) and a prediction for an unknown question raises ValueError.
"""
from collections.abc import Mapping, Sequence
from typing import Any, Union

import torch

from clipbert_legacy.evaluation.predictions import finite_argmax
from clipbert_legacy.utils.distributed import all_gather_list


def mc_predict(logits: Union[torch.Tensor, Sequence[float]], n_options: int = 5) -> list[int]:
    """Predicted option index per question from logits (B, n_options) or flat (B*n_options,);
    -1 (counted wrong) for a question whose logits are not all finite."""
    return finite_argmax(torch.as_tensor(logits).reshape(-1, n_options), "multiple choice")[0]


def eval_mc(predictions: Mapping[Any, int], gts: Mapping[Any, int]) -> dict[str, float]:
    """``{"mc_accuracy": %}`` for ``predictions`` {qid: idx} against ``gts`` {qid: idx}."""
    gts = {str(k): int(v) for k, v in gts.items()}
    preds = {str(k): int(v) for k, v in predictions.items()}
    if not preds:
        raise ValueError("eval_mc: no predictions to evaluate")
    unknown = [k for k in preds if k not in gts]
    if unknown:
        raise ValueError(f"eval_mc: question_id {unknown[0]!r} has no ground truth")
    correct = sum(preds[k] == gts[k] for k in preds)
    return {"mc_accuracy": 100.0 * correct / len(preds)}


def format_mc_accuracy(acc: float) -> str:
    """ClipBERT's string form of the accuracy (``mc_test_scores.json``): two decimals."""
    return f"{acc:.2f}"


def gather_mc_predictions(local_predictions: Mapping[Any, int]) -> dict[Any, int]:
    """Merge every rank's {qid: idx} (first rank wins on duplicates from sampler padding)."""
    merged = {}
    for part in all_gather_list(local_predictions):
        for k, v in part.items():
            merged.setdefault(k, v)
    return merged
