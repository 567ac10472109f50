"""Shared pieces of the tests/test_amp_*.py files: a fresh amp state per test (autouse fixture, which
each file imports so that pytest finds it), a small MLP with BatchNorm, data, a training step and an
injected inf gradient."""
import pytest
import torch
from torch import nn

from clipbert_legacy.compat import amp

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


def inject_inf(model, opt, x, y, where=0):
    with amp.scale_loss(loss_fn(model(x), y), opt) as s:
        s.backward()
        list(model.parameters())[where].grad.view(-1)[0] = INF
