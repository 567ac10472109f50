"""A diverged run stops with one line naming the step and where the last good weights are.

A non-finite loss stops training before the optimizer step (under amp's dynamic loss scaling only after
a streak of them: amp skips such steps itself); every rank sees the same allreduced count, so all stop
together. A run that reaches its last step with non-finite weights has failed too and says so.
"""
from __future__ import annotations

import logging

from src.training.checkpoint import ModelSaver
from src.utils.errors import UserError

logger = logging.getLogger(__name__)


class NonFiniteLossError(UserError, RuntimeError):
    """Training stopped on a NaN/inf loss; the message names the step and the last good checkpoint."""


def check_finite(trainer, n_bad: int) -> None:
    """Count the streak of steps with non-finite micro-batches; stop when it exceeds what the
    precision tolerates."""
    state = trainer.state
    state.nonfinite_streak = state.nonfinite_streak + 1 if n_bad else 0
    if n_bad and state.nonfinite_streak > trainer.precision.tolerated_nonfinite_steps:
        _abort(trainer, n_bad)


def _abort(trainer, n_bad: int) -> None:
    step = trainer.global_step
    saver = ModelSaver(trainer.ckpt_dir)
    path = saver.path(step)
    state = trainer.model_state_dict()
    weights_ok = trainer.weights_finite(state)  # the same on every rank: the weights are identical
    if trainer.is_main and weights_ok:
        saver.save(state, step)
    tolerated = trainer.precision.tolerated_nonfinite_steps
    what = (f"{tolerated} consecutive steps with a non-finite loss under fp16" if tolerated
            else f"non-finite loss (nan/inf) in {n_bad} micro-batch(es)")
    saved = (f"last good weights (after step {step}) saved to {path}; " if weights_ok else
             f"the weights are no longer finite after step {step} and were not saved; ")
    restore = trainer.state.restore_saved_at
    msg = (f"training stopped at step {step + 1} (epoch {trainer.epoch}): {what}; {saved}"
           + (f"ckpt/restore.pt holds step {restore} to resume from; " if restore is not None
              else "no restore file yet; ")
           + "lower learning_rate, check the data or enable grad_norm clipping")
    logger.error(msg)
    raise NonFiniteLossError(msg)


def check_final_weights(trainer) -> None:
    """A run that reaches its last step with non-finite weights (fp16 overflowing steps, fewer in a
    row than the tolerated streak) has failed: say so, and where the last finite weights are."""
    if trainer.weights_finite():
        return
    saver = ModelSaver(trainer.ckpt_dir)
    steps = saver.saved_steps()
    last = saver.path(steps[-1]) if steps else None
    saved = f"the last finite weights saved are {last}" if last else "no finite weights were saved"
    msg = (f"training ended at step {trainer.global_step} with non-finite weights (nan/inf), "
           f"{trainer.precision.skipped_steps()} steps skipped by amp; they were not saved and {saved}; "
           f"lower learning_rate or enable grad_norm clipping, then rerun with --existing_run restart")
    logger.error(msg)
    raise NonFiniteLossError(msg)
