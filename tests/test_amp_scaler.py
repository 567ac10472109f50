"""clipbert_legacy.compat.amp loss scaling: overflow skips one step and halves the dynamic scale, the scaler's
window/caps/floor, static scales (never skip), and several losses with their own scalers."""
import copy
import logging

import pytest
import torch

from clipbert_legacy.compat import amp
from tests.amp_helpers import INF, data, inject_inf, loss_fn, mlp, same_snapshot, snapshot, train_step
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


def test_injected_inf_skips_exactly_one_step_and_halves_scale():
    m = mlp()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    x, y = data()
    train_step(m, opt, x, y)
    opt.step()
    opt.zero_grad()
    before = snapshot(m, opt)
    masters_before = [p.clone() for p in amp.master_params(opt)]
    inject_inf(m, opt, x, y)
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 2. ** 15, "unskipped": 0}
    opt.step()
    assert same_snapshot(before, snapshot(m, opt))
    assert all(torch.equal(a, b) for a, b in zip(masters_before, amp.master_params(opt)))
    assert all(p.grad is None for p in opt._amp_stash.masters)
    assert amp.num_skipped_steps() == 1
    opt.zero_grad()
    train_step(m, opt, x, y)
    opt.step()  # the next step is a real one
    assert not same_snapshot(before, snapshot(m, opt))
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 2. ** 15, "unskipped": 1}


