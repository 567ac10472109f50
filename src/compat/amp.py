"""The legacy ``apex.amp`` API, implemented natively on modern torch.

``from src.compat import amp`` is used exactly like ``from apex import amp``::

    model, optimizer = amp.initialize(model, optimizer, opt_level="O2", keep_batchnorm_fp32=True)
    with amp.scale_loss(loss, optimizer, delay_unscale=not last_micro_batch) as scaled:
        scaled.backward()
    torch.nn.utils.clip_grad_norm_(amp.master_params(optimizer), 1.0)
    optimizer.step()
    ckpt = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "amp": amp.state_dict()}

apex deleted ``amp`` upstream (PR #1896) and its old releases do not build on today's torch; this module keeps its
behaviour (shared/specs/apex_amp_legacy.md): the O0-O3 property table and override rules, the fp16 model
with fp32 affine BatchNorm and optimizer-owned fp32 master weights (O2), the patched forward, apex's
dynamic loss scaler (2**16 start, window 2000, factor 2, min/max caps) and static scales, delayed
unscaling, ``master_params`` and the ``loss_scalerN`` state dict. O1 is ``torch.autocast`` (fp16).
With ``AMP_BACKEND=apex`` and a real legacy ``apex.amp`` importable, every call is delegated to apex.

Deviations from apex, and why:

* **CPU works.** apex required CUDA params and cuDNN; here CPU models are accepted (tests, laptops)
  and a warning is emitted once that fp16 on CPU is slow. O1 autocasts on the device type of the
  model's parameters. The "An input tensor was not cuda." warning fires only for a CUDA model.
* **bf16.** ``cast_model_type=torch.bfloat16`` (O2/O3) casts to bf16 with fp32 masters. bf16 has fp32's
  range, so unless ``loss_scale`` is passed the scale is a *static 1.0*: no scaling and, like every
  static scale in apex, no overflow skipping.
* **Masters are created eagerly** in ``initialize`` (apex: lazily, at the first ``zero_grad``/
  ``scale_loss``). That removes apex's delay_unscale bug (lazy init at the first non-delayed exit set
  the grads of fp32 params to None, dropping the delayed micro-batches; ClipBERT's "quick hack" of
  ``zero_grad(); step()`` before training is no longer needed but still harmless) and means optimizer
  state loaded after ``initialize`` is cast straight to fp32 (apex cast it to fp16 first, which can
  underflow Adam's ``exp_avg_sq``). Writes to the model made before the first ``scale_loss`` (e.g.
  ``hvd.broadcast_parameters(model.named_parameters())`` after initialize) still reach the masters,
  as they did with apex's lazy init: changed params are re-copied at the first ``scale_loss``.
* **Checkpoints keep fp32 precision.** Under O2 ``model.state_dict()`` holds fp32 copies of the
  *master* weights (apex: the fp16 weights upcast; they round to the same fp16 values), and
  ``model.load_state_dict`` also writes the loaded fp32 values into the masters. So a same-level
  save/restore continues bit-identically, where apex rebuilt masters from fp16-rounded weights.
* **Static scale 1.0 with masters keeps accumulated fp32 grads** (apex ``20d00ab1`` dropped them).
* **Overflow decisions are global.** With a dynamic scale under ``src.compat.hvd``/Horovod or
  ``torch.distributed`` (size > 1) the local overflow flag is all-reduced (one scalar per non-delayed
  ``scale_loss`` exit), so a rank-local inf skips the step on every rank and the scales never diverge
  (apex relied on grads being already averaged). Like ``synchronize()`` this is a collective: every
  rank must run the same number of non-delayed exits. ``AMP_SYNC_OVERFLOW=0`` turns it off.
* **O1** is ``torch.autocast(<model's device type>, torch.float16)`` around the model's forward; apex
  patched torch functions globally (also outside the forward). Both keep weights fp32 and run GEMMs in
  fp16 and reductions/softmax/losses in fp32 on CUDA (CPU autocast has its own, shorter fp32 list).
* **O2 ``zero_grad(set_to_none=False)``** zeroes model grads (apex) unless ``set_to_none=True``, always
  sets master grads to None, and keeps Horovod's "zero_grad before synchronize" guard that apex's
  replacement silently removed.
* Casting of forward inputs/outputs rebuilds lists, tuples (namedtuples too) and sets, keeps the type
  of mutable Mappings such as OrderedDict or transformers' ``ModelOutput`` (apex returned a plain dict,
  losing attribute access) and passes other iterables through (apex tried ``type(x)(...)``, which
  breaks on namedtuples, ranges and generators). No ``DeprecatedFeatureWarning`` is emitted,
  and the option printout goes to ``logging`` instead of stdout.
* Static scales never skip (apex): an inf gradient under a static scale reaches the weights.
"""
import contextlib
import copy
import logging
import os
import sys
import types
import warnings
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping

