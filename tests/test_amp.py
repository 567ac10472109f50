"""src.compat.amp: apex.amp behaviour (shared/specs/apex_amp_legacy.md section 8) on CPU fp16."""
import collections
import copy
import sys
import types
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from src.compat import amp
from src.compat.layer_norm import FusedLayerNorm

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")
INF = float("inf")


@pytest.fixture(autouse=True)
def fresh_amp_state(monkeypatch):
    monkeypatch.delenv("AMP_BACKEND", raising=False)
    amp._amp_state.__init__()
    amp._amp_state.warned_cpu_fp16 = True  # the one-time warning is tested on its own
    torch.manual_seed(0)
    yield
    amp._amp_state.__init__()


def mlp(bn=True):
    layers = [nn.Linear(4, 8)] + ([nn.BatchNorm1d(8)] if bn else []) + [nn.ReLU(), nn.Linear(8, 2)]
    return nn.Sequential(*layers)


def data(n=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), torch.randn(n, 2, generator=g)


def loss_fn(out, y):
    return ((out.float() - y) ** 2).mean()


def train_step(model, opt, x, y, **kw):
    with amp.scale_loss(loss_fn(model(x), y), opt, **kw) as s:
        s.backward()


def snapshot(model, opt):
    params = [p.detach().clone() for p in model.parameters()]
    state = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
             for i, s in enumerate(opt.state.values())}
    return params, state


def same_snapshot(a, b):
    (pa, sa), (pb, sb) = a, b
    return all(torch.equal(x, y) for x, y in zip(pa, pb)) and sa.keys() == sb.keys() and all(
        all(torch.equal(sa[i][k], sb[i][k]) if torch.is_tensor(sa[i][k]) else sa[i][k] == sb[i][k]
            for k in sa[i]) for i in sa)


# --------------------------------------------------------------------------------------------- 1
@pytest.mark.parametrize("level,expect", [
    ("O0", (torch.float32, False, None, False, 1.0)),
    ("O1", (None, True, None, None, "dynamic")),
    ("O2", (torch.float16, False, True, True, "dynamic")),
    ("O3", (torch.float16, False, False, False, 1.0)),
])
def test_opt_level_property_table(level, expect):
    amp.initialize(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1), opt_level=level, verbosity=0)
    p = amp._amp_state.opt_properties
    assert (p.cast_model_type, p.patch_torch_functions, p.keep_batchnorm_fp32, p.master_weights,
            p.loss_scale) == expect
    assert p.enabled and p.opt_level == level


@pytest.mark.parametrize("level,kw", [
    ("O1", dict(cast_model_type=torch.float16)),
    ("O2", dict(patch_torch_functions=True)),
    ("O0", dict(patch_torch_functions=True)),
    ("O1", dict(keep_batchnorm_fp32=False)),
    ("O1", dict(keep_batchnorm_fp32=True)),
    ("O1", dict(master_weights=False)),
])
def test_rejected_overrides_raise_runtime_error(level, kw):
    with pytest.raises(RuntimeError):
        amp.initialize(mlp(), opt_level=level, verbosity=0, **kw)


def test_accepted_overrides_and_value_parsing():
    amp.initialize(mlp(), opt_level="O1", cast_model_type=torch.float32, verbosity=0)
    amp.initialize(mlp(), opt_level="O1", cast_model_type=False, verbosity=0)
    amp.initialize(mlp(), opt_level="O2", keep_batchnorm_fp32="False", loss_scale="128.0", verbosity=0)
    p = amp._amp_state.opt_properties
    assert p.keep_batchnorm_fp32 is False and p.loss_scale == 128.0
    amp.initialize(mlp(), opt_level="O3", keep_batchnorm_fp32="True", verbosity=0)
    assert amp._amp_state.opt_properties.keep_batchnorm_fp32 is True
    amp.initialize(mlp(), opt_level="O2", master_weights=False, verbosity=0)
    assert amp._amp_state.opt_properties.master_weights is False
    amp.initialize(mlp(), opt_level="O0", loss_scale="dynamic", verbosity=0)
    assert amp._amp_state.loss_scalers[0].dynamic
    with pytest.raises(AssertionError, match="keep_batchnorm_fp32"):
        amp.initialize(mlp(), opt_level="O2", keep_batchnorm_fp32="yes", verbosity=0)


