"""ClipBERT's MetaLoader as clipbert_legacy.training.data.MetaSampler: each batch from one dataset drawn by
ratio, the same dataset on every rank, disjoint examples across ranks, exact continuation after a resume."""
import pytest
import torch

from clipbert_legacy.datasets.multi import MultiDataset
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.data import MetaSampler
from clipbert_legacy.training.engine import Trainer
from tests.toy_task import ToyTask, toy_cfg

SIZES, RATIOS, B = [100, 300, 20], [1, 3, 1], 4


def _dataset_of(index):
    return 0 if index < 100 else (1 if index < 400 else 2)


def test_proportions_follow_ratios_over_many_steps():
    s = MetaSampler(SIZES, RATIOS, B, seed=3)
    counts = [0, 0, 0]
    for epoch in range(40):
        for d in s.schedule(epoch):
            counts[d] += 1
    n = sum(counts)
    assert n == 40 * s.steps_per_epoch == 40 * 105  # ceil(420 / 4) steps per epoch
    for c, r in zip(counts, RATIOS):
        assert abs(c / n - r / sum(RATIOS)) < 0.03, counts


@pytest.mark.parametrize("world", [1, 2, 3])
def test_batches_are_one_dataset_same_on_every_rank_and_disjoint(world):
    samplers = [MetaSampler(SIZES, RATIOS, B, world, r, seed=5) for r in range(world)]
    for s in samplers:
        s.set_epoch(2)
    per_rank = [[i for i, _ in s] for s in samplers]
    assert all(len(p) == samplers[0].num_samples for p in per_rank)
    for step in range(samplers[0].steps_per_epoch):
        batches = [p[step * B:(step + 1) * B] for p in per_rank]
        kinds = {_dataset_of(i) for b in batches for i in b}
        assert len(kinds) == 1  # one dataset per step, on every rank
        if next(iter(kinds)) == 1:  # the large dataset: no example twice within the step
            flat = [i for b in batches for i in b]
            assert len(set(flat)) == len(flat)


def test_each_dataset_is_read_in_a_permutation_before_repeating():
    s = MetaSampler(SIZES, RATIOS, B, seed=1)
    seen = [i for i, _ in s if _dataset_of(i) == 2]
    first = seen[:20]
    assert sorted(first) == list(range(400, 420))  # the small dataset: all 20 before any repeats
    assert seen[20:40] == first  # then the same permutation again (cycled within the epoch)
    s.set_epoch(1)
    assert [i for i, _ in s if _dataset_of(i) == 2][:20] != first  # a new order next epoch


def test_skip_continues_exactly():
    s = MetaSampler(SIZES, RATIOS, B, 2, 1, seed=9)
    s.set_epoch(4)
    full = list(s)
    s.set_epoch(4)
    s.skip(7 * B)
    assert list(s) == full[7 * B:] and len(s) == len(full) - 7 * B


def test_multidataset_locates_indices_and_validates():
    ds = MultiDataset([list(range(3)), list(range(10, 15))], [1, 2], ["a", "b"])
    assert len(ds) == 8 and ds.locate(3) == (1, 0) and ds[4] == 11 and ds.sizes == [3, 5]
    with pytest.raises(ValueError, match="ratio must be > 0"):
        MultiDataset([[1]], [0], ["a"])
    with pytest.raises(ValueError, match=r"\['b'\] have no examples"):
        MultiDataset([[1], []], [1, 1], ["a", "b"])


class CrashAt(Hook):
    def after_step(self, trainer, result):
        if trainer.global_step == 7:
            raise RuntimeError("crash")


def test_engine_trains_on_several_datasets_and_resumes_bit_exact(tmp_path):
    """The engine picks the MetaSampler for a MultiDataset; a run stopped after step 7 and resumed
    from its restore file ends with the uninterrupted run's weights, bit for bit."""
    opts = {"save_steps_ratio": 0.25, "num_valid": 1, "min_valid_steps": 1000}
    task = lambda: ToyTask(multi_ratios=[1, 3])  # noqa: E731
    ref = Trainer(toy_cfg(tmp_path / "u", **opts), task()).train()
    trainer = Trainer(toy_cfg(tmp_path / "r", **opts), task(), hooks=[CrashAt()])
    with pytest.raises(RuntimeError, match="crash"):
        trainer.train()
    assert isinstance(trainer.parts.sampler, MetaSampler)
    resumed = Trainer(toy_cfg(tmp_path / "r", **opts), task()).train()
    assert resumed["global_step"] == ref["global_step"] == 32  # 2 epochs x 64 examples / batch 4
    a = torch.load(tmp_path / "u" / "ckpt" / "model_step_32.pt")
    b = torch.load(tmp_path / "r" / "ckpt" / "model_step_32.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)
