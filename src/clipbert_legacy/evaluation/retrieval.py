"""Text<->video retrieval metrics: R@1/5/10, median and mean rank (ClipBERT's definitions).

``eval_retrieval(vid_txt_score_dicts, gt_txt_id2vid_id, id2data)`` keeps ClipBERT's signature:

1. results are grouped by ``txt_id``; a repeated ``(txt_id, vid_id)`` keeps the first score;
2. every text must be scored against the same set of videos (else ValueError naming the text);
3. ``rK = 100 * mean(rank < K)``, ``medianR = median(rank + 1)``, ``meanR = mean(rank + 1)`` with
   0-based ranks, for text->video (each text has one GT video) and video->text.

Differences from ClipBERT (documented fixes):

* **Ties are ranked pessimistically**: the ground truth's rank is the number of candidates scoring
  strictly higher plus the number of *other* candidates with an equal score. ClipBERT's result
  depended on sort order (earlier column won on CPU), which rewards constant scores; pessimistic
  ranking is deterministic, order-independent and never flatters. Scores are not rounded before
  ranking (ClipBERT's 4-decimal rounding is for ``results.json`` only).
* **Several captions per video**: video->text uses every caption whose GT is the video, and the rank
  is that of the best-ranked GT caption (ties: non-GT captions with an equal score count against it).
  ClipBERT inverted ``{txt: vid}`` to ``{vid: txt}``, silently keeping one caption per video.
  Videos without any GT caption are distractors for text->video and are not queries for video->text.

* **Non-finite scores rank last** (as -inf, ties counted against the ground truth), with a warning
  giving their number: NaN compares false, so a model with NaN weights would otherwise rank every
  ground truth first and score R@1 = 100.
* **Skipped videos** (undecodable, evaluated with ``skip_bad_videos``): ``skipped_vid_ids`` names them;
  texts whose ground-truth video is among them are left out of text->video (and the videos out of
  video->text); :func:`retrieval_coverage` states the denominators. A ground truth that is missing
  for any other reason is still an error.

``id2data`` is accepted for compatibility and not needed.
"""
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from clipbert_legacy.utils.distributed import all_gather_list

logger = logging.getLogger(__name__)


def _build_matrix(vid_txt_score_dicts):
    txt_ids, vid_ids, scores = [], [], {}
    txt_pos, vid_pos = {}, {}
    for d in vid_txt_score_dicts:
        t, v = d["txt_id"], d["vid_id"]
        if t not in txt_pos:
            txt_pos[t] = len(txt_ids)
            txt_ids.append(t)
            scores[t] = {}
        if v not in vid_pos:
            vid_pos[v] = len(vid_ids)
            vid_ids.append(v)
        scores[t].setdefault(v, float(d["score"]))
    all_vids = set(vid_ids)
    for t in txt_ids:
        if set(scores[t]) != all_vids:
            missing = sorted(map(str, all_vids - set(scores[t])))[:3]
            raise ValueError(f"eval_retrieval: text {t!r} was not scored against every video "
                             f"(missing e.g. {missing}); all texts need scores for the same videos")
    S = np.array([[scores[t][v] for v in vid_ids] for t in txt_ids], dtype=np.float64)
    return S, txt_ids, vid_ids


def pessimistic_rank(row: np.ndarray, gt_cols: Sequence[int]) -> int:
    """0-based rank of the best GT column of ``row``; ties count against the GT; nan/inf rank last."""
    row = np.where(np.isfinite(row), row, -np.inf)
    gt_cols = np.asarray(gt_cols)
    best = row[gt_cols].max()
    non_gt = np.ones(row.shape[0], dtype=bool)
    non_gt[gt_cols] = False
    return int((row[non_gt] >= best).sum())


def _metrics(ranks):
    ranks = np.asarray(ranks, dtype=np.float64)
    if ranks.size == 0:
        raise ValueError("eval_retrieval: no queries to evaluate")
    return {"r1": 100.0 * float(np.mean(ranks < 1)), "r5": 100.0 * float(np.mean(ranks < 5)),
            "r10": 100.0 * float(np.mean(ranks < 10)), "medianR": float(np.median(ranks + 1)),
            "meanR": float(np.mean(ranks + 1))}


def eval_retrieval(vid_txt_score_dicts: Iterable[Mapping[str, Any]], gt_txt_id2vid_id: Mapping[Any, Any],
                   id2data: Optional[Mapping] = None, *,  # noqa: ARG001 (ClipBERT's signature; unused there too)
                   skipped_vid_ids: Iterable[Any] = ()) -> dict[str, dict[str, float]]:
    """``{"text2video": {r1, r5, r10, medianR, meanR}, "video2text": {...}}`` (see module doc)."""
    S, txt_ids, vid_ids = _build_matrix(vid_txt_score_dicts)
    n_bad = int((~np.isfinite(S)).sum())
    if n_bad:
        logger.warning("eval_retrieval: %d of %d scores are not finite (nan/inf); they rank last",
                       n_bad, S.size)
    skipped = set(skipped_vid_ids)
    vid_col = {v: j for j, v in enumerate(vid_ids)}
    t2v, gt_txt_rows = [], {}
    for i, t in enumerate(txt_ids):
        if t not in gt_txt_id2vid_id:
            raise ValueError(f"eval_retrieval: text {t!r} has no ground-truth video in gt_txt_id2vid_id")
        gv = gt_txt_id2vid_id[t]
        if gv not in vid_col:
            if gv in skipped:
                continue
            raise ValueError(f"eval_retrieval: ground-truth video {gv!r} of text {t!r} was not scored")
        t2v.append(pessimistic_rank(S[i], [vid_col[gv]]))
        gt_txt_rows.setdefault(gv, []).append(i)
    v2t = [pessimistic_rank(S[:, vid_col[v]], rows) for v, rows in gt_txt_rows.items()]
    return {"text2video": _metrics(t2v), "video2text": _metrics(v2t)}


def with_rsum(metrics: dict[str, dict[str, float]]) -> dict[str, Any]:
    """``metrics`` plus ``rsum`` (R@1 + R@5 + R@10 of both directions, as VSE++ and the
    image-text retrieval literature report it) and ``r_mean`` (rsum / 6): one number to select
    checkpoints by (``--best_metric rsum``)."""
    rsum = sum(metrics[d][k] for d in ("text2video", "video2text") for k in ("r1", "r5", "r10"))
    return {**metrics, "rsum": rsum, "r_mean": rsum / 6}


def retrieval_coverage(vid_txt_score_dicts: Iterable[Mapping[str, Any]], gt_txt_id2vid_id: Mapping[Any, Any],
                       skipped_vid_ids: Iterable[Any] = ()) -> dict[str, int]:
    """The denominators behind :func:`eval_retrieval`: texts and videos evaluated out of the total."""
    scored_vids, skipped = {d["vid_id"] for d in vid_txt_score_dicts}, set(skipped_vid_ids)
    return {"texts": sum(v in scored_vids for v in gt_txt_id2vid_id.values()),
            "texts_total": len(gt_txt_id2vid_id), "videos": len(scored_vids),
            "videos_total": len(scored_vids | skipped), "skipped_videos": len(skipped)}


def gather_retrieval_results(local_results: list[dict]) -> list[dict]:
    """All ranks' ``[{vid_id, txt_id, score}]`` lists concatenated in rank order (every rank)."""
    out = []
    for part in all_gather_list(local_results):
        out.extend(part)
    return out
