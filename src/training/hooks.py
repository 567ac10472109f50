"""Periodic work around the training step, as hooks (the model is detectron2's ``engine/hooks.py``).

The contract (:class:`~src.training.contracts.Hook`, what a step reports, what a hook may use of the
trainer) is ``src.training.contracts``. The trainer runs ``before_train`` once, then after every
optimizer step ``after_step(trainer, result)`` on each hook in order, ``after_train`` at the end, and
``close`` whether the run ended well or not. Its default hooks:

==========================  ==========  ==============================================================
hook                        collective  what it does
==========================  ==========  ==============================================================
:class:`MetricsWriter`      no          TensorBoard scalars every step, a log.txt and metrics.jsonl line
                                        every ``log_interval`` steps and at the end, progress (rank 0)
:class:`Evaluation`         yes         every ``valid_steps`` and at the end: ``task.evaluate`` on every
                                        rank, publishes the result, calls every ``after_validation``
:class:`StepCheckpoints`    no          on a validation: ``model_step_N.pt``, ``keep_last_k/top_k``
:class:`BestCheckpoint`     no          on a validation: ``model_best.pt`` + ``log/best_metric.json``
:class:`EarlyStopping`      no          on a validation: patience, ``trainer.state.request_stop``
:class:`RestoreSaver`       yes         ``ckpt/restore.pt`` every ``save_steps`` (gathers RNG states)
==========================  ==========  ==============================================================

then the task's hooks (``Task.build_hooks``) and the ones passed to ``Trainer(cfg, task, hooks=[...])``,
and last, in elastic runs only, ``src.training.elastic.ElasticCommit``.

Hooks exchange results through ``trainer.state`` (``src.training.run_state``), never through files or
the trainer's fields, and no hook depends on another's place in the list: the validation hooks act in
``after_validation`` on the published record, and the engine itself writes the restore file of the step
that ends the run (the last step, an early stop or a stop signal) after every hook's ``after_step``.

A **collective** hook calls collective operations (allreduce, broadcast, gather): it must run on every
rank at the same steps, in the same order, or the job stalls until the launcher's timeout. Decide when
to act from values every rank agrees on (``trainer.global_step``, ``result`` — its numbers are
allreduced — and ``trainer.state``), never from rank-local state. A hook that raises ends its process;
``horovodrun`` and ``torchrun`` then stop the whole job (``tests/test_hooks.py`` checks it does not hang).
"""
from __future__ import annotations

import json
import logging
import math
import os

import torch

import src.compat.hvd as hvd
from src.training.checkpoint import ModelSaver, atomic_write_text, checkpoints_to_keep
from src.training.contracts import Hook
from src.training.metrics_log import MetricsLog, read_metrics
from src.training.run_state import ValidationRecord
from src.utils.progress import Progress

logger = logging.getLogger(__name__)


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


