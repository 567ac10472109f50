"""Where a run is and what it has decided: one object the engine and its hooks share.

detectron2's ``EventStorage`` is the model: hooks do not assign the trainer's fields; they read this
state and change it through its methods (:meth:`RunState.request_stop`, :meth:`RunState.set_best`, ...).
Everything in it is decided from values every rank agrees on (the step, allreduced losses, rank 0's
broadcast metrics), so it is the same on every rank. :meth:`RunState.counters` is what the restore file,
the Horovod elastic commit and the elastic sync carry. What only one hook needs (early stopping's
patience) is that hook's own ``state_dict``, not a field here (``clipbert_legacy.training.contracts.Hook``).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

RUNNING_LOSS_SMOOTHING = 0.99  # the logged training loss: exponentially smoothed (ClipBERT's RunningMeter)


@dataclass
class ValidationRecord:
    """One validation, published by the ``Evaluation`` hook for the hooks that act on it."""

    step: int
    metrics: dict[str, float]
    weights_finite: bool  # the weights (fp32 and those the model runs with) are all finite
    weights: dict | None  # rank 0: the fp32 weights that were evaluated (None on other ranks)


@dataclass
class Best:
    """The best validation so far of the metric the best checkpoint follows (``BestCheckpoint`` sets it)."""

    metric: str | None = None
    value: float | None = None
    step: int | None = None


@dataclass
class RunState:
    """The run's position, its best checkpoint, the smoothed loss, the stop request."""

    global_step: int = 0
    epoch: int = 0
    examples_in_epoch: int = 0  # of the epoch's permutation, consumed by all ranks together
    stop_reason: str | None = None  # set by request_stop: the run ends after this step
    best: Best = field(default_factory=Best)
    running_loss: float | None = None  # the training loss, smoothed over steps (what the logs show)
    validation: ValidationRecord | None = None  # the validation of the current step, while it is handled
    last_metrics: dict | None = None
    restore_saved_at: int | None = None  # the step the restore file was last written at
    nonfinite_streak: int = 0  # consecutive steps with a non-finite loss

    # ----------------------------------------------------------------------------- decisions
    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    def request_stop(self, reason: str) -> None:
        """End the run after the current step (its restore file is written then); the first reason wins."""
        if self.stop_reason is None:
            self.stop_reason = reason

    def finished_at(self, step: int, reason: str) -> None:
        """A stored run that finished at ``step`` (its restore files were deleted): nothing to train."""
        self.global_step = step
        self.request_stop(reason)

    def resume_stopped(self) -> None:
        """``existing_run extend``: a finished run trains on."""
        self.stop_reason = None

    def publish_validation(self, record: ValidationRecord | None) -> None:
        """The validation the hooks act on now (``None``: done with it; its weights are not kept)."""
        self.validation = record
        if record is not None:
            self.last_metrics = record.metrics

    def set_best(self, value: float, step: int) -> None:
        self.best.value, self.best.step = value, step

    def follow_metric(self, name: str) -> None:
        """The metric the best checkpoint and early stopping follow (``best_metric`` or the task's)."""
        self.best.metric = name

    def step_done(self, loss: float) -> None:
        """A step was taken: the counter, and the smoothed loss when ``loss`` is finite (nan != nan)."""
        self.global_step += 1
        if loss == loss and abs(loss) != float("inf"):
            prev = self.running_loss
            self.running_loss = loss if prev is None else \
                loss * (1 - RUNNING_LOSS_SMOOTHING) + prev * RUNNING_LOSS_SMOOTHING

    def count_nonfinite(self, n_bad: int) -> int:
        """The streak of consecutive steps with a non-finite loss, after this step's ``n_bad``."""
        self.nonfinite_streak = self.nonfinite_streak + 1 if n_bad else 0
        return self.nonfinite_streak

    def consumed(self, n_examples: int, epoch_size: int) -> None:
        """The data position moved by ``n_examples`` (all ranks), at most to the end of the epoch."""
        self.examples_in_epoch = min(self.examples_in_epoch + n_examples, epoch_size)

    def next_epoch(self) -> None:
        self.epoch += 1
        self.examples_in_epoch = 0

    def restore_written(self) -> None:
        self.restore_saved_at = self.global_step

    # ----------------------------------------------------------------------------- persistence
    def counters(self) -> dict:
        """The position and bookkeeping (no tensors), under the restore file's keys."""
        return {"global_step": self.global_step, "epoch": self.epoch,
                "examples_in_epoch": self.examples_in_epoch, "finished": self.finished,
                "stop_reason": self.stop_reason, "best": asdict(self.best),
                "nonfinite_streak": self.nonfinite_streak, "running_loss": self.running_loss}

    def load_counters(self, c: dict) -> None:
        self.global_step, self.epoch, self.examples_in_epoch = c["global_step"], c["epoch"], \
            c["examples_in_epoch"]
        self.stop_reason = c.get("stop_reason") or ("finished" if c["finished"] else None)
        self.best = Best(**{k: c["best"].get(k) for k in ("metric", "value", "step")})
        self.nonfinite_streak = c.get("nonfinite_streak", 0)
        self.running_loss = None if c.get("running_loss") is None else float(c["running_loss"])
