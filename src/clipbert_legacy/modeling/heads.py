"""Task heads (classifier shape, logits layout, loss) and multi-clip score aggregation.

A head object here is plain Python (not an nn.Module): the classifier it builds lives in
``ClipBertTransformer.classifier`` so checkpoint keys stay ClipBERT's ``transformer.classifier.*``
(``classifier.0.*`` / ``classifier.2.*`` for the MLP). ``calc_loss`` returns the *unreduced* loss
(ClipBERT's reduction="none"); the training loss is its ``.mean()``.

Fixes versus ClipBERT's task heads (each item says what ClipBERT did instead):
* ``classifier`` (mlp|linear) and ``cls_hidden_scale`` are honoured (ClipBERT always built a 2x MLP).
* the rank loss compares every positive with every negative *of the same video*, using
  ``n_examples_list``; ClipBERT's ``view(n_videos, -1)`` treated all but the first text as negatives,
  which is only right for one positive per video (there both agree exactly).
"""
import logging

import torch
import torch.nn.functional as F
from torch import nn

from clipbert_legacy.config.options import check_lse_loss

logger = logging.getLogger(__name__)

__all__ = ["build_classifier", "RetrievalHead", "QAHead", "MultipleChoiceHead", "make_head",
           "AGG_FUNCS", "aggregate_clip_logits", "lse_loss", "clip_aggregated_loss"]

AGG_FUNCS = ("mean", "max", "lse")


def build_classifier(hidden_size, num_outputs, classifier="mlp", cls_hidden_scale=2):
    """mlp: Linear(h, h*scale) -> ReLU -> Linear(h*scale, K) (keys 0.*, 2.*); linear: Linear(h, K)."""
    if classifier == "mlp":
        inner = hidden_size * cls_hidden_scale
        if cls_hidden_scale <= 0 or int(inner) != inner:
            raise ValueError(f"cls_hidden_scale={cls_hidden_scale!r} must be > 0 and give an integer "
                             f"hidden width with hidden_size={hidden_size}")
        inner = int(inner)
        return nn.Sequential(nn.Linear(hidden_size, inner), nn.ReLU(True), nn.Linear(inner, num_outputs))
    if classifier == "linear":
        return nn.Linear(hidden_size, num_outputs)
    raise ValueError(f"classifier={classifier!r} is not supported; use 'mlp' or 'linear'")


class _Head:
    task_type = None
    loss_type = "ce"

    def __init__(self, num_outputs, classifier="mlp", cls_hidden_scale=2):
        self.num_outputs = int(num_outputs)
        self.classifier = classifier
        self.cls_hidden_scale = cls_hidden_scale

    def build_classifier(self, hidden_size):
        return build_classifier(hidden_size, self.num_outputs, self.classifier, self.cls_hidden_scale)

    def reshape_logits(self, logits, _n_examples_list):
        """Per-text logits (N, K) -> the task's layout (unchanged here; see MultipleChoiceHead)."""
        return logits

    def calc_loss(self, logits, labels, n_examples_list=None):
        raise NotImplementedError

    def __repr__(self):
        return (f"{type(self).__name__}(num_outputs={self.num_outputs}, loss_type={self.loss_type!r}, "
                f"classifier={self.classifier!r}, cls_hidden_scale={self.cls_hidden_scale})")


class RetrievalHead(_Head):
    """Video-text matching. ce: 2 logits + cross-entropy; rank: 1 logit, sigmoid + hinge with margin."""
    task_type = "retrieval"

    def __init__(self, loss_type="ce", margin=0.2, classifier="mlp", cls_hidden_scale=2):
        if loss_type not in ("ce", "rank"):
            raise ValueError(f"loss_type={loss_type!r} is not supported for retrieval; use 'ce' or 'rank'")
        super().__init__(2 if loss_type == "ce" else 1, classifier, cls_hidden_scale)
        self.loss_type = loss_type
        self.margin = float(margin)

    def calc_loss(self, logits, labels, n_examples_list=None):
        logits = logits.float()
        labels = labels.view(-1).long()
        if self.loss_type == "ce":
            return F.cross_entropy(logits.view(-1, 2), labels, reduction="none")
        groups = n_examples_list
        if groups is None:
            raise ValueError("rank loss needs n_examples_list (texts per video) to pair positives "
                             "with negatives of the same video")
        if sum(groups) != labels.numel():
            raise ValueError(f"n_examples_list sums to {sum(groups)} but there are {labels.numel()} labels")
        scores = torch.sigmoid(logits.view(-1))
        losses = []
        for s, y in zip(torch.split(scores, list(groups)), torch.split(labels, list(groups))):
            pos, neg = s[y == 1], s[y == 0]
            if pos.numel() and neg.numel():
                losses.append(torch.clamp(self.margin + neg[None, :] - pos[:, None], min=0).reshape(-1))
        if not losses:
            return scores.sum()[None] * 0.0  # no (positive, negative) pair in this batch
        return torch.cat(losses)

    @staticmethod
    def scores(logits):
        """Matching score per text: softmax[:, 1] for ce, sigmoid for rank (ClipBERT's inference)."""
        logits = logits.float()
        return F.softmax(logits, dim=-1)[:, 1] if logits.shape[-1] == 2 else torch.sigmoid(logits.view(-1))


