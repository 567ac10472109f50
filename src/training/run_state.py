"""Where a run is and what it has decided: one object the engine and its hooks share.

detectron2's ``EventStorage`` is the model: hooks do not assign the trainer's fields; they read this
state and change it through its methods (:meth:`RunState.request_stop`, :meth:`RunState.set_best`, ...).
Everything in it is decided from values every rank agrees on (the step, allreduced losses, rank 0's
broadcast metrics), so it is the same on every rank. :meth:`RunState.counters` is what the restore file,
the Horovod elastic commit and the elastic sync carry (the keys of older restore files are kept).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ValidationRecord:
    """One validation, published by the ``Evaluation`` hook for the hooks that act on it."""

    step: int
    metrics: dict[str, float]
    weights_finite: bool  # the weights (fp32 and those the model runs with) are all finite
    weights: dict | None  # rank 0: the fp32 weights that were evaluated (None on other ranks)


@dataclass
class RunState:
    """The run's position, its best checkpoint, early-stopping patience and stop request."""

    global_step: int = 0
    epoch: int = 0
    examples_in_epoch: int = 0  # of the epoch's permutation, consumed by all ranks together
    stop_reason: str | None = None  # set by request_stop: the run ends after this step
    best: dict = field(default_factory=lambda: {"metric": None, "value": None, "step": None,
                                                "bad_validations": 0, "patience_ref": None})
    validation: ValidationRecord | None = None  # the validation of the current step, while it is handled
    last_metrics: dict | None = None
    valid_history: dict[int, dict[str, float]] = field(default_factory=dict)  # step -> metrics
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

    def publish_validation(self, record: ValidationRecord) -> None:
        self.validation = record
        self.last_metrics = record.metrics
        self.valid_history[record.step] = record.metrics

    def set_best(self, value: float, step: int) -> None:
        self.best.update(value=value, step=step)

    def reset_patience(self, ref: float) -> None:
        """An improvement that counts: patience starts again from ``ref``."""
        self.best.update(patience_ref=ref, bad_validations=0)

    def count_bad_validation(self) -> int:
        """One more validation without an improvement that counts; returns how many in a row."""
        self.best["bad_validations"] += 1
        return self.best["bad_validations"]

    # ----------------------------------------------------------------------------- persistence
    def counters(self) -> dict:
        """The position and bookkeeping (no tensors), under the restore file's keys."""
        return {"global_step": self.global_step, "epoch": self.epoch,
                "examples_in_epoch": self.examples_in_epoch, "finished": self.finished,
                "stop_reason": self.stop_reason, "best": dict(self.best),
                "nonfinite_streak": self.nonfinite_streak}

    def load_counters(self, c: dict) -> None:
        self.global_step, self.epoch, self.examples_in_epoch = c["global_step"], c["epoch"], \
            c["examples_in_epoch"]
        self.stop_reason = c.get("stop_reason") or ("finished" if c["finished"] else None)
        self.best.update(c["best"])
        if "patience_ref" not in c["best"]:  # a restore file older than min_delta: patience ran from the best
            self.best["patience_ref"] = self.best["value"]
        self.nonfinite_streak = c.get("nonfinite_streak", 0)