class Evaluation(Hook):
    """Every ``every`` steps and at the end: ``task.evaluate`` on every rank (rank 0's metrics for all),
    the weights checked for nan/inf, the metrics to TensorBoard, log.txt and ``log/metrics.jsonl``;
    then :class:`~src.training.run_state.ValidationRecord` in ``trainer.state.validation`` and every
    hook's ``after_validation``: the hooks below act on it there, so their order does not matter."""

    def __init__(self, every: int):
        self.every = every

    def after_step(self, trainer, _result):
        if trainer.global_step % self.every == 0 or trainer.at_end:
            self.validate(trainer)

    def validate(self, trainer) -> dict[str, float]:
        step = trainer.global_step
        metrics = self.evaluate(trainer)
        trainer.tb.log_scalar_dict({f"valid/{k}": v for k, v in metrics.items()}, step=step)
        logger.info("validation at step %d: %s", step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        if trainer.is_main:
            MetricsLog(trainer.log_dir).append("valid", step, trainer.epoch, metrics)
        # zero_stage with amp O2: every rank takes part in gathering the fp32 masters
        weights = trainer.model_state_dict() if trainer.is_main or trainer.sharding.stage else None
        finite = hvd.broadcast_object(trainer.weights_finite(weights) if trainer.is_main else None, 0)
        if not finite:  # never a "checkpoint" or "best": inference on it would only mislead
            logger.warning("validation at step %d: the weights are not finite (nan/inf); model_step_%d.pt "
                           "and model_best.pt are not written", step, step)
        trainer.state.publish_validation(ValidationRecord(step, metrics, finite, weights))
        try:
            for h in trainer.hooks:
                h.after_validation(trainer, metrics)
        finally:
            trainer.state.validation = None  # the fp32 copy of the weights is not kept beyond this step
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


def _best_metric(trainer, metrics: dict[str, float]) -> tuple[str, float, str]:
    """(name, value, mode) of the metric the best checkpoint and early stopping follow."""
    name = trainer.state.best["metric"]
    if name not in metrics:
        raise KeyError(f"best_metric={name!r} is not among the validation metrics "
                       f"({', '.join(sorted(metrics))}); set --best_metric to one of them")
    return name, metrics[name], metric_mode(name, trainer.cfg.best_metric_mode)


def _candidate(record, value: float) -> bool:
    """Finite weights and a finite metric: a validation that may be the best or reset patience."""
    return record.weights_finite and math.isfinite(value)


class StepCheckpoints(Hook):
    """``ckpt/model_step_N.pt`` at each validation with finite weights (rank 0), then the removal of those
    ``keep_last_k`` / ``keep_top_k`` do not keep (MMF's ``max_to_keep``, Lightning's ``save_top_k``):
    never the best or the latest. The ranking uses ``trainer.state.valid_history`` (seeded from
    ``log/metrics.jsonl`` when a run resumes, so the earlier files are ranked too)."""

    def __init__(self, keep_last_k: int, keep_top_k: int):
        self.keep_last_k, self.keep_top_k = keep_last_k, keep_top_k
        self.saver: ModelSaver | None = None

    def before_train(self, trainer):
        if trainer.is_main:
            self.saver = ModelSaver(trainer.ckpt_dir)
            if not trainer.state.valid_history:  # a resumed run: what it validated before
                trainer.state.valid_history.update(
                    {int(r["step"]): r for r in read_metrics(MetricsLog(trainer.log_dir).path, "valid")
                     if r["step"] <= trainer.global_step})

    def after_validation(self, trainer, _metrics):
        record = trainer.state.validation
        if not trainer.is_main:
            return
        if self.saver is None:  # this process became rank 0 (Horovod elastic)
            self.before_train(trainer)
        if record.weights_finite:
            self.saver.save(record.weights, record.step)
        if self.keep_last_k == -1 and self.keep_top_k == -1:
            return
        name = trainer.state.best["metric"]
        history = {s: m[name] for s, m in trainer.state.valid_history.items() if name in m}
        steps = self.saver.saved_steps()
        keep = checkpoints_to_keep(steps, history, metric_mode(name, trainer.cfg.best_metric_mode),
                                   self.keep_last_k, self.keep_top_k, {trainer.state.best["step"]})
        for step in sorted(set(steps) - keep):
            os.remove(self.saver.path(step))
            logger.info("removed %s (keep_last_k %d, keep_top_k %d)", self.saver.path(step),
                        self.keep_last_k, self.keep_top_k)


class BestCheckpoint(Hook):
    """The best value of ``trainer.state.best["metric"]`` so far: ``ckpt/model_best.pt`` and
    ``log/best_metric.json`` (rank 0 writes; every rank updates the state alike)."""

    def after_validation(self, trainer, metrics):
        record, best = trainer.state.validation, trainer.state.best
        name, value, mode = _best_metric(trainer, metrics)
        if not math.isfinite(value):
            logger.warning("validation at step %d: %s is %s, not a candidate for the best checkpoint",
                           record.step, name, value)
        prev = best["value"]
        if not _candidate(record, value) or not (prev is None or (value > prev if mode == "max"
                                                                  else value < prev)):
            return
        trainer.state.set_best(value, record.step)
        if trainer.is_main:
            ModelSaver(trainer.ckpt_dir).save_best(record.weights)
            atomic_write_text(os.path.join(trainer.log_dir, "best_metric.json"), json.dumps(
                {"metric": name, "value": value, "step": record.step, "mode": mode}, indent=4))


class EarlyStopping(Hook):
    """Stop after ``patience`` validations in a row without an improvement larger than ``min_delta``
    (MMF's and Lightning's definition; -1: never). The reference is the value at the last improvement
    that counted, so a run of small gains does not keep it alive; a smaller improvement still updates
    the best checkpoint (:class:`BestCheckpoint`)."""

    def __init__(self, patience: int = -1, min_delta: float = 0.0):
        self.patience, self.min_delta = patience, min_delta

    def significant(self, value: float, ref: float | None, mode: str) -> bool:
        """An improvement on ``ref`` by more than ``min_delta``; the first validation always is one."""
        if ref is None:
            return True
        return value - ref > self.min_delta if mode == "max" else ref - value > self.min_delta

    def after_validation(self, trainer, metrics):
        state = trainer.state
        name, value, mode = _best_metric(trainer, metrics)
        if _candidate(state.validation, value) and self.significant(value, state.best["patience_ref"], mode):
            state.reset_patience(value)
            return
        bad = state.count_bad_validation()
        if self.patience != -1 and bad >= self.patience:
            state.request_stop(f"early stopping: {name} has not improved on {state.best['value']} "
                               f"(step {state.best['step']}) for {self.patience} validations")
            logger.info("early stopping at step %d: %s has not improved on %s (step %s) for %d validations",
                        trainer.global_step, name, state.best["value"], state.best["step"], self.patience)


class RestoreSaver(Hook):
    """The restore file (``ckpt/restore.pt``) every ``every`` steps. The one of the step that ends the
    run is the engine's (``Trainer._end_of_step``), so an early stop decided by a later hook is saved."""

    def __init__(self, every: int):
        self.every = every

    def after_step(self, trainer, _result):
        if trainer.global_step % self.every == 0:
            trainer.save_restore()
