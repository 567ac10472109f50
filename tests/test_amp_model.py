"""clipbert_legacy.compat.amp model processing: dtypes after O2/O3 (affine BatchNorm fp32), in-place buffer
casts, the patched forward's input/output casts, O1 training on CPU, the CPU fp16 warning, and the same on
CUDA when there is one (O1's cast lists themselves: tests/test_amp_o1.py)."""
import collections
import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from clipbert_legacy.compat import amp
from clipbert_legacy.compat.layer_norm import FusedLayerNorm
from tests.amp_helpers import data, inject_inf, loss_fn, mlp, train_step
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


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


def test_o1_trains_on_cpu_close_to_autocast_and_scales():
    """O1 keeps fp32 weights and runs the GEMMs in fp16 (apex.amp.lists), so its gradients are close to
    torch.autocast's (which follows the same idea with its own lists)."""
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


def test_cpu_fp16_warning_once():
    amp._amp_state.warned_cpu_fp16 = False
    with pytest.warns(UserWarning, match="fp16 on CPU"):
        amp.initialize(mlp(), opt_level="O2", verbosity=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        amp.initialize(mlp(), opt_level="O2", verbosity=0)


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


def test_o2_casts_buffers_in_place_so_shared_buffers_stay_shared():
    """apex.fp16_utils.fp16util.convert_module cast buffers with ``buf.data = buf.data.to(dtype)``: the
    buffer objects survive, and one tensor registered in two modules is still one tensor."""
    a, b = nn.Module(), nn.Module()
    shared = torch.ones(3)
    a.register_buffer("s", shared)
    b.register_buffer("s", shared)
    root = nn.Sequential(a, b, nn.Linear(3, 3), nn.BatchNorm1d(3))
    bn_mean = root[3].running_mean
    amp.initialize(root, opt_level="O2", verbosity=0)
    assert root[0].s is root[1].s is shared and shared.dtype == torch.float16
    assert root[3].running_mean is bn_mean and bn_mean.dtype == torch.float32  # kept BN untouched
