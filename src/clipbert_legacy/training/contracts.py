"""The contracts between the engine, its hooks and tasks' hooks: what a step reports (:class:`StepResult`),
what a hook may override (:class:`Hook`, with its own saved state) and what a hook may read and call on
the trainer (:class:`TrainerView`).

At run time it imports nothing from ``clipbert_legacy.training`` (only ``if TYPE_CHECKING:``, for the
annotations; ``tests/test_architecture.py`` counts those imports too and finds no cycle), so hooks,
elastic training and tasks can name these types without importing the engine.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from clipbert_legacy.config import Config
    from clipbert_legacy.training.checkpointer import Checkpointer
    from clipbert_legacy.training.events import EventRecord
    from clipbert_legacy.training.plan import RunPlan
    from clipbert_legacy.training.run_state import RunState, ValidationRecord


@dataclass
class StepResult:
    """What one optimizer step did. Loss figures and counts are over all ranks."""

    step: int  # the global step just taken (1-based)
    loss: float  # mean loss of the step's finite micro-batches (nan if none was finite)
    n_nonfinite: int  # micro-batches with a nan/inf loss
    grad_norm: float | None  # total norm before clipping (None: grad_norm -1, no clipping)
    skipped: bool  # the optimizer step was skipped (amp: gradient overflow)
    skipped_total: int  # steps skipped so far in this process
    loss_scale: float | None  # amp's loss scale after the step (None without loss scaling)
    lr_transformer: float
    lr_cnn: float
    n_examples: int  # examples this rank trained on in this step
    seconds: float  # wall time of the step, data loading included
    data_wait: float  # of which waiting for the data loader
    extras: dict = field(default_factory=dict)  # extra scalars the task's forward returned
    comm_wait: float = 0.0  # of which blocked in the gradient allreduce after the last backward
    stop_requested: bool = False  # a rank received SIGTERM/SIGUSR1/SIGINT (training.preemption)
    memory_mb: float = 0.0  # this rank's peak CUDA memory in the step, or its RSS on the CPU


class TrainerView(Protocol):
    """What a hook may use of ``clipbert_legacy.training.engine.Trainer``, and all it uses: the built
    components it reads (model, plan, checkpointer, the training dataset), the run state and the event
    record. Hooks change the run only through ``trainer.state`` (``request_stop``, the best checkpoint),
    put values for the writers into ``trainer.events`` and keep what they must save in their own
    ``state_dict``; they never assign the trainer's attributes or the config, and never write the restore
    file (the engine does, at the end of the step). ``tests/test_hooks.py`` checks that every hook of the
    project reads only these names and that the Trainer has each of them."""

    cfg: Config
    task: object  # the run's training.task.Task (not imported: task.py imports this module)
    state: RunState
    events: EventRecord

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def plan(self) -> RunPlan: ...

    @property
    def checkpointer(self) -> Checkpointer: ...

    @property
    def train_dataset(self) -> object: ...  # the task's training dataset (bad-video reports)

    @property
    def rank(self) -> int: ...

    @property
    def world(self) -> int: ...

    @property
    def is_main(self) -> bool: ...

    @property
    def log_dir(self) -> str: ...

    @property
    def ckpt_dir(self) -> str: ...

    @property
    def global_step(self) -> int: ...

    @property
    def epoch(self) -> int: ...

    @property
    def at_end(self) -> bool: ...

    @property
    def finished(self) -> bool: ...

    def publish_validation(self, record: ValidationRecord) -> None: ...


class Hook:
    """Periodic work around the step (detectron2's ``HookBase``). Subclass and override what you need;
    every method is a no-op by default. Arguments are the interface: an override may ignore them.

    A hook with something to carry across a resume returns it from :meth:`state_dict` (plain values, no
    tensors) and takes it back in :meth:`load_state_dict`: the restore file, the Horovod elastic commit
    and the elastic sync hold it under the hook's ``state_key`` (default: its class name). Two hooks that
    keep state under one key are refused when the trainer is made (:func:`check_state_keys`): give one
    of them its own ``state_key``."""

    def before_train(self, trainer: TrainerView) -> None:
        """After set-up (model, data, resume) and before the first step of this process."""

    def before_step(self, trainer: TrainerView) -> None:
        """Before each optimizer step, after the engine's end of the step before (its record written,
        its restore file saved when due); ``trainer.global_step`` is the step last taken."""

    def after_step(self, trainer: TrainerView, result: StepResult) -> None:
        """After each optimizer step; ``trainer.global_step`` is the step just taken."""

    def after_validation(self, trainer: TrainerView, metrics: dict[str, float]) -> None:
        """After each validation, on every rank, with the flattened metrics (the full record, with
        ``weights_finite``, is ``trainer.state.validation``)."""

    def after_train(self, trainer: TrainerView, summary: dict) -> None:
        """After the last step (not called when the run stops on an error)."""

    def close(self) -> None:
        """Release what the hook holds (files, progress bars); called when ``train()`` returns or raises."""

    @property
    def state_key(self) -> str:
        """Where the restore file keeps this hook's :meth:`state_dict` (detectron2: the class name)."""
        return type(self).__qualname__

    def state_dict(self) -> dict:
        """What this hook needs back after a resume (default: nothing)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back a :meth:`state_dict` (called before :meth:`before_train` when the run resumes)."""


def _keeps_state(hook: Hook) -> bool:
    cls = type(hook)
    return cls.state_dict is not Hook.state_dict or cls.load_state_dict is not Hook.load_state_dict


def check_state_keys(hooks: list[Hook]) -> None:
    """Refuse two hooks that keep saved state under one ``state_key`` (the second would silently
    overwrite the first in the restore file); hooks without state may repeat."""
    seen: dict[str, Hook] = {}
    for h in hooks:
        if not _keeps_state(h):
            continue
        other = seen.setdefault(h.state_key, h)
        if other is not h:
            raise ValueError(f"hooks {type(other).__qualname__} and {type(h).__qualname__} both keep their "
                             f"saved state under state_key {h.state_key!r}: override state_key on one")
