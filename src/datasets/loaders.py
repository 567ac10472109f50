"""DataLoader helpers: distributed sampling over hvd ranks (with set_epoch), an infinite iterator,
and a prefetching loader that moves batches to the device and normalises the pixels there."""
import logging

import torch
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from src.datasets.image_ops import ImageNorm
from src.utils.device import move_to_device
from src.utils.loader_workers import worker_settings

logger = logging.getLogger(__name__)


def build_dataloader(dataset, collate_fn, batch_size, is_train, num_workers=0, pin_memory=False,
                     seed=42, drop_last=False, num_replicas=None, rank=None):
    """DataLoader over a DistributedSampler(hvd.size(), hvd.rank(), shuffle=is_train, seed).

    Call `loader.sampler.set_epoch(epoch)` each epoch (InfiniteIterator and PrefetchLoader.set_epoch
    do it); ClipBERT never did, so every epoch had the same order. Workers get per-rank seeds.
    Before hvd.init() (plain single-process use) it behaves as size 1, rank 0.
    """
    import src.compat.hvd as hvd
    initialized = hvd.is_initialized()
    size = num_replicas if num_replicas is not None else (hvd.size() if initialized else 1)
    rank = rank if rank is not None else (hvd.rank() if initialized else 0)
    sampler = DistributedSampler(dataset, num_replicas=size, rank=rank, shuffle=is_train, seed=seed,
                                 drop_last=drop_last)
    gen = torch.Generator()
    gen.manual_seed(seed + 1000 * rank)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=pin_memory,
                      collate_fn=collate_fn, drop_last=drop_last, generator=gen, persistent_workers=False,
                      **worker_settings(num_workers))


def _sampler_of(loader):
    return getattr(loader, "sampler", None)


class InfiniteIterator:
    """Iterate a loader forever, calling sampler.set_epoch(epoch) before each pass."""

    def __init__(self, iterable, start_epoch=0):
        self.iterable, self.epoch = iterable, start_epoch

    def __iter__(self):
        while True:
            sampler = _sampler_of(self.iterable)
            if hasattr(self.iterable, "set_epoch"):
                self.iterable.set_epoch(self.epoch)
            elif hasattr(sampler, "set_epoch"):
                sampler.set_epoch(self.epoch)
            yield from self.iterable
            self.epoch += 1


class PrefetchLoader:
    """Wrap a DataLoader: move each batch to `device` (on a side CUDA stream when on GPU),
    normalise `visual_inputs` with ImageNorm(img_pixel_mean, img_pixel_std) there, hand the
    batch's `bad_videos` to `dataset.record_bad_videos`, skip batches whose videos all failed,
    and call `dataset.end_of_pass()` after each pass (per-epoch bad-video summary; evaluation
    raises BadVideosError unless skip_bad_videos).

    Args: loader, img_norm (ImageNorm or None), device (default: cuda if available else cpu),
    yield_empty: yield None for such a batch instead of skipping it (training: the engine then
    runs a zero-loss micro-step so every rank does the same number of steps).
    """

    def __init__(self, loader, img_norm=None, device=None, yield_empty=False):
        self.loader, self.img_norm = loader, img_norm
        self.yield_empty = bool(yield_empty)
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu"))
        self.dataset = getattr(loader, "dataset", None)
        self.sampler = _sampler_of(loader)
        self.batch_size = getattr(loader, "batch_size", None)

    def __len__(self):
        return len(self.loader)

    def set_epoch(self, epoch):
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _prepare(self, batch):
        bad = batch.pop("bad_videos", []) if isinstance(batch, dict) else []
        if bad and hasattr(self.dataset, "record_bad_videos"):
            self.dataset.record_bad_videos(bad)
        if not isinstance(batch, dict) or batch.get("visual_inputs") is None:
            return None
        batch = move_to_device(batch, self.device)
        if self.img_norm is not None:
            batch["visual_inputs"] = self.img_norm(batch["visual_inputs"].float())
        return batch

    def __iter__(self):
        if self.device.type == "cuda":
            yield from self._iter_cuda()
        else:
            for batch in self.loader:
                batch = self._prepare(batch)
                if batch is not None or self.yield_empty:
                    yield batch
        if hasattr(self.dataset, "end_of_pass"):
            self.dataset.end_of_pass()

    def _iter_cuda(self):
        stream = torch.cuda.Stream(device=self.device)
        nxt = None
        for batch in self.loader:
            with torch.cuda.stream(stream):
                cur = self._prepare(batch)
            if nxt is not None:
                yield nxt
                nxt = None
            if cur is None:
                if self.yield_empty:
                    yield None
                continue
            torch.cuda.current_stream(self.device).wait_stream(stream)
            for v in cur.values():
                if isinstance(v, torch.Tensor):
                    v.record_stream(torch.cuda.current_stream(self.device))
            nxt = cur
        if nxt is not None:
            yield nxt

    def __getattr__(self, name):
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)


def build_img_norm(img_pixel_mean, img_pixel_std):
    return ImageNorm(img_pixel_mean, img_pixel_std)
