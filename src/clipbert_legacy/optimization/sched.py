"""Learning-rate schedules with ClipBERT's formulas (``get_lr_sched``, legacy signature).

``step`` is the 1-based global step, ``T = num_train_steps``, ``W = int(warmup_ratio * T)``; every
schedule returns ``learning_rate * factor`` and any value <= 0 becomes 1e-8 (as ClipBERT).

* linear:     ``step/W`` while ``step < W``, else ``max(0, (T-step)/(T-W))``.
* invsqrt:    ``step/W`` while ``step <= W``, else ``sqrt(W)/sqrt(step)``.
* constant:   1.
* multi_step: ``0.5**i``, ``i`` = number of sorted milestones ``<=`` the epoch.
* cosine:     linear warm-up, then ``0.5*(1+cos(pi*(step-W)/(T-W)))`` (new; not in ClipBERT).

Fixed ClipBERT bugs (documented differences):

* multi_step past the last milestone gave ``0.5**(len+1)``, skipping one factor; here ``0.5**len``.
* invsqrt with ``W = 0`` stayed at 1e-8 for the whole run (``sqrt(0)/sqrt(step)``); here it uses
  ``W = 1``, i.e. ``1/sqrt(step)``.
* an unknown schedule name raised UnboundLocalError; here ValueError naming the allowed names.
"""
import bisect
import math

from clipbert_legacy.config.options import DECAYS as SCHEDULES  # the option's choices: one list


def warmup_linear(step, warmup_steps, total_steps):
    if step < warmup_steps:
        return step / warmup_steps
    return max(0.0, (total_steps - step) / max(total_steps - warmup_steps, 1))


def noam_schedule(step, warmup_steps):
    if warmup_steps > 0 and step <= warmup_steps:
        return step / warmup_steps
    return math.sqrt(max(warmup_steps, 1)) / math.sqrt(max(step, 1))


def multi_step_schedule(n_epoch, milestones, gamma=0.5):
    return gamma ** bisect.bisect_right(sorted(milestones), n_epoch)


def warmup_cosine(step, warmup_steps, total_steps):
    if step < warmup_steps:
        return step / warmup_steps
    progress = (step - warmup_steps) / max(total_steps - warmup_steps, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def get_lr_sched(global_step, decay, learning_rate, num_train_steps, warmup_ratio=0.1,
                 decay_epochs=[], multi_step_epoch=-1):  # noqa: B006 - legacy signature
    """LR for ``global_step`` (ClipBERT's signature and formulas; see the module docstring)."""
    warmup_steps = int(warmup_ratio * num_train_steps)
    if decay == "linear":
        lr = learning_rate * warmup_linear(global_step, warmup_steps, num_train_steps)
    elif decay == "invsqrt":
        lr = learning_rate * noam_schedule(global_step, warmup_steps)
    elif decay == "constant":
        lr = learning_rate
    elif decay == "multi_step":
        if multi_step_epoch < 0:
            raise ValueError(f"decay='multi_step' needs multi_step_epoch >= 0, got {multi_step_epoch}")
        if not decay_epochs:
            raise ValueError("decay='multi_step' needs decay_epochs (milestone epochs), got none")
        lr = learning_rate * multi_step_schedule(multi_step_epoch, decay_epochs)
    elif decay == "cosine":
        lr = learning_rate * warmup_cosine(global_step, warmup_steps, num_train_steps)
    else:
        raise ValueError(f"unknown LR schedule decay={decay!r}; expected one of {'|'.join(SCHEDULES)}")
    if lr <= 0:
        lr = 1e-8
    return lr
