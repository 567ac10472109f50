"""Elastic training: a job that survives losing workers and takes in new ones.

**Horovod elastic** (``horovodrun -np N --min-np A --max-np B --host-discovery-script S``, which sets
``HOROVOD_ELASTIC=1`` in every worker): the training loop runs inside ``hvd.elastic.run`` with
:class:`EngineState`. Every ``elastic_commit_steps`` optimizer steps the run's state (fp32 weights,
optimizer and amp state, counters, data position: :func:`snapshot`) is committed to host memory
and Horovod checks for host changes. When a worker fails, the others get ``HorovodInternalError``
from a collective, return to the last commit, re-form with the workers that remain and continue; when
the discovery script reports new slots, every worker stops at its next commit, the new ones start,
and all continue together. After such a change every process takes rank 0's state, the data sampler
is re-split (the rest of the epoch's permutation among the new ranks: no example of the epoch is
repeated or dropped, apart from the steps redone after a rollback), the run plan keeps the examples
still to train on (``RunPlan.rescaled``: more steps with fewer workers), and RNGs are reseeded.
Set-up does no collective operation in this mode (Horovod's rule: a new worker must meet the others
inside ``hvd.elastic.run``); the run-directory check of rank 0 reaches the others in the first sync.

**torchrun** (``--nnodes MIN:MAX --max-restarts K``) restarts all workers after a failure or a
membership change; they resume from ``ckpt/restore.pt``, which the engine then also writes every
``elastic_commit_steps`` steps (the checkpointer's cadence; the global data position makes a resume
with another world size continue the epoch exactly).

A change of the world is an explicit rebuild through the builder (``Trainer.rebuild`` ->
``clipbert_legacy.training.build.rebuild``: rank, world, the sampler and loader of the new share, rank 0's
rank-0 duties; the plan and run-directory outcome rank 0 sends), never an assignment of the trainer's fields.
"""
from __future__ import annotations

import logging

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.compat import launcher_env
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.plan import RunPlan
from clipbert_legacy.utils.errors import UserError

logger = logging.getLogger(__name__)


horovod_elastic = launcher_env.horovod_elastic  # started by horovodrun in elastic mode
torchrun_restarts = launcher_env.torchrun_max_restarts  # torchrun --max-restarts (0 outside torchrun)


def check_horovod_backend() -> None:
    if hvd.backend_name() != "horovod":
        raise UserError(f"horovodrun started this worker in elastic mode (HOROVOD_ELASTIC=1) but the hvd "
                        f"backend is {hvd.backend_name()!r}; elastic training needs Horovod: use "
                        f"--dist_backend horovod (or auto) with Horovod installed")


class ElasticCommit(Hook):
    """Every ``every`` steps: Horovod's elastic commit (``state.commit()``: the run's state to host memory,
    then a check for host changes, which may raise ``HostsUpdatedInterrupt``). Collective. The commit of
    step N is made in :meth:`before_step` of step N + 1, after the engine's end of step N (the writers
    have written its record, its restore file is written when due), so an interrupt from the commit
    loses nothing of step N, and no hook but the engine writes the restore file."""

    def __init__(self, every: int):
        self.every, self.state = every, None
        self._due: int | None = None  # the step whose state is committed before the next step

    def attach(self, state) -> None:
        """The Horovod ``State`` of this run (made when the elastic loop starts)."""
        self.state = state

    def after_step(self, trainer, _result):
        if trainer.global_step % self.every == 0 and not trainer.finished:  # not the run's last step
            self._due = trainer.global_step

    def before_step(self, trainer):
        if self.state is None or self._due != trainer.global_step:  # a rollback went back before it
            return
        self._due = None
        self.state.commit()


def snapshot(trainer) -> dict:
    """This process's state in host memory (a Horovod elastic commit)."""
    return trainer.checkpointer.snapshot(trainer.state_dict())


def load_snapshot(trainer, snap: dict) -> None:
    """Back to a :func:`snapshot` (a worker failed after it)."""
    trainer.load_state_dict(trainer.checkpointer.load_snapshot(snap))


def sync_from_rank0(trainer) -> dict:
    """Every rank takes rank 0's weights, optimizer and counters (collective); returns the counters."""
    counters = trainer.checkpointer.sync_from_rank0(trainer.state_dict() if trainer.is_main else None)
    if not trainer.is_main:
        trainer.load_state_dict(counters)
    return counters


def _sync(trainer, reseed: bool) -> None:
    """Rank 0's state everywhere; the plan rescaled to the current world size (a rebuild)."""
    outcome = hvd.broadcast_object(trainer.parts.outputs.outcome if trainer.is_main else None, 0,
                                   name="elastic.outcome")
    if isinstance(outcome, Exception):  # rank 0 could not take the run directory: all stop (Trainer._run)
        trainer.rebuild(outcome=outcome)
        return
    joining = trainer.global_step == 0
    counters = sync_from_rank0(trainer)
    plan = RunPlan(**counters["plan"])
    if plan.world_size != trainer.world:
        new = plan.rescaled(trainer.world, trainer.global_step)
        logger.warning("elastic: %d -> %d processes at step %d; the run now ends at step %d (was %d), the "
                       "epoch continues after its %d consumed examples", plan.world_size, trainer.world,
                       trainer.global_step, new.num_train_steps, plan.num_train_steps,
                       trainer.state.examples_in_epoch)
        plan = new
    trainer.rebuild(plan=plan, outcome=outcome)
    if reseed or (joining and trainer.global_step > 0):  # per-rank RNG seeds for the changed processes
        trainer.checkpointer.reseed(trainer.global_step)


def _state_class():
    from horovod.common.elastic import State

    class EngineState(State):
        """Horovod's elastic ``State`` over the trainer (see the module docstring)."""

        def __init__(self, trainer):
            super().__init__(bcast_object=lambda obj: hvd.broadcast_object(obj, 0, name="elastic.hosts"),
                             get_rank=hvd.rank)
            self.trainer, self._saved, self._after_reset = trainer, None, False

        def save(self):
            self._saved = snapshot(self.trainer)

        def restore(self):
            logger.warning("elastic: a worker failed at step %d; back to the last commit (step %s)",
                           self.trainer.global_step, self._saved and self._saved["global_step"])
            if self._saved is not None:
                load_snapshot(self.trainer, self._saved)

        def sync(self):
            _sync(self.trainer, reseed=self._after_reset)
            self._after_reset = False
            self.save()

        def reset(self):
            self._after_reset = True
            self.trainer.rebuild()

    return EngineState


def run_horovod_elastic(trainer, body):
    """``body()`` (the training, returning the summary) inside ``hvd.elastic.run``; the
    :class:`ElasticCommit` hook commits this run's state."""
    from horovod.torch.elastic import run

    state = _state_class()(trainer)
    for hook in trainer.hooks:
        if isinstance(hook, ElasticCommit):
            hook.attach(state)
    return run(lambda _state: body())(state)
