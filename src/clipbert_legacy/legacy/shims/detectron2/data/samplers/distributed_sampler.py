"""detectron2's ``TrainingSampler`` (an endless shuffled stream of indices, each rank taking every
world-size-th one) and ``InferenceSampler`` (a contiguous shard per rank)."""
import itertools

import torch
from torch.utils.data.sampler import Sampler

from clipbert_legacy.legacy.shims._unsupported import unsupported_class

from ...utils import comm

__all__ = ["TrainingSampler", "InferenceSampler", "RepeatFactorTrainingSampler"]

RepeatFactorTrainingSampler = unsupported_class("detectron2.data.samplers.RepeatFactorTrainingSampler",
                                                "category-frequency sampling of detector data")


class TrainingSampler(Sampler):
    def __init__(self, size: int, shuffle: bool = True, seed=None):
        if size <= 0:
            raise ValueError(f"TrainingSampler needs a positive dataset size, got {size}")
        self._size, self._shuffle = size, shuffle
        self._seed = int(comm.shared_random_seed() if seed is None else seed)
        self._rank, self._world_size = comm.get_rank(), comm.get_world_size()

    def __iter__(self):
        yield from itertools.islice(self._infinite_indices(), self._rank, None, self._world_size)

    def _infinite_indices(self):
        g = torch.Generator()
        g.manual_seed(self._seed)
        while True:
            if self._shuffle:
                yield from torch.randperm(self._size, generator=g).tolist()
            else:
                yield from range(self._size)


class InferenceSampler(Sampler):
    def __init__(self, size: int):
        self._size = size
        rank, world = comm.get_rank(), comm.get_world_size()
        shard = (size - 1) // world + 1 if size > 0 else 0
        begin = shard * rank
        self._local_indices = range(begin, min(shard * (rank + 1), size))

    def __iter__(self):
        yield from self._local_indices

    def __len__(self):
        return len(self._local_indices)
