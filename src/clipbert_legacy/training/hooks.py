"""Periodic work around the training step, as hooks (the model is detectron2's ``engine/hooks.py``).

The contract (:class:`~clipbert_legacy.training.contracts.Hook`, what a step reports, what a hook may use of
the trainer) is ``clipbert_legacy.training.contracts``. The trainer runs ``before_train`` once, then around
every optimizer step ``before_step(trainer)`` and ``after_step(trainer, result)`` on each hook in order,
``after_train`` at the end, and ``close`` whether the run ended well or not. Its default hooks:

==========================  ==========  ==============================================================
hook                        collective  what it does
==========================  ==========  ==============================================================
:class:`Evaluation`         yes         every ``valid_steps`` and at the end: ``task.evaluate`` on every
                                        rank, the weights checked; the metrics into the event record,
                                        the validation to every hook's ``after_validation``
:class:`StepCheckpoints`    no          on a validation: ``model_step_N.pt``, ``keep_last_k/top_k``
:class:`BestCheckpoint`     no          on a validation: ``model_best.pt`` + ``log/best_metric.json``
:class:`EarlyStopping`      no          on a validation: patience (its own saved state),
                                        ``trainer.state.request_stop``
==========================  ==========  ==============================================================

then, with ``profile_steps``, the profiler (``clipbert_legacy.training.profiling.StepProfiler``), the task's
hooks (``Task.build_hooks``) and the ones passed to ``Trainer(cfg, task, hooks=[...])``, and last, in Horovod
elastic runs only, ``clipbert_legacy.training.elastic.ElasticCommit`` (it commits in the next step's
``before_step``, after the engine's end of the step).

No hook writes a log line of metrics, a TensorBoard scalar or the restore file: hooks put values into
the step's event record (``trainer.events``; ``clipbert_legacy.training.events``), and after every hook of the
step the engine hands the record to the writers and writes the restore file when it is due. Hooks read the
trainer only through ``TrainerView`` (``clipbert_legacy.training.contracts``), exchange results only through
``trainer.state`` (``clipbert_legacy.training.run_state``), keep what they need across a resume in their own
``state_dict``, and the validation hooks act in ``after_validation`` on the published record; so no default
hook depends on its place in the list (``tests/test_hooks.py`` runs them reversed and compares every file).
The one file a hook reads is ``log/metrics.jsonl``, once, when :class:`StepCheckpoints` resumes from a
restore file written before its ranking was saved state.

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

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.training.checkpoint_files import ModelSaver, atomic_write_text, checkpoints_to_keep
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.metrics_log import MetricsLog, read_metrics
from clipbert_legacy.training.run_state import ValidationRecord
from clipbert_legacy.utils.safe_open import remove_inside

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
class Evaluation(Hook):
    """Every ``valid_steps`` steps (the plan's) and at the end: ``task.evaluate`` on every rank (rank 0's
    metrics for all) and the weights checked for nan/inf; the metrics go into the event record (the
    writers log them) and the :class:`~clipbert_legacy.training.run_state.ValidationRecord` to
    ``trainer.publish_validation``, which runs every hook's ``after_validation``."""

    def after_step(self, trainer, _result):
        if trainer.global_step % trainer.plan.valid_steps == 0 or trainer.at_end:
            self.validate(trainer)

    def validate(self, trainer) -> dict[str, float]:
        step = trainer.global_step
        metrics = self.evaluate(trainer)
        trainer.events.put("valid", metrics)
        weights = trainer.checkpointer.gathered_weights()  # rank 0's fp32 weights (every rank takes part)
        finite = trainer.checkpointer.weights_finite(weights) if trainer.is_main else None
        finite = hvd.broadcast_object(finite, 0)
        if not finite:  # never a "checkpoint" or "best": inference on it would only mislead
            logger.warning("validation at step %d: the weights are not finite (nan/inf); model_step_%d.pt "
                           "and model_best.pt are not written", step, step)
        trainer.publish_validation(ValidationRecord(step, metrics, finite, weights))
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
    name = trainer.state.best.metric
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
    never the best or the latest. The ranking uses the validations of the run so far: its own saved
    state (:meth:`state_dict`), so a resumed run ranks the earlier files too. A restore file of the
    layout before that state existed seeds it once from ``log/metrics.jsonl``."""

    def __init__(self, keep_last_k: int, keep_top_k: int):
        self.keep_last_k, self.keep_top_k = keep_last_k, keep_top_k
        self.saver: ModelSaver | None = None
        self.history: dict[int, dict[str, float]] = {}  # step -> validation metrics
        self._restored = False  # load_state_dict gave the history

    def state_dict(self) -> dict:
        return {"history": {str(step): dict(m) for step, m in sorted(self.history.items())}}

    def load_state_dict(self, state: dict) -> None:
        self.history = {int(step): dict(m) for step, m in state["history"].items()}
        self._restored = True

    def before_train(self, trainer):
        if trainer.is_main:
            self.saver = ModelSaver(trainer.ckpt_dir)
            if trainer.global_step and not self._restored:  # a restore file of the earlier layout
                self.history.update({int(r["step"]): r for r in read_metrics(MetricsLog(trainer.log_dir).path,
                                                                             "valid")
                                     if r["step"] <= trainer.global_step})

    def after_validation(self, trainer, metrics):
        record = trainer.state.validation
        self.history[record.step] = metrics
        if not trainer.is_main:
            return
        if self.saver is None:  # this process became rank 0 (Horovod elastic)
            self.before_train(trainer)
        if record.weights_finite:
            self.saver.save(record.weights, record.step)
        if self.keep_last_k == -1 and self.keep_top_k == -1:
            return
        name = trainer.state.best.metric
        history = {s: m[name] for s, m in self.history.items() if name in m}
        steps = self.saver.saved_steps()
        keep = checkpoints_to_keep(steps, history, metric_mode(name, trainer.cfg.best_metric_mode),
                                   self.keep_last_k, self.keep_top_k, {trainer.state.best.step})
        for step in sorted(set(steps) - keep):
            # only files of this run (a step it validated) and regular files (remove_inside: never a link)
            if step not in self.history or not remove_inside(self.saver.path(step)):
                continue
            logger.info("removed %s (keep_last_k %d, keep_top_k %d)", self.saver.path(step),
                        self.keep_last_k, self.keep_top_k)


class BestCheckpoint(Hook):
    """The best value of ``trainer.state.best.metric`` so far: ``ckpt/model_best.pt`` and
    ``log/best_metric.json`` (rank 0 writes; every rank updates the state alike)."""

    def after_validation(self, trainer, metrics):
        record, best = trainer.state.validation, trainer.state.best
        name, value, mode = _best_metric(trainer, metrics)
        if not math.isfinite(value):
            logger.warning("validation at step %d: %s is %s, not a candidate for the best checkpoint",
                           record.step, name, value)
        prev = best.value
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
    the best checkpoint (:class:`BestCheckpoint`). Its patience is its own saved state
    (:meth:`state_dict`: the restore file carries it across a resume)."""

    def __init__(self, patience: int = -1, min_delta: float = 0.0):
        self.patience, self.min_delta = patience, min_delta
        self.bad_validations = 0  # validations in a row without an improvement that counts
        self.patience_ref: float | None = None  # the value of the last improvement that counted

    def state_dict(self) -> dict:
        return {"bad_validations": self.bad_validations, "patience_ref": self.patience_ref}

    def load_state_dict(self, state: dict) -> None:
        self.bad_validations, self.patience_ref = state["bad_validations"], state["patience_ref"]

    def significant(self, value: float, ref: float | None, mode: str) -> bool:
        """An improvement on ``ref`` by more than ``min_delta``; the first validation always is one."""
        if ref is None:
            return True
        return value - ref > self.min_delta if mode == "max" else ref - value > self.min_delta

    def after_validation(self, trainer, metrics):
        state = trainer.state
        name, value, mode = _best_metric(trainer, metrics)
        if _candidate(state.validation, value) and self.significant(value, self.patience_ref, mode):
            self.bad_validations, self.patience_ref = 0, value
            return
        self.bad_validations += 1
        if self.patience != -1 and self.bad_validations >= self.patience:
            best = state.best
            state.request_stop(f"early stopping: {name} has not improved on {best.value} (step {best.step}) "
                               f"for {self.patience} validations")
            logger.info("early stopping at step %d: %s has not improved on %s (step %s) for %d validations",
                        trainer.global_step, name, best.value, best.step, self.patience)