def test_unknown_level_mentions_letter_o():
    with pytest.raises(RuntimeError, match="letter O, not the number zero"):
        amp.initialize(mlp(), opt_level="00", verbosity=0)


# --------------------------------------------------------------------------------------------- 2, 3
def test_enabled_false_is_identity():
    m, o = mlp(), None
    o = torch.optim.SGD(m.parameters(), lr=0.1)
    w = [p.clone() for p in m.parameters()]
    assert amp.initialize(m, enabled=False, opt_level="O2") is m
    m2, o2 = amp.initialize(m, o, enabled=False, opt_level="not-a-level")
    assert m2 is m and o2 is o and not hasattr(o, "_amp_stash") and amp._amp_state.loss_scalers is None
    assert all(p.dtype == torch.float32 and torch.equal(p, q) for p, q in zip(m.parameters(), w))
    loss = torch.tensor(2.0, requires_grad=True)
    with amp.scale_loss(loss, o) as s:
        assert s is loss


def test_return_shapes_follow_input_listness():
    def fresh():
        m = mlp()
        return m, torch.optim.SGD(m.parameters(), lr=0.1)
    m, o = fresh()
    r = amp.initialize(m, o, opt_level="O0", verbosity=0)
    assert isinstance(r, tuple) and r[0] is m and r[1] is o
    m, o = fresh()
    rm, ro = amp.initialize(m, [o], opt_level="O0", verbosity=0)
    assert rm is m and ro == [o]
    m, o = fresh()
    rm, ro = amp.initialize([m], o, opt_level="O0", verbosity=0)
    assert rm == [m] and ro is o
    (m, o), (m2, o2) = fresh(), fresh()
    rm, ro = amp.initialize([m, m2], [o, o2], opt_level="O2", verbosity=0)
    assert rm == [m, m2] and ro == [o, o2]
    m = mlp()
    assert amp.initialize(m, opt_level="O0", verbosity=0) is m
    assert amp.initialize([mlp()], opt_level="O0", verbosity=0)[0].__class__ is nn.Sequential
    m = mlp()
    assert amp.initialize(m, [], opt_level="O0", verbosity=0) == (m, [])


