"""Training data order that can be resumed exactly: a skippable DistributedSampler and per-sample seeds.

* :class:`ResumableDistributedSampler` is ``torch.utils.data.DistributedSampler`` (same shuffle:
  ``randperm`` seeded with ``seed + epoch``, padding by repetition, ``rank::world`` split) plus
  ``start_at(consumed)`` (or ``skip(n)`` per rank): the next pass starts after the epoch's first
  ``consumed`` examples, so a resumed run never re-reads (or decodes) consumed data. The engine calls
  ``set_epoch`` every epoch (ClipBERT never did, so every epoch saw the same order).
* :class:`MetaSampler` (ClipBERT's MetaLoader): each batch from one of several datasets, chosen per
  step in proportion to their ratios, with the same resumability.
* Every sample is loaded under its own seed ``f(seed, epoch, index)`` (python, numpy and torch RNGs,
  restored afterwards), so random augmentation does not depend on worker count, prefetching or
  where a run was resumed, and data loading never disturbs the training process's RNG stream.
"""
import random

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler, get_worker_info

from clipbert_legacy.utils.loader_workers import worker_settings


def _seed_all(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.default_generator.manual_seed(seed)  # CPU generator only: torch.manual_seed is ~1000x slower


def sample_seed(seed, epoch, index):
    return (seed * 0x9E3779B1 + (epoch + 1) * 0x85EBCA77 + index * 0xC2B2AE3D) % (2 ** 31 - 1)


class ResumableDistributedSampler(Sampler):
    """Yields ``(index, sample_seed)``; see the module docstring.

    The position within an epoch is global: :meth:`start_at` ``(c)`` resumes after the first ``c``
    examples of the epoch's permutation, whichever world size consumed them, and :meth:`reshard`
    changes the world size / rank. The rest of the permutation is padded (by wrapping, as
    ``DistributedSampler``) to a multiple of the world size and split ``rank::world``. So a pass
    that resumes with another number of processes (Horovod elastic, a rerun on fewer GPUs) reads
    every remaining example of the epoch exactly once, plus at most ``world - 1`` padding repeats at
    its end, and nothing already consumed. From ``c = 0`` the order is ``DistributedSampler``'s.
    """

    def __init__(self, n_examples, num_replicas=1, rank=0, shuffle=True, seed=0):
        if n_examples <= 0:
            raise ValueError(f"the training dataset is empty (n_examples={n_examples})")
        self.n, self.shuffle, self.seed = n_examples, shuffle, seed
        self.epoch, self.start = 0, 0
        self.reshard(num_replicas, rank)

    def reshard(self, num_replicas, rank):
        """Split among ``num_replicas`` processes from now on (this one is ``rank``)."""
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
        self.world, self.rank = num_replicas, rank
        self.num_samples = -(-self.n // num_replicas)  # per rank, in a whole epoch

    def set_epoch(self, epoch):
        self.epoch, self.start = epoch, 0

    def start_at(self, consumed):
        """The next pass starts after the epoch's first ``consumed`` examples (all ranks together)."""
        self.start = max(0, min(int(consumed), self.n))

    def skip(self, n_samples):
        """Start the next pass after ``n_samples`` of this rank's samples (reset by set_epoch): the
        per-rank spelling of :meth:`start_at`, used by the sampler tests."""
        self.start_at(int(n_samples) * self.world)

    def permutation(self):
        """The epoch's order of all ``n`` examples."""
        if not self.shuffle:
            return list(range(self.n))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def indices(self):
        order = self.permutation()
        rest = order[self.start:]
        pad = -len(rest) % self.world
        if pad:
            rest += (order * (pad // len(order) + 1))[:pad]
        return rest[self.rank::self.world]

    def __iter__(self):
        for i in self.indices():
            yield i, sample_seed(self.seed, self.epoch, i)

    def __len__(self):
        return -(-(self.n - self.start) // self.world)


class MetaSampler(ResumableDistributedSampler):
    """ClipBERT's MetaLoader as a sampler: every batch comes from one dataset of a
    ``clipbert_legacy.datasets.multi.MultiDataset``, chosen per step with probability proportional to its
    ratio.

    The choice of step ``s`` in epoch ``e`` is drawn from ``Random(f(seed, e))``, the same on every
    rank (all ranks train on the same dataset at a step); each dataset is read in its own seeded
    permutation, cycled when a dataset is used more often than it has examples, and every step takes
    ``batch_size * world`` consecutive positions of it, rank ``r`` the ``r``-th slice. An epoch has
    as many steps as the concatenated datasets give (``ceil(n / (batch_size * world))``), so the run
    plan is unchanged; ``start_at`` resumes mid-epoch exactly (the sequence is recomputed, not stored)
    at the step the position falls in. After a world-size change the epoch continues at the same step
    of the new schedule (datasets are drawn with replacement, so "each example once" is not a
    property of this sampler; ratios and per-dataset permutations are).
    """

    def __init__(self, sizes, ratios, batch_size, num_replicas=1, rank=0, seed=0):
        self.sizes, self.ratios, self.batch_size = list(sizes), list(ratios), int(batch_size)
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        super().__init__(sum(sizes), num_replicas, rank, shuffle=True, seed=seed)

    def reshard(self, num_replicas, rank):
        super().reshard(num_replicas, rank)
        self.steps_per_epoch = -(-self.n // (self.batch_size * self.world))
        self.num_samples = self.steps_per_epoch * self.batch_size

    def schedule(self, epoch=None):
        """The dataset number of every step of ``epoch`` (default: the current one)."""
        epoch = self.epoch if epoch is None else epoch
        rng = random.Random(sample_seed(self.seed, epoch, -1))
        return rng.choices(range(len(self.sizes)), weights=self.ratios, k=self.steps_per_epoch)

    def _rank_skip(self):
        """This rank's samples in the steps before global position ``start`` (a step begun there, the
        epoch's clamped last one or one cut by a world-size change, counts as consumed)."""
        return -(-self.start // (self.batch_size * self.world)) * self.batch_size

    def indices(self):
        g = torch.Generator()
        perms, cursors, out = {}, [0] * len(self.sizes), []
        span = self.batch_size * self.world
        for d in self.schedule():
            if d not in perms:
                g.manual_seed(sample_seed(self.seed, self.epoch, d))
                perms[d] = torch.randperm(self.sizes[d], generator=g).tolist()
            perm, start = perms[d], cursors[d]
            chunk = [perm[(start + i) % len(perm)] for i in range(span)]
            cursors[d] = (start + span) % len(perm)
            mine = chunk[self.rank * self.batch_size:(self.rank + 1) * self.batch_size]
            out += [self.offsets[d] + j for j in mine]
        return out[self._rank_skip():]

    def __len__(self):
        return self.num_samples - self._rank_skip()


class SeededDataset(Dataset):
    """Loads ``dataset[index]`` under the sample's own seed, restoring the caller's RNG states."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self):
        return len(self.dataset)

    def __getattr__(self, name):  # record_bad_videos, end_of_pass, ... of the wrapped dataset
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key):
        index, seed = key
        if get_worker_info() is not None:  # a DataLoader worker: no caller RNG to protect
            _seed_all(seed)
            return self.dataset[index]
        saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
        random.seed(seed)
        np.random.seed(seed)
        torch.default_generator.manual_seed(seed)  # CPU generator only: torch.manual_seed is ~1000x slower
        try:
            return self.dataset[index]
        finally:
            random.setstate(saved[0])
            np.random.set_state(saved[1])
            torch.set_rng_state(saved[2])


def build_train_dataloader(dataset, sampler, batch_size, collate_fn=None, n_workers=0, seed=0, **settings):
    """DataLoader over :class:`SeededDataset` with its own generator (the global RNG is untouched).
    ``settings``: the run's ``clipbert_legacy.utils.loader_workers.loader_settings`` (workers, timeout,
    pin_memory); without them ``n_workers`` workers and no pinning."""
    g = torch.Generator()
    g.manual_seed(seed)
    settings = settings or worker_settings(n_workers)
    return DataLoader(SeededDataset(dataset), batch_size=batch_size, sampler=sampler,
                      collate_fn=collate_fn, drop_last=False, generator=g, **settings)
