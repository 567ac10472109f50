"""Periodic work around the training step, as hooks (the model is detectron2's ``engine/hooks.py``).

The trainer runs ``before_train`` once, then after every optimizer step ``after_step(trainer, result)``
on each hook in order, ``after_train`` at the end, and ``close`` whether the run ended well or not.
Its default hooks, in this order:

==================  ==========  ====================================================================
hook                collective  what it does
==================  ==========  ====================================================================
:class:`MetricsWriter`   no     TensorBoard scalars every step, a log.txt line every ``log_interval``
                                steps and at the end, the tqdm bar (rank 0 writes; others do nothing)
:class:`Validation`      yes    every ``valid_steps`` and at the end: ``task.evaluate`` on every rank,
                                ``model_step_N.pt``, best checkpoint, early stopping
:class:`RestoreSaver`    yes    every ``save_steps``, at the end and when stopping early: the restore
                                file (gathers every rank's RNG state)
==================  ==========  ====================================================================

then the task's hooks (``Task.build_hooks``) and the ones passed to ``Trainer(cfg, task, hooks=[...])``,
and last, in elastic runs only, ``src.training.elastic.ElasticCommit`` (collective: every
``elastic_commit_steps``, Horovod's commit or, under ``torchrun --max-restarts``, the restore file).

A **collective** hook calls collective operations (allreduce, broadcast, gather): it must run on every
rank at the same steps, in the same order, or the job stalls until the launcher's timeout. Decide when
to act from values every rank agrees on (``trainer.global_step``, ``result`` — its numbers are
allreduced), never from rank-local state. A hook that raises ends its process; ``horovodrun`` and
``torchrun`` then stop the whole job (``tests/test_hooks.py`` checks it does not hang).
"""
from __future__ import annotations

import json
import logging
import math
import os
from typing import TYPE_CHECKING

import torch

import src.compat.hvd as hvd
from src.training.checkpoint import checkpoints_to_keep
from src.training.metrics_log import MetricsLog, read_metrics
from src.utils.progress import Progress

if TYPE_CHECKING:
    from src.training.engine import StepResult, Trainer

logger = logging.getLogger(__name__)