import numpy as np
import torch

logger = logging.getLogger(__name__)

__all__ = ["initialize", "scale_loss", "master_params", "state_dict", "load_state_dict",
           "LossScaler", "Properties", "opt_levels", "num_skipped_steps", "backend"]

AMP_BACKENDS = ("native", "apex")


# ---------------------------------------------------------------------------------------------
# global state (apex keeps the same in _amp_state)
class _AmpState:
    def __init__(self):
        self.opt_properties = None      # None until initialize() is called at all
        self.loss_scalers = None        # None until an enabled initialize() ran
        self.verbosity = 1
        self.min_loss_scale = None
        self.max_loss_scale = 2. ** 24
        self.backend = None             # None (native) or the delegated apex.amp module
        self.skipped_steps = 0
        self.warned_cpu_fp16 = False


_amp_state = _AmpState()


def _rank0():
    try:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return torch.distributed.get_rank() == 0
    except Exception:  # pragma: no cover
        pass
    return int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0"))) == 0


def _maybe_log(msg, *args):
    if _amp_state.verbosity > 0 and _rank0():
        logger.info(msg, *args)


def _warn_or_err(msg):
    # apex: hard_override (never set by any argument) would turn this into a warning.
    raise RuntimeError(msg)


# ---------------------------------------------------------------------------------------------
# properties and opt levels
class Properties:
    """The option set of one opt_level; assignments are validated against the level (apex rules)."""

    def __init__(self):
        self.__dict__["options"] = {"enabled": False, "opt_level": None, "cast_model_type": None,
                                    "patch_torch_functions": False, "keep_batchnorm_fp32": None,
                                    "master_weights": None, "loss_scale": 1.0}

    def __getattr__(self, name):
        options = self.__dict__.get("options", {})
        if name in options:
            return options[name]
        raise AttributeError(f"'Properties' object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name not in self.options:
            self.__dict__[name] = value
            return
        level = self.options["opt_level"]
        if name == "cast_model_type":
            if level == "O1" and value not in (None, False) and value is not torch.float32:
                _warn_or_err("O1 inserts casts around Torch functions rather than model weights, so with "
                             "O1 the model weights themselves should remain FP32. To cast the model to "
                             f"another type use opt_level='O2' or 'O3'. cast_model_type was {value}")
        elif name == "patch_torch_functions":
            if level != "O1" and value:
                _warn_or_err("patch_torch_functions=True should only be set by selecting opt_level='O1'.")
        elif name == "keep_batchnorm_fp32":
            if level == "O1" and value is not None:
                _warn_or_err("With opt_level O1, batchnorm functions are automatically run in FP32, so "
                             f"keep_batchnorm_fp32 should be None. keep_batchnorm_fp32 was {value}")
            if value == "False":
                value = False
            elif value == "True":
                value = True
            else:
                assert value is True or value is False or value is None, (
                    "keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', or None, found "
                    f"keep_batchnorm_fp32={value}")
        elif name == "master_weights":
            if level == "O1" and value is not None:
                _warn_or_err("It doesn't make sense to use master_weights with O1. With O1, your model "
                             "weights themselves should be FP32.")
        elif name == "loss_scale":
            value = value if value == "dynamic" else float(value)
        self.options[name] = value


def _o3(p):
    p.enabled, p.opt_level = True, "O3"
    p.cast_model_type, p.patch_torch_functions = torch.float16, False
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = False, False, 1.0
    return p


def _o2(p):
    p.enabled, p.opt_level = True, "O2"
    p.cast_model_type, p.patch_torch_functions = torch.float16, False
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = True, True, "dynamic"
    return p


def _o1(p):
    p.enabled, p.opt_level = True, "O1"
    p.cast_model_type, p.patch_torch_functions = None, True
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = None, None, "dynamic"
    return p


def _o0(p):
    p.enabled, p.opt_level = True, "O0"
    p.cast_model_type, p.patch_torch_functions = torch.float32, False
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = None, False, 1.0
    return p


opt_levels = {"O3": _o3, "O2": _o2, "O1": _o1, "O0": _o0}


# ---------------------------------------------------------------------------------------------
# loss scaler
class LossScaler:
    """apex's loss scaler: dynamic (x2 every ``scale_window`` clean updates, /2 on overflow) or static."""

    def __init__(self, loss_scale, init_scale=2. ** 16, scale_factor=2., scale_window=2000,
                 min_loss_scale=None, max_loss_scale=2. ** 24):
        # scale_factor is accepted and ignored: apex hard-codes 2.
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._unskipped = 0
        self._has_overflow = False
        if loss_scale == "dynamic":
            self.dynamic = True
            self._loss_scale = float(init_scale if max_loss_scale is None else min(max_loss_scale, init_scale))
        else:
            self.dynamic = False
            self._loss_scale = float(loss_scale)

    def loss_scale(self):
        return self._loss_scale

    def clear_overflow_state(self):
        self._has_overflow = False

    def update_scale(self):
        """Apply the overflow state of the last unscale; returns True when the step must be skipped."""
        if self._has_overflow and self.dynamic:
            should_skip = True
            new = self._loss_scale / 2.
            self._loss_scale = max(self._min_loss_scale, new) if self._min_loss_scale else new
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len and self.dynamic:
            new = self._loss_scale * 2.
            self._loss_scale = min(self._max_loss_scale, new) if self._max_loss_scale else new
            self._unskipped = 0
        return should_skip


# ---------------------------------------------------------------------------------------------
# backend selection
def _select_backend():
    name = os.environ.get("AMP_BACKEND", "native") or "native"
    if name not in AMP_BACKENDS:
        raise ValueError(f"AMP_BACKEND={name!r} is not one of {'|'.join(AMP_BACKENDS)}")
    if name == "native":
        return None
    try:
        import apex.amp as apex_amp
    except Exception as e:
        raise RuntimeError(f"AMP_BACKEND=apex but legacy apex.amp is not importable ({e}); unset "
                           "AMP_BACKEND to use the native implementation") from e
    if not all(hasattr(apex_amp, f) for f in ("initialize", "scale_loss", "master_params")):
        raise RuntimeError("AMP_BACKEND=apex but the installed apex has no legacy amp API (apex removed "
                           "amp in PR #1896); unset AMP_BACKEND to use the native implementation")
    return apex_amp


def backend():
    """'apex' when calls are delegated to real apex.amp, else 'native'."""
    return "apex" if _amp_state.backend is not None else "native"


def num_skipped_steps():
    """How many optimizer steps were skipped for gradient overflow since import (all optimizers)."""
    return _amp_state.skipped_steps


# ---------------------------------------------------------------------------------------------
# model casting / forward patching
def _is_bn_kept(module):
    return isinstance(module, torch.nn.modules.batchnorm._BatchNorm) and module.affine is True


def _convert_module(module, dtype):
    """Cast this module's own floating params (+ grads) and buffers in place, keeping Parameter objects."""
    for p in module._parameters.values():
        if p is not None and p.is_floating_point():
            p.data = p.data.to(dtype)
            if p.grad is not None:
                p.grad.data = p.grad.data.to(dtype)
    for name, b in module._buffers.items():
        if b is not None and b.is_floating_point():
            module._buffers[name] = b.to(dtype)


def _convert_network(model, dtype):
    for m in model.modules():
        if not _is_bn_kept(m):
            _convert_module(m, dtype)


def _cast(value, dtype, warn_not_cuda=False):
    if isinstance(value, torch.Tensor):
        if warn_not_cuda and not value.is_cuda:
            warnings.warn("An input tensor was not cuda.")
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (str, bytes, np.ndarray)):
        return value
    if hasattr(value, "to"):
        return value.to(dtype)
    if isinstance(value, Mapping):
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
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_cast(v, dtype, warn_not_cuda) for v in value))
    if isinstance(value, (list, tuple, set, frozenset)):
        return type(value)(_cast(v, dtype, warn_not_cuda) for v in value)
    return value


