"""Optimizer processing: fp32 master weights swapped into the optimizer (O2), the patched ``step``
(copies masters back to the model), ``zero_grad`` and ``add_param_group``, the one-shot skipping
``step`` installed after an overflow, and the lazy model -> master synchronisation.

Masters are created as objects in ``initialize`` (so optimizer state loaded afterwards lands on fp32
tensors), but their *values* follow apex's lazy rule: at the first ``zero_grad()``, ``step()``,
``scale_loss`` or ``add_param_group`` after ``initialize`` (apex's ``lazy_init_with_master_weights``)
they are taken from the model as it is then. Until that point model and masters are compared with a
snapshot of the model taken at ``initialize``: a model param written since (``load``, a broadcast of
``named_parameters()``) is copied into its master, and a master written since (a broadcast into
``model.state_dict()``, whose entries are the masters themselves) is copied into the model; when both
were written and disagree, the model wins, as in apex. The per-optimizer bookkeeping lives in
``optimizer._amp_stash``.
"""
from __future__ import annotations

import types

import torch

from clipbert_legacy.compat.amp._casts import disable_casts
from clipbert_legacy.compat.amp._state import log_overflow

_MISSING = object()


class _OptimizerStash:
    def __init__(self) -> None:
        self.master_weights = False
        self.model_params = []          # fp16/bf16 model params that have a master
        self.masters = []               # their fp32 masters (same order)
        self.self_master = []           # params that are their own master (fp32, or any dtype w/o masters)
        self.stash = {}                 # param -> stashed grad (prepare/post)
        self.params_have_scaled_gradients = False
        self.skip_armed = False         # a one-shot skipping step() is installed
        self.synced = False             # apex's lazy_init_called: masters taken from the model
        self.snapshots = []             # model_params as they were at initialize (until synced)
        self.param_to_master = {}


def _all_params(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
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
                if not stash.synced:
                    stash.snapshots.append(p.detach().clone())
                if p in opt.state:
                    opt.state[master] = opt.state.pop(p)
            elif p.dtype == torch.float32:
                stash.self_master.append(p)
            else:
                raise TypeError(f"amp: optimizer param of type {p.type()} is neither float16, bfloat16 "
                                "nor float32; master weights cannot be created for it")


def reconcile_masters(st: _OptimizerStash, final: bool = True) -> None:
    """Bring model params and masters together after writes since ``initialize`` (module docstring).

    ``final`` (apex's lazy-init point) ends the tracking; a non-final call (``model.state_dict()``
    before that point) keeps tracking from the current values.
    """
    if st.synced:
        return
    with torch.no_grad():
        for p, m, s in zip(st.model_params, st.masters, st.snapshots):
            if not torch.equal(p, s):                  # the model was written
                if not torch.equal(m.to(p.dtype), p):  # ... and the master does not hold it: apex's copy
                    m.copy_(p)
            elif not torch.equal(m, s.to(m.dtype)):    # only the master was written
                p.copy_(m)
            if not final:
                s.copy_(p)
    if final:
        st.snapshots = []
        st.synced = True


def _master_step(orig_step):
    """``step`` with masters: sync lazily, step the masters, copy them into the model."""
    def step(self, closure=None):
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        st = self._amp_stash
        reconcile_masters(st)
        out = orig_step()
        with torch.no_grad():
            if st.model_params:
                torch._foreach_copy_(st.model_params, st.masters)
        for m in st.masters:
            m.grad = None
        return out
    return step


def _uncast_step(orig_step):
    """O1 ``step``: the optimizer's own step (any arguments, closures too) with O1's casts off."""
    def step(_self, *args, **kwargs):  # bound to the optimizer, whose own step is orig_step
        with disable_casts():
            return orig_step(*args, **kwargs)
    return step


def arm_skip(opt: torch.optim.Optimizer, loss_id: int, scaler) -> bool:
    """After an overflow: the next ``step()`` only logs apex's message, clears the master grads and puts
    the previous ``step`` back. Returns False when a skip was already armed (several overflows before
    one step skip once)."""
    st = opt._amp_stash
    if st.skip_armed:
        return False
    previous = opt.__dict__.get("step", _MISSING)

    def skip_step(self, closure=None):
        if closure is not None:
            raise RuntimeError("Currently, Amp does not support closure use with optimizers.")
        log_overflow(loss_id, scaler.loss_scale())
        for m in st.masters:
            m.grad = None
        if hasattr(self, "_synchronized"):  # a Horovod optimizer whose sync was consumed
            self._synchronized = False
        if previous is _MISSING:
            del self.step
        else:
            self.step = previous
        st.skip_armed = False
        return None

    opt.step = types.MethodType(skip_step, opt)
    st.skip_armed = True
    return True


def _zero_grad(self, set_to_none=False):
    """O2 ``zero_grad``: model grads zeroed (or None), master grads None; keeps Horovod's guard."""
    in_flight = getattr(self, "_in_flight", None)
    if (callable(in_flight) and in_flight()) or getattr(self, "_handles", None):
        raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                             "optimizer.step() or optimizer.synchronize(); this would drop gradients "
                             "being reduced. Call synchronize()/step() first.")
    st = self._amp_stash
    reconcile_masters(st)
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


def _make_add_param_group(orig_add_param_group):
    """``add_param_group`` that gives the new group's params masters (or registers them as their own)."""
    def add_param_group(self, param_group):
        st = self._amp_stash
        if st.master_weights:
            reconcile_masters(st)  # apex ran its lazy init first
        orig_add_param_group(param_group)
        group = self.param_groups[-1]
        if st.master_weights:
            _make_masters(self, st, group)
        else:
            st.self_master.extend(p for p in group["params"] if p.is_floating_point())
    return add_param_group


def _collect_params(opt, stash):
    """Fill the stash: fp32 masters for low-precision params (O2), else every param is its own master."""
    if stash.master_weights:
        _make_masters(opt, stash)
        for p in stash.self_master + stash.masters:
            p.grad = None
        opt.load_state_dict(opt.state_dict())  # recast existing state onto the fp32 masters
        return
    stash.synced = True  # nothing to synchronise without masters
    for p in _all_params(opt):
        if p.is_floating_point():
            stash.self_master.append(p)
        else:
            raise TypeError(f"amp: optimizer param of type {p.type()} is not floating point")


def _process_optimizer(opt: torch.optim.Optimizer, properties) -> torch.optim.Optimizer:
    """Attach ``opt._amp_stash``, create masters if ``properties.master_weights``, patch the methods.

    ``step`` is patched only where master weights exist (and, at O1, to run without casts), as apex
    did: elsewhere ``step(closure)`` reaches the optimizer unchanged.
    """
    if hasattr(opt, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    stash = opt._amp_stash = _OptimizerStash()
    stash.master_weights = bool(properties.master_weights)
    _collect_params(opt, stash)
    orig_add_param_group = opt.add_param_group
    if stash.master_weights:
        opt.step = types.MethodType(_master_step(opt.step), opt)
        opt.zero_grad = types.MethodType(_zero_grad, opt)
    elif properties.patch_torch_functions:
        opt.step = types.MethodType(_uncast_step(opt.step), opt)
    opt.add_param_group = types.MethodType(_make_add_param_group(orig_add_param_group), opt)
    return opt
