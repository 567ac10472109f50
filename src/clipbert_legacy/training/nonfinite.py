"""A diverged run stops with one line naming the step and where the last good weights are.

A non-finite loss stops training before the optimizer step (under amp's dynamic loss scaling only after
a streak of them: amp skips such steps itself; ``clipbert_legacy.training.step.Diverged``); every rank sees
the same allreduced count, so all stop together. A run that reaches its last step with non-finite weights has
failed too and says so.
"""
from __future__ import annotations

import logging
from typing import NoReturn

from clipbert_legacy.training.checkpoint_files import ModelSaver
from clipbert_legacy.utils.errors import UserError

logger = logging.getLogger(__name__)


class NonFiniteLossError(UserError, RuntimeError):
    """Training stopped on a NaN/inf loss; the message names the step and the last good checkpoint."""


def stop_diverged(parts, state, n_bad: int) -> NoReturn:
    """The step raised ``Diverged`` (before its optimizer step): the last good weights to
    ``model_step_N.pt`` (rank 0), then :class:`NonFiniteLossError` naming the step and the files."""
    step = state.global_step
    saver = ModelSaver(parts.outputs.ckpt_dir)
    path = saver.path(step)
    weights = parts.checkpointer.model_state_dict()
    weights_ok = parts.checkpointer.weights_finite(weights)  # the same on every rank (identical weights)
    if parts.process.is_main and weights_ok:
        saver.save(weights, step)
    tolerated = parts.precision.tolerated_nonfinite_steps
    what = (f"{tolerated} consecutive steps with a non-finite loss under fp16" if tolerated
            else f"non-finite loss (nan/inf) in {n_bad} micro-batch(es)")
    saved = (f"last good weights (after step {step}) saved to {path}; " if weights_ok else
             f"the weights are no longer finite after step {step} and were not saved; ")
    restore = state.restore_saved_at
    msg = (f"training stopped at step {step + 1} (epoch {state.epoch}): {what}; {saved}"
           + (f"ckpt/restore.pt holds step {restore} to resume from; " if restore is not None
              else "no restore file yet; ")
           + "lower learning_rate, check the data or enable grad_norm clipping")
    logger.error(msg)
    raise NonFiniteLossError(msg)


def check_final_weights(parts, state) -> None:
    """A run that reaches its last step with non-finite weights (fp16 overflowing steps, fewer in a
    row than the tolerated streak) has failed: say so, and where the last finite weights are."""
    if parts.checkpointer.weights_finite():
        return
    saver = ModelSaver(parts.outputs.ckpt_dir)
    steps = saver.saved_steps()
    last = saver.path(steps[-1]) if steps else None
    saved = f"the last finite weights saved are {last}" if last else "no finite weights were saved"
    msg = (f"training ended at step {state.global_step} with non-finite weights (nan/inf), "
           f"{parts.precision.skipped_steps()} steps skipped by amp; they were not saved and {saved}; "
           f"lower learning_rate or enable grad_norm clipping, then rerun with --existing_run restart")
    logger.error(msg)
    raise NonFiniteLossError(msg)
