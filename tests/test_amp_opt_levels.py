"""clipbert_legacy.compat.amp.initialize: the O0-O3 property table, apex's override rules, enabled=False, the
list-ness of what it returns, and its errors."""
import pytest
import torch
from torch import nn

from clipbert_legacy.compat import amp
from tests.amp_helpers import data, inject_inf, loss_fn, mlp
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


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
    ("O1", {"cast_model_type": torch.float16}),
    ("O2", {"patch_torch_functions": True}),
    ("O0", {"patch_torch_functions": True}),
    ("O1", {"keep_batchnorm_fp32": False}),
    ("O1", {"keep_batchnorm_fp32": True}),
    ("O1", {"master_weights": False}),
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


@pytest.mark.parametrize("level", ["O0", "O1", "O3"])
def test_step_closure_passes_through_without_master_weights(level):
    """apex.amp._process_optimizer._process_optimizer patched ``step`` (refusing closures) only where
    master weights exist; at O0/O1/O3 ``step(closure)`` reached the optimizer. Only the one-shot
    ``skip_step`` that apex.amp.handle.scale_loss installs after an overflow refuses a closure."""
    m = mlp(bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = amp.initialize(m, opt, opt_level=level, verbosity=0, loss_scale="dynamic")
    x, y = data()
    calls = []

    def closure():
        calls.append(1)
        opt.zero_grad()
        loss = loss_fn(m(x), y)
        loss.backward()
        return loss

    assert torch.isfinite(opt.step(closure)) and calls == [1]
    inject_inf(m, opt, x, y)
    with pytest.raises(RuntimeError, match="closure"):
        opt.step(closure)
    w = m[0].weight.clone()
    opt.step()  # the skip is still armed (the closure error came first, as in apex): this one is skipped
    assert torch.equal(m[0].weight, w)
    assert torch.isfinite(opt.step(closure)) and calls == [1, 1]


def test_error_types_legacy_code_catches():
    """apex.amp.handle.scale_loss indexed ``_amp_state.loss_scalers[loss_id]`` (IndexError for
    loss_id >= num_losses) and read ``optimizer._amp_stash`` (AttributeError for an optimizer never
    passed to initialize). Both are raised, as subclasses of the ValueError/RuntimeError of before."""
    m, opt = amp.initialize(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1), opt_level="O2",
                            num_losses=2, verbosity=0)
    loss = torch.tensor(1.0, requires_grad=True)
    for exc in (IndexError, ValueError):
        with pytest.raises(exc, match="num_losses=2"):
            with amp.scale_loss(loss, opt, loss_id=2):
                pass
    with amp.scale_loss(loss, opt, loss_id=-1):  # a list index, as in apex: the last scaler
        pass
    stranger = torch.optim.SGD(mlp().parameters(), lr=0.1)
    for exc in (AttributeError, RuntimeError):
        with pytest.raises(exc, match="not passed through amp.initialize"):
            with amp.scale_loss(loss, stranger):
                pass
