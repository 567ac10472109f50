"""clipbert_legacy.compat.amp O2 masters follow apex's lazy rule: their values are taken from the model at the
first zero_grad() / step() / scale_loss / add_param_group after initialize, so writes made to the model (or
into ``model.state_dict()``) in between survive ClipBERT's ``zero_grad(); step()`` "quick hack"; the
guarantees that made masters eager objects (fp32 optimizer state and fp32 checkpoints loaded after
initialize) still hold."""
import copy

import pytest
import torch
from torch import nn

from clipbert_legacy.compat import amp
from tests.amp_helpers import data, loss_fn, mlp, train_step
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


def o2(m=None, opt_cls=torch.optim.SGD, **kw):
    m = m or mlp()
    opt = opt_cls(m.parameters(), lr=0.1, **kw)
    return amp.initialize(m, opt, opt_level="O2", verbosity=0)


def quick_hack(opt):
    """ClipBERT's "quick hack for amp delay_unscale bug" before its training loop."""
    opt.zero_grad()
    opt.step()


def test_model_write_after_initialize_survives_quick_hack():
    """apex.amp._process_optimizer.lazy_init_with_master_weights: masters are ``param.clone().float()``
    of the model as it is at the first zero_grad() after initialize (e.g. after
    ``hvd.broadcast_parameters(model.named_parameters())``), and the patched step copies them back."""
    m, opt = o2()
    with torch.no_grad():
        for p in m.parameters():  # what a broadcast into named_parameters() does
            p.data.copy_(torch.full_like(p, 0.375))
    quick_hack(opt)
    for p, mp in zip(m.parameters(), amp.master_params(opt)):
        assert (p == 0.375).all() and torch.equal(mp, p.float())
    assert len(opt.state) == 0 or all(not s for s in opt.state.values())


def test_write_into_state_dict_after_initialize_reaches_model():
    """``hvd.broadcast_parameters(model.state_dict())`` after initialize writes into the state dict. apex
    (O2StateDictHook) returned fp32 copies there, so the write was lost for the fp16 params; here the
    entries are the masters themselves, and the write reaches the model at apex's lazy-init point
    (apex.amp._process_optimizer.lazy_init_with_master_weights) or at the next step."""
    m, opt = o2()
    sd = m.state_dict()
    assert sd["0.weight"].dtype == torch.float32 and sd["0.weight"].data_ptr() != m[0].weight.data_ptr()
    for v in sd.values():
        if v.is_floating_point():
            v.fill_(0.625)
    opt.zero_grad()  # without a step: the model takes the written masters
    assert all((p == 0.625).all() for p in m.parameters())
    assert (m[1].running_mean == 0.625).all()  # fp32 BatchNorm buffers are plain torch aliases
    opt.step()
    assert all((p == 0.625).all() for p in m.parameters())


def test_state_dict_before_first_zero_grad_shows_model_writes():
    """Before apex's lazy init its state_dict upcast the model's current fp16 weights; ours returns the
    masters, brought up to date with model writes first."""
    m, opt = o2()
    with torch.no_grad():
        m[0].weight.data.fill_(0.25)
    assert (m.state_dict()["0.weight"] == 0.25).all()
    quick_hack(opt)
    assert (m[0].weight == 0.25).all()


def test_after_the_lazy_init_point_masters_are_the_weights():
    """apex.amp._process_optimizer (patched step): once masters exist, every step() copies them into
    the model, so a later write to the fp16 model alone is overwritten, as in apex."""
    m, opt = o2()
    opt.zero_grad()  # lazy-init point
    w = list(amp.master_params(opt))[0].clone()
    with torch.no_grad():
        m[0].weight.data.fill_(0.125)
    opt.step()
    assert torch.equal(m[0].weight, w.half())


def test_first_step_without_zero_grad_and_add_param_group_sync_first():
    """apex ran lazy_init_with_master_weights before add_param_group (and its step needed it done); a
    model write made before either is kept."""
    m, opt = o2()
    with torch.no_grad():
        m[0].weight.data.fill_(0.5)
    extra = nn.Linear(2, 2)
    amp._convert_module(extra, torch.float16)
    opt.add_param_group({"params": list(extra.parameters())})
    assert (list(amp.master_params(opt))[0] == 0.5).all()
    m2, opt2 = o2(mlp())
    with torch.no_grad():
        m2[3].weight.data.fill_(-0.5)
    opt2.step()
    assert (m2[3].weight == -0.5).all()


def test_first_scale_loss_takes_the_model_as_it_is():
    """apex.amp._process_optimizer.prepare_backward_with_master_weights runs the lazy init too: the
    first backward's master grads belong to the weights written after initialize."""
    m, opt = o2()
    with torch.no_grad():
        m[0].weight.data.fill_(0.25)
    x, y = data()
    train_step(m, opt, x, y)
    mp0 = list(amp.master_params(opt))[0]
    assert (mp0 == 0.25).all() and mp0.grad is not None


def test_fp32_optimizer_state_loaded_before_lazy_init_stays_fp32():
    """Kept guarantee (deliberate difference): apex swapped masters in at its lazy init, so state loaded
    after initialize went through the fp16 params first (Adam's small exp_avg_sq underflowed to 0)."""
    ref = mlp()
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-3)
    x, y = data()
    loss_fn(ref(x), y).backward()
    ref_opt.step()
    sd = copy.deepcopy(ref_opt.state_dict())
    for s in sd["state"].values():
        s["exp_avg_sq"].fill_(1e-9)  # below fp16's smallest subnormal (6e-8)
    m, opt = o2(copy.deepcopy(ref), torch.optim.Adam)
    opt.load_state_dict(sd)
    quick_hack(opt)
    for s in opt.state.values():
        assert s["exp_avg_sq"].dtype == torch.float32 and (s["exp_avg_sq"] == 1e-9).all()


def test_fp32_checkpoint_loaded_after_initialize_keeps_fp32_masters_through_quick_hack():
    """Kept guarantee (deliberate difference): ``model.load_state_dict`` of an fp32 checkpoint writes the
    full fp32 values into the masters; the lazy sync keeps them (apex rebuilt masters from the fp16
    weights)."""
    ckpt = {k: v + 1e-4 if v.is_floating_point() else v  # values fp16 cannot hold exactly
            for k, v in mlp().state_dict().items()}
    m, opt = o2()
    m.load_state_dict(ckpt)
    quick_hack(opt)
    assert torch.equal(list(amp.master_params(opt))[0], ckpt["0.weight"])
    assert torch.equal(m[0].weight, ckpt["0.weight"].half())
    assert torch.equal(m.state_dict()["0.weight"], ckpt["0.weight"])
