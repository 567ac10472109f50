"""Moving batches to the training device (used by the engine and by the data loaders)."""
from __future__ import annotations

import torch


def move_to_device(batch, device: torch.device | str, non_blocking: bool = True):
    """Tensors in (nested) dicts, lists and tuples moved to ``device``; everything else unchanged."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in batch):
        return type(batch)(move_to_device(v, device, non_blocking) for v in batch)
    return batch


def training_device(local_rank: int) -> torch.device:
    """``cuda:local_rank`` when CUDA is available (made the current device), else the CPU."""
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
