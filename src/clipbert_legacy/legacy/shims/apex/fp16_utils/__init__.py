"""``apex.fp16_utils``: the manual mixed-precision helpers forks used beside (or before) amp.

``network_to_half``, ``BN_convert_float``, ``convert_network``, ``prep_param_lists``,
``model_grads_to_master_grads``, ``master_params_to_model_params``, ``to_python_float``: apex's
behaviour. apex's ``FP16_Optimizer`` is not provided (use ``apex.amp``, which the layer provides).
"""
import torch
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

__all__ = ["BN_convert_float", "convert_network", "master_params_to_model_params",
           "model_grads_to_master_grads", "network_to_half", "prep_param_lists", "to_python_float", "tofp16"]

_BATCHNORM = (nn.modules.batchnorm._BatchNorm,)


class tofp16(nn.Module):
    """Casts its input to fp16 (the first module of ``network_to_half``)."""

    def forward(self, x):
        return x.half()


def BN_convert_float(module):
    """Affine BatchNorm layers back to fp32 (their statistics need the range)."""
    if isinstance(module, _BATCHNORM) and module.affine:
        module.float()
    for child in module.children():
        BN_convert_float(child)
    return module


def network_to_half(network):
    return nn.Sequential(tofp16(), BN_convert_float(network.half()))


def convert_network(network, dtype):
    """Every parameter and buffer to ``dtype`` except those of affine BatchNorm layers."""
    for module in network.modules():
        if isinstance(module, _BATCHNORM) and module.affine:
            continue
        for tensors in (module._parameters, module._buffers):
            for t in tensors.values():
                if t is not None and t.is_floating_point():
                    t.data = t.data.to(dtype)
                    if t.grad is not None:
                        t.grad.data = t.grad.data.to(dtype)
    return network


def prep_param_lists(model, flat_master=False):
    """(model params, fp32 master copies): one flat master tensor with ``flat_master``."""
    model_params = [p for p in model.parameters() if p.requires_grad]
    if flat_master:
        master = _flatten_dense_tensors([p.data.float() for p in model_params])
        master = nn.Parameter(master)
        master.grad = master.new_zeros(master.size())
        return model_params, [master]
    master_params = [p.detach().clone().float() for p in model_params]
    for p in master_params:
        p.requires_grad = True
    return model_params, master_params


def model_grads_to_master_grads(model_params, master_params, flat_master=False):
    if flat_master:
        master_params[0].grad.data.copy_(_flatten_dense_tensors([p.grad.data for p in model_params]))
        return
    for model, master in zip(model_params, master_params):
        if model.grad is None:
            master.grad = None
        elif master.grad is None:
            master.grad = model.grad.detach().float()
        else:
            master.grad.data.copy_(model.grad.data)


def master_params_to_model_params(model_params, master_params, flat_master=False):
    if flat_master:
        for model, master in zip(model_params,
                                 _unflatten_dense_tensors(master_params[0].data, model_params)):
            model.data.copy_(master)
        return
    for model, master in zip(model_params, master_params):
        model.data.copy_(master.data)


def to_python_float(t):
    return t.item() if isinstance(t, torch.Tensor) else float(t)
