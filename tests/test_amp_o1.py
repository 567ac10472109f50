"""clipbert_legacy.compat.amp O1: apex's cast lists installed process-wide (also outside the model's forward,
on CPU too), the user registry (register_*_function, the decorators, disable_casts), the weight-cast
cache, and removal of every patch by the next initialize."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clipbert_legacy.compat import amp
from clipbert_legacy.compat.amp import _o1
from tests.amp_helpers import data, loss_fn, mlp
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")
ORIGINALS = {"linear": F.linear, "sum": torch.sum, "add": torch.Tensor.__add__,
             "vf": torch.nn.modules.rnn._VF}


@pytest.fixture(autouse=True)
def empty_registry():
    _o1._USER_CASTS.clear()
    _o1._USER_PROMOTES.clear()
    yield
    _o1._USER_CASTS.clear()
    _o1._USER_PROMOTES.clear()


def o1(model=None):
    m = model or mlp(bn=False)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    return amp.initialize(m, opt, opt_level="O1", verbosity=0)


def test_loss_after_the_forward_runs_in_fp32():
    """apex.amp.lists.functional_overrides.FP32_FUNCS (cross_entropy, softmax, ...) were patched on
    torch.nn.functional itself by apex.amp.amp.init, so a loss computed outside the model's forward on
    fp16 logits ran in fp32."""
    m, _ = o1(nn.Linear(4, 3))
    logits = m(torch.randn(5, 4))
    assert logits.dtype == torch.float16
    y = torch.tensor([0, 1, 2, 0, 1])
    loss = F.cross_entropy(logits, y)
    assert loss.dtype == torch.float32
    with amp.disable_casts():
        assert torch.equal(loss, F.cross_entropy(logits.float(), y))
    assert F.softmax(logits, -1).dtype == F.log_softmax(logits, -1).dtype == torch.float32
    assert F.layer_norm(logits, (3,)).dtype == F.mse_loss(logits, logits).dtype == torch.float32


def test_whitelist_runs_fp16_on_cpu_and_blacklist_fp32():
    """apex.amp.lists.torch_overrides / tensor_overrides: GEMMs (F.linear, torch.matmul, ``@``, bmm) in
    fp16; pointwise exp/log/pow and reductions (torch.sum, Tensor.sum, ``**``) in fp32."""
    o1()
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    assert torch.equal(a @ b, a.half() @ b.half())
    assert (a @ b).dtype == torch.matmul(a, b).dtype == torch.bmm(a[None], b[None]).dtype == torch.float16
    h = torch.randn(3, 4).half()
    assert torch.exp(h).dtype == h.sum().dtype == torch.sum(h).dtype == (h ** 2).dtype == torch.float32
    assert h.cpu().dtype == torch.float32  # apex: fp32 before leaving the device
    assert (h + 1).dtype == torch.float16 and h.relu().dtype == torch.float16  # on no list: unchanged
    d = torch.randn(3, dtype=torch.float64)
    assert torch.exp(d).dtype == torch.float64  # only fp16 <-> fp32 (package docstring)


def test_promote_lists_cast_mixed_inputs_to_fp32():
    """apex.amp.wrap.make_promote_wrapper / sequence_promote: fp16 meeting fp32 becomes fp32, also
    where torch alone would keep fp16 (a 0-dim fp32 tensor) or for torch.cat / torch.stack."""
    o1()
    h, f = torch.randn(3).half(), torch.randn(3)
    assert (h * torch.tensor(2.0)).dtype == torch.float32
    assert torch.mul(h, torch.tensor(2.0)).dtype == torch.float32
    assert torch.cat([h, f]).dtype == torch.stack([h, f]).dtype == torch.float32
    assert torch.cat(tensors=[h, f]).dtype == torch.float32
    assert torch.cat([h, h]).dtype == torch.float16


def test_in_place_rules_and_banned_function():
    """apex.amp.wrap.err_if_arg0_half / err_if_any_half / promote_match_arg0 and the banned
    F.binary_cross_entropy of apex.amp.lists.functional_overrides.BANNED_FUNCS."""
    o1()
    h, f = torch.randn(3).half(), torch.randn(3)
    with pytest.raises(NotImplementedError, match="exp_ on fp16"):
        h.clone().exp_()
    with pytest.raises(NotImplementedError, match="in-place function exp_"):
        torch.exp_(h.clone())
    assert f.clone().exp_().dtype == torch.float32
    g = h.clone()
    g.add_(f)  # other arguments take self's dtype
    assert g.dtype == torch.float16 and torch.equal(g, h + f.half())
    g2 = h.clone()
    ref = g2
    g2 += f  # stays the same fp16 tensor (apex returned a new fp32 one; package docstring)
    assert g2 is ref and g2.dtype == torch.float16
    with pytest.raises(NotImplementedError, match="binary_cross_entropy"):
        F.binary_cross_entropy(torch.sigmoid(h), torch.rand(3).half())
    assert F.binary_cross_entropy(torch.sigmoid(f), torch.rand(3)).dtype == torch.float32


def test_rnn_runs_in_fp16():
    """apex.amp.rnn_compat / wrap.new_rnn_cast: the RNN functions get fp16 inputs, states and weights;
    the fp32 weights receive fp32 gradients."""
    o1()
    lstm, cell = nn.LSTM(4, 6), nn.GRUCell(4, 6)
    out, (h, c) = lstm(torch.randn(3, 2, 4))
    assert out.dtype == h.dtype == torch.float16
    out.float().sum().backward()
    assert lstm.weight_ih_l0.grad.dtype == torch.float32
    assert cell(torch.randn(2, 4)).dtype == torch.float16


def test_registry_before_initialize_and_its_errors():
    """apex.amp.amp.register_float_function / register_half_function / register_promote_function:
    registered before initialize, applied by O1, taking precedence over the built-in lists."""
    amp.register_float_function(torch, "sigmoid")
    amp.register_half_function(torch, "tanh")
    amp.register_promote_function(torch, "where")
    amp.register_float_function(F, "linear")  # beats the fp16 list
    with pytest.raises(ValueError, match="No function named nope"):
        amp.register_half_function(torch, "nope")
    h, f = torch.randn(3).half(), torch.randn(3)
    assert torch.sigmoid(h).dtype == torch.float16  # not before O1
    o1()
    assert torch.sigmoid(h).dtype == torch.float32 and torch.tanh(f).dtype == torch.float16
    assert torch.where(f > 0, h, f).dtype == torch.float32
    assert F.linear(f[None], torch.randn(2, 3)).dtype == torch.float32
    amp.initialize(mlp(), opt_level="O2", verbosity=0)
    assert torch.sigmoid(h).dtype == torch.float16  # gone with O1


def test_decorators_and_disable_casts():
    """apex.amp.amp.half_function / float_function / promote_function and apex.amp.handle.disable_casts:
    casts only while amp is initialized at O1, none inside disable_casts()."""
    @amp.half_function
    def f16(x):
        return x

    @amp.float_function
    def f32(x):
        return x

    @amp.promote_function
    def both(a, b):
        return a, b

    x, h = torch.randn(2), torch.randn(2).half()
    assert f16(x).dtype == torch.float32 and f32(h).dtype == torch.float16  # no O1: unchanged
    with amp.disable_casts():  # without O1: an empty block
        pass
    o1()
    assert f16(x).dtype == torch.float16 and f32(h).dtype == torch.float32
    assert [t.dtype for t in both(h, x)] == [torch.float32, torch.float32]
    with amp.disable_casts():
        assert f16(x).dtype == torch.float32 and F.linear(x, torch.randn(3, 2)).dtype == torch.float32
    assert F.linear(x, torch.randn(3, 2)).dtype == torch.float16


def test_weight_casts_cached_until_scale_loss_exit():
    """apex.amp.utils.cached_cast: an fp32 Parameter's fp16 cast is made once and reused until the
    scale_loss exit clears the cache (here also redone once the weight changed)."""
    m, opt = o1(nn.Linear(4, 2))
    h = amp._amp_state.handle
    x = torch.randn(3, 4)
    m(x)
    m(x)
    assert set(h.cache) == {id(m.weight), id(m.bias)}
    first = h.cache[id(m.weight)][2]
    m(x)
    assert h.cache[id(m.weight)][2] is first
    with amp.scale_loss(m(x).float().mean(), opt) as s:
        s.backward()
    assert not h.cache
    opt.step()
    m(x)
    assert not torch.equal(h.cache[id(m.weight)][2], first)


def test_o1_step_has_no_casts_and_passes_closures():
    """apex.amp._initialize: at O1 the optimizer's step ran inside disable_casts(), with its arguments
    passed through (a closure reaches the optimizer)."""
    m, opt = o1()
    x, y = data()
    seen = []

    def closure():
        opt.zero_grad()
        loss = loss_fn(m(x), y)
        loss.backward()
        seen.append(F.linear(x, torch.randn(3, 4)).dtype)
        return loss

    assert opt.step(closure) is not None and seen == [torch.float32]


def test_patches_removed_by_next_initialize_and_by_reset():
    """apex never removed its patches; here they last while amp is initialized at O1 (package
    docstring): the next initialize, at any level, and a state reset restore the torch functions."""
    o1()
    assert F.linear is not ORIGINALS["linear"] and torch.nn.modules.rnn._VF is not ORIGINALS["vf"]
    o1()  # a second O1 initialize re-installs, it does not stack
    assert F.linear.__wrapped__ is ORIGINALS["linear"]
    amp.initialize(mlp(), opt_level="O0", verbosity=0)
    assert F.linear is ORIGINALS["linear"] and torch.sum is ORIGINALS["sum"]
    assert torch.Tensor.__add__ is ORIGINALS["add"] and torch.nn.modules.rnn._VF is ORIGINALS["vf"]
    o1()
    amp._amp_state.__init__()
    assert F.linear is ORIGINALS["linear"] and "__add__" not in vars(torch.Tensor)
