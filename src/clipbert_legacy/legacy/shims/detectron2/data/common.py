"""detectron2's dataset wrappers: ``DatasetFromList``, ``MapDataset`` (a ``None`` from the mapper means
"try another item"), ``AspectRatioGroupedDataset`` (batches of landscape or of portrait images)."""
import copy
import logging
import random

import torch.utils.data as data

__all__ = ["DatasetFromList", "MapDataset", "AspectRatioGroupedDataset"]

_MAX_RETRIES = 100


class DatasetFromList(data.Dataset):
    """A list as a dataset; ``copy`` returns a deep copy of each item (the mapper may change it)."""

    def __init__(self, lst, copy: bool = True, serialize: bool = True):  # noqa: ARG002 (detectron2's signature: kept as a list here)
        self._lst, self._copy = list(lst), copy

    def __len__(self):
        return len(self._lst)

    def __getitem__(self, idx):
        return copy.deepcopy(self._lst[idx]) if self._copy else self._lst[idx]


class MapDataset(data.Dataset):
    """``map_func(dataset[i])``; when it returns None another random item is tried (at most 100 times)."""

    def __init__(self, dataset, map_func):
        self._dataset, self._map_func = dataset, map_func
        self._rng = random.Random(42)

    def __len__(self):
        return len(self._dataset)

    def __getitem__(self, idx):
        cur = idx
        for attempt in range(_MAX_RETRIES):
            result = self._map_func(self._dataset[cur])
            if result is not None:
                return result
            if attempt % 3 == 2:
                logging.getLogger(__name__).warning("Failed to apply `_map_func` for idx: %d, retry count: %d",
                                                    idx, attempt + 1)
            cur = self._rng.randrange(len(self._dataset))
        raise RuntimeError(f"MapDataset: the mapper returned None for {_MAX_RETRIES} items in a row "
                           f"(starting at index {idx}); check the mapper and the data")


class AspectRatioGroupedDataset(data.IterableDataset):
    """Batches of ``batch_size`` dicts that all have width > height, or all not."""

    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size
        self._buckets = [[] for _ in range(2)]

    def __iter__(self):
        for d in self.dataset:
            bucket = self._buckets[0 if d["width"] > d["height"] else 1]
            bucket.append(d)
            if len(bucket) == self.batch_size:
                yield bucket[:]
                del bucket[:]