def _model_device_type(model):
    for t in model.parameters():
        return t.device.type
    for t in model.buffers():
        return t.device.type
    return "cpu"


def _patch_forward(model, in_dtype, out_dtype, autocast_dtype=None):
    orig = model.forward
    is_cuda = _model_device_type(model) == "cuda"

    def new_fwd(*args, **kwargs):
        if in_dtype is not None:
            args = _cast(args, in_dtype, is_cuda)
            kwargs = _cast(kwargs, in_dtype, is_cuda)
        if autocast_dtype is not None:
            with torch.autocast(_model_device_type(model), dtype=autocast_dtype):
                out = orig(*args, **kwargs)
        else:
            out = orig(*args, **kwargs)
        return _cast(out, out_dtype) if out_dtype is not None else out

    new_fwd.__wrapped__ = orig
    model.forward = new_fwd


def _register_fp32_state_dict_hooks(model, cast_dtype, param_to_master):
    """model.state_dict() returns fp32 copies (of the masters, where there are masters)."""
    def hook(module, sd, prefix, local_metadata):
        for name, p in list(module._parameters.items()) + list(module._buffers.items()):
            key = prefix + name
            if p is None or key not in sd:
                continue
            v = sd[key]
            if torch.is_tensor(v) and v.dtype == cast_dtype:
                master = param_to_master.get(p)
                sd[key] = master.detach().clone() if master is not None else v.float()

    def load_hook(module, sd, prefix, *args):
        with torch.no_grad():
            for name, p in module._parameters.items():
                master = param_to_master.get(p) if p is not None else None
                key = prefix + name
                if master is not None and key in sd and torch.is_tensor(sd[key]) \
                        and sd[key].shape == master.shape:
                    master.copy_(sd[key])

    for m in model.modules():
        if hasattr(m, "register_state_dict_post_hook"):
            m.register_state_dict_post_hook(hook)
        else:  # pragma: no cover - older torch
            m._register_state_dict_hook(hook)
        m.register_load_state_dict_pre_hook(load_hook)


