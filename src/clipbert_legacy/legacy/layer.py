"""Install the legacy layer into this process (the launcher and ``legacy.install`` call ``install``).

Idempotent. Nothing here runs on ``import clipbert_legacy.legacy``: a process gets the layer only when it
asks for it.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass

from clipbert_legacy.compat.launcher_env import under_torchrun
from clipbert_legacy.legacy import patches_lmdb, patches_transformers
from clipbert_legacy.legacy.finder import FrontFinder, ShimFinder, apply_now_or_on_import

logger = logging.getLogger("clipbert_legacy.legacy")


@dataclass
class Layer:
    """What ``install`` put in place (kept so tests can inspect and ``uninstall`` can undo it)."""
    front: FrontFinder
    shims: ShimFinder
    cpu: bool
    uint8_masks: bool


_INSTALLED: list[Layer] = []


def installed() -> Layer | None:
    return _INSTALLED[0] if _INSTALLED else None


def install(cpu: bool = False, uint8_masks: bool = False) -> Layer:
    """Put the finders on ``sys.meta_path`` and the patches in place; return what was installed.

    ``cpu``: run a CUDA-only script on the CPU (``legacy.cpu``). ``uint8_masks``: accept uint8 masks in
    ``masked_fill``/``masked_select`` as torch 1.x did (``legacy.torch_masks``).
    """
    layer = installed()
    if layer is None:
        front, shims = FrontFinder(), ShimFinder()
        sys.meta_path.insert(0, front)
        sys.meta_path.append(shims)
        # horovod.torch under torchrun: Horovod's own would init a world of one in every process
        front.use_shim["horovod.torch"] = under_torchrun
        # a torchvision wheel built for another torch raises at import (a missing torchvision::nms)
        front.fallback.add("torchvision")
        for module_name, patch in (*patches_transformers.PATCHES, *patches_lmdb.PATCHES):
            apply_now_or_on_import(front, module_name, patch)
        layer = Layer(front=front, shims=shims, cpu=False, uint8_masks=False)
        _INSTALLED.append(layer)
    if cpu and not layer.cpu:
        from clipbert_legacy.legacy import cpu as cpu_mode
        cpu_mode.enable()
        layer.cpu = True
    if uint8_masks and not layer.uint8_masks:
        from clipbert_legacy.legacy import torch_masks
        torch_masks.enable()
        layer.uint8_masks = True
    return layer


def uninstall() -> None:
    """Take the finders off ``sys.meta_path`` (the patches applied to loaded modules stay)."""
    layer = installed()
    if layer is None:
        return
    for finder in (layer.front, layer.shims):
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    _INSTALLED.clear()
