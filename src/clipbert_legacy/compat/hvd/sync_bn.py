"""``hvd.SyncBatchNorm``: batch norm whose batch statistics are taken over every rank's batch.

Under ``horovodrun`` with CUDA input it runs Horovod's own ``_SyncBatchNorm`` (fused CUDA kernels).
Otherwise (CPU input, which Horovod rejects, or the torch backend) the statistics come from two
differentiable allreduces (sum and count, then the centred sum of squares: no cancellation of
E[x^2] - E[x]^2), so the backward pass reduces the gradients of the statistics across ranks the way
Horovod's does (its ``sum_dy`` / ``sum_dy_xmu`` allreduces). Running mean and variance are updated as
``torch.nn.BatchNorm`` does over the global batch (unbiased variance, ``momentum`` or cumulative average).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from clipbert_legacy.compat.hvd.api import Sum, allreduce
from clipbert_legacy.compat.hvd.state import backend_name, impl


class SyncBatchNorm(_BatchNorm):
    """Synchronous N-dimensional batch norm (Horovod's arguments; see the module docstring)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if self.training and self.track_running_stats:
            self.num_batches_tracked = self.num_batches_tracked + 1
        if not self.training and self.track_running_stats:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, False,
                                0.0, self.eps)
        if impl().size() == 1:
            return F.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias, True,
                                self._factor(), self.eps)
        if backend_name() == "horovod" and input.is_cuda:
            from horovod.torch.sync_batch_norm import _SyncBatchNorm
            return _SyncBatchNorm.apply(input, self.weight, self.bias, self.running_mean, self.running_var,
                                        self.eps, self._factor())
        return self._sync_forward(input)

    def _factor(self) -> float:
        if self.momentum is not None:
            return self.momentum
        return 1.0 / float(self.num_batches_tracked)  # cumulative moving average, as torch's BatchNorm

    def _sync_forward(self, input: torch.Tensor) -> torch.Tensor:
        dims = [0] + list(range(2, input.dim()))
        shape = [1, -1] + [1] * (input.dim() - 2)
        x = input.float() if input.dtype in (torch.float16, torch.bfloat16) else input
        count = torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype, device=x.device)
        stats = allreduce(torch.cat([x.sum(dims), count]), op=Sum)
        n = stats[-1]
        mean = stats[:-1] / n
        var = allreduce((x - mean.view(shape)).pow(2).sum(dims), op=Sum) / n
        if self.track_running_stats and self.running_mean is not None:
            with torch.no_grad():
                f = self._factor()
                self.running_mean.mul_(1 - f).add_(mean.detach(), alpha=f)
                unbiased = var.detach() * (n / (n - 1)) if n > 1 else var.detach()
                self.running_var.mul_(1 - f).add_(unbiased, alpha=f)
        out = (x - mean.view(shape)) * torch.rsqrt(var.view(shape) + self.eps)
        if self.weight is not None:
            out = out * self.weight.view(shape) + self.bias.view(shape)
        return out.to(input.dtype)
