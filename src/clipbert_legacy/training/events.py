"""One event record per step, and the writers that turn it into files (detectron2's ``EventStorage`` and
``EventWriter``s).

The engine puts the step's training scalars into :class:`EventRecord`, the ``Evaluation`` hook the
validation metrics, any hook its own scalars (``trainer.events.put("train", {...})``). After every hook
has run, the engine hands the step's :class:`StepEvents` to each writer, so what a file shows does not
depend on the order of the hooks:

=======================  ===================================================================
writer                   what it writes (rank 0)
=======================  ===================================================================
:class:`TensorBoard`     every scalar, every step (``train/*``, ``perf/*``, ``valid/*``)
:class:`LogLines`        log.txt: a training line every ``log_interval`` steps and at the end, a
                         line per validation
:class:`MetricsJsonl`    ``log/metrics.jsonl``: the same steps as the log lines, one JSON line each
:class:`ProgressBar`     a bar in a terminal, plain lines with an ETA under a launcher
``WandbLogger``          W&B (``wandb_project``; ``clipbert_legacy.training.wandb_logger``)
=======================  ===================================================================
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from clipbert_legacy.training.metrics_log import MetricsLog
from clipbert_legacy.utils.logger import make_tb_logger
from clipbert_legacy.utils.progress import Progress

logger = logging.getLogger(__name__)


@dataclass
class StepEvents:
    """What one step recorded: ``train`` scalars under their TensorBoard tags (``train/loss``,
    ``perf/examples_per_s``, ...) and, at a validation, the flat ``valid`` metrics."""

    step: int
    epoch: int
    train: dict[str, float] = field(default_factory=dict)
    valid: dict[str, float] | None = None


class EventRecord:
    """The values of the current step, kept until the writers have taken them (:meth:`take`)."""

    def __init__(self):
        self._current = StepEvents(0, 0)

    def begin(self, step: int, epoch: int) -> None:
        """A new step (the engine, after the optimizer step): what was put before is dropped."""
        self._current = StepEvents(step, epoch)

    def put(self, split: str, scalars: dict[str, float]) -> None:
        """Add ``scalars`` to the step's ``train`` or ``valid`` values (a later put of a name wins)."""
        if split == "train":
            self._current.train.update(scalars)
        elif split == "valid":
            self._current.valid = {**(self._current.valid or {}), **scalars}
        else:
            raise ValueError(f"split must be 'train' or 'valid', got {split!r}")

    def take(self) -> StepEvents:
        """The step's values, for the writers; the record is then empty until the next :meth:`begin`."""
        out, self._current = self._current, StepEvents(self._current.step, self._current.epoch)
        return out


class Writer:
    """Writes the event record somewhere (detectron2's ``EventWriter``); rank 0 only. Every method is a
    no-op by default."""

    def start(self, trainer) -> None:
        """Before the first step of this process (after resume: ``trainer.global_step`` is where it is)."""

    def write(self, events: StepEvents, trainer) -> None:
        """After every hook of a step."""

    def finish(self, trainer, summary: dict) -> None:
        """After the last step (not when the run stops on an error)."""

    def close(self) -> None:
        """Release files; called whether the run ended well or not."""


class TensorBoard(Writer):
    """Every scalar of every step to ``log/events.out.tfevents.*`` (nan/inf left out: the log lines
    show them)."""

    def __init__(self, log_dir: str):
        self.tb = make_tb_logger(log_dir, True)

    def write(self, events, _trainer):
        self.tb.log_scalar_dict(events.train, step=events.step)
        if events.valid is not None:
            self.tb.log_scalar_dict({f"valid/{k}": v for k, v in events.valid.items()}, step=events.step)

    def close(self):
        self.tb.close()


def logged_step(step: int, log_interval: int, stop_step: int) -> bool:
    """Training lines go to log.txt and metrics.jsonl every ``log_interval`` steps and at the last step."""
    return step % log_interval == 0 or step == stop_step


class LogLines(Writer):
    """log.txt (through the ``logging`` handler rank 0 added): the training line of the logged steps,
    one line per validation."""

    def __init__(self, log_interval: int):
        self.log_interval = log_interval

    def write(self, events, trainer):
        plan, s = trainer.plan, events.train
        if s and logged_step(events.step, self.log_interval, plan.stop_step):
            grad = f" grad_norm {s['train/grad_norm']:.3f}" if "train/grad_norm" in s else ""
            scale = (f" loss_scale {s['train/loss_scale']:g} skipped {int(s['train/skipped_steps'])}"
                     if "train/loss_scale" in s else "")
            logger.info("step %d/%d epoch %d: loss %.4f lr %.3g/%.3g%s%s %.1f ex/s data wait %.0f%% "
                        "allreduce wait %.0f%% mem %.0f MB", events.step, plan.num_train_steps, events.epoch,
                        s["train/loss"], s["train/lr_transformer"], s["train/lr_cnn"], grad, scale,
                        s["perf/examples_per_s"], 100 * s["perf/data_wait_ratio"],
                        100 * s["perf/comm_wait_ratio"], s["perf/memory_mb"])
        if events.valid is not None:
            logger.info("validation at step %d: %s", events.step,
                        ", ".join(f"{k} {v:.4f}" for k, v in events.valid.items()))


class MetricsJsonl(Writer):
    """``log/metrics.jsonl`` (``clipbert_legacy.training.metrics_log``): the logged training steps (tags
    without their ``train/`` / ``perf/`` prefix) and every validation. A resumed run first drops the lines
    after the step it resumes from."""

    def __init__(self, log_dir: str, log_interval: int):
        self.log, self.log_interval = MetricsLog(log_dir), log_interval

    def start(self, trainer):
        self.log.truncate_after(trainer.global_step)

    def write(self, events, trainer):
        if events.train and logged_step(events.step, self.log_interval, trainer.plan.stop_step):
            self.log.append("train", events.step, events.epoch,
                            {k.split("/", 1)[-1]: v for k, v in events.train.items()})
        if events.valid is not None:
            self.log.append("valid", events.step, events.epoch, events.valid)


class ProgressBar(Writer):
    """A live bar in a terminal, plain lines under a launcher (``clipbert_legacy.utils.progress``)."""

    def __init__(self):
        self._bar = None

    def start(self, trainer):
        self._bar = Progress(trainer.plan.stop_step, "train", initial=trainer.global_step)

    def write(self, events, _trainer):
        if self._bar is not None and events.train:
            self._bar.update(1, loss=events.train.get("train/loss", math.nan))

    def close(self):
        if self._bar is not None:
            self._bar.close()
            self._bar = None

