"""``--profile_steps`` windows the run never reaches: one warning at the start, no trace (issue 38,
item 12). The trace itself: tests/test_engine.py."""
import logging

from clipbert_legacy.training.engine import Trainer
from tests.toy_task import ToyTask, toy_cfg


def _profile_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile_steps")]


def test_a_window_after_the_last_step_warns_at_the_start(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    out = tmp_path / "run"
    Trainer(toy_cfg(out, profile_steps="1000-1005", debug=1), ToyTask()).train()  # debug: 3 steps
    assert _profile_warnings(caplog) == ["profile_steps 1000-1005: the run ends at step 3, before the first "
                                         "step to profile; nothing is profiled"]
    messages = [r.getMessage() for r in caplog.records]
    warned = next(i for i, m in enumerate(messages) if m.startswith("profile_steps"))
    assert warned < next(i for i, m in enumerate(messages) if m.startswith("step "))  # before any step
    assert not (out / "log" / "profile").exists()


def test_a_window_the_run_reaches_does_not_warn(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    Trainer(toy_cfg(tmp_path / "run", profile_steps="2-9", debug=1), ToyTask()).train()
    assert _profile_warnings(caplog) == []
    assert (tmp_path / "run" / "log" / "profile" / "steps_2-3.pt.trace.json").is_file()
