"""``apex.optimizers.FusedSGD``: ``torch.optim.SGD`` with apex's arguments (weight decay before momentum,
apex's default; ``wd_after_momentum=True`` is not provided)."""
import torch

from ._grad_none import SetGradNoneDefault


class FusedSGD(SetGradNoneDefault, torch.optim.SGD):
    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False,
                 wd_after_momentum=False, materialize_master_grads=True,
                 set_grad_none=False):
        if wd_after_momentum:
            raise ValueError("FusedSGD(wd_after_momentum=True) is not provided by the legacy layer; "
                             "use the default (weight decay applied before momentum, as torch.optim.SGD)")
        super().__init__(params, lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                         nesterov=nesterov)
        self.set_grad_none = set_grad_none
