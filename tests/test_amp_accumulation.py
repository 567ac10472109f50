"""clipbert_legacy.compat.amp gradient accumulation with delay_unscale: same result as unscaling every
micro-batch and as one big batch, and the first accumulation cycle keeps the fp32 (BatchNorm) grads."""
import copy

import pytest
import torch

from clipbert_legacy.compat import amp
from tests.amp_helpers import data, loss_fn, mlp, same_snapshot, snapshot
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


def accumulate(level, k, delayed, x, y, steps=2, bn=True, **kw):
    """Master weights after `steps` optimizer steps of k micro-batches (loss / k) each."""
    torch.manual_seed(0)
    m = mlp(bn=bn)
    opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
    m, opt = amp.initialize(m, opt, opt_level=level, verbosity=0, **kw)
    n = x.shape[0] // k
    for _ in range(steps):
        for i in range(k):
            xb, yb = x[i * n:(i + 1) * n], y[i * n:(i + 1) * n]
            with amp.scale_loss(loss_fn(m(xb), yb) / k, opt, delay_unscale=delayed and i < k - 1) as s:
                s.backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().float().clone() for p in amp.master_params(opt)]


@pytest.mark.parametrize("level,tol", [("O0", 1e-6), ("O2", 2e-2)])
def test_delay_unscale_equals_non_delayed_accumulation(level, tol):
    x, y = data(n=24)
    kw = {"loss_scale": "dynamic"} if level == "O0" else {}
    delayed = accumulate(level, 3, True, x, y, **kw)
    amp._amp_state.__init__()
    stepwise = accumulate(level, 3, False, x, y, **kw)
    for a, b in zip(delayed, stepwise):
        assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max()


@pytest.mark.parametrize("level,tol", [("O0", 1e-6), ("O2", 2e-2)])
def test_delay_unscale_k_micro_batches_equals_one_k_times_batch(level, tol):
    x, y = data(n=24)
    kw = {"loss_scale": "dynamic"} if level == "O0" else {}
    micro = accumulate(level, 3, True, x, y, bn=False, **kw)
    amp._amp_state.__init__()
    big = accumulate(level, 1, True, x, y, bn=False, **kw)
    for a, b in zip(micro, big):
        assert torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max()


def test_first_accumulation_cycle_keeps_bn_grads_and_pre_training_step_is_noop():
    x, y = data(n=16)
    torch.manual_seed(0)
    m = mlp()
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    before = snapshot(m, opt)
    opt.zero_grad()  # ClipBERT's "quick hack for amp delay_unscale bug": harmless here
    opt.step()
    assert same_snapshot(before, snapshot(m, opt)) and len(opt.state) == 0
    for i in range(2):
        with amp.scale_loss(loss_fn(m(x[i * 8:(i + 1) * 8]), y[i * 8:(i + 1) * 8]) / 2, opt,
                            delay_unscale=i == 0) as s:
            s.backward()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if not name.startswith("1."):
                p.copy_(p.half().float())
    for i in range(2):
        (loss_fn(ref(x[i * 8:(i + 1) * 8].half().float()), y[i * 8:(i + 1) * 8]) / 2).backward()
    assert torch.allclose(m[1].weight.grad, ref[1].weight.grad, rtol=2e-2, atol=2e-3)
    assert torch.allclose(m[1].bias.grad, ref[1].bias.grad, rtol=2e-2, atol=2e-3)