def _warn_cpu_fp16(model, dtype):
    if dtype is torch.float16 and _model_device_type(model) == "cpu" and not _amp_state.warned_cpu_fp16:
        _amp_state.warned_cpu_fp16 = True
        warnings.warn("amp: fp16 on CPU runs, but slowly (tests/development only); use O0 for CPU "
                      "training or a CUDA device for speed.")


def _check_models(models):
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


# ---------------------------------------------------------------------------------------------
# optimizer processing
class _OptimizerStash:
    def __init__(self):
        self.master_weights = False
        self.model_params = []          # fp16/bf16 model params that have a master
        self.masters = []               # their fp32 masters (same order)
        self.self_master = []           # params that are their own master (fp32, or any dtype w/o masters)
        self.stash = {}                 # param -> stashed grad (prepare/post)
        self.params_have_scaled_gradients = False
        self.skip_next_step = False
        self.first_scale_loss_done = False
        self.param_to_master = {}


def _all_params(opt):
    return [p for g in opt.param_groups for p in g["params"]]


def _make_masters(opt, stash, params_in_group=None):
    """Replace each trainable low-precision param in the optimizer by an fp32 master (in place)."""
    groups = opt.param_groups if params_in_group is None else [params_in_group]
    for group in groups:
        for i, p in enumerate(group["params"]):
            if not p.requires_grad:
                continue
            if p.dtype in (torch.float16, torch.bfloat16):
                master = p.detach().clone().float()
                master.requires_grad = True
                group["params"][i] = master
                stash.model_params.append(p)
                stash.masters.append(master)
                stash.param_to_master[p] = master
                if p in opt.state:
                    opt.state[master] = opt.state.pop(p)
            elif p.dtype == torch.float32:
                stash.self_master.append(p)
            else:
                raise TypeError(f"amp: optimizer param of type {p.type()} is neither float16, bfloat16 "
                                "nor float32; master weights cannot be created for it")


