"""Named parameter groups, role-based LRs, and ClipBERT's AdamW numerics."""
import math

import pytest
import torch
from torch import nn

from clipbert_legacy.config import parse_args
from clipbert_legacy.optimization.adamw import AdamW
from clipbert_legacy.optimization.param_groups import build_optimizer, build_param_groups, set_lr
from tests.toy_task import ToyModel


def test_adamw_one_step_matches_clipbert():
    p = nn.Parameter(torch.ones(1))
    opt = AdamW([p], lr=0.1, weight_decay=0.01, betas=(0.9, 0.98))
    p.grad = torch.ones(1)
    opt.step()
    assert p.item() == pytest.approx(0.8991, abs=1e-6)
    q = nn.Parameter(torch.ones(1))
    t = torch.optim.AdamW([q], lr=0.1, weight_decay=0.01, betas=(0.9, 0.98), eps=1e-6)
    q.grad = torch.ones(1)
    t.step()
    assert abs(q.item() - p.item()) > 5e-5  # torch's AdamW is not ClipBERT's


def test_adamw_matches_formula_over_steps():
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(5, dtype=torch.float64))
    ref = p.detach().clone()
    m = torch.zeros(5, dtype=torch.float64)
    v = torch.zeros(5, dtype=torch.float64)
    lr, wd, b1, b2, eps = 0.05, 0.1, 0.9, 0.98, 1e-6
    opt = AdamW([p], lr=lr, weight_decay=wd, betas=(b1, b2))
    for t in range(1, 6):
        g = torch.randn(5, dtype=torch.float64)
        p.grad = g.clone()
        opt.step()
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        ref = ref - lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (v.sqrt() + eps)
        ref = ref - lr * wd * ref
    torch.testing.assert_close(p.detach(), ref, rtol=0, atol=1e-12)
    assert opt.defaults["eps"] == 1e-6


def test_param_groups_by_name():
    cfg = parse_args("shared", ["--transformer_lr_mul", "10", "--transformer_lr_mul_prefix", "head",
                                "--learning_rate", "1e-4", "--cnn_learning_rate", "1e-3",
                                "--cnn_lr_mul", "0.5"])
    model = ToyModel()
    model.cnn.feature.requires_grad_(False)  # frozen params are left out
    groups = build_param_groups(model, cfg)
    by_name = {g["name"]: g for g in groups}
    names = {g["name"]: sorted(g["param_names"]) for g in groups}
    assert names == {
        "transformer_mul": ["transformer.head.weight", "transformer.unused_head.weight"],
        "transformer_mul_no_decay": ["transformer.head.bias", "transformer.unused_head.bias"],
        "transformer": ["transformer.dense.weight"],
        "transformer_no_decay": ["transformer.LayerNorm.bias", "transformer.LayerNorm.weight",
                                 "transformer.dense.bias"],
        "cnn_mul": ["cnn.grid_encoder.weight"], "cnn_mul_no_decay": ["cnn.grid_encoder.bias"]}
    assert by_name["transformer_mul"]["lr"] == pytest.approx(1e-3)
    assert by_name["transformer"]["weight_decay"] == 1e-3
    assert by_name["transformer_no_decay"]["weight_decay"] == 0
    assert by_name["cnn_mul"]["lr"] == pytest.approx(5e-4)
    opt = build_optimizer(model, cfg)
    set_lr(opt, {"transformer": 2.0, "cnn": 4.0})
    lrs = {g["name"]: g["lr"] for g in opt.param_groups}
    assert lrs["transformer_mul"] == 20.0 and lrs["transformer"] == 2.0 and lrs["cnn_mul"] == 2.0


def test_layer_norm_detected_by_module_type():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.Module()
            self.transformer.norm = nn.LayerNorm(3)   # not named LayerNorm
            self.transformer.bn = nn.BatchNorm1d(3)   # decayed, as in ClipBERT
            self.transformer.fc = nn.Linear(3, 3)
    cfg = parse_args("shared", [])
    groups = build_param_groups(Net(), cfg)
    nd = [n for g in groups if g["weight_decay"] == 0 for n in g["param_names"]]
    assert sorted(nd) == ["transformer.bn.bias", "transformer.fc.bias", "transformer.norm.bias",
                          "transformer.norm.weight"]


@pytest.mark.parametrize("name,cls", [("adam", torch.optim.Adam), ("adamax", torch.optim.Adamax),
                                      ("adamw", AdamW)])
def test_build_optimizer_kinds(name, cls):
    cfg = parse_args("shared", ["--optim", name, "--betas", "0.8", "0.9"])
    opt = build_optimizer(ToyModel(), cfg)
    assert type(opt) is cls and opt.param_groups[0]["betas"] == (0.8, 0.9)
    assert {g["role"] for g in opt.param_groups} == {"transformer", "cnn"}
