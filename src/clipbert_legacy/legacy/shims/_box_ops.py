"""Box operations both stand-ins serve (torchvision.ops, detectron2.layers), in plain torch.

``nms`` keeps torchvision's contract: boxes (N, 4) as (x1, y1, x2, y2), indices of the kept boxes in
decreasing score order; a box is dropped when its IoU with a kept, higher-scored box is above the threshold.
It is exact and O(N^2) in memory per call, which the post-processing sizes of these forks (hundreds to a few
thousand boxes) allow.
"""
import torch

__all__ = ["box_area", "box_iou", "nms", "batched_nms"]

MAX_NMS_BOXES = 20_000
"""An (N, N) IoU matrix of 20k boxes is 1.6 GB of float32: a larger call is refused, not run."""


def box_area(boxes: torch.Tensor) -> torch.Tensor:
    """Areas of (N, 4) xyxy boxes."""
    return (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])


def box_iou(boxes1: torch.Tensor, boxes2: torch.Tensor) -> torch.Tensor:
    """(N, M) IoU of two sets of xyxy boxes (0 where the union is empty)."""
    area1, area2 = box_area(boxes1), box_area(boxes2)
    lt = torch.max(boxes1[:, None, :2], boxes2[None, :, :2])
    rb = torch.min(boxes1[:, None, 2:], boxes2[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area1[:, None] + area2[None, :] - inter
    ratio = inter / union.clamp(min=torch.finfo(union.dtype).tiny)
    return torch.where(union > 0, ratio, torch.zeros_like(inter))


def nms(boxes: torch.Tensor, scores: torch.Tensor, iou_threshold: float) -> torch.Tensor:
    """Indices (int64) of the boxes kept by greedy non-maximum suppression, highest score first."""
    if boxes.dim() != 2 or boxes.shape[-1] != 4 or scores.shape != boxes.shape[:1]:
        raise ValueError(f"nms takes boxes (N, 4) and scores (N,), got {tuple(boxes.shape)} and "
                         f"{tuple(scores.shape)}")
    n = boxes.shape[0]
    if n > MAX_NMS_BOXES:
        raise ValueError(f"nms on {n} boxes: the legacy layer's nms holds an N x N IoU matrix and takes at "
                         f"most "
                         f"{MAX_NMS_BOXES}; keep the top-k scores first")
    order = torch.argsort(scores, descending=True, stable=True)
    iou = box_iou(boxes[order].float(), boxes[order].float())
    suppressed = torch.zeros(n, dtype=torch.bool, device=boxes.device)
    keep = []
    for i in range(n):
        if suppressed[i]:
            continue
        keep.append(i)
        suppressed |= iou[i] > iou_threshold
    return order[torch.as_tensor(keep, dtype=torch.long, device=boxes.device)]


def batched_nms(boxes: torch.Tensor, scores: torch.Tensor, idxs: torch.Tensor,
                iou_threshold: float) -> torch.Tensor:
    """NMS within each category of ``idxs`` (boxes of different categories never suppress each other)."""
    if boxes.numel() == 0:
        return torch.empty((0,), dtype=torch.int64, device=boxes.device)
    offsets = idxs.to(boxes) * (boxes.max() - boxes.min() + 1)
    return nms(boxes + offsets[:, None], scores, iou_threshold)
