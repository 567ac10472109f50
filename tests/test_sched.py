"""LR schedules: ClipBERT's formulas on worked examples (1000 steps, 10% warm-up); the two fixed bugs."""
import math

import pytest

from clipbert_legacy.optimization.sched import get_lr_sched


@pytest.mark.parametrize("step,expected", [(1, 0.01), (100, 1.0), (550, 0.5), (1000, 1e-8), (50, 0.5)])
def test_linear_worked_examples(step, expected):  # T=1000, W=100
    assert get_lr_sched(step, "linear", 1.0, 1000, 0.1) == pytest.approx(expected, rel=1e-12)


def test_linear_scales_with_base_lr():
    assert get_lr_sched(550, "linear", 5e-5, 1000) == pytest.approx(2.5e-5)


def test_invsqrt():
    assert get_lr_sched(50, "invsqrt", 1.0, 1000) == pytest.approx(0.5)
    assert get_lr_sched(100, "invsqrt", 1.0, 1000) == pytest.approx(1.0)
    assert get_lr_sched(400, "invsqrt", 1.0, 1000) == pytest.approx(0.5)  # sqrt(100)/sqrt(400)


def test_invsqrt_without_warmup_is_fixed():
    # ClipBERT: sqrt(0)/sqrt(step) = 0 -> 1e-8 for the whole run; ours: 1/sqrt(step)
    assert get_lr_sched(1, "invsqrt", 1.0, 1000, warmup_ratio=0.0) == pytest.approx(1.0)
    assert get_lr_sched(4, "invsqrt", 1.0, 1000, warmup_ratio=0.0) == pytest.approx(0.5)


def test_constant():
    assert get_lr_sched(1, "constant", 3e-4, 1000) == 3e-4
    assert get_lr_sched(1000, "constant", 3e-4, 1000) == 3e-4


def test_multi_step_with_off_by_one_fixed():
    f = [get_lr_sched(1, "multi_step", 1.0, 100, decay_epochs=[4, 2], multi_step_epoch=e) for e in range(6)]
    assert f == [1.0, 1.0, 0.5, 0.5, 0.25, 0.25]  # ClipBERT gave 0.125 from epoch 4 on
    with pytest.raises(ValueError, match="multi_step_epoch >= 0"):
        get_lr_sched(1, "multi_step", 1.0, 100, decay_epochs=[2])


def test_cosine():
    assert get_lr_sched(50, "cosine", 1.0, 1000) == pytest.approx(0.5)
    assert get_lr_sched(100, "cosine", 1.0, 1000) == pytest.approx(1.0)
    assert get_lr_sched(550, "cosine", 1.0, 1000) == pytest.approx(0.5)
    assert get_lr_sched(325, "cosine", 1.0, 1000) == pytest.approx(0.5 * (1 + math.cos(math.pi / 4)))
    assert get_lr_sched(1000, "cosine", 1.0, 1000) == 1e-8


def test_unknown_schedule_names_choices():
    with pytest.raises(ValueError, match="unknown LR schedule decay='step'.*linear\\|invsqrt"):
        get_lr_sched(1, "step", 1.0, 10)
