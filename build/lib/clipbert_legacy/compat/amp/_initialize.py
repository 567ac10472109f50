"""``amp.initialize``: choose the backend, resolve the options, then cast the models, patch their
forward and give the optimizers their masters, create one loss scaler per loss and, at O1, install
the cast lists (removed again by the next ``initialize``)."""
from __future__ import annotations

from typing import Any, Union

import torch

from clipbert_legacy.compat.amp._backend import _select_backend
from clipbert_legacy.compat.amp._model import _check_models, _process_model, _register_fp32_state_dict_hooks
from clipbert_legacy.compat.amp._o1 import activate, deactivate
from clipbert_legacy.compat.amp._optimizer import _process_optimizer, reconcile_masters
from clipbert_legacy.compat.amp._options import Properties, opt_levels
from clipbert_legacy.compat.amp._scaler import LossScaler
from clipbert_legacy.compat.amp._state import _amp_state, _maybe_log

Models = Union[torch.nn.Module, list[torch.nn.Module]]
Optimizers = Union[torch.optim.Optimizer, list[torch.optim.Optimizer], None]
_OVERRIDES = ("cast_model_type", "patch_torch_functions", "keep_batchnorm_fp32", "master_weights")


def _as_list(x, cls, what, single):
    """(was_list, items) for a single ``cls`` instance or a list of them (None: no items)."""
    if isinstance(x, cls):
        return False, [x]
    if x is None and cls is torch.optim.Optimizer:
        return False, []
    if not isinstance(x, list):
        raise TypeError(f"{what} must be either a single {single} or a list of {what}.")
    for o in x:
        if not isinstance(o, cls):
            raise TypeError(f"{what} must be {cls.__name__} instances, got {type(o).__name__}")
    return True, x


def _resolve_properties(opt_level: str, overrides: dict[str, Any], loss_scale, min_loss_scale,
                        max_loss_scale) -> Properties:
    """The opt level's defaults with the user's overrides applied (validated, in apex's order)."""
    if opt_level not in opt_levels:
        raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', 'O2', "
                           "'O3'. Note that in `O0`, `O1`, etc., the prefix O is the letter O, not the "
                           "number zero.")
    props = opt_levels[opt_level](_amp_state.opt_properties)
    _maybe_log("Selected optimization level %s; defaults: %s", opt_level, dict(props.options))
    _amp_state.min_loss_scale = min_loss_scale
    _amp_state.max_loss_scale = max_loss_scale
    for name in _OVERRIDES:
        if overrides[name] is not None:
            setattr(props, name, overrides[name])
    if loss_scale is not None:
        props.loss_scale = loss_scale
    elif props.cast_model_type is torch.bfloat16:
        props.loss_scale = 1.0  # bf16 has fp32's exponent range: no loss scaling (package docstring)
    _maybe_log("Processing user overrides; final options: %s", dict(props.options))
    return props


def _check_inputs(models, optimizers):
    """(models_was_list, models, optimizers_was_list, optimizers), validated as apex did."""
    optimizers_was_list, opt_list = _as_list(optimizers, torch.optim.Optimizer, "optimizers", "optimizer")
    for o in opt_list:
        if type(o).__name__ == "FP16_Optimizer":
            raise RuntimeError("amp.initialize does not accept apex FP16_Optimizer; pass the plain "
                               "torch optimizer instead.")
    models_was_list, model_list = _as_list(models, torch.nn.Module, "models", "model")
    for o in opt_list:
        if hasattr(o, "_amp_stash"):
            raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    _check_models(model_list)
    return models_was_list, model_list, optimizers_was_list, opt_list


def _process_optimizers(opt_list, model_list, props):
    """Masters and patched methods for every optimizer; fp32 state_dict hooks on the cast models."""
    cast_type = props.cast_model_type
    if cast_type and not props.master_weights:
        for o in opt_list:
            o.load_state_dict(o.state_dict())  # recast existing state to the params' new dtype
    param_to_master = {}
    for o in opt_list:
        _process_optimizer(o, props)
        param_to_master.update(o._amp_stash.param_to_master)
    stashes = [o._amp_stash for o in opt_list]

    def before_state_dict():  # entries alias the masters: bring in writes to the model first
        for st in stashes:
            reconcile_masters(st, final=False)
    if cast_type and cast_type is not torch.float32:
        for model in model_list:
            _register_fp32_state_dict_hooks(model, cast_type, param_to_master, before_state_dict)


def initialize(models: Models, optimizers: Optimizers = None, enabled: bool = True, opt_level: str = "O1",
               cast_model_type: torch.dtype | None = None, patch_torch_functions: bool | None = None,
               keep_batchnorm_fp32: bool | str | None = None, master_weights: bool | None = None,
               loss_scale: float | str | None = None, cast_model_outputs: torch.dtype | None = None,
               num_losses: int = 1, verbosity: int = 1, min_loss_scale: float | None = None,
               max_loss_scale: float = 2. ** 24) -> Any:
    """apex.amp.initialize: returns the (mutated) model(s) and optimizer(s) with the input's list-ness.

    ``model`` alone when ``optimizers`` is None, else ``(model(s), optimizer(s))``; a list in gives
    a list out. ``loss_scale`` is a number (static) or ``"dynamic"``; see the package docstring.
    """
    deactivate()  # O1's patches are in force only while amp is initialized at O1
    _amp_state.opt_properties = Properties()
    _amp_state.verbosity = verbosity
    _amp_state.backend = None
    if not enabled:
        return models if optimizers is None else (models, optimizers)
    kw = {"cast_model_type": cast_model_type, "patch_torch_functions": patch_torch_functions,
          "keep_batchnorm_fp32": keep_batchnorm_fp32, "master_weights": master_weights}
    apex_amp = _select_backend()
    if apex_amp is not None:
        _amp_state.backend = apex_amp
        return apex_amp.initialize(
            models, optimizers, enabled=enabled, opt_level=opt_level, loss_scale=loss_scale,
            cast_model_outputs=cast_model_outputs, num_losses=num_losses, verbosity=verbosity,
            min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale, **kw)

    props = _resolve_properties(opt_level, kw, loss_scale, min_loss_scale, max_loss_scale)
    models_was_list, model_list, optimizers_was_list, opt_list = _check_inputs(models, optimizers)
    for model in model_list:
        _process_model(model, props, cast_model_outputs)
    _process_optimizers(opt_list, model_list, props)
    _amp_state.loss_scalers = [LossScaler(props.loss_scale, min_loss_scale=min_loss_scale,
                                          max_loss_scale=max_loss_scale) for _ in range(num_losses)]
    if props.patch_torch_functions:
        activate()
    out_models = model_list if models_was_list else model_list[0]
    if optimizers is None:
        return out_models
    return out_models, (opt_list if optimizers_was_list else opt_list[0])
