"""``scale_loss``: scale the loss, then unscale the new gradients into the fp32 masters, check them
for inf/NaN and update the loss scaler (or leave them scaled while ``delay_unscale``)."""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Union

import torch

from clipbert_legacy.compat.amp._o1 import clear_cache
from clipbert_legacy.compat.amp._optimizer import _OptimizerStash, arm_skip, reconcile_masters
from clipbert_legacy.compat.amp._overflow import _any_overflow
from clipbert_legacy.compat.amp._scaler import LossScaler
from clipbert_legacy.compat.amp._state import LossIdError, OptimizerNotInitializedError, _amp_state

Optimizers = Union[torch.optim.Optimizer, Iterable[torch.optim.Optimizer]]


def _require_stash(opt: torch.optim.Optimizer) -> _OptimizerStash:
    st = getattr(opt, "_amp_stash", None)
    if st is None:
        raise OptimizerNotInitializedError(
            f"amp.scale_loss: optimizer {type(opt).__name__} was not passed through amp.initialize; pass "
            "every optimizer to amp.initialize first.")
    return st


def _prepare(st):
    """Before a non-delayed backward: clear model grads (O2) and set aside accumulated fp32 grads."""
    if st.master_weights:
        for p in st.model_params:
            p.grad = None
    for p in st.self_master:
        if p.grad is not None:
            st.stash[p] = p.grad
            p.grad = None


def _unscale_(fresh, inv, found_inf, check):
    """Multiply the grads by ``inv`` in place, per device and dtype; flag non-finite ones if ``check``."""
    by_dev = {}
    for t in fresh:
        by_dev.setdefault((t.device, t.dtype), []).append(t)
    for (dev, _), ts in by_dev.items():
        if check:
            flag = found_inf.setdefault(dev, torch.zeros(1, device=dev))
            torch._amp_foreach_non_finite_check_and_unscale_(ts, flag, torch.full((1,), inv, device=dev))
        elif inv != 1.:
            torch._foreach_mul_(ts, inv)


def _accumulate(st, fresh, targets):
    """Add the unscaled grads to the masters' grads, and the stashed grads back onto fp32 params."""
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
        _unscale_(fresh, inv, found_inf, check)
    _accumulate(st, fresh, targets)


def _scaler_for(loss_id: int) -> LossScaler:
    """apex indexed its list of scalers (a negative id counts from the end, as a list index does)."""
    try:
        return _amp_state.loss_scalers[loss_id]
    except IndexError:
        n = len(_amp_state.loss_scalers)
        raise LossIdError(f"amp.scale_loss: loss_id={loss_id} but amp.initialize(num_losses={n}); pass "
                          "num_losses > loss_id to initialize") from None


def _finish(opts, stashes, scaler, scale, loss_id, delay_overflow_check):
    """After a non-delayed backward: unscale, agree on overflow, update the scale, arm the skip."""
    scaler.clear_overflow_state()
    found_inf = {}
    for st in stashes:
        _post(st, scale, found_inf, check=scaler.dynamic)
        st.params_have_scaled_gradients = False
    if scaler.dynamic:
        scaler._has_overflow = _any_overflow(found_inf)
    should_skip = False if delay_overflow_check else scaler.update_scale()
    if should_skip:  # the next step() of each optimizer is skipped (and logs apex's message)
        for o in opts:
            if arm_skip(o, loss_id, scaler):
                _amp_state.skipped_steps += 1


def _native_scale_loss(loss, optimizers, loss_id, delay_unscale, delay_overflow_check):
    """The generator behind ``scale_loss`` once amp is initialised and enabled natively."""
    opts = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    stashes = [_require_stash(o) for o in opts]
    scaler = _scaler_for(loss_id)
    scale = scaler.loss_scale()
    if not _amp_state.opt_properties.master_weights and not scaler.dynamic and scale == 1.0:
        yield loss.float()
        return
    for st in stashes:
        reconcile_masters(st)  # apex's lazy init (no-op once done, and without masters)
    if not delay_unscale:
        for st in stashes:
            if not st.params_have_scaled_gradients:
                _prepare(st)
    yield loss.float() * scale

    if delay_unscale:
        for st in stashes:
            st.params_have_scaled_gradients = True
        return
    _finish(opts, stashes, scaler, scale, loss_id, delay_overflow_check)


def _apex_armed(opts: list) -> list[bool]:
    """Which optimizers have apex's one-shot skipping ``step`` armed (``_amp_stash.already_patched``)."""
    return [bool(getattr(getattr(o, "_amp_stash", None), "already_patched", False)) for o in opts]


def _apex_scale_loss(loss, optimizers, loss_id, model, delay_unscale, delay_overflow_check):
    """Delegate to apex's ``scale_loss``, counting the skips it arms: apex keeps no count, and
    ``num_skipped_steps()`` (the engine's skipped flag and total) must not read 0 under apex."""
    opts = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    before = _apex_armed(opts)
    with _amp_state.backend.scale_loss(loss, optimizers, loss_id=loss_id, model=model,
                                       delay_unscale=delay_unscale,
                                       delay_overflow_check=delay_overflow_check) as s:
        yield s
    _amp_state.skipped_steps += sum(a and not b for a, b in zip(_apex_armed(opts), before))


@contextlib.contextmanager
def scale_loss(loss: torch.Tensor, optimizers: Optimizers, loss_id: int = 0,
               model: torch.nn.Module | None = None, delay_unscale: bool = False,
               delay_overflow_check: bool = False) -> Iterator[torch.Tensor]:
    """Yield ``loss.float() * scale``; on exit unscale the grads into the optimizer's masters.

    ``delay_unscale=True`` leaves the grads scaled (for gradient accumulation; only on micro-batches
    before the last one, with no ``step()`` in between). An overflow makes the next ``step()`` a no-op.
    ``loss_id`` picks one of the ``num_losses`` scalers; ``model`` is only passed on to apex.
    """
    if _amp_state.opt_properties is None:
        raise RuntimeError("Invoked 'with amp.scale_loss`, but internal Amp state has not been initialized. "
                           "model, optimizer = amp.initialize(model, optimizer, opt_level=...) must be "
                           "called before `with amp.scale_loss`.")
    if _amp_state.backend is not None:
        yield from _apex_scale_loss(loss, optimizers, loss_id, model, delay_unscale, delay_overflow_check)
        return
    if not _amp_state.opt_properties.enabled:
        yield loss
        return
    try:
        yield from _native_scale_loss(loss, optimizers, loss_id, delay_unscale, delay_overflow_check)
    finally:
        clear_cache()  # O1: weight casts are redone after every exit, as apex
