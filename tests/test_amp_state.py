"""clipbert_legacy.compat.amp checkpoints: fp32 model state_dict under O2/O3, amp.state_dict / load_state_dict
(format, key order, unexpected keys), and a same-level save/restore that continues identically."""
import collections
import copy

import pytest
import torch

from clipbert_legacy.compat import amp
from tests.amp_helpers import data, inject_inf, mlp, train_step
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


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