def _process_optimizer(opt, properties):
    if hasattr(opt, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    stash = opt._amp_stash = _OptimizerStash()
    stash.master_weights = bool(properties.master_weights)
    if stash.master_weights:
        _make_masters(opt, stash)
        for p in stash.self_master + stash.masters:
            p.grad = None
        opt.load_state_dict(opt.state_dict())  # recast existing state onto the fp32 masters
    else:
        for p in _all_params(opt):
            if p.is_floating_point():
                stash.self_master.append(p)
            else:
                raise TypeError(f"amp: optimizer param of type {p.type()} is not floating point")

    orig_step = opt.step
    orig_add_param_group = opt.add_param_group

    def step(self, closure=None):
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        st = self._amp_stash
        if st.skip_next_step:
            st.skip_next_step = False
            if st.master_weights:
                for m in st.masters:
                    m.grad = None
            if hasattr(self, "_synchronized"):  # a Horovod optimizer whose sync was consumed
                self._synchronized = False
            return None
        out = orig_step()
        if st.master_weights:
            with torch.no_grad():
                if st.model_params:
                    torch._foreach_copy_(st.model_params, st.masters)
            for m in st.masters:
                m.grad = None
        return out

    def zero_grad(self, set_to_none=False):
        in_flight = getattr(self, "_in_flight", None)
        if (callable(in_flight) and in_flight()) or getattr(self, "_handles", None):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); this would drop gradients "
                                 "being reduced. Call synchronize()/step() first.")
        st = self._amp_stash
        for p in st.model_params + st.self_master:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_()
                    p.grad.zero_()
        for m in st.masters:
            m.grad = None
        st.stash.clear()

    def add_param_group(self, param_group):
        orig_add_param_group(param_group)
        st = self._amp_stash
        group = self.param_groups[-1]
        if st.master_weights:
            _make_masters(self, st, group)
        else:
            st.self_master.extend(p for p in group["params"] if p.is_floating_point())

    opt.step = types.MethodType(step, opt)
    if stash.master_weights:
        opt.zero_grad = types.MethodType(zero_grad, opt)
    opt.add_param_group = types.MethodType(add_param_group, opt)
    return opt


# ---------------------------------------------------------------------------------------------
# initialize

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