# --------------------------------------------------------------------------------------------- 4
class Zoo(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.bn_na = nn.BatchNorm1d(4, affine=False)
        self.ln = nn.LayerNorm(4)
        self.fln = FusedLayerNorm(4)
        self.gn = nn.GroupNorm(2, 4)

    def forward(self, ids):
        return self.lin(self.emb(ids)).sum()


def test_o2_dtypes_affine_bn_fp32_everything_else_fp16():
    m = amp.initialize(Zoo(), opt_level="O2", verbosity=0)
    assert m.bn.weight.dtype == m.bn.running_mean.dtype == m.bn.running_var.dtype == torch.float32
    assert m.bn.num_batches_tracked.dtype == torch.int64
    for mod in (m.emb, m.lin, m.ln, m.fln, m.gn):
        assert all(p.dtype == torch.float16 for p in mod.parameters()), mod
    assert m.bn_na.running_mean.dtype == torch.float16


def test_o3_dtypes_with_and_without_keep_bn():
    m = amp.initialize(Zoo(), opt_level="O3", verbosity=0)
    assert all(t.dtype == torch.float16 for t in list(m.parameters()) + list(m.buffers())
               if t.is_floating_point())
    m = amp.initialize(Zoo(), opt_level="O3", keep_batchnorm_fp32=True, verbosity=0)
    assert m.bn.weight.dtype == torch.float32 and m.lin.weight.dtype == torch.float16


def test_o2_keeps_parameter_objects():
    m = Zoo()
    ids = [id(p) for p in m.parameters()]
    amp.initialize(m, opt_level="O2", verbosity=0)
    assert [id(p) for p in m.parameters()] == ids


# --------------------------------------------------------------------------------------------- 5
class Recorder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.seen = None

    def forward(self, batch, extra=None):
        self.seen = (batch, extra)
        return {"logits": self.lin(batch["x"]), "pair": (batch["x"].sum(), batch["ids"])}


def test_forward_casts_nested_inputs_and_outputs():
    m = amp.initialize(Recorder(), opt_level="O2", verbosity=0)
    NT = collections.namedtuple("NT", "a b")
    arr = np.ones(3, dtype=np.float32)
    batch = {"x": torch.randn(3, 2), "ids": torch.arange(3), "name": "vid", "arr": arr,
             "lst": [torch.ones(1), 2.5, NT(torch.ones(1), torch.zeros(1, dtype=torch.long))]}
    od = collections.OrderedDict(w=torch.ones(1))
    out = m(batch, extra=(torch.ones(2), od))
    seen, extra = m.seen
    assert type(extra[1]) is collections.OrderedDict and extra[1]["w"].dtype == torch.float16
    assert od["w"].dtype == torch.float32  # the caller's mapping is not mutated
    assert type(seen) is dict and seen["x"].dtype == torch.float16 and seen["ids"].dtype == torch.int64
    assert seen["name"] == "vid" and seen["arr"] is arr and seen["lst"][1] == 2.5
    assert seen["lst"][0].dtype == torch.float16 and isinstance(seen["lst"][2], NT)
    assert seen["lst"][2].a.dtype == torch.float16 and seen["lst"][2].b.dtype == torch.int64
    assert extra[0].dtype == torch.float16
    assert out["logits"].dtype == torch.float32 and out["pair"][0].dtype == torch.float32
    assert out["pair"][1].dtype == torch.int64


def test_cast_model_outputs_and_not_cuda_warning_rule():
    m = amp.initialize(Recorder(), opt_level="O2", cast_model_outputs=torch.float16, verbosity=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CPU model: CPU inputs are expected, no "not cuda" warning
        out = m({"x": torch.randn(1, 2), "ids": torch.arange(1)})
    assert out["logits"].dtype == torch.float16
    with pytest.warns(UserWarning, match="An input tensor was not cuda"):
        amp._cast(torch.ones(1), torch.float16, warn_not_cuda=True)
    # only outputs cast: O1 / O0 with cast_model_outputs
    m0 = amp.initialize(Recorder(), opt_level="O0", cast_model_outputs=torch.float16, verbosity=0)
    assert m0({"x": torch.randn(1, 2), "ids": torch.arange(1)})["logits"].dtype == torch.float16


# --------------------------------------------------------------------------------------------- 6
@pytest.mark.parametrize("level", ["O2", "O3"])
def test_state_dict_fp32_copies_and_fp32_checkpoint_loads(level):
    ref = mlp()
    ckpt = copy.deepcopy(ref.state_dict())
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level=level, verbosity=0)
    sd = m.state_dict()
    assert all(v.dtype == torch.float32 for k, v in sd.items() if "num_batches" not in k)
    assert sd["0.weight"].data_ptr() != m[0].weight.data_ptr()
    m.load_state_dict(ckpt)
    assert torch.equal(m[0].weight, ckpt["0.weight"].half())
    assert torch.equal(m[1].weight, ckpt["1.weight"])
    if level == "O2":  # masters take the full fp32 values of the checkpoint
        assert torch.equal(list(amp.master_params(opt))[0], ckpt["0.weight"])
        assert torch.equal(m.state_dict()["0.weight"], ckpt["0.weight"])


# --------------------------------------------------------------------------------------------- 7
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


# --------------------------------------------------------------------------------------------- 8, 9
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


# --------------------------------------------------------------------------------------------- 10
def inject_inf(model, opt, x, y, where=0):
    with amp.scale_loss(loss_fn(model(x), y), opt) as s:
        s.backward()
        list(model.parameters())[where].grad.view(-1)[0] = INF


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


# --------------------------------------------------------------------------------------------- 11
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


# --------------------------------------------------------------------------------------------- 12
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


# --------------------------------------------------------------------------------------------- 13
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
    with pytest.raises(ValueError, match="num_losses"):
        with amp.scale_loss(loss_fn(m(x), y), opt, loss_id=2):
            pass


# --------------------------------------------------------------------------------------------- 14, 15
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


# --------------------------------------------------------------------------------------------- 16
def test_amp_state_dict_format_order_load_and_unexpected_key():
    amp.initialize(mlp(), opt_level="O2", num_losses=2, verbosity=0)
    sd = amp.state_dict()
    assert isinstance(sd, collections.OrderedDict) and list(sd) == ["loss_scaler0", "loss_scaler1"]
    assert sd["loss_scaler0"] == {"loss_scale": 65536.0, "unskipped": 0}
    amp.load_state_dict(collections.OrderedDict([("loss_scaler7", {"loss_scale": 8.0, "unskipped": 3}),
                                                 ("loss_scaler0", {"loss_scale": 4.0, "unskipped": 1})]))
    assert amp.state_dict()["loss_scaler0"] == {"loss_scale": 8.0, "unskipped": 3}  # by order, not id
    assert amp.state_dict()["loss_scaler1"] == {"loss_scale": 4.0, "unskipped": 1}
    with pytest.raises(RuntimeError, match="Unexpected key"):
        amp.load_state_dict({"loss_scaler0": {"loss_scale": 2.0, "unskipped": 0}, "bogus": {}})
    assert amp.state_dict()["loss_scaler0"]["loss_scale"] == 2.0  # loaded before raising
    amp.load_state_dict({f"loss_scaler{i}": {"loss_scale": 1.0, "unskipped": 0} for i in range(3)})
    assert amp._amp_state.loss_scalers[0].dynamic  # dynamic flag unchanged
    amp._amp_state.__init__()
    with pytest.raises(AttributeError):
        amp.state_dict()


def test_same_level_round_trip_continues_identically():
    x, y = data()

    def build():
        torch.manual_seed(0)
        m = mlp()
        opt = torch.optim.Adam(m.parameters(), lr=1e-2)
        return amp.initialize(m, opt, opt_level="O2", verbosity=0)

    def steps(m, opt, n):
        for _ in range(n):
            train_step(m, opt, x, y)
            opt.step()
            opt.zero_grad()

    m, opt = build()
    steps(m, opt, 3)
    inject_inf(m, opt, x, y)  # non-trivial scaler state
    opt.step()
    opt.zero_grad()
    ckpt = copy.deepcopy({"model": m.state_dict(), "optimizer": opt.state_dict(), "amp": amp.state_dict()})
    steps(m, opt, 3)
    cont = [p.clone() for p in amp.master_params(opt)]

    m2, opt2 = build()
    m2.load_state_dict(ckpt["model"])
    opt2.load_state_dict(ckpt["optimizer"])
    amp.load_state_dict(ckpt["amp"])
    steps(m2, opt2, 3)
    assert all(torch.equal(a, b) for a, b in zip(cont, amp.master_params(opt2)))
    assert all(torch.equal(a, b) for a, b in zip(m.parameters(), m2.parameters()))


# --------------------------------------------------------------------------------------------- 17
def test_errors():
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="not been initialized"):
        with amp.scale_loss(torch.tensor(1.0), opt):
            pass
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    with pytest.raises(RuntimeError, match="only be passed through amp.initialize once"):
        amp.initialize(mlp(), opt, opt_level="O2", verbosity=0)
    with pytest.raises(RuntimeError, match="expected float32"):
        amp.initialize(m, opt_level="O2", verbosity=0)  # already cast
    with pytest.raises(RuntimeError, match="do not need to call .half"):
        amp.initialize(mlp().half(), opt_level="O1", verbosity=0)
    with pytest.raises(RuntimeError, match="AFTER"):
        amp.initialize(nn.DataParallel(mlp()), opt_level="O2", verbosity=0)
    with pytest.raises(TypeError):
        amp.initialize(mlp(), "sgd", opt_level="O2", verbosity=0)
    with pytest.raises(TypeError):
        amp.initialize("model", opt_level="O2", verbosity=0)
    m, opt = amp.initialize(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1), opt_level="O2",
                            verbosity=0)
    with pytest.raises(RuntimeError, match="closure"):
        opt.step(lambda: 0.0)
    stranger = torch.optim.SGD(mlp().parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="not passed through amp.initialize"):
        with amp.scale_loss(torch.tensor(1.0), stranger):
            pass


