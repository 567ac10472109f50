"""The base of ClipBERT's tasks: :class:`ClipBertTask` and the per-clip forwards every task shares.

ClipBERT copied this into every ``run_*.py``; here a task subclasses :class:`ClipBertTask` (datasets,
head, evaluation, inference) and the engine (``clipbert_legacy.training.engine``) runs the loop.

* :func:`forward_clips` splits ``visual_inputs`` (B, n_clips*num_frm, 3, H, W) into clips and runs one
  model forward per clip (ClipBERT), returning stacked logits (n_clips, N, C).
* :class:`ClipBertTask`: ``build_model``, the training forward (pooled over clips with
  ``clip_aggregated_loss``; lse = ClipBERT's lse loss), the PrefetchLoader wrapping (normalisation on
  the device; ``None`` for a batch whose videos all failed, so ranks stay in step), eval loaders that
  shard across ranks without duplicates (:func:`progress_over` shows their progress), the bad-video
  hook (``clipbert_legacy.tasks.bad_videos``) and the inference steps
  (``clipbert_legacy.tasks.inference_io``).
"""
import torch
from torch.utils.data import DataLoader

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.datasets.loaders import PrefetchLoader, build_img_norm
from clipbert_legacy.modeling.build import build_model
from clipbert_legacy.modeling.heads import aggregate_clip_logits, clip_aggregated_loss
from clipbert_legacy.tasks.bad_videos import LastEpochBadVideos
from clipbert_legacy.tasks.inference_io import InferenceSteps
from clipbert_legacy.training.task import Task
from clipbert_legacy.utils.device import training_device
from clipbert_legacy.utils.loader_workers import loader_settings
from clipbert_legacy.utils.progress import Progress

__all__ = ["forward_clips", "clip_logits", "unwrap_model", "shard_indices", "progress_over", "ClipBertTask"]


def unwrap_model(model):
    """The ClipBert module behind DDP-style ``.module`` wrappers (for ``model.head``)."""
    while hasattr(model, "module") and not hasattr(model, "head"):
        model = model.module
    return model


def forward_clips(model, batch, n_clips, num_frm):
    """One forward per clip -> logits stacked (n_clips, N, C) (for MC heads (n_clips, B, n_options)).

    ``batch["visual_inputs"]`` is (B, n_clips*num_frm, 3, H, W), clips concatenated along T (batch
    contract). Labels are not passed to the per-clip forwards (ClipBERT computed and discarded them).
    """
    vis = batch["visual_inputs"]
    if vis.dim() != 5 or vis.shape[1] != n_clips * num_frm:
        raise ValueError(f"visual_inputs has shape {tuple(vis.shape)}, expected (B, n_clips*num_frm="
                         f"{n_clips}*{num_frm}, 3, H, W); check train_n_clips/inference_n_clips and num_frm")
    logits = []
    for k in range(n_clips):
        clip = dict(batch)
        clip["visual_inputs"] = vis[:, k * num_frm:(k + 1) * num_frm]
        clip["labels"] = None
        logits.append(model(clip)["logits"])
    return torch.stack(logits)


def clip_logits(model, batch, n_clips, num_frm, agg):
    """Clip-aggregated logits (N, C): mean / max / logsumexp (lse) over clips."""
    return aggregate_clip_logits(forward_clips(model, batch, n_clips, num_frm), agg)


def shard_indices(n, rank, world):
    """Indices ``rank::world`` of ``range(n)``: every item on exactly one rank (no sampler padding)."""
    return list(range(rank, n, world))


class ClipBertTask(InferenceSteps, Task):
    """Base task over ClipBert: subclasses give ``spec`` (and ``name = spec.name``), ``build_train_data``,
    ``build_head``, ``evaluate`` and ``run_inference`` (clipbert_legacy.tasks.registry)."""

    main_metric = "loss"
    _val = _val_key = None

    def val_data(self, build):
        """The validation data from ``build()``, built once (tokenizer, LMDB, annotations) per rank and
        world size: after a Horovod elastic change of workers each rank evaluates its new share."""
        key = (hvd.rank(), hvd.size())
        if self._val_key != key:
            self._val, self._val_key = build(), key
        return self._val

    # -- model / training --------------------------------------------------------------------
    def build_model(self, cfg):
        return build_model(cfg, head=self.build_head(cfg))

    def build_head(self, cfg):  # required (unless build_model is overridden)
        """The task head (``modeling.heads``: classifier shape, logits layout, loss) for ``cfg``."""
        raise NotImplementedError(f"{type(self).__name__} must define build_head(cfg) (or build_model)")

    def img_norm(self, cfg):
        if cfg.img_pixel_mean is None or cfg.img_pixel_std is None:
            raise ValueError("img_pixel_mean and img_pixel_std must be set (3 values each), e.g. "
                             "[123.675, 116.28, 103.53] and [1, 1, 1]")
        return build_img_norm(cfg.img_pixel_mean, cfg.img_pixel_std)

    def wrap_train_loader(self, loader, cfg, device):
        return PrefetchLoader(loader, self.img_norm(cfg), device, yield_empty=True)

    def build_hooks(self, _cfg):
        return [LastEpochBadVideos()]

    def forward_train(self, model, batch, cfg):
        stacked = forward_clips(model, batch, cfg.train_n_clips, cfg.num_frm)
        return clip_aggregated_loss(stacked, batch["labels"], cfg.score_agg_func, unwrap_model(model).head,
                                    batch["n_examples_list"])

    # -- evaluation helpers ------------------------------------------------------------------
    def build_eval_loader(self, dataset, collate_fn, cfg, batch_size, indices=None):
        """PrefetchLoader over ``dataset[indices]`` (default: this rank's ``shard_indices``), in order,
        normalised on the device. Batches whose videos all failed are skipped (evaluation only)."""
        if indices is None:
            indices = shard_indices(len(dataset), hvd.rank(), hvd.size())
        device = training_device()
        loader = DataLoader(dataset, batch_size=batch_size, sampler=indices, collate_fn=collate_fn,
                            drop_last=False, **loader_settings(cfg, device))
        return PrefetchLoader(loader, self.img_norm(cfg), device)


def progress_over(loader, desc):
    """Iterate ``loader`` with a progress display on rank 0 (a bar in a terminal, plain lines with ETA
    under a launcher): the cross-encoder scoring of every text x video pair is the slowest phase."""
    bar = Progress(len(loader) if hasattr(loader, "__len__") else None, desc, enabled=hvd.rank() == 0)
    try:
        for batch in loader:
            yield batch
            bar.update(1)
    finally:
        bar.close()
