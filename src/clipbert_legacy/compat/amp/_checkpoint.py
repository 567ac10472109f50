"""``master_params`` and the amp checkpoint: ``{'loss_scaler0': {'loss_scale', 'unskipped'}, ...}``."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from clipbert_legacy.compat.amp._state import _amp_state, logger


def master_params(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every param the optimizer updates (the fp32 masters under O2); clip these after scale_loss."""
    if _amp_state.backend is not None:
        yield from _amp_state.backend.master_params(optimizer)
        return
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination: dict[str, Any] | None = None) -> dict[str, Any]:
    """``{'loss_scaler0': {'loss_scale': float, 'unskipped': int}, ...}``, in ``destination`` if given
    (else a new OrderedDict)."""
    if _amp_state.backend is not None:
        return _amp_state.backend.state_dict(destination)
    if _amp_state.loss_scalers is None:
        raise AttributeError("amp.state_dict(): amp has no loss scalers; call amp.initialize(..., "
                             "enabled=True) first")
    if destination is None:
        destination = OrderedDict()
    for idx, s in enumerate(_amp_state.loss_scalers):
        destination[f"loss_scaler{idx}"] = {"loss_scale": s.loss_scale(), "unskipped": s._unskipped}
    return destination


def load_state_dict(state_dict: Mapping[str, Any]) -> None:
    """Load scalers from ``amp.state_dict()`` output, in key order (apex semantics).

    Entries are matched to scalers by position, not by the number in the key; surplus entries are
    skipped with a warning, and keys without ``loss_scaler`` raise after the others were loaded.
    """
    if _amp_state.backend is not None:
        _amp_state.backend.load_state_dict(state_dict)  # apex's returns None too
        return
    if _amp_state.loss_scalers is None:
        raise AttributeError("amp.load_state_dict(): call amp.initialize(..., enabled=True) first")
    scalers = _amp_state.loss_scalers
    if len(state_dict) != len(scalers):
        logger.warning("amp.load_state_dict: state_dict contains %d entries, while %d loss_scalers are "
                       "used", len(state_dict), len(scalers))
    unexpected = []
    idx = 0
    for key in state_dict:
        if "loss_scaler" not in key:
            unexpected.append(key)
            continue
        if idx > len(scalers) - 1:
            logger.warning("Skipping loss_scaler[%d], since num_losses was set to %d", idx, len(scalers))
            break
        scalers[idx]._loss_scale = state_dict[key]["loss_scale"]
        scalers[idx]._unskipped = state_dict[key]["unskipped"]
        idx += 1
    if unexpected:
        raise RuntimeError("Error(s) in loading state_dict. Unexpected key(s) in state_dict: "
                           + ", ".join(f'"{k}"' for k in unexpected) + ". ")
