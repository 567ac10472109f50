"""Predictions from scores that may not be finite.

A model with NaN/inf weights produces NaN/inf logits; ``argmax`` then returns the position of a NaN
(torch treats NaN as the maximum), so a broken model can look accurate. Here a row with any non-finite
score predicts nothing (``-1``, never equal to a label) and the rows are counted, so the caller can say
how many there were.
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)

NO_PREDICTION = -1


def finite_argmax(scores: torch.Tensor, what: str = "predictions") -> tuple[list[int], int]:
    """``(argmax per row, or -1 where the row has a nan/inf score; number of such rows)``."""
    scores = torch.as_tensor(scores)
    pred = scores.argmax(dim=-1)
    bad = ~torch.isfinite(scores).all(dim=-1)
    n_bad = int(bad.sum())
    if n_bad:
        pred = torch.where(bad, torch.full_like(pred, NO_PREDICTION), pred)
        logger.warning("%s: %d of %d rows have non-finite scores (nan/inf); they count as wrong", what,
                       n_bad, scores.shape[0])
    return pred.tolist(), n_bad
