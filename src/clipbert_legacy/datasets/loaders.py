"""The loader wrapper of the video tasks: batches moved to the device and normalised there, bad videos
reported. The DataLoaders themselves are built by the engine (training: ``clipbert_legacy.training.data``) and
by ``clipbert_legacy.tasks.base`` (evaluation), with the settings of
``clipbert_legacy.utils.loader_workers.loader_settings``."""
import logging

import torch

from clipbert_legacy.datasets.image_ops import ImageNorm
from clipbert_legacy.utils.device import move_to_device

logger = logging.getLogger(__name__)


def _sampler_of(loader):
    return getattr(loader, "sampler", None)


class PrefetchLoader:
    """Wrap a DataLoader: move each batch to `device` (on a side CUDA stream when on GPU), make
    `visual_inputs` float32 there (uint8 batches: ``img_resize`` "uint8") and normalise it with
    ImageNorm(img_pixel_mean, img_pixel_std), hand the batch's `bad_videos` to
    `dataset.record_bad_videos`, skip batches whose videos all failed, and call
    `dataset.end_of_pass()` after each pass (per-epoch bad-video summary; evaluation raises
    BadVideosError unless skip_bad_videos).

    Args: loader, img_norm (ImageNorm or None), device (the process's,
    ``clipbert_legacy.utils.device.training_device``),
    yield_empty: yield None for such a batch instead of skipping it (training: the engine then
    runs a zero-loss micro-step so every rank does the same number of steps).
    """

    def __init__(self, loader, img_norm, device, yield_empty=False):
        self.loader, self.img_norm = loader, img_norm
        self.yield_empty = bool(yield_empty)
        self.device = torch.device(device)
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
        v = batch["visual_inputs"].float()  # img_resize "uint8": the batch crossed the workers as uint8
        batch["visual_inputs"] = v if self.img_norm is None else self.img_norm(v)
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
