"""Gradient compression for ``clipbert_legacy.compat.hvd`` (``hvd.Compression.none`` / ``.fp16``).

Its own module so that the front module (``hvd``) and the torch backend (``hvd.torch_backend``) can both
import it without importing each other.
"""
from __future__ import annotations

from typing import Any, Protocol

import torch


class Compressor(Protocol):
    """What ``compression=`` accepts: ours, or ``horovod.torch.Compression.*`` (static methods)."""

    @staticmethod
    def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, Any]: ...

    @staticmethod
    def decompress(tensor: torch.Tensor, ctx: Any) -> torch.Tensor: ...


class Compression:
    """Gradient compression, duck-compatible with ``horovod.torch.Compression``."""

    class none:  # horovod's lower-case spelling
        @staticmethod
        def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, None]:
            return tensor, None

        @staticmethod
        def decompress(tensor: torch.Tensor, ctx: None) -> torch.Tensor:  # noqa: ARG004 (Horovod's Compressor API)
            return tensor

    class fp16:  # horovod's lower-case spelling
        @staticmethod
        def compress(tensor: torch.Tensor) -> tuple[torch.Tensor, torch.dtype | None]:
            if tensor.dtype.is_floating_point and tensor.dtype != torch.float16:
                return tensor.to(torch.float16), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor: torch.Tensor, ctx: torch.dtype | None) -> torch.Tensor:
            return tensor if ctx is None else tensor.to(ctx)