def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None, loss_scale=None,
               cast_model_outputs=None, num_losses=1, verbosity=1, min_loss_scale=None,
               max_loss_scale=2. ** 24):
    """apex.amp.initialize: returns the (mutated) model(s) and optimizer(s) with the input's list-ness."""
    _amp_state.opt_properties = Properties()
    _amp_state.verbosity = verbosity
    _amp_state.backend = None
    if not enabled:
        return models if optimizers is None else (models, optimizers)

    apex_amp = _select_backend()
    if apex_amp is not None:
        _amp_state.backend = apex_amp
        return apex_amp.initialize(
            models, optimizers, enabled=enabled, opt_level=opt_level, cast_model_type=cast_model_type,
            patch_torch_functions=patch_torch_functions, keep_batchnorm_fp32=keep_batchnorm_fp32,
            master_weights=master_weights, loss_scale=loss_scale, cast_model_outputs=cast_model_outputs,
            num_losses=num_losses, verbosity=verbosity, min_loss_scale=min_loss_scale,
            max_loss_scale=max_loss_scale)

    if opt_level not in opt_levels:
        raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', 'O2', 'O3'. "
                           "Note that in `O0`, `O1`, etc., the prefix O is the letter O, not the number zero.")
    props = opt_levels[opt_level](_amp_state.opt_properties)
    _maybe_log("Selected optimization level %s; defaults: %s", opt_level, dict(props.options))
    _amp_state.min_loss_scale = min_loss_scale
    _amp_state.max_loss_scale = max_loss_scale
    if cast_model_type is not None:
        props.cast_model_type = cast_model_type
    if patch_torch_functions is not None:
        props.patch_torch_functions = patch_torch_functions
    if keep_batchnorm_fp32 is not None:
        props.keep_batchnorm_fp32 = keep_batchnorm_fp32
    if master_weights is not None:
        props.master_weights = master_weights
    if loss_scale is not None:
        props.loss_scale = loss_scale
    elif props.cast_model_type is torch.bfloat16:
        props.loss_scale = 1.0  # bf16 has fp32's exponent range: no loss scaling (documented above)
    _maybe_log("Processing user overrides; final options: %s", dict(props.options))

    # -- inputs ---------------------------------------------------------------------------------
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

    # -- models ---------------------------------------------------------------------------------
    cast_type = props.cast_model_type
    for model in model_list:
        if cast_type:
            if props.keep_batchnorm_fp32:
                _convert_network(model, cast_type)
            else:
                model.to(cast_type)
            _warn_cpu_fp16(model, cast_type)
            _patch_forward(model, cast_type, cast_model_outputs or torch.float32)
        elif props.patch_torch_functions:  # O1: per-op mixed precision
            _warn_cpu_fp16(model, torch.float16)
            _patch_forward(model, None, cast_model_outputs, autocast_dtype=torch.float16)
        elif cast_model_outputs is not None:
            _patch_forward(model, None, cast_model_outputs)
    if cast_type and not props.master_weights:
        for o in opt_list:
            o.load_state_dict(o.state_dict())  # recast existing state to the params' new dtype

    # -- optimizers -----------------------------------------------------------------------------
    param_to_master = {}
    for o in opt_list:
        _process_optimizer(o, props)
        param_to_master.update(o._amp_stash.param_to_master)
    if cast_type and cast_type is not torch.float32:
        for model in model_list:
            _register_fp32_state_dict_hooks(model, cast_type, param_to_master)

    _amp_state.loss_scalers = [LossScaler(props.loss_scale, min_loss_scale=min_loss_scale,
                                          max_loss_scale=max_loss_scale) for _ in range(num_losses)]

    out_models = model_list if models_was_list else model_list[0]
    if optimizers is None:
        return out_models
    return out_models, (opt_list if optimizers_was_list else opt_list[0])


# ---------------------------------------------------------------------------------------------
# scale_loss
def _require_stash(opt):
    st = getattr(opt, "_amp_stash", None)
    if st is None:
        raise RuntimeError(f"amp.scale_loss: optimizer {type(opt).__name__} was not passed through "
                           "amp.initialize; pass every optimizer to amp.initialize first.")
    return st


