"""Optimizer processing: fp32 master weights swapped into the optimizer (O2), and the patched
``step`` (skips after an overflow, copies masters back to the model), ``zero_grad`` and
``add_param_group``. The per-optimizer bookkeeping lives in ``optimizer._amp_stash``."""
from __future__ import annotations

import types

import torch


class _OptimizerStash:
    def __init__(self) -> None:
        self.master_weights = False
        self.model_params = []          # fp16/bf16 model params that have a master
        self.masters = []               # their fp32 masters (same order)
        self.self_master = []           # params that are their own master (fp32, or any dtype w/o masters)
        self.stash = {}                 # param -> stashed grad (prepare/post)
        self.params_have_scaled_gradients = False
        self.skip_next_step = False
        self.first_scale_loss_done = False
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
                if p in opt.state:
                    opt.state[master] = opt.state.pop(p)
            elif p.dtype == torch.float32:
                stash.self_master.append(p)
            else:
                raise TypeError(f"amp: optimizer param of type {p.type()} is neither float16, bfloat16 "
                                "nor float32; master weights cannot be created for it")


def _make_step(orig_step):
    """``step`` that is a no-op after an overflow, else steps and copies the masters into the model."""
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
    return step


def _zero_grad(self, set_to_none=False):
    """O2 ``zero_grad``: model grads zeroed (or None), master grads None; keeps Horovod's guard."""
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


def _make_add_param_group(orig_add_param_group):
    """``add_param_group`` that gives the new group's params masters (or registers them as their own)."""
    def add_param_group(self, param_group):
        orig_add_param_group(param_group)
        st = self._amp_stash
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
    for p in _all_params(opt):
        if p.is_floating_point():
            stash.self_master.append(p)
        else:
            raise TypeError(f"amp: optimizer param of type {p.type()} is not floating point")


def _process_optimizer(opt: torch.optim.Optimizer, properties) -> torch.optim.Optimizer:
    """Attach ``opt._amp_stash``, create masters if ``properties.master_weights``, patch the methods."""
    if hasattr(opt, "_amp_stash"):
        raise RuntimeError("A given optimizer should only be passed through amp.initialize once.")
    stash = opt._amp_stash = _OptimizerStash()
    stash.master_weights = bool(properties.master_weights)
    _collect_params(opt, stash)
    orig_step = opt.step
    orig_add_param_group = opt.add_param_group
    opt.step = types.MethodType(_make_step(orig_step), opt)
    if stash.master_weights:
        opt.zero_grad = types.MethodType(_zero_grad, opt)
    opt.add_param_group = types.MethodType(_make_add_param_group(orig_add_param_group), opt)
    return opt
