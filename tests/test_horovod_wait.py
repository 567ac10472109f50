"""clipbert_legacy.compat.hvd.horovod_wait: Horovod's optimizer waits with polls and sleeps on a CPU job
(the real thing under horovodrun: tests/test_hvd.py's wait probe)."""
import pytest
import torch

from clipbert_legacy.compat.hvd import horovod_wait


def _sgd(device="cpu"):
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2, device=device))], lr=0.1)


def test_the_mode_follows_the_parameters_unless_the_variable_says(monkeypatch):
    monkeypatch.delenv(horovod_wait.WAIT_ENV, raising=False)
    assert horovod_wait.wait_mode(_sgd()) == "poll"
    meta = _sgd("meta")  # any device but the CPU stands for a GPU here: Horovod's own wait
    assert horovod_wait.wait_mode(meta) == "spin"
    monkeypatch.setenv(horovod_wait.WAIT_ENV, "spin")
    assert horovod_wait.wait_mode(_sgd()) == "spin"
    monkeypatch.setenv(horovod_wait.WAIT_ENV, " Poll ")
    assert horovod_wait.wait_mode(meta) == "poll"
    monkeypatch.setenv(horovod_wait.WAIT_ENV, "busy")
    with pytest.raises(ValueError, match=r"CLIPBERT_HVD_WAIT='busy' must be one of auto\|poll\|spin"):
        horovod_wait.wait_mode(_sgd())


def test_the_wait_sleeps_longer_each_time_up_to_a_millisecond(monkeypatch):
    sleeps, answers = [], iter([False] * 9 + [True])
    monkeypatch.setattr(horovod_wait.time, "sleep", sleeps.append)
    horovod_wait.wait_until_done(7, lambda h: h == 7 and next(answers))
    assert len(sleeps) == 9 and sleeps[0] == pytest.approx(2e-5) and sleeps[1] == pytest.approx(4e-5)
    assert sleeps == sorted(sleeps) and max(sleeps) == horovod_wait.MAX_SLEEP_S


class _FakeHorovodOptimizer:
    """The attributes Horovod 0.28's _DistributedOptimizer.synchronize() reads, and a log of the calls."""

    def __init__(self, included=True):
        self.p_hooked, self.p_unused, self.p_late = "hooked", "unused", "late"
        self._requires_update = {self.p_hooked, self.p_unused, self.p_late}
        self._handles = {self.p_hooked: (1, None), self.p_late: (None, None), ("g1", "g2"): (2, None)}
        self.log, self._included = [], included
        self.process_set = type("PS", (), {"included": lambda _self: self._included})()

    def _allreduce_grad_async(self, p):
        self.log.append(("start", p))
        return 10 + len(self.log), None

    def synchronize(self):
        """Horovod's."""
        self.log.append(("horovod synchronize", sorted(str(h) for h, _ in self._handles.values())))


def test_every_reduction_is_started_and_waited_for_before_horovods_synchronize():
    opt, polled = _FakeHorovodOptimizer(), []
    horovod_wait.poll_before_synchronize(opt, lambda h: polled.append(h) or True)
    opt.synchronize()
    assert opt.log[:2] == [("start", "unused"), ("start", "late")]  # as Horovod starts them, first
    assert sorted(polled) == [1, 2, 11, 12] and opt.log[2] == ("horovod synchronize", ["1", "11", "12", "2"])
    assert opt.synchronize.__doc__ == "Horovod's."


def test_a_rank_outside_the_process_set_goes_straight_to_horovod():
    opt, polled = _FakeHorovodOptimizer(included=False), []
    horovod_wait.poll_before_synchronize(opt, polled.append)
    opt.synchronize()
    assert polled == [] and [e[0] for e in opt.log] == ["horovod synchronize"]
