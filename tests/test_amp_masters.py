"""clipbert_legacy.compat.amp optimizer processing: fp32 master weights (O2, bf16), unscaled master grads, the
patched zero_grad / add_param_group, and writes made before the first scale_loss."""
import copy

import pytest
import torch
from torch import nn

from clipbert_legacy.compat import amp
from tests.amp_helpers import data, loss_fn, mlp, train_step
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


def test_masters_fp32_equal_param_float_same_slots_frozen_untouched_state_moved():
    m = mlp()
    m[3].bias.requires_grad = False
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    x, y = data()
    loss_fn(m(x), y).backward()
    opt.step()  # optimizer state exists before amp
    opt.zero_grad()
    exp_avg = opt.state[m[0].weight]["exp_avg"].clone()
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    model_params = list(m.parameters())
    masters = list(amp.master_params(opt))
    assert len(masters) == len(model_params)
    for p, mp in zip(model_params, masters):
        if p is m[3].bias:
            assert mp is p and p.dtype == torch.float16 and not p.requires_grad
        elif p.dtype == torch.float16:
            assert mp is not p and mp.dtype == torch.float32 and torch.equal(mp, p.float())
            assert mp.requires_grad and not isinstance(mp, nn.Parameter)
        else:
            assert mp is p  # fp32 BN params are their own master
    assert masters[0] in opt.state and m[0].weight not in opt.state
    assert opt.state[masters[0]]["exp_avg"].dtype == torch.float32
    assert torch.equal(opt.state[masters[0]]["exp_avg"], exp_avg)  # no fp16 round trip of state


def test_master_grad_unscaled_matches_fp32_reference_and_model_grad_stays_scaled():
    m = mlp()
    ref = copy.deepcopy(m)
    with torch.no_grad():  # the reference sees the same fp16-rounded weights
        for name, p in ref.named_parameters():
            if not name.startswith("1."):
                p.copy_(p.half().float())
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    x, y = data()
    train_step(m, opt, x, y)
    loss_fn(ref(x.half().float()), y).backward()
    S = amp.state_dict()["loss_scaler0"]["loss_scale"]
    assert S == 2. ** 16
    for p, mp, rp in zip(m.parameters(), amp.master_params(opt), ref.parameters()):
        assert mp.grad.dtype == torch.float32
        assert torch.allclose(mp.grad, rp.grad, rtol=2e-2, atol=2e-3)
        if p.dtype == torch.float16:
            assert torch.allclose(p.grad.float() / S, mp.grad, rtol=1e-6, atol=0)
    opt.step()
    for p, mp in zip(m.parameters(), amp.master_params(opt)):
        assert torch.equal(p, mp.to(p.dtype))
        if p.dtype == torch.float16:
            assert mp.grad is None  # fp32 self-master (BN) grads stay until zero_grad, as apex


def test_o2_zero_grad_and_add_param_group():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    x, y = data()
    train_step(m, opt, x, y)
    opt.zero_grad()
    assert all(p.grad is not None and not p.grad.any() for p in m.parameters())
    assert all(mp.grad is None for mp in opt._amp_stash.masters)
    opt.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in m.parameters())
    extra = nn.Linear(2, 2)
    amp._convert_module(extra, torch.float16)
    opt.add_param_group({"params": list(extra.parameters()), "lr": 0.5})
    new = opt.param_groups[-1]["params"]
    assert [p.dtype for p in new] == [torch.float32, torch.float32]
    assert torch.equal(new[0], extra.weight.float()) and new[0] is not extra.weight
    out = m(x)
    with amp.scale_loss(loss_fn(out, y) + extra(out.half()).float().mean(), opt) as s:
        s.backward()
    assert new[0].grad is not None
    w = extra.weight.clone()
    opt.step()
    assert not torch.equal(extra.weight, w) and torch.equal(extra.weight, new[0].half())


def test_bf16_o2_masters_and_static_unit_scale():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", cast_model_type=torch.bfloat16, verbosity=0)
    assert m[0].weight.dtype == torch.bfloat16 and m[1].weight.dtype == torch.float32
    sc = amp._amp_state.loss_scalers[0]
    assert not sc.dynamic and sc.loss_scale() == 1.0
    x, y = data()
    w = list(amp.master_params(opt))[0].clone()
    train_step(m, opt, x, y)
    assert list(amp.master_params(opt))[0].grad.dtype == torch.float32
    opt.step()
    assert not torch.equal(w, list(amp.master_params(opt))[0])
    assert torch.equal(m[0].weight, list(amp.master_params(opt))[0].bfloat16())
    assert m.state_dict()["0.weight"].dtype == torch.float32


def test_lr_scheduler_and_broadcast_before_first_scale_loss_reach_masters():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    with torch.no_grad():  # e.g. hvd.broadcast_parameters(model.named_parameters()) after initialize
        m[0].weight.fill_(0.25)
    x, y = data()
    train_step(m, opt, x, y)
    mp0 = list(amp.master_params(opt))[0]
    g = mp0.grad.clone()
    opt.step()
    sched.step()
    assert torch.allclose(mp0, 0.25 - 0.1 * g) and opt.param_groups[0]["lr"] == 0.05
