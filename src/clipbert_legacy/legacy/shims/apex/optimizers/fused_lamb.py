"""``apex.optimizers.FusedLAMB``: LAMB with apex's arguments and apex's update rule (torch has no LAMB).

Per step, as apex's ``multi_tensor_lamb``: the gradients of all groups are clipped together to
``max_grad_norm`` (their global L2 norm); Adam moments (``grad_averaging``: ``1 - beta1`` on the new
gradient, else 1) with bias correction; the update ``m / (sqrt(v) + eps)`` plus decoupled weight decay
(``adam_w_mode``; else L2 added to the gradient first); then the step is scaled by the trust ratio
``||w|| / ||update||`` (1 where either is 0), applied where weight decay is non-zero or ``use_nvlamb``.
"""
import torch

from ._grad_none import SetGradNoneDefault


class FusedLAMB(SetGradNoneDefault, torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01,
                 amsgrad=False, adam_w_mode=True, grad_averaging=True, set_grad_none=True, max_grad_norm=1.0,
                 use_nvlamb=False):
        if amsgrad:
            raise RuntimeError("FusedLAMB does not support the AMSGrad variant.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay,
                        grad_averaging=grad_averaging, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        self.use_nvlamb = use_nvlamb

    def _clip_factor(self):
        grads = [p.grad.float() for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return 1.0
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads]))
        max_norm = self.defaults["max_grad_norm"]
        return float(norm / max_norm) if max_norm > 0 and norm > max_norm else 1.0

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        clip = self._clip_factor()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group, clip)
        return loss

    def _update(self, p, group, clip):
        beta1, beta2 = group["betas"]
        decay = group["weight_decay"]
        grad = p.grad.float() / clip
        weight = p.float()
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(weight)
            state["exp_avg_sq"] = torch.zeros_like(weight)
        state["step"] += 1
        if not self.adam_w_mode and decay != 0:
            grad = grad + decay * weight
        state["exp_avg"].mul_(beta1).add_(grad, alpha=(1 - beta1) if group["grad_averaging"] else 1.0)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        m, v = state["exp_avg"], state["exp_avg_sq"]
        if group["bias_correction"]:
            m = m / (1 - beta1 ** state["step"])
            v = v / (1 - beta2 ** state["step"])
        update = m / (v.sqrt() + group["eps"])
        if self.adam_w_mode and decay != 0:
            update = update + decay * weight
        ratio = 1.0
        if decay != 0 or self.use_nvlamb:
            w_norm, u_norm = torch.linalg.vector_norm(weight), torch.linalg.vector_norm(update)
            if w_norm > 0 and u_norm > 0:
                ratio = float(w_norm / u_norm)
        p.add_((update * (-group["lr"] * ratio)).to(p.dtype))