def _resync_masters_once(st):
    """Pick up writes to model params made between initialize and the first scale_loss."""
    st.first_scale_loss_done = True
    with torch.no_grad():
        for p, m in zip(st.model_params, st.masters):
            if not torch.equal(p, m.to(p.dtype)):
                m.copy_(p)


def _prepare(st):
    if st.master_weights:
        for p in st.model_params:
            p.grad = None
    for p in st.self_master:
        if p.grad is not None:
            st.stash[p] = p.grad
            p.grad = None


def _post(st, scale, found_inf, check):
    """Unscale the new grads into the masters (adding stashed/earlier grads); flag non-finite values."""
    inv = 1. / scale
    fresh, targets = [], []
    for p, m in zip(st.model_params, st.masters):
        if p.grad is not None:
            fresh.append(p.grad.detach().float())  # fp32 copy, unscaled below
            targets.append(m)
    for p in st.self_master:
        if p.grad is not None:
            fresh.append(p.grad)
            targets.append(None)
    if fresh:
        by_dev = {}
        for t in fresh:
            by_dev.setdefault((t.device, t.dtype), []).append(t)
        for (dev, _), ts in by_dev.items():
            if check:
                flag = found_inf.setdefault(dev, torch.zeros(1, device=dev))
                torch._amp_foreach_non_finite_check_and_unscale_(ts, flag, torch.full((1,), inv, device=dev))
            elif inv != 1.:
                torch._foreach_mul_(ts, inv)
    with torch.no_grad():
        for g, m in zip(fresh, targets):
            if m is None:
                continue
            if m.grad is None:
                m.grad = g
            else:
                m.grad.add_(g)
        for p in st.self_master:
            s = st.stash.pop(p, None)
            if s is None:
                continue
            if p.grad is None:
                p.grad = s
            else:
                p.grad.add_(s)
    st.stash.clear()


def _active_collective():
    """A function all-reducing (sum) a flag tensor across ranks, or None when single-process."""
    if os.environ.get("AMP_SYNC_OVERFLOW", "1") == "0":
        return None
    hvd = sys.modules.get("src.compat.hvd")
    if hvd is not None and getattr(hvd, "is_initialized", lambda: False)():
        if hvd.size() > 1:
            return lambda t: hvd.allreduce(t, op=hvd.Sum, name="amp.overflow")
        return None
    hh = sys.modules.get("horovod.torch")
    if hh is not None:
        try:
            if hh.size() > 1:
                return lambda t: hh.allreduce(t, op=hh.Sum, name="amp.overflow")
            return None
        except Exception:  # not initialised
            pass
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        def reduce(t):
            dev = "cuda" if dist.get_backend() == "nccl" else "cpu"
            buf = t.to(dev)
            dist.all_reduce(buf)
            return buf
        return reduce
    return None