class QAHead(_Head):
    """Open-ended QA classifier over num_labels answers. ce (default), bce (VQA-style) or mse (K=1)."""
    task_type = "qa_open"

    def __init__(self, num_labels, loss_type="ce", classifier="mlp", cls_hidden_scale=2):
        if int(num_labels) < 1:
            raise ValueError(f"num_labels={num_labels!r} must be >= 1 for qa_open")
        if loss_type not in ("ce", "bce", "mse"):
            raise ValueError(f"loss_type={loss_type!r} is not supported for qa_open; use 'ce', 'bce' or "
                             "'mse'")
        super().__init__(num_labels, classifier, cls_hidden_scale)
        self.loss_type = "mse" if self.num_outputs == 1 else loss_type

    def calc_loss(self, logits, labels, _n_examples_list=None):
        logits = logits.float()
        if self.loss_type == "mse":
            return F.mse_loss(logits.view(-1), labels.view(-1).float(), reduction="none")
        if self.loss_type == "bce":  # ClipBERT's instance_bce_with_logits, per element
            return F.binary_cross_entropy_with_logits(logits, labels.float(), reduction="none")
        return F.cross_entropy(logits.view(-1, self.num_outputs), labels.view(-1).long(), reduction="none")


class MultipleChoiceHead(_Head):
    """One score per (question, option) text; logits come out (B, n_options), cross-entropy on the index."""
    task_type = "qa_mc"

    def __init__(self, num_choices=5, classifier="mlp", cls_hidden_scale=2):
        super().__init__(1, classifier, cls_hidden_scale)
        self.num_choices = int(num_choices)

    def reshape_logits(self, logits, n_examples_list):
        bad = sorted({n for n in n_examples_list if n != self.num_choices})
        if bad:
            raise ValueError(f"multiple choice expects {self.num_choices} texts per video "
                             f"(n_examples_list), got {bad}; set num_labels to the number of options")
        return logits.view(-1, self.num_choices)

    def calc_loss(self, logits, labels, _n_examples_list=None):
        return F.cross_entropy(logits.float().view(-1, self.num_choices), labels.view(-1).long(),
                               reduction="none")


def make_head(task_type, num_labels=None, loss_type="ce", margin=0.2, classifier="mlp",
              cls_hidden_scale=2):
    """Head for ``task_type`` retrieval | qa_open | qa_mc (num_labels = number of options for qa_mc)."""
    if task_type == "retrieval":
        want = 2 if loss_type == "ce" else 1
        if num_labels not in (None, want):
            logger.warning("retrieval with loss_type=%r uses %d output(s); ignoring num_labels=%r "
                           "(as ClipBERT)", loss_type, want, num_labels)
        return RetrievalHead(loss_type, margin, classifier, cls_hidden_scale)
    if task_type == "qa_open":
        if num_labels is None:
            raise ValueError("task_type='qa_open' needs num_labels (the answer vocabulary size)")
        return QAHead(num_labels, loss_type or "ce", classifier, cls_hidden_scale)
    if task_type == "qa_mc":
        if loss_type not in (None, "ce"):
            raise ValueError(f"loss_type={loss_type!r} is not supported for qa_mc; use 'ce'")
        return MultipleChoiceHead(num_labels or 5, classifier, cls_hidden_scale)
    raise ValueError(f"task_type={task_type!r} is not supported; use 'retrieval', 'qa_open' or 'qa_mc'")


def _stack(stacked_logits):
    if isinstance(stacked_logits, (list, tuple)):
        stacked_logits = torch.stack(list(stacked_logits))
    if stacked_logits.dim() != 3:
        raise ValueError(f"stacked logits must be (n_clips, N, C), got shape {tuple(stacked_logits.shape)}")
    return stacked_logits


def aggregate_clip_logits(stacked_logits, agg):
    """(n_clips, N, C) -> (N, C) by mean, max or logsumexp over clips (ClipBERT's score_agg_func)."""
    stacked_logits = _stack(stacked_logits)
    if agg == "mean":
        return stacked_logits.mean(0)
    if agg == "max":
        return stacked_logits.max(0).values
    if agg == "lse":
        return torch.logsumexp(stacked_logits, dim=0)
    raise ValueError(f"score_agg_func={agg!r} is not supported; use one of {AGG_FUNCS}")


def lse_loss(stacked_logits, labels):
    """ClipBERT's lse loss per example: LSE_{k,c} s_kc - LSE_k s_{k,y} (k: clip, c: class)."""
    s = _stack(stacked_logits).float()
    n_clips, n, c = s.shape
    labels = labels.view(-1).long()
    all_lse = torch.logsumexp(s.permute(1, 0, 2).reshape(n, n_clips * c), dim=1)
    pos = s.gather(2, labels.view(1, n, 1).expand(n_clips, n, 1)).squeeze(2)  # (K, N)
    return all_lse - torch.logsumexp(pos, dim=0)


def clip_aggregated_loss(stacked_logits, labels, agg, head, n_examples_list=None):
    """Scalar training loss over clips: pool then ``head.calc_loss`` (mean/max; ``n_examples_list``: the
    texts per video, which the rank loss pairs within), or ClipBERT's lse loss (cross-entropy heads)."""
    stacked_logits = _stack(stacked_logits)
    if agg == "lse":
        check_lse_loss(agg, head.loss_type)
        return lse_loss(stacked_logits, labels).mean()
    return head.calc_loss(aggregate_clip_logits(stacked_logits, agg), labels, n_examples_list).mean()
