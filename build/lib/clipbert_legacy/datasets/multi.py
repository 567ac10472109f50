"""Several training datasets of one task as one index space, for ClipBERT's MetaLoader.

ClipBERT's pretraining drew each step's batch from one of its ``train_datasets`` in proportion to
their ``ratio``. :class:`MultiDataset` concatenates the datasets (index ``offsets[d] + j`` is example
``j`` of dataset ``d``) and keeps their sizes and ratios; ``clipbert_legacy.training.data.MetaSampler`` then
chooses the dataset of every batch. Bad videos are counted over all of them.
"""
import bisect
import logging

from torch.utils.data import Dataset

from clipbert_legacy.datasets.dataset_base import BadVideoLog

logger = logging.getLogger(__name__)


class MultiDataset(BadVideoLog, Dataset):
    def __init__(self, datasets, ratios, names):
        if not (len(datasets) == len(ratios) == len(names)) or not datasets:
            raise ValueError("MultiDataset needs as many ratios and names as datasets (at least one)")
        bad = [(n, r) for n, r in zip(names, ratios) if not r > 0]
        if bad:
            raise ValueError(f"train_datasets ratio must be > 0; got {bad}")
        self.datasets, self.ratios, self.names = list(datasets), [float(r) for r in ratios], list(names)
        self.sizes = [len(d) for d in self.datasets]
        empty = [n for n, size in zip(names, self.sizes) if size == 0]
        if empty:
            raise ValueError(f"train_datasets {empty} have no examples")
        self.offsets = [sum(self.sizes[:i]) for i in range(len(self.sizes))]
        self.init_bad_video_log("+".join(names), is_train=True, skip_bad_videos=True)

    @classmethod
    def join(cls, parts):
        """From ``[(dataset, ratio, name)]`` (one per ``train_datasets`` entry), with a log line."""
        logger.info("%d training datasets, each batch from one, drawn by ratio: %s", len(parts),
                    ", ".join(f"{n} ({len(d)} examples, ratio {r:g})" for d, r, n in parts))
        return cls(*(list(x) for x in zip(*parts)))

    def __len__(self):
        return sum(self.sizes)

    def locate(self, index):
        """(dataset number, index inside it) of a global index."""
        d = bisect.bisect_right(self.offsets, index) - 1
        return d, index - self.offsets[d]

    def __getitem__(self, index):
        d, j = self.locate(index)
        return self.datasets[d][j]