def _any_overflow(found_inf):
    total = None
    for t in found_inf.values():
        total = t.cpu() if total is None else total + t.cpu()
    reduce = _active_collective()
    if reduce is not None:  # every rank must take part, overflowed or not
        local = total if total is not None else torch.zeros(1)
        total = reduce(local)
    return total is not None and float(total.sum()) > 0


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False, delay_overflow_check=False):
    """Yield ``loss.float() * scale``; on exit unscale the grads into the optimizer's masters.

    ``delay_unscale=True`` leaves the grads scaled (for gradient accumulation; only on micro-batches
    before the last one, with no ``step()`` in between). An overflow makes the next ``step()`` a no-op.
    """
    if _amp_state.opt_properties is None:
        raise RuntimeError("Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized. "
                           "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be "
                           "called before `with amp.scale_loss`.")
    if _amp_state.backend is not None:
        with _amp_state.backend.scale_loss(loss, optimizers, loss_id=loss_id, model=model,
                                           delay_unscale=delay_unscale,
                                           delay_overflow_check=delay_overflow_check) as s:
            yield s
        return
    if not _amp_state.opt_properties.enabled:
        yield loss
        return
    opts = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    stashes = [_require_stash(o) for o in opts]
    if not 0 <= loss_id < len(_amp_state.loss_scalers):
        raise ValueError(f"amp.scale_loss: loss_id={loss_id} but amp.initialize(num_losses="
                         f"{len(_amp_state.loss_scalers)}); pass num_losses > loss_id to initialize")
    scaler = _amp_state.loss_scalers[loss_id]
    S = scaler.loss_scale()
    if not _amp_state.opt_properties.master_weights and not scaler.dynamic and S == 1.0:
        yield loss.float()
        return
    for st in stashes:
        if st.master_weights and not st.first_scale_loss_done:
            _resync_masters_once(st)
    if not delay_unscale:
        for st in stashes:
            if not st.params_have_scaled_gradients:
                _prepare(st)
    yield loss.float() * S

    if delay_unscale:
        for st in stashes:
            st.params_have_scaled_gradients = True
        return
    scaler.clear_overflow_state()
    found_inf = {}
    for st in stashes:
        _post(st, S, found_inf, check=scaler.dynamic)
        st.params_have_scaled_gradients = False
    if scaler.dynamic:
        scaler._has_overflow = _any_overflow(found_inf)
    should_skip = False if delay_overflow_check else scaler.update_scale()
    if should_skip:
        _maybe_log("Gradient overflow.  Skipping step, loss scaler %d reducing loss scale to %s",
                   loss_id, scaler.loss_scale())
        for st in stashes:
            if not st.skip_next_step:
                st.skip_next_step = True
                _amp_state.skipped_steps += 1


# ---------------------------------------------------------------------------------------------
# master params and state dict
def master_params(optimizer):
    """Every param the optimizer updates (the fp32 masters under O2); clip these after scale_loss."""
    if _amp_state.backend is not None:
        yield from _amp_state.backend.master_params(optimizer)
        return
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination=None):
    """``{'loss_scaler0': {'loss_scale': float, 'unskipped': int}, ...}``."""
    if _amp_state.backend is not None:
        return _amp_state.backend.state_dict(destination)
    if _amp_state.loss_scalers is None:
        raise AttributeError("amp.state_dict(): amp has no loss scalers; call amp.initialize(..., "
                             "enabled=True) first")
    if destination is None:
        destination = OrderedDict()
    for idx, s in enumerate(_amp_state.loss_scalers):
        destination[f"loss_scaler{idx}"] = {"loss_scale": s.loss_scale(), "unskipped": s._unskipped}
    return destination


def load_state_dict(state_dict):
    """Load scalers from ``amp.state_dict()`` output, in key order (apex semantics)."""
    if _amp_state.backend is not None:
        return _amp_state.backend.load_state_dict(state_dict)
    if _amp_state.loss_scalers is None:
        raise AttributeError("amp.load_state_dict(): call amp.initialize(..., enabled=True) first")
    scalers = _amp_state.loss_scalers
    if len(state_dict) != len(scalers):
        logger.warning("amp.load_state_dict: state_dict contains %d entries, while %d loss_scalers are "
                       "used", len(state_dict), len(scalers))
    unexpected = []
    idx = 0
    for key in state_dict:
        if "loss_scaler" not in key:
            unexpected.append(key)
            continue
        if idx > len(scalers) - 1:
            logger.warning("Skipping loss_scaler[%d], since num_losses was set to %d", idx, len(scalers))
            break
        scalers[idx]._loss_scale = state_dict[key]["loss_scale"]
        scalers[idx]._unskipped = state_dict[key]["unskipped"]
        idx += 1
    if unexpected:
        raise RuntimeError("Error(s) in loading state_dict. Unexpected key(s) in state_dict: "
                           + ", ".join(f'"{k}"' for k in unexpected) + ". ")
