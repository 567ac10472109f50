"""What every task entry point shares: per-clip forwards, a base :class:`ClipBertTask`, loaders, ``main``.

ClipBERT copied this into every ``run_*.py``; here a task script subclasses :class:`ClipBertTask`
(datasets, evaluation, inference) and calls :func:`main`; the engine (src.training.engine) runs the loop.

* :func:`forward_clips` splits ``visual_inputs`` (B, n_clips*num_frm, 3, H, W) into clips and runs one
  model forward per clip (ClipBERT), returning stacked logits (n_clips, N, C).
* :class:`ClipBertTask`: ``build_model``, the training forward (pooled over clips with
  ``clip_aggregated_loss``; lse = ClipBERT's lse loss), the PrefetchLoader wrapping (normalisation on
  the device; ``None`` for a batch whose videos all failed, so ranks stay in step), eval loaders that
  shard across ranks without duplicates, and the inference bookkeeping (stored model config,
  checkpoint, result directory, ``raw_args.json`` / ``merged_args.json``).
* :func:`main`: parse the config (exit 2 on a bad value), train or ``--do_inference 1``, exit 1 with
  one line on a user-fixable error.
"""
import copy
import json
import logging
import os
import sys

import torch
from torch.utils.data import DataLoader

import src.compat.hvd as hvd
from src.config import parse_args_or_exit
from src.datasets.loaders import PrefetchLoader, build_img_norm
from src.modeling.build import build_model
from src.modeling.heads import aggregate_clip_logits, clip_aggregated_loss
from src.training.contracts import Hook
from src.training.engine import Trainer
from src.training.preemption import Preempted
from src.training.task import Task
from src.utils.device import training_device
from src.utils.distributed import all_gather_list
from src.utils.errors import UserError, one_line
from src.utils.loader_workers import loader_settings
from src.utils.logger import setup_logging
from src.utils.progress import Progress

logger = logging.getLogger(__name__)

__all__ = ["forward_clips", "clip_logits", "unwrap_model", "shard_indices", "ClipBertTask", "main"]


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


class LastEpochBadVideos(Hook):
    """Logs the bad-video summary of the last, partly read epoch (full epochs report at their end)."""

    def after_train(self, trainer, _summary):
        dataset = getattr(trainer.loader, "dataset", None)
        if trainer.state.examples_in_epoch and hasattr(dataset, "bad_video_report"):
            dataset.bad_video_report(reset=True, log=True)


class ClipBertTask(Task):
    """Base task over ClipBert: subclasses give ``name``, ``config``, ``build_train_data``, ``build_head``,
    ``evaluate`` and ``run_inference`` (src.tasks.registry)."""

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
        """The task head (``src.modeling.heads``: classifier shape, logits layout, loss) for ``cfg``."""
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

    # -- inference ---------------------------------------------------------------------------
    def prepare_inference(self, cfg, prefix="results"):
        """Stored model config applied (CLI inference settings kept), checkpoint resolved, model
        loaded. Nothing is written yet: :meth:`write_inference_outputs` writes the result dir (with
        ``raw_args.json`` / ``merged_args.json``) once inference has succeeded.

        Returns ``(model, result_dir)``.
        """
        from src.training.inference import (
            check_writable,
            checkpoint_mode,
            inference_result_dir,
            load_trained_model,
            prepare_inference_config,
        )
        if not cfg.output_dir and not cfg.e2e_weights_path:
            raise ValueError("--output_dir must point at the training run to run inference from (or give "
                             "--e2e_weights_path FILE to evaluate a checkpoint file)")
        if not cfg.inference_txt_db:
            raise ValueError("--inference_txt_db is not set: give the annotation file to run inference on")
        raw = copy.deepcopy(cfg.to_dict())
        prepare_inference_config(cfg)
        result_dir = inference_result_dir(cfg, prefix=prefix)
        check_writable(result_dir)
        model = load_trained_model(cfg, self)
        self._inference_args = {"raw_args.json": raw, "merged_args.json": copy.deepcopy(cfg.to_dict())}
        logger.info("inference: %s, %d clip(s), %s aggregation, results -> %s",
                    cfg.e2e_weights_path if checkpoint_mode(cfg) else f"step {cfg.inference_model_step}",
                    cfg.inference_n_clips, cfg.score_agg_func, result_dir)
        return model, result_dir

    def write_inference_outputs(self, result_dir, files):
        """Rank 0: the result dir with raw/merged args and ``files`` ({name: JSON object})."""
        from src.training.inference import write_inference_outputs
        write_inference_outputs(result_dir, {**self._inference_args, **files})

    def run_inference(self, cfg):  # required for --do_inference 1
        raise NotImplementedError


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


