"""The one training engine every task uses (ClipBERT copied its loop into each ``run_*.py``).

A task supplies a :class:`~src.training.task.Task` (model, training data, loss, evaluation);
:class:`Trainer` does the rest, in ClipBERT's order:

set-up: ``hvd.init()``, device ``cuda:local_rank`` (else CPU), seed, model, named param groups,
``hvd.DistributedOptimizer(backward_passes_per_step=gradient_accumulation_steps)``, the restore file if
there is one, parameter and optimizer-state broadcast, then the precision's ``prepare`` (for ``--fp16 1``
``amp.initialize(O2, keep_batchnorm_fp32=True)``, after the broadcast as in ClipBERT).

:meth:`Trainer.run_step` is one optimizer step, read top to bottom: for each of the k micro-batches a
forward, ``loss / k`` and backward inside the precision's ``scale_loss`` (``delay_unscale`` on all but
the last), with ``zero_none_grad`` + ``optimizer.synchronize()`` (the step's single allreduce) inside
the last one; then the loss statistics of all ranks, the LR schedules by group role, gradient clipping
on the master params, the step in ``skip_synchronize()`` (``zero_stage`` 1/2: each rank steps the
parameters it owns and broadcasts them, ``src.training.zero``), ``zero_grad``. It returns a
:class:`StepResult`. Everything periodic (logging, validation, checkpoints) is a hook
(``src.training.hooks``); fp32 / bf16 / amp O2 differ only inside ``src.training.precision``.

SIGTERM / SIGUSR1 / SIGINT only set a flag; it rides on the step's loss-statistics allreduce, so every
rank stops at the same step boundary, writes the restore file and exits 75 (``src.training.preemption``).

Under ``horovodrun --min-np/--max-np`` (Horovod elastic) set-up does no collective and the loop runs
inside ``hvd.elastic.run``, committing every ``elastic_commit_steps`` (``src.training.elastic``); the
run's state, its restore file and the elastic commits are ``src.training.state``.

Where this loop differs from ClipBERT's (loss divided by the accumulation steps, one allreduce per
step, ``set_epoch`` every epoch, exact resume, the restore interval, stopping on a non-finite loss, the
multi_step epoch) is listed, with the reasons, in docs/differences.md.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator

import torch

import src.compat.hvd as hvd
from src.config.options import profile_range
from src.optimization.param_groups import set_lr
from src.optimization.sched import get_lr_sched
from src.training import batch_size_finder
from src.training.checkpoint import TrainingRestorer, atomic_write_text, load_model_weights, model_step_path
from src.training.contracts import Hook, StepResult
from src.training.data import MetaSampler, ResumableDistributedSampler, build_train_dataloader
from src.training.elastic import (
    ElasticCommit,
    check_horovod_backend,
    horovod_elastic,
    run_horovod_elastic,
    torchrun_restarts,
)
from src.training.hooks import (
    BestCheckpoint,
    EarlyStopping,
    Evaluation,
    MetricsWriter,
    RestoreSaver,
    StepCheckpoints,
)
from src.training.nonfinite import check_final_weights, check_finite
from src.training.plan import RunPlan
from src.training.precision import FullPrecision, build_precision
from src.training.preemption import StopSignals, stop_on_signal
from src.training.profiling import StepProfiler
from src.training.run_dir import RunDirectory, check_same_restore_state
from src.training.run_state import RunState
from src.training.state import TrainerState
from src.training.task import Task
from src.training.wandb_logger import WandbLogger
from src.training.zero import Unsharded, build_distributed_optimizer
from src.utils.device import memory_mb, reset_peak_memory, training_device
from src.utils.errors import RunDirError, UserError
from src.utils.loader_workers import loader_settings
from src.utils.logger import RunningMeter, add_log_to_file, make_tb_logger, remove_log_file, setup_logging
from src.utils.misc import NoOp, set_random_seed, zero_none_grad

logger = logging.getLogger(__name__)

class Trainer(TrainerState):
    """``Trainer(cfg, task, hooks=()).train()`` -> summary dict (see :meth:`train`).

    ``hooks`` run after the default hooks (:meth:`default_hooks`) and the task's own
    (``Task.build_hooks``); see ``src.training.hooks`` for the order and which hooks are collective.
    """

    def __init__(self, cfg, task: Task, hooks: Iterable[Hook] = ()):
        if not cfg.output_dir:
            raise ValueError("output_dir is not set: give --output_dir (or output_dir in the JSON config)")
        self.cfg, self.task = cfg, task
        self._extra_hooks = list(hooks)
        self.hooks: list[Hook] = []
        self.state = RunState()  # position, best, patience, stop request: shared with the hooks
        self.elastic = horovod_elastic()
        self._started = False
        self.model = self.optimizer = self.plan = None
        self.precision: FullPrecision | None = None
        self.sharding = Unsharded()  # zero_stage (src.training.zero)
        self.tb, self._log_handler, self.run_dir = NoOp(), None, None
        self.signals = StopSignals()

    # read-only views of the run state, for hooks and callers
    global_step = property(lambda self: self.state.global_step)
    epoch = property(lambda self: self.state.epoch)
    finished = property(lambda self: self.state.finished)
    best = property(lambda self: self.state.best)
    last_metrics = property(lambda self: self.state.last_metrics)

    # ---------------------------------------------------------------------------------- set-up
    def setup(self) -> None:
        """Processes, outputs, model + optimizer + data, resume (no collective under Horovod elastic)."""
        self._init_process()
        self._init_outputs()
        self._build()

    def _make_hooks(self, elastic_state=None) -> list[Hook]:
        hooks = self.default_hooks() + list(self.task.build_hooks(self.cfg)) + self._extra_hooks
        if self.elastic or torchrun_restarts() > 0:
            hooks.append(ElasticCommit(self.cfg.elastic_commit_steps, elastic_state))
        return hooks

    def default_hooks(self) -> list[Hook]:
        """Metrics writer, evaluation and what acts on it (step checkpoints, best checkpoint, early
        stopping), the periodic restore file; then W&B (``wandb_project``) and the profiler
        (``profile_steps``)."""
        cfg = self.cfg
        hooks = [MetricsWriter(cfg.log_interval), Evaluation(self.plan.valid_steps),
                 StepCheckpoints(cfg.keep_last_k, cfg.keep_top_k), BestCheckpoint(),
                 EarlyStopping(cfg.early_stop_patience, cfg.early_stop_min_delta),
                 RestoreSaver(self.plan.save_steps)]
        if self.cfg.wandb_project:  # W&B beside TensorBoard (src.training.wandb_logger)
            hooks.append(WandbLogger(self.cfg))
        if self.cfg.profile_steps:  # rank 0's trace of some steps (src.training.profiling)
            hooks.append(StepProfiler(*profile_range(self.cfg.profile_steps)))
        return hooks

    def _init_process(self) -> None:
        if not hvd.is_initialized():
            hvd.set_backend(self.cfg.dist_backend)
        hvd.init()
        if self.elastic:
            check_horovod_backend()
        self.rank, self.world = hvd.rank(), hvd.size()
        self.is_main = self.rank == 0
        self.device = training_device()
        set_random_seed(self.cfg.seed)

    def _init_outputs(self) -> None:
        out = self.cfg.output_dir
        self.log_dir, self.ckpt_dir = os.path.join(out, "log"), os.path.join(out, "ckpt")
        self.run_outcome = self._claim_output_dir()
        if self.is_main:
            setup_logging()
            self._log_handler = add_log_to_file(os.path.join(self.log_dir, "log.txt"))
        else:  # as ClipBERT: progress lines from rank 0 only; other ranks still report warnings
            logging.getLogger().setLevel(logging.WARNING)
        self.restorer = TrainingRestorer(self.ckpt_dir)

    def adopt_world(self) -> None:
        """Horovod elastic re-formed the job: this process's rank, the world size, rank 0's duties, the
        data sampler's share."""
        was_main = self.is_main
        self.rank, self.world = hvd.rank(), hvd.size()
        self.is_main = self.rank == 0
        if self.is_main and not was_main:
            self._become_main()
        self.sampler.reshard(self.world, self.rank)

    def adopt_plan(self, plan: RunPlan, run_outcome) -> None:
        """The plan (rescaled to the world size) and run-directory outcome every rank takes from rank 0."""
        self.plan, self.run_outcome = plan, run_outcome
        self.sampler.reshard(self.world, self.rank)

    def _become_main(self) -> None:
        """Horovod elastic made this process rank 0 (the old one is gone): it now writes the outputs."""
        setup_logging()
        self._log_handler = add_log_to_file(os.path.join(self.log_dir, "log.txt"))
        self.tb = make_tb_logger(self.log_dir, True)
        logger.warning("elastic: this process is rank 0 now and writes log, checkpoints and metrics")

    def _claim_output_dir(self) -> str:
        """Rank 0 locks ``output_dir`` and applies the ``existing_run`` policy (``src.training.run_dir``);
        every rank gets the outcome, or raises the same one-line error."""
        outcome = None
        if self.is_main:
            self.run_dir = RunDirectory(self.cfg.output_dir, self.cfg.existing_run)
            try:
                outcome = self.run_dir.acquire(self.cfg.to_dict())
            except Exception as e:  # every rank must learn of it, not wait in the next collective
                self.run_dir.release()
                outcome = e if isinstance(e, RunDirError) else RunDirError(f"{self.cfg.output_dir}: {e}")
        if self.elastic:  # no collective before hvd.elastic.run: the first sync delivers it
            return outcome
        outcome = hvd.broadcast_object(outcome, root_rank=0)
        if isinstance(outcome, Exception):
            raise RunDirError(str(outcome))
        return outcome

    def _build(self) -> None:
        cfg = self.cfg
        model = self.task.build_model(cfg).to(self.device)
        dataset, collate_fn = self.task.build_train_data(cfg)
        self.plan = RunPlan.build(cfg, len(dataset), self.world)
        self.state.best["metric"] = cfg.best_metric or self.task.main_metric
        # zero_stage 1/2: this rank's optimizer holds only the parameters it owns (src.training.zero)
        optimizer, self.sharding = build_distributed_optimizer(model, cfg,
                                                               self.plan.gradient_accumulation_steps)
        state = self.restorer.load()
        if state is not None:
            load_model_weights(model, state["model"], self.restorer.loaded_from,
                               "use another --output_dir, or --existing_run restart to start again")
        if not self.elastic:  # elastic: every rank takes rank 0's state in the first sync instead
            check_same_restore_state(state, cfg.output_dir)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            self.sharding.broadcast_state(optimizer)
        self.precision = build_precision(cfg, self.device)
        self.model, self.optimizer = self.precision.prepare(model, optimizer)
        # after prepare (which may cast them): the parameters the per-step code touches
        self._trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.running_loss = RunningMeter("loss")
        if cfg.find_batch_size != "none":  # before the sampler and loader: they take the size it finds
            batch_size_finder.apply(self, dataset, collate_fn)
        self.sampler = self._train_sampler(dataset)
        loader = build_train_dataloader(dataset, self.sampler, cfg.train_batch_size, collate_fn,
                                        seed=cfg.seed, **loader_settings(cfg, self.device))
        self.loader = self.task.wrap_train_loader(loader, cfg, self.device)
        if state is not None:
            self._load_restore_state(state)
            self._apply_extend()
        elif self.run_outcome == "finished":  # its restore files were deleted; the final checkpoint is there
            self.state.global_step = self.plan.stop_step
            self.state.request_stop("finished (its restore files were deleted)")
        self.precision.before_training(self.optimizer, fresh_run=self.global_step == 0)
        p = self.plan
        warning = p.accumulation_warning()
        if warning:
            logger.warning(warning)
        logger.info("training: %d examples, %d processes, batch %d x accum %d -> %d steps (%s); validate "
                    "every %d, restore file every %d steps", p.n_examples, p.world_size, p.train_batch_size,
                    p.gradient_accumulation_steps, p.num_train_steps, self.precision.name, p.valid_steps,
                    p.save_steps)

    def _apply_extend(self) -> None:
        """``existing_run extend``: a stored run continues under the new plan, even if it had finished."""
        if self.run_outcome != "extend":
            return
        if self.global_step >= self.plan.stop_step:
            raise RunDirError(f"existing_run=extend: the run in {self.cfg.output_dir} is at step "
                              f"{self.global_step} and the new settings end at step {self.plan.stop_step}; "
                              f"nothing to extend (train for more epochs, or use --existing_run restart)")
        if self.state.finished:
            logger.info("existing_run=extend: the finished run continues from step %d to %d",
                        self.global_step, self.plan.stop_step)
        self.state.stop_reason = None

    def _train_sampler(self, dataset) -> ResumableDistributedSampler:
        """Shuffled and resumable; for several datasets (``sizes`` + ``ratios``, src.datasets.multi)
        ClipBERT's MetaLoader order: each batch from one dataset, drawn by ratio."""
        if hasattr(dataset, "sizes") and hasattr(dataset, "ratios"):
            return MetaSampler(dataset.sizes, dataset.ratios, self.cfg.train_batch_size, self.world,
                               self.rank, seed=self.cfg.seed)
        return ResumableDistributedSampler(self.plan.n_examples, self.world, self.rank, shuffle=True,
                                           seed=self.cfg.seed)

    def _accept_run(self) -> None:
        """The run goes ahead: only now are the stored config and tensorboard files written, so a
        refused or already finished rerun leaves the directory as it was (its log lines aside)."""
        if self.is_main:
            if self.run_dir is not None:
                self.run_dir.keep_previous_args()
            self._write_run_files()
        self.tb = make_tb_logger(self.log_dir, self.is_main)

    def _write_run_files(self) -> None:
        """``log/args.json`` (the config + ClipBERT's derived keys), ``log/run_plan.json``,
        ``log/model_config.json``."""
        self._write_json("args.json", {**self.cfg.to_dict(), **self.plan.clipbert_args()})
        self._write_json("run_plan.json", self.plan.to_dict())
        mc = self.task.model_config(self.cfg)
        if mc is not None:
            self._write_json("model_config.json", mc)

    def _write_json(self, name: str, obj) -> None:
        atomic_write_text(os.path.join(self.log_dir, name), json.dumps(obj, indent=4, default=str))

    # ---------------------------------------------------------------------------------- the step
    def run_step(self) -> StepResult:
        """One optimizer step over ``gradient_accumulation_steps`` micro-batches, one allreduce."""
        k, opt, precision = self.plan.gradient_accumulation_steps, self.optimizer, self.precision
        t0, self._data_wait, n_examples, comm_wait = time.perf_counter(), 0.0, 0, 0.0
        skipped_before = precision.skipped_steps()
        reset_peak_memory(self.device)
        # loss sum, #non-finite, #finite, #ranks asked to stop (summed over ranks in one allreduce)
        stats = torch.zeros(4, dtype=torch.float64, device=self.device)
        for micro in range(k):
            batch = self._next_batch()
            loss, extras = self._forward(batch, stats)
            n_examples += self.task.batch_size(batch) if batch is not None else 0
            last = micro == k - 1
            with precision.scale_loss(loss / k, opt, delay_unscale=not last) as scaled:
                scaled.backward()
                if last:  # the step's single allreduce, inside scale_loss (apex + Horovod recipe)
                    zero_none_grad(self._trainable)
                    t_sync = time.perf_counter()
                    opt.synchronize()  # waits for what the backward hooks started: the exposed part
                    comm_wait = time.perf_counter() - t_sync
        stats[3] = float(self.signals.received is not None)
        loss, n_bad, n_stop = self._reduce_loss_stats(stats)
        check_finite(self, n_bad)  # before the step: a stop keeps the last good weights
        self.state.global_step += 1
        lr_t, lr_c = self._set_lr()
        grad_norm = self._clip_grad_norm()
        with opt.skip_synchronize():
            opt.step()
        self.sharding.after_step()  # zero_stage: owners broadcast the parameters they stepped
        opt.zero_grad()
        skipped_total = precision.skipped_steps()
        return StepResult(step=self.global_step, loss=loss, n_nonfinite=n_bad, grad_norm=grad_norm,
                          skipped=skipped_total > skipped_before, skipped_total=skipped_total,
                          loss_scale=precision.loss_scale(), lr_transformer=lr_t, lr_cnn=lr_c,
                          n_examples=n_examples, seconds=time.perf_counter() - t0,
                          data_wait=self._data_wait, extras=extras, comm_wait=comm_wait,
                          stop_requested=n_stop > 0, memory_mb=memory_mb(self.device))

    def _forward(self, batch, stats: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """fp32 loss of one micro-batch (added to ``stats``) and the task's extra scalars."""
        if batch is None:  # nothing usable (e.g. every video undecodable): a zero loss that touches
            # every parameter keeps accumulation and the gradient hooks aligned across ranks
            return sum(p.sum() for p in self._trainable) * 0.0, {}
        with self.precision.autocast():
            out = self.task.forward_train(self.model, batch, self.cfg)
        if isinstance(out, dict):
            loss = out["loss"]
            extras = {k: v.detach() if torch.is_tensor(v) else v for k, v in out.items() if k != "loss"}
        else:
            loss, extras = out, {}
        lv = loss.detach().double()  # kept on the device: one sync per optimizer step, not per micro-step
        finite = torch.isfinite(lv)
        stats[:3] += torch.stack([torch.where(finite, lv, torch.zeros_like(lv)), (~finite).double(),
                                  finite.double()])
        return loss.float(), extras

    def _next_batch(self):
        t = time.perf_counter()
        batch = next(self._data)
        self._data_wait += time.perf_counter() - t
        return batch  # on self.device: Task.wrap_train_loader's contract

    def _batches(self) -> Iterator:
        """Batches forever, epoch after epoch, continuing at the data position (``examples_in_epoch``:
        consumed by all ranks together, see src.training.state)."""
        while True:
            state = self.state
            self.sampler.set_epoch(state.epoch)
            self.sampler.start_at(state.examples_in_epoch)
            span = self.cfg.train_batch_size * self.world
            if len(self.sampler) > 0:
                for batch in self.loader:
                    state.examples_in_epoch = min(state.examples_in_epoch + span, self.sampler.n)
                    yield batch
            state.epoch += 1
            state.examples_in_epoch = 0

    def _reduce_loss_stats(self, stats: torch.Tensor) -> tuple[float, int, int]:
        if self.world > 1:
            stats = hvd.allreduce(stats, op=hvd.Sum, name="engine.loss_stats")
        loss_sum, n_bad, n_ok, n_stop = stats.tolist()
        return (loss_sum / n_ok if n_ok > 0 else float("nan")), int(n_bad), int(n_stop)

    def _set_lr(self) -> tuple[float, float]:
        cfg, step, total = self.cfg, self.global_step, self.plan.num_train_steps
        lr_t = get_lr_sched(step, cfg.decay, cfg.learning_rate, total, cfg.warmup_ratio,
                            cfg.step_decay_epochs or [], self.epoch)
        lr_c = get_lr_sched(step, cfg.cnn_lr_decay, cfg.cnn_learning_rate, total, cfg.warmup_ratio,
                            cfg.cnn_step_decay_epochs or [], self.epoch)
        set_lr(self.optimizer, {"transformer": lr_t, "cnn": lr_c})
        return lr_t, lr_c

    def _clip_grad_norm(self) -> float | None:
        if self.cfg.grad_norm == -1:
            return None
        params = self.precision.master_params(self.optimizer)
        return self.sharding.clip_grad_norm(params, self.cfg.grad_norm)  # bit-equal for every zero_stage

    # ---------------------------------------------------------------------------------- the loop
    @property
    def at_end(self) -> bool:
        """The planned last step has been taken."""
        return self.global_step >= self.plan.stop_step

    def train(self) -> dict:
        """Train to the plan's last step (resuming from ``ckpt/restore.pt`` if present).

        Returns ``{"global_step", "num_train_steps", "best": {metric, value, step}, "last_metrics",
        "stopped_early"}``.
        """
        ok = False
        self.signals.install()
        try:
            self.setup()
            summary = run_horovod_elastic(self, self._run) if self.elastic else self._run()
            ok = True
            return summary
        finally:
            self.signals.uninstall()
            self._close_outputs(raise_errors=ok)

    def _close_outputs(self, raise_errors: bool) -> None:
        """Hooks, TensorBoard, log.txt, the lock. After a failure, a second failure here (the full
        disk again) is logged, not raised: the first error is the one to report."""
        for h in self.hooks:
            h.close()
        try:
            self.tb.close()
        except UserError as e:
            if raise_errors:
                raise
            logger.warning("%s", e)
        finally:
            if self._log_handler is not None:
                remove_log_file(self._log_handler)
                self._log_handler = None
            if self.run_dir is not None:
                self.run_dir.release()

    def _run(self, elastic_state=None) -> dict:
        """Hooks, the loop, the end. Under Horovod elastic this is re-entered after every change of the
        workers, with the state synced; what happens once per process is done on the first entry."""
        if not self._started:
            if isinstance(self.run_outcome, Exception):  # elastic: rank 0's run-directory error, synced
                raise RunDirError(str(self.run_outcome))
            if self.state.finished or self.at_end:
                final = model_step_path(self.ckpt_dir, self.global_step)
                where = (self.restorer.path if self.run_outcome != "finished" else
                         f"{final}; its restore files were deleted")
                logger.info("training already finished at step %d (%s); nothing to do", self.global_step,
                            where)
                return self._summary()
            self._accept_run()
            self.hooks = self._make_hooks(elastic_state)
            for h in self.hooks:
                h.before_train(self)
            self._started = True
        self._train_loop()
        check_final_weights(self)
        summary = self._summary()
        for h in self.hooks:
            h.after_train(self, summary)
        return summary

    def _train_loop(self) -> None:
        self.model.train()
        self.optimizer.zero_grad()
        self._data = self._batches()
        while not (self.state.finished or self.at_end):
            result = self.run_step()
            if math.isfinite(result.loss):
                self.running_loss(result.loss)
            if self.at_end:
                self.state.request_stop("finished")
            for h in self.hooks:
                h.after_step(self, result)
            self._end_of_step(result)

    def _end_of_step(self, result: StepResult) -> None:
        """After every hook: the step that ends the run (the last one, an early stop) writes the restore
        file; a stop signal writes it and exits 75 (``src.training.preemption``)."""
        if self.state.finished:
            self.save_restore()
        elif result.stop_requested:
            stop_on_signal(self)

    def _summary(self) -> dict:
        return {"global_step": self.global_step, "num_train_steps": self.plan.num_train_steps,
                "best": {k: self.state.best[k] for k in ("metric", "value", "step")},
                "last_metrics": self.state.last_metrics,
                "stopped_early": self.state.finished and self.global_step < self.plan.stop_step}
