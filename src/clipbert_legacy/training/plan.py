"""The run plan: the facts a run derives from its config and data (steps, cadences, world size).

ClipBERT wrote these into the config object (``cfg.num_train_steps = ...``) and from there into
``log/args.json``. Here the user's config is never mutated: the plan is its own frozen object, written
to ``log/run_plan.json``, and its ClipBERT-named keys are added to ``log/args.json`` (where ClipBERT's
tooling reads them).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

DEBUG_STEPS = 3  # --debug 1 stops after this many optimizer steps
CLIPBERT_DERIVED_KEYS = ("num_train_steps", "valid_steps", "save_steps", "n_gpu")
"""The derived keys ClipBERT wrote into ``log/args.json`` (:meth:`RunPlan.clipbert_args`)."""


def num_train_steps(n_examples: int, epochs: float, world: int, batch_size: int, accum: int) -> int:
    """ClipBERT: ``ceil(epochs * n_groups / (n_gpu * bsz * accum))``."""
    return int(math.ceil(epochs * n_examples / (world * batch_size * accum)))


def valid_interval(total_steps: int, num_valid: int, min_valid_steps: int) -> int:
    """ClipBERT: ``ceil(T / num_valid / min_valid_steps) * min_valid_steps`` (T=1234 -> 100)."""
    return int(math.ceil(total_steps / num_valid / min_valid_steps)) * min_valid_steps


def save_interval(total_steps: int, save_steps_ratio: float) -> int:
    """Restore-file interval ``int(save_steps_ratio * T)``, at least 1 (ClipBERT crashed on 0)."""
    return max(1, int(save_steps_ratio * total_steps))


@dataclass(frozen=True)
class RunPlan:
    """What this run will do, derived once at start-up."""

    n_examples: int  # training groups (after data_ratio)
    world_size: int  # processes
    train_batch_size: int  # per process
    gradient_accumulation_steps: int
    num_train_steps: int  # T: the LR schedule's horizon
    stop_step: int  # where training stops: T, or DEBUG_STEPS with --debug 1
    valid_steps: int  # validation (and model_step_N.pt) every this many steps, and at the end
    save_steps: int  # restore file every this many steps, and at the end

    @classmethod
    def build(cls, cfg, n_examples: int, world_size: int) -> RunPlan:
        accum = cfg.gradient_accumulation_steps
        total = num_train_steps(n_examples, cfg.num_train_epochs, world_size, cfg.train_batch_size, accum)
        return cls(n_examples=n_examples, world_size=world_size, train_batch_size=cfg.train_batch_size,
                   gradient_accumulation_steps=accum, num_train_steps=total,
                   stop_step=min(total, DEBUG_STEPS) if cfg.debug else total,
                   valid_steps=valid_interval(total, cfg.num_valid, cfg.min_valid_steps),
                   save_steps=save_interval(total, cfg.save_steps_ratio))

    @property
    def examples_per_step(self) -> int:
        return self.world_size * self.train_batch_size * self.gradient_accumulation_steps

    def rescaled(self, world_size: int, step: int) -> RunPlan:
        """The plan after the number of processes changed at ``step`` (Horovod elastic): the examples
        still to train on are kept, so the remaining steps scale by the ratio of examples per step.
        The validation and restore-file cadences (in steps) stay as they were."""
        new = replace(self, world_size=world_size)

        def moved(end: int) -> int:
            return step + math.ceil(max(0, end - step) * self.examples_per_step / new.examples_per_step)
        return replace(new, num_train_steps=moved(self.num_train_steps), stop_step=moved(self.stop_step))

    def accumulation_warning(self) -> str | None:
        """A warning when one optimizer step needs more batches than an epoch has per process."""
        batches = math.ceil(self.n_examples / (self.world_size * self.train_batch_size))
        if self.gradient_accumulation_steps <= batches:
            return None
        return (f"gradient_accumulation_steps {self.gradient_accumulation_steps} is more than the {batches} "
                f"batch(es) of an epoch per process ({self.n_examples} examples / ({self.world_size} "
                f"processes x batch {self.train_batch_size})): each optimizer step spans several epochs; "
                f"lower gradient_accumulation_steps or train_batch_size")

    def to_dict(self) -> dict:
        return asdict(self)

    def clipbert_args(self) -> dict:
        """The derived keys ClipBERT's ``log/args.json`` carried, under ClipBERT's names."""
        values = (self.num_train_steps, self.valid_steps, self.save_steps, self.world_size)
        return dict(zip(CLIPBERT_DERIVED_KEYS, values))