def gather_bad_videos(dataset):
    """Collective: the (key, reason) pairs of every rank's last evaluation pass, sorted, unique."""
    merged = set()
    for part in all_gather_list(list(getattr(dataset, "last_pass_bad", []))):
        merged.update(tuple(b) for b in part)
    return sorted(merged)


def skipped_videos_report(bad, evaluated):
    """``skipped_videos.json``: the videos left out (undecodable, ``skip_bad_videos 1``) and the
    denominators the metrics were computed over."""
    if bad:
        logger.warning("evaluation skipped %d undecodable video(s) (%s); metrics are over %s",
                       len(bad), ", ".join(k for k, _ in bad[:10]) + (" ..." if len(bad) > 10 else ""),
                       ", ".join(f"{k} {v}" for k, v in evaluated.items()))
    return {"count": len(bad), "keys": [{"key": k, "reason": r} for k, r in bad], "evaluated": evaluated}


# What a user can fix, printed as one line: bad files/values/keys, unusable output dirs and disks,
# unreadable checkpoints and LMDB stores, bad videos at evaluation, a diverged run (UserError family).
_USER_ERRORS = (UserError, FileNotFoundError, ValueError, KeyError, OSError)


def limit_cpu_threads():
    """Under a launcher with several processes per machine and no OMP_NUM_THREADS, give each process
    its share of the cores (torch would start one thread per core in every process)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    for key in ("HOROVOD_LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE"):
        if os.environ.get(key, "").isdigit() and int(os.environ[key]) > 1:
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ[key])))
            return


def batch_scheduling(enabled):
    """Put this process (and the threads and workers it starts later: Horovod's background thread,
    Gloo's loops, DataLoader workers) under SCHED_BATCH on a CPU-only Linux machine.

    Under the default policy every wake-up of a communication thread preempts a compute thread at
    once; with ranks filling the cores those preemptions (hundreds a second per rank under Horovod)
    cost a few percent of the step. SCHED_BATCH threads do not preempt on wake-up; the scheduler lets
    the running thread finish its slice. Call before ``hvd.init()``. Returns whether it was applied."""
    if not enabled or torch.cuda.is_available() or not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        # every thread so far (this one, and those torch and others started at import); threads
        # started later inherit the policy of the thread that starts them
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setscheduler(int(tid), os.SCHED_BATCH, os.sched_param(0))
            except ProcessLookupError:  # ended meanwhile
                pass
    except OSError as e:  # a container or seccomp policy may forbid it; nothing else depends on it
        logger.info("cpu_sched_batch: SCHED_BATCH not available here (%s); default scheduling", e)
        return False
    return True


def main(task, task_cls=None, argv=None):
    """Entry point: ``python src/tasks/run_x.py --config c.json [--key value ...]``.

    ``main(RetrievalTask)`` runs a task class that declares its ``name`` (src.tasks.registry);
    ``main("retrieval", RetrievalTask)`` gives the config task's name and the class separately.

    Trains (engine) unless ``--do_inference 1``; returns the process exit status: 0 ok, 1 a
    user-fixable error (one line ``error: Type: message`` on stderr; CLIPBERT_TRACEBACK=1 shows the
    traceback), 2 a bad config value, 75 stopped by SIGTERM/SIGUSR1/SIGINT after saving the restore
    file (src.training.preemption).
    """
    task_name, task_cls = (task, task_cls) if isinstance(task, str) else (task.name, task)
    limit_cpu_threads()
    cfg = parse_args_or_exit(task_name, argv)
    setup_logging()
    if batch_scheduling(cfg.cpu_sched_batch):
        logger.info("cpu_sched_batch: SCHED_BATCH for this CPU job (--cpu_sched_batch 0 to keep the default)")
    task = task_cls()
    try:
        if cfg.do_inference:
            with torch.no_grad():
                task.run_inference(cfg)
        else:
            summary = Trainer(cfg, task).train()
            logger.info("done: %s", json.dumps(summary, default=str))
    except Preempted as e:  # the restore file is written and the line logged (rank 0)
        return e.exit_status
    except _USER_ERRORS as e:
        if os.environ.get("CLIPBERT_TRACEBACK"):
            raise
        print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        return 1
    return 0