# --------------------------------------------------------------------------------------------- 18
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


# --------------------------------------------------------------------------------------------- extra
def test_o1_autocasts_on_cpu_and_scales():
    m = mlp(bn=False)
    ref = copy.deepcopy(m)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O1", verbosity=0)
    x, y = data()
    out = m(x)
    assert out.dtype == torch.float16 and m[0].weight.dtype == torch.float32
    with amp.scale_loss(loss_fn(out, y), opt) as s:
        assert s.item() == pytest.approx(loss_fn(out, y).item() * 2 ** 16, rel=1e-6)
        s.backward()
    with torch.autocast("cpu", dtype=torch.float16):
        rout = ref(x)
    loss_fn(rout, y).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        assert p.grad.dtype == torch.float32
        assert torch.allclose(p.grad, q.grad, rtol=1e-2, atol=1e-3)


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


def test_cpu_fp16_warning_once():
    amp._amp_state.warned_cpu_fp16 = False
    with pytest.warns(UserWarning, match="fp16 on CPU"):
        amp.initialize(mlp(), opt_level="O2", verbosity=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amp.initialize(mlp(), opt_level="O2", verbosity=0)


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


def test_apex_backend_delegation_with_fake_module(monkeypatch):
    calls = []
    fake = types.ModuleType("apex.amp")

    def initialize(models, optimizers=None, **kw):
        calls.append(("initialize", kw["opt_level"]))
        return models if optimizers is None else (models, optimizers)

    class _CM:
        def __init__(self, loss):
            self.loss = loss

        def __enter__(self):
            calls.append("scale_loss")
            return self.loss * 3

        def __exit__(self, *a):
            return False

    fake.initialize = initialize
    fake.scale_loss = lambda loss, opts, **kw: _CM(loss)
    fake.master_params = lambda opt: iter(["fake-master"])
    fake.state_dict = lambda destination=None: {"from": "apex"}
    fake.load_state_dict = lambda sd: calls.append(("load", sd))
    pkg = types.ModuleType("apex")
    pkg.amp = fake
    monkeypatch.setitem(sys.modules, "apex", pkg)
    monkeypatch.setitem(sys.modules, "apex.amp", fake)
    monkeypatch.setenv("AMP_BACKEND", "apex")
    m = mlp()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m2, opt2 = amp.initialize(m, opt, opt_level="O2")
    assert m2 is m and amp.backend() == "apex" and m[0].weight.dtype == torch.float32
    with amp.scale_loss(torch.tensor(2.0), opt) as s:
        assert s.item() == 6.0
    assert list(amp.master_params(opt)) == ["fake-master"] and amp.state_dict() == {"from": "apex"}
    amp.load_state_dict({"x": 1})
    assert calls == [("initialize", "O2"), "scale_loss", ("load", {"x": 1})]
    monkeypatch.setenv("AMP_BACKEND", "native")
    amp.initialize(mlp(), opt_level="O2", verbosity=0)
    assert amp.backend() == "native"


def test_apex_backend_missing_or_bad_value(monkeypatch):
    monkeypatch.setitem(sys.modules, "apex", None)  # makes `import apex` fail
    monkeypatch.setenv("AMP_BACKEND", "apex")
    with pytest.raises(RuntimeError, match="AMP_BACKEND=apex"):
        amp.initialize(mlp(), opt_level="O2")
    monkeypatch.setenv("AMP_BACKEND", "fast")
    with pytest.raises(ValueError, match="AMP_BACKEND='fast'"):
        amp.initialize(mlp(), opt_level="O2")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_o2_and_o1_on_cuda():
    m = mlp().cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level="O2", verbosity=0)
    x, y = (t.cuda() for t in data())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # CUDA inputs into a CUDA model: no "not cuda" warning
        train_step(m, opt, x, y)
    masters = list(amp.master_params(opt))
    assert all(p.is_cuda and p.dtype == torch.float32 for p in masters)
    opt.step()
    assert all(torch.equal(p, mp.to(p.dtype)) for p, mp in zip(m.parameters(), masters))
    before = [p.clone() for p in m.parameters()]
    inject_inf(m, opt, x, y)
    opt.step()
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    with pytest.warns(UserWarning, match="not cuda"):
        m(x.cpu())
    amp._amp_state.__init__()
    m1 = amp.initialize(mlp(bn=False).cuda(), opt_level="O1", verbosity=0)
    assert m1(x).dtype == torch.float16 and m1[0].weight.dtype == torch.float32