class Hook:
    """Subclass and override what you need; every method is a no-op by default."""

    #: True if the hook calls collectives (see the module docstring); informational for readers/tools
    collective = False

    def before_train(self, trainer: Trainer) -> None:
        """After set-up (model, data, resume) and before the first step of this process."""

    def after_step(self, trainer: Trainer, result: StepResult) -> None:
        """After each optimizer step; ``trainer.global_step`` is the step just taken."""

    def after_validation(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        """After each validation (called by :class:`Validation` with the flattened metrics)."""

    def after_train(self, trainer: Trainer, summary: dict) -> None:
        """After the last step (not called when the run stops on an error)."""

    def close(self) -> None:
        """Release what the hook holds (files, progress bars); called when ``train()`` returns or raises."""


def flatten_metrics(d: dict, prefix: str = "") -> dict[str, float]:
    """``{"text2video": {"r1": 5}}`` -> ``{"text2video_r1": 5.0}``; non-numbers are dropped."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}_{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten_metrics(v, key))
        elif isinstance(v, (bool, int, float)):
            out[key] = float(v)
        elif torch.is_tensor(v) and v.numel() == 1:
            out[key] = float(v.item())
    return out


def metric_mode(name: str, mode: str = "auto") -> str:
    """'min' for losses and ranks (medianR/meanR), else 'max', unless ``mode`` says."""
    if mode != "auto":
        return mode
    low = name.lower()
    return "min" if low.endswith(("loss", "medianr", "meanr")) else "max"


# ------------------------------------------------------------------------------------------------
class MetricsWriter(Hook):
    """Training scalars to TensorBoard (every step), log.txt (every ``log_interval``), progress (rank 0)."""

    def __init__(self, log_interval: int):
        self.log_interval = log_interval
        self._pbar = self._mlog = None

    def before_train(self, trainer):
        if trainer.is_main:  # a live bar in a terminal, plain lines under a launcher (src.utils.progress)
            self._pbar = Progress(trainer.plan.stop_step, "train", initial=trainer.global_step)
            self._mlog = MetricsLog(trainer.log_dir)
            self._mlog.truncate_after(trainer.global_step)

    def after_step(self, trainer, result):
        logs = self.scalars(trainer, result)
        trainer.tb.log_scalar_dict(logs, step=trainer.global_step)  # nan/inf: in the log line, not in TB
        step = trainer.global_step
        if result.n_nonfinite:  # every such step, not only every log_interval: divergence must show
            what = (f"amp skipped the step (loss scale now {result.loss_scale:g}, {result.skipped_total} "
                    f"steps skipped so far)" if result.skipped else "the weights were updated")
            logger.warning("step %d: the loss of %d micro-batch(es) is not finite (nan/inf); %s", step,
                           result.n_nonfinite, what)
        if step % self.log_interval == 0 or step == trainer.plan.stop_step:
            logger.info("step %d/%d epoch %d: loss %.4f lr %.3g/%.3g%s%s %.1f ex/s data wait %.0f%% "
                        "allreduce wait %.0f%% mem %.0f MB",
                        step, trainer.plan.num_train_steps, trainer.epoch, logs["train/loss"],
                        result.lr_transformer, result.lr_cnn,
                        f" grad_norm {result.grad_norm:.3f}" if result.grad_norm is not None else "",
                        f" loss_scale {result.loss_scale:g} skipped {result.skipped_total}"
                        if result.loss_scale is not None else "",
                        logs["perf/examples_per_s"], 100 * logs["perf/data_wait_ratio"],
                        100 * logs["perf/comm_wait_ratio"], logs["perf/memory_mb"])
            if self._mlog is not None:
                self._mlog.append("train", step, trainer.epoch,
                                  {k.split("/", 1)[1]: v for k, v in logs.items()})
        if self._pbar is not None:
            self._pbar.update(1, loss=logs["train/loss"])

    @staticmethod
    def scalars(trainer, result) -> dict[str, float]:
        running = trainer.running_loss.val
        logs = {"train/loss": running if running is not None else result.loss,
                "train/lr_transformer": result.lr_transformer, "train/lr_cnn": result.lr_cnn}
        if result.grad_norm is not None:
            logs["train/grad_norm"] = result.grad_norm
        if result.loss_scale is not None:
            logs["train/loss_scale"] = result.loss_scale
            logs["train/skipped_steps"] = result.skipped_total
        logs["train/nonfinite_microbatches"] = result.n_nonfinite
        for k, v in result.extras.items():
            logs[f"train/{k}"] = float(v)
        seconds = max(result.seconds, 1e-9)
        logs["perf/examples_per_s"] = result.n_examples * trainer.world / seconds
        logs["perf/data_wait_ratio"] = result.data_wait / seconds
        logs["perf/comm_wait_ratio"] = result.comm_wait / seconds
        logs["perf/memory_mb"] = result.memory_mb  # peak CUDA memory of the step, or the CPU RSS
        return logs

    def close(self):
        if self._pbar is not None:
            self._pbar.close()
            self._pbar = None


class Validation(Hook):
    """Every ``every`` steps and at the end: evaluate, save ``model_step_N.pt``, track the best value of
    ``trainer.best["metric"]`` (``model_best.pt`` + ``log/best_metric.json``), stop early after
    ``patience`` validations without an improvement larger than ``min_delta`` (-1: never). A smaller
    improvement still updates the best checkpoint; it only does not reset patience."""

    collective = True

    def __init__(self, every: int, patience: int = -1, min_delta: float = 0.0):
        self.every, self.patience, self.min_delta = every, patience, min_delta

    def significant(self, value: float, ref: float | None, mode: str) -> bool:
        """An improvement on ``ref`` (the value at the last reset of patience) by more than
        ``min_delta`` (MMF's and Lightning's definition); the first validation always is one."""
        if ref is None:
            return True
        return value - ref > self.min_delta if mode == "max" else ref - value > self.min_delta

    def after_step(self, trainer, result):
        if trainer.global_step % self.every == 0 or trainer.at_end:
            self.validate(trainer)

    def validate(self, trainer) -> dict[str, float]:
        metrics = self.evaluate(trainer)
        trainer.last_metrics = metrics
        trainer.tb.log_scalar_dict({f"valid/{k}": v for k, v in metrics.items()}, step=trainer.global_step)
        logger.info("validation at step %d: %s", trainer.global_step,
                    ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if trainer.is_main:
            MetricsLog(trainer.log_dir).append("valid", trainer.global_step, trainer.epoch, metrics)
        # zero_stage with amp O2: every rank takes part in gathering the fp32 masters
        state = trainer.model_state_dict() if trainer.is_main or trainer.sharding.stage else None
        finite = hvd.broadcast_object(trainer.weights_finite(state) if trainer.is_main else None, root_rank=0)
        if not finite:  # never a "checkpoint" or "best": inference on it would only mislead
            logger.warning("validation at step %d: the weights are not finite (nan/inf); model_step_%d.pt "
                           "and model_best.pt are not written", trainer.global_step, trainer.global_step)
        elif trainer.is_main:
            trainer.saver.save(state, trainer.global_step)
        self.update_best(trainer, metrics, state, finite)
        for h in trainer.hooks:
            h.after_validation(trainer, metrics)
        return metrics

    @staticmethod
    def evaluate(trainer) -> dict[str, float]:
        """``task.evaluate`` in eval mode under no_grad on every rank; rank 0's result for all."""
        model = trainer.model
        model.eval()
        with torch.no_grad():
            metrics = trainer.task.evaluate(model, trainer.cfg, trainer.global_step)
        model.train()
        return hvd.broadcast_object(flatten_metrics(metrics or {}), root_rank=0)

    def update_best(self, trainer, metrics, state, weights_finite=True):
        """Collective decision (every rank updates ``trainer.best`` alike); rank 0 writes the files."""
        best = trainer.best
        name = best["metric"]
        if name not in metrics:
            raise KeyError(f"best_metric={name!r} is not among the validation metrics "
                           f"({', '.join(sorted(metrics))}); set --best_metric to one of them")
        value, prev = metrics[name], best["value"]
        mode = metric_mode(name, trainer.cfg.best_metric_mode)
        candidate = weights_finite and math.isfinite(value)
        if not math.isfinite(value):
            logger.warning("validation at step %d: %s is %s, not a candidate for the best checkpoint",
                           trainer.global_step, name, value)
        if candidate and (prev is None or (value > prev if mode == "max" else value < prev)):
            best.update(value=value, step=trainer.global_step)
            if trainer.is_main:
                trainer.saver.save_best(state)
                with open(os.path.join(trainer.log_dir, "best_metric.json"), "w") as f:
                    json.dump({"metric": name, "value": value, "step": trainer.global_step, "mode": mode},
                              f, indent=4)
        # the reference of patience; restore files written before min_delta existed have none: the best
        ref = best.get("patience_ref") if best.get("patience_ref") is not None else prev
        if candidate and self.significant(value, ref, mode):
            best.update(patience_ref=value, bad_validations=0)
            return
        best["bad_validations"] += 1
        if self.patience != -1 and best["bad_validations"] >= self.patience:
            logger.info("early stopping at step %d: %s has not improved on %s (step %s) for %d "
                        "validations", trainer.global_step, name, best["value"], best["step"], self.patience)
            trainer.finished = True


class CheckpointRetention(Hook):
    """After each validation, delete the ``model_step_*.pt`` that ``keep_last_k`` / ``keep_top_k`` do
    not keep (MMF's ``max_to_keep``, Lightning's ``save_top_k``); never the best or the latest. The
    metric history comes from ``log/metrics.jsonl``, so a resumed run ranks the earlier files too."""

    def __init__(self, keep_last_k: int, keep_top_k: int):
        self.keep_last_k, self.keep_top_k = keep_last_k, keep_top_k

    def after_validation(self, trainer, metrics):
        if not trainer.is_main or (self.keep_last_k == -1 and self.keep_top_k == -1):
            return
        name = trainer.best["metric"]
        history = {int(r["step"]): r[name] for r in read_metrics(MetricsLog(trainer.log_dir).path, "valid")
                   if name in r}
        steps = trainer.saver.saved_steps()
        keep = checkpoints_to_keep(steps, history, metric_mode(name, trainer.cfg.best_metric_mode),
                                   self.keep_last_k, self.keep_top_k, {trainer.best["step"]})
        for step in sorted(set(steps) - keep):
            os.remove(trainer.saver.path(step))
            logger.info("removed %s (keep_last_k %d, keep_top_k %d)", trainer.saver.path(step),
                        self.keep_last_k, self.keep_top_k)


class RestoreSaver(Hook):
    """The restore file (``ckpt/restore.pt``) every ``every`` steps and when the run is finished."""

    collective = True

    def __init__(self, every: int):
        self.every = every

    def after_step(self, trainer, result):
        if trainer.global_step % self.every == 0 or trainer.finished:
            trainer.save_restore()
