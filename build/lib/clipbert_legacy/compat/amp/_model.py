"""Model processing: casting (affine BatchNorm kept fp32), the patched forward (input/output casts),
fp32 ``state_dict`` hooks, and the checks on models passed to ``initialize``."""
from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, MutableMapping

import numpy as np
import torch

from clipbert_legacy.compat.amp._state import _amp_state


def _is_bn_kept(module: torch.nn.Module) -> bool:
    return isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine is True


def _convert_module(module: torch.nn.Module, dtype: torch.dtype) -> None:
    """Cast this module's own floating params (+ grads) and buffers in place, keeping the tensor objects
    (as apex's ``convert_module``: a buffer shared by several modules stays one shared tensor)."""
    for p in module._parameters.values():
        if p is not None and p.is_floating_point():
            p.data = p.data.to(dtype)
            if p.grad is not None:
                p.grad.data = p.grad.data.to(dtype)
    for b in module._buffers.values():
        if b is not None and b.is_floating_point():
            b.data = b.data.to(dtype)


def _convert_network(model: torch.nn.Module, dtype: torch.dtype) -> None:
    for m in model.modules():
        if not _is_bn_kept(m):
            _convert_module(m, dtype)


def _cast_mapping(value, dtype, warn_not_cuda):
    items = {_cast(k, dtype, warn_not_cuda): _cast(v, dtype, warn_not_cuda) for k, v in value.items()}
    if type(value) is not dict and isinstance(value, MutableMapping):
        try:  # keep OrderedDict / transformers ModelOutput (attribute access) intact
            if all(a is b for a, b in zip(items, value.keys())):  # keys unchanged (strings)
                new = copy.copy(value)
                for k, v in items.items():
                    new[k] = v
                return new
        except Exception:
            pass
    return items


def _cast(value, dtype, warn_not_cuda=False):
    """``value`` with every floating tensor in it (nested containers too) cast to ``dtype``."""
    if isinstance(value, torch.Tensor):
        if warn_not_cuda and not value.is_cuda:
            warnings.warn("An input tensor was not cuda.", stacklevel=2)
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (str, bytes, np.ndarray)):
        return value
    if hasattr(value, "to"):
        return value.to(dtype)
    if isinstance(value, Mapping):
        return _cast_mapping(value, dtype, warn_not_cuda)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_cast(v, dtype, warn_not_cuda) for v in value))
    if isinstance(value, (list, tuple, set, frozenset)):
        return type(value)(_cast(v, dtype, warn_not_cuda) for v in value)
    return value


def _model_device_type(model: torch.nn.Module) -> str:
    for t in model.parameters():
        return t.device.type
    for t in model.buffers():
        return t.device.type
    return "cpu"


def _patch_forward(model, in_dtype, out_dtype):
    orig = model.forward
    is_cuda = _model_device_type(model) == "cuda"

    def new_fwd(*args, **kwargs):
        if in_dtype is not None:
            args = _cast(args, in_dtype, is_cuda)
            kwargs = _cast(kwargs, in_dtype, is_cuda)
        out = orig(*args, **kwargs)
        return _cast(out, out_dtype) if out_dtype is not None else out

    new_fwd.__wrapped__ = orig
    model.forward = new_fwd


def _register_fp32_state_dict_hooks(model, cast_dtype, param_to_master, before_state_dict):
    """``model.state_dict()`` is fp32: a param with a master appears as that master (detached, sharing
    its memory, so in-place writes into the state dict reach the weights as they do for plain torch
    modules), any other low-precision tensor as an fp32 copy (apex copied every entry).
    ``before_state_dict()`` runs first (the lazy master sync, see ``_optimizer``)."""
    def pre_hook(_module, _prefix, _keep_vars):  # torch passes these by position
        before_state_dict()

    def hook(module, sd, prefix, _local_metadata):
        for name, p in list(module._parameters.items()) + list(module._buffers.items()):
            key = prefix + name
            if p is None or key not in sd:
                continue
            v = sd[key]
            if torch.is_tensor(v) and v.dtype == cast_dtype:
                master = param_to_master.get(p)
                sd[key] = master.detach() if master is not None else v.float()

    def load_hook(module, sd, prefix, *_args):
        with torch.no_grad():
            for name, p in module._parameters.items():
                master = param_to_master.get(p) if p is not None else None
                key = prefix + name
                if master is not None and key in sd and torch.is_tensor(sd[key]) \
                        and sd[key].shape == master.shape:
                    master.copy_(sd[key])

    model.register_state_dict_pre_hook(pre_hook)
    for m in model.modules():
        if hasattr(m, "register_state_dict_post_hook"):
            m.register_state_dict_post_hook(hook)
        else:  # pragma: no cover - older torch
            m._register_state_dict_hook(hook)
        m.register_load_state_dict_pre_hook(load_hook)


def _warn_cpu_fp16(model: torch.nn.Module, dtype: torch.dtype | None) -> None:
    if dtype is torch.float16 and _model_device_type(model) == "cpu" and not _amp_state.warned_cpu_fp16:
        _amp_state.warned_cpu_fp16 = True
        # stacklevel 4: the caller's amp.initialize(...) line (here <- _process_model <- initialize)
        warnings.warn("amp: fp16 on CPU runs, but slowly (tests/development only); use O0 for CPU "
                      "training or a CUDA device for speed.", stacklevel=4)


def _check_models(models: list[torch.nn.Module]) -> None:
    for model in models:
        if isinstance(model, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            raise RuntimeError("Incoming model is an instance of torch.nn.parallel.DistributedDataParallel "
                               "or DataParallel. Parallel wrappers should only be applied to the model(s) "
                               "AFTER the model(s) have been returned from amp.initialize.")
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.is_floating_point() and t.dtype in (torch.float16, torch.bfloat16):
                raise RuntimeError(f"Found param/buffer {name} with type {t.type()}, expected float32. When "
                                   "using amp, you do not need to call .half() on your model before "
                                   "passing it, no matter what optimization level you choose (was "
                                   "amp.initialize called twice on this model?).")
        if _model_device_type(model) == "cuda" and not torch.backends.cudnn.enabled:
            raise RuntimeError("Amp requires torch.backends.cudnn.enabled = True")


def _process_model(model, props, cast_model_outputs):
    """Cast one model as ``props`` says (O0/O2/O3: weights and forward inputs; O1: nothing, its casts are
    process-wide, see ``_o1``) and patch its forward."""
    cast_type = props.cast_model_type
    if cast_type:
        if props.keep_batchnorm_fp32:
            _convert_network(model, cast_type)
        else:
            model.to(cast_type)
        _warn_cpu_fp16(model, cast_type)
        _patch_forward(model, cast_type, cast_model_outputs or torch.float32)
        return
    if props.patch_torch_functions:
        _warn_cpu_fp16(model, torch.float16)
    if cast_model_outputs is not None:  # only the outputs, as apex
        _patch_forward(model, None, cast_model_outputs)