def test_two_overflows_before_one_step_quarter_scale_and_skip_once():
    m = mlp(bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    x, y = data()
    before = snapshot(m, opt)
    inject_inf(m, opt, x, y)
    inject_inf(m, opt, x, y, where=2)
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2. ** 14
    opt.step()
    assert same_snapshot(before, snapshot(m, opt))
    opt.zero_grad()
    train_step(m, opt, x, y)
    opt.step()
    assert not same_snapshot(before, snapshot(m, opt))


def test_overflow_without_master_weights_o1_skips():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O1", verbosity=0)
    x, y = data()
    before = snapshot(m, opt)
    inject_inf(m, opt, x, y)
    opt.step()
    assert same_snapshot(before, snapshot(m, opt))
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2. ** 15


def test_loss_scaler_growth_caps_and_floor():
    s = amp.LossScaler("dynamic", scale_window=3)
    assert s.loss_scale() == 2. ** 16
    for _ in range(2):
        assert s.update_scale() is False
    assert s.loss_scale() == 2. ** 16
    s.update_scale()
    assert s.loss_scale() == 2. ** 17 and s._unskipped == 0
    capped = amp.LossScaler("dynamic", scale_window=1, max_loss_scale=2. ** 24)
    for _ in range(20):
        capped.update_scale()
    assert capped.loss_scale() == 2. ** 24
    floor = amp.LossScaler("dynamic", min_loss_scale=2. ** 14)
    for _ in range(5):
        floor._has_overflow = True
        assert floor.update_scale() is True
    assert floor.loss_scale() == 2. ** 14
    assert amp.LossScaler("dynamic", max_loss_scale=2. ** 10).loss_scale() == 2. ** 10
    assert amp.LossScaler("dynamic").loss_scale() == 2. ** 16
    static = amp.LossScaler(128.0)
    static._has_overflow = True
    assert static.update_scale() is False and static.loss_scale() == 128.0 and static._unskipped == 1


def test_initialize_caps_reach_scalers_and_window_doubles_in_training():
    m = mlp(bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    m, opt = amp.initialize(m, opt, opt_level="O2", max_loss_scale=2. ** 12, min_loss_scale=2. ** 11,
                            verbosity=0)
    sc = amp._amp_state.loss_scalers[0]
    assert sc.loss_scale() == 2. ** 12
    sc._scale_seq_len = 2
    x, y = data()
    for _ in range(2):
        inject_inf(m, opt, x, y)
        opt.step()
    assert sc.loss_scale() == 2. ** 11  # floor
    for _ in range(2):
        train_step(m, opt, x, y)
        opt.step()
        opt.zero_grad()
    assert sc.loss_scale() == 2. ** 12  # doubled after the window, capped at max


def test_static_128_unscales_and_never_skips():
    m = mlp(bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", loss_scale=128.0, verbosity=0)
    x, y = data()
    train_step(m, opt, x, y)
    for p, mp in zip(m.parameters(), amp.master_params(opt)):
        assert torch.allclose(p.grad.float() / 128., mp.grad)
    opt.step()
    opt.zero_grad()
    inject_inf(m, opt, x, y)
    opt.step()
    assert not torch.isfinite(m[0].weight).all()  # static scales never skip (apex)
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 128.0, "unskipped": 2}


def test_static_one_without_masters_is_noop():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    ref = copy.deepcopy(m)
    m, opt = amp.initialize(m, opt, opt_level="O0", verbosity=0)
    x, y = data()
    loss = loss_fn(m(x), y)
    with amp.scale_loss(loss, opt) as s:
        assert s is loss
        s.backward()
    loss_fn(ref(x), y).backward()
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(m.parameters(), ref.parameters()))


def test_static_one_with_masters_keeps_accumulated_fp32_grads():
    """apex 20d00ab1 dropped the stashed fp32 (BN) grads here; we keep them."""
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", loss_scale=1.0, verbosity=0)
    x, y = data()
    train_step(m, opt, x, y)
    g1 = m[1].weight.grad.clone()
    train_step(m, opt, x, y)
    assert torch.allclose(m[1].weight.grad, 2 * g1, rtol=1e-3, atol=1e-6)


def test_several_backwards_with_loss_ids_sum_and_inf_in_one_skips():
    m = mlp()
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O1", num_losses=2, verbosity=0)
    amp._amp_state.loss_scalers[1]._loss_scale = 2. ** 10
    x, y = data()
    train_step(m, opt, x, y, loss_id=0)
    train_step(m, opt, x[:8], y[:8], loss_id=1)
    (loss_fn(ref(x), y) + loss_fn(ref(x[:8]), y[:8])).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=2e-2, atol=2e-3)
    before = snapshot(m, opt)
    opt.zero_grad()
    train_step(m, opt, x, y, loss_id=0)
    with amp.scale_loss(loss_fn(m(x), y), opt, loss_id=1) as s:
        s.backward()
        m[0].weight.grad[0, 0] = INF
    opt.step()
    assert same_snapshot(before, snapshot(m, opt))
    sd = amp.state_dict()
    assert sd["loss_scaler0"] == {"loss_scale": 2. ** 16, "unskipped": 2}
    assert sd["loss_scaler1"] == {"loss_scale": 2. ** 9, "unskipped": 0}
    with pytest.raises(IndexError, match="num_losses"):
        with amp.scale_loss(loss_fn(m(x), y), opt, loss_id=2):
            pass


def test_overflow_message_on_every_rank_when_the_step_is_skipped(caplog, monkeypatch):
    """apex.amp.handle.scale_loss installed a skip_step that printed "Gradient overflow.  Skipping step,
    loss scaler {id} reducing loss scale to {scale}" (maybe_print: every rank, verbosity > 0) when the
    skipped step() ran. Here it is a WARNING (shown by logging's defaults) on every rank."""
    monkeypatch.setenv("RANK", "1")  # not rank 0
    monkeypatch.setenv("HOROVOD_RANK", "1")
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=1)
    x, y = data()
    caplog.set_level(logging.WARNING, logger="clipbert_legacy.compat.amp")
    inject_inf(m, opt, x, y)
    inject_inf(m, opt, x, y)
    assert not caplog.records  # printed by the skipped step, with the scale it finds then
    opt.step()
    msgs = [r.getMessage() for r in caplog.records]
    assert msgs == ["Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 16384.0"]
    assert caplog.records[0].levelno == logging.WARNING
    caplog.clear()
    amp._amp_state.verbosity = 0  # apex: verbosity=0 silences it
    inject_inf(m, opt, x, y)
    opt.step()
    assert not caplog.records
