"""Opt-in (``--uint8-masks``): uint8 masks in ``masked_fill`` / ``masked_select``, as torch 1.x took them.

UNITER-style code builds masks as ``torch.uint8`` (``attn_mask.eq(0)`` in torch < 1.2, ``.byte()``)
and fills with them; torch 2 raises "masked_fill_ only supports boolean masks". With this opt-in, a
uint8 mask is read as ``mask != 0`` (torch 1.x's meaning) in ``Tensor.masked_fill(_)``,
``Tensor.masked_select``, ``torch.masked_fill`` and ``torch.masked_select``; any other mask dtype is
passed through unchanged (and still gets torch's error). It is off by default because it changes a
torch function process-wide.
"""
from __future__ import annotations

import logging

import torch

logger = logging.getLogger("clipbert_legacy.legacy")
_ENABLED: list[bool] = []


def _as_bool(mask):
    if isinstance(mask, torch.Tensor) and mask.dtype == torch.uint8:
        return mask != 0
    return mask


def _tensor_method(original):
    def method(self, mask, *args, **kwargs):
        return original(self, _as_bool(mask), *args, **kwargs)
    method.__wrapped__ = original
    return method


def _function(original):
    def function(input, mask, *args, **kwargs):
        return original(input, _as_bool(mask), *args, **kwargs)
    function.__wrapped__ = original
    return function


def enable() -> None:
    """Accept uint8 masks process-wide (once)."""
    if _ENABLED:
        return
    for name in ("masked_fill", "masked_fill_", "masked_select"):
        setattr(torch.Tensor, name, _tensor_method(getattr(torch.Tensor, name)))
    for name in ("masked_fill", "masked_select"):
        setattr(torch, name, _function(getattr(torch, name)))
    _ENABLED.append(True)
    logger.info("legacy layer: uint8 masks accepted in masked_fill / masked_select (read as mask != 0)")
