"""The contracts between the engine, its hooks and tasks' hooks: what a step reports (:class:`StepResult`),
what a hook may override (:class:`Hook`, with its own saved state) and what a hook may read and call on
the trainer (:class:`TrainerView`).

A leaf module (it imports nothing from ``clipbert_legacy.training``), so hooks, elastic training and tasks can
name these types without importing the engine, and the engine without importing them back.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

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
    """What hooks use of ``clipbert_legacy.training.engine.Trainer``: the built components (read-only), the
    run state and the event record. Hooks change the run only through ``trainer.state`` (``request_stop``,
    the best checkpoint), put values for the writers into ``trainer.events`` and keep what they must save
    in their own ``state_dict``; they never assign the trainer's attributes or the config, and never write
    the restore file (the engine does, at the end of the step)."""

    cfg: object
    task: object
    parts: object  # training.build.Components: model, optimizer, precision, sharding, plan, loader, ...
    state: RunState
    events: EventRecord
    hooks: list[Hook]

    @property
    def model(self) -> torch.nn.Module: ...

    @property
    def plan(self) -> RunPlan: ...

    @property
    def checkpointer(self) -> object: ...  # clipbert_legacy.training.checkpointer.Checkpointer

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
    and the elastic sync hold it under the hook's class name (``state_key``)."""

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
