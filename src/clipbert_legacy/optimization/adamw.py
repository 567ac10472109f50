"""ClipBERT's AdamW (the pre-4.x ``transformers.AdamW``): not the same numbers as torch's.

Per parameter, with ``bc1 = 1-b1**t``, ``bc2 = 1-b2**t`` (``correct_bias=True``)::

    m = b1*m + (1-b1)*g ;  v = b2*v + (1-b2)*g*g
    p -= lr * sqrt(bc2)/bc1 * m / (sqrt(v) + eps)       # eps NOT bias-corrected
    p -= lr * wd * p                                     # decoupled decay, AFTER the Adam step

``torch.optim.AdamW`` differs twice: it decays first (``p *= 1-lr*wd`` on the old p) and adds eps
to ``sqrt(v)/sqrt(bc2)``. One step from p=1, lr=0.1, wd=0.01: ours 0.8991 (ClipBERT), torch's 0.899.
So the legacy optimizer is kept. Defaults are ClipBERT's: eps=1e-6, betas=(0.9, 0.999), wd=0.
"""
import math

import torch
from torch.optim import Optimizer


class AdamW(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0, correct_bias=True):
        if lr < 0.0:
            raise ValueError(f"AdamW: invalid learning rate {lr} (must be >= 0)")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"AdamW: invalid betas {betas} (each must be in [0, 1))")
        if eps < 0.0:
            raise ValueError(f"AdamW: invalid eps {eps} (must be >= 0)")
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay,
                                  "correct_bias": correct_bias})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("AdamW does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                exp_avg.mul_(b1).add_(grad, alpha=1.0 - b1)
                exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1.0 - b2)
                denom = exp_avg_sq.sqrt().add_(group["eps"])
                step_size = group["lr"]
                if group["correct_bias"]:
                    t = state["step"]
                    step_size = step_size * math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t)
                p.addcdiv_(exp_avg, denom, value=-step_size)
                if group["weight_decay"] > 0.0:
                    p.add_(p, alpha=-group["lr"] * group["weight_decay"])
        return loss
