"""``apex.optimizers.FusedAdam``: ``torch.optim.Adam`` with apex's arguments.

``adam_w_mode=True`` (apex's default) is decoupled weight decay (AdamW), ``False`` is L2 added to the
gradient, as in apex. ``set_grad_none`` is ``zero_grad``'s default. apex refused AMSGrad; so does this.
"""
import torch

from ._grad_none import SetGradNoneDefault


class FusedAdam(SetGradNoneDefault, torch.optim.Adam):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True, capturable=False,
                 master_weights=False):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        if not bias_correction:
            raise ValueError("FusedAdam(bias_correction=False) is not provided by the legacy layer "
                             "(torch's Adam always corrects the bias); use bias_correction=True")
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         decoupled_weight_decay=adam_w_mode)
        self.set_grad_none = set_grad_none
