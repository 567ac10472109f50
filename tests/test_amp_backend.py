"""clipbert_legacy.compat.amp backend selection: AMP_BACKEND=apex delegates every call (to a fake apex.amp
here), and a missing apex or an unknown AMP_BACKEND value fails clearly."""
import sys
import types

import pytest
import torch

from clipbert_legacy.compat import amp
from tests.amp_helpers import fresh_amp_state as fresh_amp_state  # autouse fixture, found by pytest
from tests.amp_helpers import mlp

pytestmark = pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")


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


def test_apex_backend_counts_the_skips_apex_arms(monkeypatch):
    """apex keeps no skip count; under AMP_BACKEND=apex num_skipped_steps() counts each scale_loss exit
    that arms apex's skipping step (``_amp_stash.already_patched`` False -> True), once per arming,
    so the engine's per-step ``skipped`` flag is not always False there."""
    fake = types.ModuleType("apex.amp")
    stash = types.SimpleNamespace(already_patched=False)

    def initialize(models, optimizers=None, **kw):
        optimizers._amp_stash = stash
        return models, optimizers

    class _CM:
        def __init__(self, loss):
            self.loss = loss

        def __enter__(self):
            return self.loss

        def __exit__(self, *a):
            if not torch.isfinite(self.loss):  # apex: overflow -> patch step (once until it runs)
                stash.already_patched = True
            return False

    fake.initialize, fake.master_params = initialize, lambda opt: iter([])
    fake.scale_loss = lambda loss, opts, **kw: _CM(loss)
    pkg = types.ModuleType("apex")
    pkg.amp = fake
    monkeypatch.setitem(sys.modules, "apex", pkg)
    monkeypatch.setitem(sys.modules, "apex.amp", fake)
    monkeypatch.setenv("AMP_BACKEND", "apex")
    opt = torch.optim.SGD(mlp().parameters(), lr=0.1)
    amp.initialize(mlp(), opt, opt_level="O2")
    seen = []
    for loss, step_runs in [(1.0, True), (float("inf"), False), (float("inf"), True), (2.0, True),
                            (float("inf"), True), (float("inf"), True)]:
        with amp.scale_loss(torch.tensor(loss), opt):
            pass
        seen.append(amp.num_skipped_steps())
        if step_runs:  # apex's skip_step puts the real step back
            stash.already_patched = False
    assert seen == [0, 1, 1, 1, 2, 3]
