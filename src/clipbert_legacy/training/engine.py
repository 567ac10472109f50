"""The one training engine every task uses (ClipBERT copied its loop into each ``run_*.py``).

A task supplies a :class:`~clipbert_legacy.training.task.Task` (model, training data, loss, evaluation);
:class:`Trainer` does the rest. It holds only the loop's parts (detectron2's ``TrainerBase``):

* ``parts``: the built components, one frozen :class:`~clipbert_legacy.training.build.Components`
  (config, process, outputs, plan, model, optimizer, precision, sharding, loader, checkpointer), made by
  ``clipbert_legacy.training.build`` in one visible order and never changed afterwards (a change of the world
  under Horovod elastic is an explicit rebuild there);
* ``hooks`` (``clipbert_legacy.training.hooks``, the task's, the caller's), ``state`` (the run state
  they share, ``clipbert_legacy.training.run_state``) and ``events`` (the step's event record the
  writers write, ``clipbert_legacy.training.events``);
* the config and task it was given, the stop signals.

One step (``clipbert_legacy.training.step.run_step``) is forward/backward over the accumulation steps with one
allreduce, then the optimizer step; then the step's scalars go into the event record, every hook's
``after_step`` runs (validation and what acts on it happens there), the writers write the record, and
at the end of the step, after every hook, the engine writes the restore file when it is due (the
cadence, the step that ends the run, a stop signal), so no hook's place in the list changes what is
saved. SIGTERM / SIGUSR1 / SIGINT only set a flag; it rides on the step's loss-statistics allreduce, so
every rank stops at the same step boundary, writes the restore file and exits 75
(``clipbert_legacy.training.preemption``). Before the next step every hook's ``before_step`` runs. Under
``horovodrun --min-np/--max-np`` (Horovod elastic) set-up does no collective and the loop runs inside
``hvd.elastic.run`` (``clipbert_legacy.training.elastic``; its commit is such a ``before_step``).

Where this loop differs from ClipBERT's (loss divided by the accumulation steps, one allreduce per
step, ``set_epoch`` every epoch, exact resume, the restore interval, stopping on a non-finite loss, the
multi_step epoch) is listed, with the reasons, in docs/differences.md.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

from clipbert_legacy.config.options import profile_range
from clipbert_legacy.training import build
from clipbert_legacy.training.checkpoint_files import model_step_path
from clipbert_legacy.training.checkpointer import migrate_counters
from clipbert_legacy.training.contracts import Hook, StepResult, check_state_keys
from clipbert_legacy.training.elastic import ElasticCommit, horovod_elastic, run_horovod_elastic
from clipbert_legacy.training.events import EventRecord
from clipbert_legacy.training.hooks import BestCheckpoint, EarlyStopping, Evaluation, StepCheckpoints
from clipbert_legacy.training.nonfinite import check_final_weights, stop_diverged
from clipbert_legacy.training.preemption import StopSignals, preempted
from clipbert_legacy.training.profiling import StepProfiler
from clipbert_legacy.training.run_state import RunState, ValidationRecord
from clipbert_legacy.training.step import Diverged, TimedBatches, batch_stream, run_step, step_scalars
from clipbert_legacy.training.task import Task
from clipbert_legacy.utils.errors import RunDirError

logger = logging.getLogger(__name__)


class Trainer:
    """``Trainer(cfg, task, hooks=()).train()`` -> summary dict (see :meth:`train`).

    ``hooks`` run after the default hooks (:meth:`default_hooks`) and the task's own
    (``Task.build_hooks``); see ``clipbert_legacy.training.hooks`` for the order and which hooks are
    collective.
    """

    def __init__(self, cfg, task: Task, hooks: Iterable[Hook] = ()):
        if not cfg.output_dir:
            raise ValueError("output_dir is not set: give --output_dir (or output_dir in the JSON config)")
        self.given_cfg, self.task = cfg, task  # the config as given: never changed
        self.parts: build.Components | None = None  # set only from clipbert_legacy.training.build
        self.state = RunState()  # position, best, stop request: shared with the hooks
        self.events = EventRecord()  # the step's values, for the writers
        self.signals = StopSignals()
        self.hooks: list[Hook] = self.default_hooks() + list(task.build_hooks(cfg)) + list(hooks)
        if horovod_elastic():
            self.hooks.append(ElasticCommit(cfg.elastic_commit_steps))
        check_state_keys(self.hooks)

    def default_hooks(self) -> list[Hook]:
        """Evaluation and what acts on it (step checkpoints, best checkpoint, early stopping); then the
        profiler (``profile_steps``)."""
        cfg = self.given_cfg
        hooks = [Evaluation(), StepCheckpoints(cfg.keep_last_k, cfg.keep_top_k), BestCheckpoint(),
                 EarlyStopping(cfg.early_stop_patience, cfg.early_stop_min_delta)]
        if cfg.profile_steps:  # rank 0's trace of some steps (clipbert_legacy.training.profiling)
            hooks.append(StepProfiler(*profile_range(cfg.profile_steps)))
        return hooks

    # ------------------------------------------------------------------ what hooks read (TrainerView)
    cfg = property(lambda self: self.parts.cfg if self.parts is not None else self.given_cfg)
    model = property(lambda self: self.parts.model)
    optimizer = property(lambda self: self.parts.optimizer)
    precision = property(lambda self: self.parts.precision)
    plan = property(lambda self: self.parts.plan)
    loader = property(lambda self: self.parts.loader)
    train_dataset = property(lambda self: self.parts.dataset)
    checkpointer = property(lambda self: self.parts.checkpointer)
    device = property(lambda self: self.parts.process.device)
    rank = property(lambda self: self.parts.process.rank)
    world = property(lambda self: self.parts.process.world)
    is_main = property(lambda self: self.parts.process.is_main)
    log_dir = property(lambda self: self.parts.outputs.log_dir)
    ckpt_dir = property(lambda self: self.parts.outputs.ckpt_dir)
    global_step = property(lambda self: self.state.global_step)
    epoch = property(lambda self: self.state.epoch)
    finished = property(lambda self: self.state.finished)

    @property
    def at_end(self) -> bool:
        """The planned last step has been taken."""
        return self.global_step >= self.plan.stop_step

    # ---------------------------------------------------------------------------------- set-up
    def setup(self) -> None:
        """The components (``clipbert_legacy.training.build.build``: no collective under Horovod elastic),
        then the restore file's counters and every hook's saved state."""
        self.parts, restored = build.build(self.given_cfg, self.task)
        self.state.follow_metric(self.cfg.best_metric or self.task.main_metric)
        if restored is not None:
            self._resume(migrate_counters(restored))
        elif self.parts.outputs.outcome == "finished":  # no restore file left; the final checkpoint is there
            self.state.finished_at(self.plan.stop_step, "finished (its restore files were deleted)")
        self.precision.before_training(self.optimizer, fresh_run=self.global_step == 0)
        p = self.plan
        warning = p.accumulation_warning()
        if warning:
            logger.warning(warning)
        logger.info("training: %d examples, %d processes, batch %d x accum %d -> %d steps (%s); validate "
                    "every %d, restore file every %d steps", p.n_examples, p.world_size, p.train_batch_size,
                    p.gradient_accumulation_steps, p.num_train_steps, self.precision.name, p.valid_steps,
                    p.save_steps)

    def _resume(self, restored: dict) -> None:
        self.checkpointer.resume(restored)
        self.load_state_dict(restored)
        self.state.restore_written()
        if self.parts.outputs.outcome == "extend":  # the stored run continues under the new plan
            if self.global_step >= self.plan.stop_step:
                raise RunDirError(f"existing_run=extend: the run in {self.cfg.output_dir} is at step "
                                  f"{self.global_step} and the new settings end at step "
                                  f"{self.plan.stop_step}; "
                                  f"nothing to extend (train for more epochs, or use --existing_run restart)")
            if self.finished:
                logger.info("existing_run=extend: the finished run continues from step %d to %d",
                            self.global_step, self.plan.stop_step)
            self.state.resume_stopped()
        s = self.state
        logger.info("resumed from %s at step %d (epoch %d, %d of its examples consumed)",
                    self.checkpointer.path, s.global_step, s.epoch, s.examples_in_epoch)

    def rebuild(self, plan=None, outcome=None) -> None:
        """Horovod elastic re-formed the job: the components for this process's new rank and world, with
        rank 0's ``plan`` and run-directory ``outcome`` (``clipbert_legacy.training.build.rebuild``)."""
        was_main = self.parts.process.is_main
        self.parts = build.rebuild(self.parts, self.task, plan=plan, outcome=outcome)
        if self.is_main and not was_main:
            for w in self.parts.outputs.writers:
                w.start(self)

    # ------------------------------------------------------------------------ the run's counters
    def state_dict(self) -> dict:
        """The run's position and bookkeeping (no tensors): the run state, every hook's own state, the
        plan and the loss scale; what every rank must agree on (the restore file's non-tensor keys)."""
        p = self.parts
        hooks = {h.state_key: sd for h in self.hooks if (sd := h.state_dict())}
        return {**self.state.counters(), "world_size": p.process.world,
                "train_batch_size": p.cfg.train_batch_size,
                "num_train_steps": p.plan.num_train_steps, "plan": p.plan.to_dict(),
                "amp": p.precision.state_dict(), "hooks": hooks}

    def load_state_dict(self, counters: dict) -> None:
        """Take back :meth:`state_dict` (a restore file, an elastic snapshot or rank 0's sync). Saved hook
        state that no hook of this run claims is dropped with a warning that names it."""
        self.state.load_counters(counters)
        self.precision.load_state_dict(counters.get("amp"))
        saved = counters.get("hooks") or {}
        for h in self.hooks:
            if h.state_key in saved:
                h.load_state_dict(saved[h.state_key])
        unclaimed = sorted(set(saved) - {h.state_key for h in self.hooks})
        if unclaimed:
            keys = ", ".join(h.state_key for h in self.hooks)
            logger.warning("the saved state of hook(s) %s is not claimed by any hook of this run (hooks: "
                           "%s); it is dropped", ", ".join(unclaimed), keys)

    def save_restore(self) -> None:
        """``ckpt/restore.pt`` of this step (unless written already). Collective: every rank calls it."""
        if self.checkpointer.save_restore(self.state_dict()):
            self.state.restore_written()

    # ---------------------------------------------------------------------------------- the step
    def batches(self) -> TimedBatches:
        """The training batches from the data position on (``clipbert_legacy.training.step.batch_stream``)."""
        return batch_stream(self.parts, self.state)

    def run_step(self, batches: TimedBatches) -> StepResult:
        """One optimizer step (``training.step.run_step``); a diverged loss stops the run here."""
        try:
            return run_step(self.parts, self.task, batches, self.state, self.signals.received is not None)
        except Diverged as e:
            stop_diverged(self.parts, self.state, e.n_bad)

    def publish_validation(self, record: ValidationRecord) -> None:
        """Every hook's ``after_validation`` on ``record`` (the ``Evaluation`` hook calls this); the
        record's copy of the weights is dropped afterwards."""
        self.state.publish_validation(record)
        try:
            for h in self.hooks:
                h.after_validation(self, record.metrics)
        finally:
            self.state.publish_validation(None)

    # ---------------------------------------------------------------------------------- the loop
    def train(self) -> dict:
        """Train to the plan's last step (resuming from ``ckpt/restore.pt`` if present).

        Returns ``{"global_step", "num_train_steps", "best": {metric, value, step}, "last_metrics",
        "stopped_early"}``.
        """
        ok = False
        self.signals.install()
        try:
            self.setup()
            summary = run_horovod_elastic(self, self._run) if self.parts.process.elastic else self._run()
            ok = True
            return summary
        finally:
            self.signals.uninstall()
            self._close(raise_errors=ok)

    def _close(self, raise_errors: bool) -> None:
        """Hooks, then the outputs (writers, log.txt, the lock)."""
        for h in self.hooks:
            h.close()
        build.close_outputs(self.parts.outputs if self.parts is not None else None, raise_errors)

    def _run(self) -> dict:
        """Hooks, the loop, the end. Under Horovod elastic this is re-entered after every change of the
        workers, with the state synced; what happens once per process is done on the first entry."""
        if not self.parts.outputs.accepted:  # the first entry of this process
            outcome = self.parts.outputs.outcome
            if isinstance(outcome, Exception):  # elastic: rank 0's run-directory error, synced
                raise RunDirError(str(outcome))
            if self.finished or self.at_end:
                final = model_step_path(self.ckpt_dir, self.global_step)
                where = (self.checkpointer.path if outcome != "finished" else
                         f"{final}; its restore files were deleted")
                logger.info("training already finished at step %d (%s); nothing to do", self.global_step,
                            where)
                return self._summary()
            self.parts = build.accept_run(self.parts, self.task)
            for h in self.hooks:
                h.before_train(self)
            for w in self.parts.outputs.writers:
                w.start(self)
        self._train_loop()
        check_final_weights(self.parts, self.state)
        summary = self._summary()
        for h in self.hooks:
            h.after_train(self, summary)
        for w in self.parts.outputs.writers:
            w.finish(self, summary)
        return summary

    def _train_loop(self) -> None:
        self.model.train()
        self.optimizer.zero_grad()
        batches = self.batches()
        while not (self.finished or self.at_end):
            for h in self.hooks:
                h.before_step(self)
            result = self.run_step(batches)
            self.events.begin(result.step, self.epoch)
            self.events.put("train", step_scalars(result, self.state.running_loss, self.world))
            if result.n_nonfinite:  # every such step, not only every log_interval: divergence must show
                what = (f"amp skipped the step (loss scale now {result.loss_scale:g}, {result.skipped_total} "
                        f"steps skipped so far)" if result.skipped else "the weights were updated")
                logger.warning("step %d: the loss of %d micro-batch(es) is not finite (nan/inf); %s",
                               result.step, result.n_nonfinite, what)
            if self.at_end:
                self.state.request_stop("finished")
            for h in self.hooks:
                h.after_step(self, result)
            self._end_of_step(result)

    def _end_of_step(self, result: StepResult) -> None:
        """After every hook: the writers write the step's record; the restore file is written when it is
        due, at the step that ends the run (the last one, an early stop) and at a stop signal, which then
        ends the process with exit status 75 (``clipbert_legacy.training.preemption``)."""
        events = self.events.take()
        for w in self.parts.outputs.writers:
            w.write(events, self)
        if self.finished or result.stop_requested or self.checkpointer.due(self.global_step):
            self.save_restore()
        if result.stop_requested and not self.finished:
            raise preempted(self.signals, self.state, self.plan.stop_step, self.checkpointer.path,
                            self.is_main)

    def _summary(self) -> dict:
        best = self.state.best
        return {"global_step": self.global_step, "num_train_steps": self.plan.num_train_steps,
                "best": {"metric": best.metric, "value": best.value, "step": best.step},
                "last_metrics": self.state.last_metrics,
                "stopped_early": self.finished and self.global_step < self.plan.stop_step}
