"""The builder: everything a training run is made of, built once, in one visible order (torchtune's
recipe ``setup()``), into one frozen :class:`Components`.

:func:`build` is that order::

    the parsed config (the user's; never changed)
    -> processes: hvd.init, rank, world, device, seed
    -> outputs: output_dir taken (lock, rerun policy), log.txt, the restore file read
    -> the training data
    -> the batch size: find_batch_size's trial steps (or the size a resumed run found), a new config
    -> the plan (steps, cadences; a resume on another world size keeps the stored plan's examples)
    -> model, optimizer + sharding (zero_stage), the restore file's weights, broadcast, precision
    -> sampler and loader
    -> the checkpointer

Nothing in :class:`Components` is replaced after it is built, and no code outside this module assigns
a trainer attribute or a training config value (two places fill a config before this: the config layer
derives keys while it parses, and inference's ``prepare_inference_config`` sets ``output_dir``,
``model_config`` and ``inference_model_step`` of an inference config; ``tests/test_engine_build.py``
exempts exactly these). A change of the world (Horovod elastic) is an explicit :func:`rebuild`, and
accepting a run (its files, rank 0's writers) is :func:`accept_run`, which every run goes through; both
return new Components holding the same model and optimizer. The engine
(``clipbert_legacy.training.engine``) runs the loop.
"""
from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
from torch.utils.data import Dataset, Sampler

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config import Config
from clipbert_legacy.training import batch_size_finder
from clipbert_legacy.training.checkpoint_files import TrainingRestorer, atomic_write_text, load_model_weights
from clipbert_legacy.training.checkpointer import Checkpointer
from clipbert_legacy.training.data import MetaSampler, ResumableDistributedSampler, build_train_dataloader
from clipbert_legacy.training.elastic import check_horovod_backend, horovod_elastic, torchrun_restarts
from clipbert_legacy.training.events import LogLines, MetricsJsonl, ProgressBar, TensorBoard, Writer
from clipbert_legacy.training.plan import RunPlan
from clipbert_legacy.training.precision import FullPrecision, build_precision
from clipbert_legacy.training.run_dir import RunDirectory, check_same_restore_state
from clipbert_legacy.training.run_state import RunState
from clipbert_legacy.training.step import TimedBatches, run_step
from clipbert_legacy.training.wandb_logger import WandbLogger
from clipbert_legacy.training.zero import Unsharded, build_distributed_optimizer
from clipbert_legacy.utils.device import training_device
from clipbert_legacy.utils.errors import RunDirError, UserError
from clipbert_legacy.utils.loader_workers import loader_settings
from clipbert_legacy.utils.logger import add_log_to_file, remove_log_file, setup_logging
from clipbert_legacy.utils.misc import get_rng_states, set_random_seed, set_rng_states

logger = logging.getLogger(__name__)
RESTORE_FIX = "use another --output_dir, or --existing_run restart to start again"


@dataclass(frozen=True)
class Process:
    """This process in the job. ``elastic``: started by horovodrun in elastic mode (set-up does no
    collective; the first sync delivers rank 0's state)."""

    rank: int
    world: int
    device: torch.device
    elastic: bool = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Outputs:
    """``output_dir`` as this run holds it. ``outcome``: what happens to an earlier run there ('new',
    'resume', 'extend', 'restart', 'finished'), or, under Horovod elastic before the first sync, rank
    0's RunDirError. ``writers``: rank 0's, once the run is accepted (:func:`accept_run`)."""

    dir: str
    log_dir: str
    ckpt_dir: str
    outcome: object
    restorer: TrainingRestorer
    run_dir: RunDirectory | None = None  # rank 0: the lock and the rerun policy
    log_handler: object = None  # rank 0: log.txt
    accepted: bool = False  # the run goes ahead (its run files are written)
    writers: tuple[Writer, ...] = ()  # rank 0's, once accepted


@dataclass(frozen=True)
class Components:
    """A run's built parts; ``cfg`` is the run's config (the user's, plus what find_batch_size found).
    The data fields are None only in the batch-size finder's trial components (no checkpointer) and
    before :func:`_with_loader_and_checkpointer`."""

    cfg: Config
    process: Process
    outputs: Outputs | None  # None: trial components (batch-size finder)
    plan: RunPlan
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer  # hvd.DistributedOptimizer, possibly amp-processed
    precision: FullPrecision  # FullPrecision (fp32, bf16 autocast) or AmpO2Precision
    sharding: Unsharded  # Unsharded, or the zero_stage 1/2 ZeroSharding
    trainable: tuple[torch.nn.Parameter, ...] = ()  # what the per-step code touches (after the cast)
    dataset: Dataset | None = None  # the task's training dataset (map-style)
    collate_fn: Callable[[list], dict] | None = None
    sampler: Sampler[int] | None = None  # ResumableDistributedSampler or MetaSampler
    loader: Iterable[dict] | None = None  # the DataLoader, wrapped by the task (on the device)
    checkpointer: Checkpointer | None = None


# ------------------------------------------------------------------------------------------ the order
def build(cfg: Config, task) -> tuple[Components, dict | None]:
    """The run's components in the order of the module docstring, and the restore file's content (None
    for a fresh run); on an error after ``output_dir`` was taken, it is released again."""
    process = init_process(cfg)
    outputs = claim_outputs(cfg, process)
    try:
        restored = outputs.restorer.load()
        dataset, collate_fn = task.build_train_data(cfg)
        cfg = find_batch_size(cfg, task, process, outputs, dataset, collate_fn)
        plan = plan_run(cfg, len(dataset), process, restored, outputs.outcome)
        model, optimizer, sharding, precision = build_model_and_optimizer(
            cfg, task, process, plan, restored, outputs.restorer.loaded_from)
        parts = Components(cfg=cfg, process=process, outputs=outputs, plan=plan, model=model,
                           optimizer=optimizer, precision=precision, sharding=sharding,
                           trainable=tuple(p for p in model.parameters() if p.requires_grad),
                           dataset=dataset, collate_fn=collate_fn)
        return _with_loader_and_checkpointer(parts, task), restored
    except BaseException:
        close_outputs(outputs, raise_errors=False)
        raise


def init_process(cfg) -> Process:
    """``hvd.init()`` (the config's backend), this process's rank, world and device; the seed."""
    if not hvd.is_initialized():
        hvd.set_backend(cfg.dist_backend)
    hvd.init()
    elastic = horovod_elastic()
    if elastic:
        check_horovod_backend()
    set_random_seed(cfg.seed)
    return Process(hvd.rank(), hvd.size(), training_device(), elastic)


def claim_outputs(cfg, process: Process) -> Outputs:
    """Rank 0 locks ``output_dir`` and applies the ``existing_run`` policy
    (``clipbert_legacy.training.run_dir``);
    every rank gets the outcome, or raises the same one-line error; rank 0 writes log.txt."""
    out = cfg.output_dir
    if not out:
        raise ValueError("output_dir is not set: give --output_dir (or output_dir in the JSON config)")
    outcome, run_dir = None, None
    if process.is_main:
        run_dir = RunDirectory(out, cfg.existing_run)
        try:
            outcome = run_dir.acquire(cfg.to_dict())
        except Exception as e:  # every rank must learn of it, not wait in the next collective
            run_dir.release()
            run_dir = None
            outcome = e if isinstance(e, RunDirError) else RunDirError(f"{out}: {e}")
    if not process.elastic:  # elastic: no collective before hvd.elastic.run; the first sync delivers it
        outcome = hvd.broadcast_object(outcome, root_rank=0)
        if isinstance(outcome, Exception):
            raise RunDirError(str(outcome))
    log_dir, ckpt_dir = os.path.join(out, "log"), os.path.join(out, "ckpt")
    handler = _main_logging(log_dir) if process.is_main else _quiet_logging()
    return Outputs(out, log_dir, ckpt_dir, outcome, TrainingRestorer(ckpt_dir), run_dir, handler)


def _main_logging(log_dir: str):
    setup_logging()
    return add_log_to_file(os.path.join(log_dir, "log.txt"))


def _quiet_logging() -> None:
    """As ClipBERT: progress lines from rank 0 only; other ranks still report warnings."""
    logging.getLogger().setLevel(logging.WARNING)


def find_batch_size(cfg, task, process, outputs, dataset, collate_fn) -> Config:
    """``find_batch_size``: the config with the size found by trial steps (each on components built for
    that size and dropped after), or the one a resumed run found; the RNGs are as before the trials."""
    if cfg.find_batch_size == "none":
        return cfg
    run_dir, resumed = outputs.run_dir, outputs.outcome in ("resume", "extend", "finished")
    stored = run_dir.stored_settings if run_dir is not None and resumed else None
    rngs = get_rng_states()

    def fits(batch_size: int) -> bool:
        trial = _trial_components(Config({**cfg, "train_batch_size": batch_size}), task, process, dataset,
                                  collate_fn)
        batches, state = TimedBatches(_forever(trial.loader)), RunState()
        try:
            return batch_size_finder.trial_fits(lambda: run_step(trial, task, batches, state))
        finally:
            trial.optimizer.synchronize()  # what an interrupted backward left in flight
    try:
        return batch_size_finder.settle(cfg, process.device, process.world, stored, fits, limit=len(dataset))
    finally:
        set_rng_states(rngs)


def _trial_components(cfg, task, process, dataset, collate_fn) -> Components:
    plan = RunPlan.build(cfg, len(dataset), process.world)
    model, optimizer, sharding, precision = build_model_and_optimizer(cfg, task, process, plan, None, None,
                                                                      collective=False)
    sampler = ResumableDistributedSampler(len(dataset), 1, 0, shuffle=True, seed=cfg.seed)
    loader = build_train_dataloader(dataset, sampler, cfg.train_batch_size, collate_fn, n_workers=0,
                                    seed=cfg.seed)
    return Components(cfg=cfg, process=process, outputs=None, plan=plan, model=model, optimizer=optimizer,
                      precision=precision, sharding=sharding,
                      trainable=tuple(p for p in model.parameters() if p.requires_grad),
                      loader=task.wrap_train_loader(loader, cfg, process.device))


def _forever(loader):
    while True:
        yield from loader


def plan_run(cfg, n_examples: int, process: Process, restored: dict | None, outcome) -> RunPlan:
    """The plan of ``cfg``; a resume on another number of processes (same settings) keeps the stored
    plan's examples still to train on, rather than re-deriving a step count that would train on more
    or fewer."""
    plan = RunPlan.build(cfg, n_examples, process.world)
    if restored is None:
        return plan
    stored = restored.get("plan")
    if (stored is not None and stored["world_size"] != process.world and outcome != "extend"
            and stored["train_batch_size"] == cfg.train_batch_size):
        plan = RunPlan(**stored).rescaled(process.world, restored["global_step"])
        logger.warning("resume: %d processes instead of %d; the run ends at step %d (keeps the examples "
                       "left to train on)", process.world, stored["world_size"], plan.num_train_steps)
    elif restored["num_train_steps"] != plan.num_train_steps:
        logger.warning("resume: the run was planned for %d steps, now %d (config changed?)",
                       restored["num_train_steps"], plan.num_train_steps)
    return plan


def build_model_and_optimizer(cfg, task, process, plan, restored, restored_from, collective=True):
    """The task's model on the device, ``hvd.DistributedOptimizer`` over the named param groups
    (``backward_passes_per_step`` = the plan's accumulation; ``zero_stage`` 1/2: this rank's shard),
    the restore file's weights, the parameter and optimizer-state broadcast (not under Horovod elastic:
    the first sync does it), then the precision's ``prepare`` (amp O2: after the broadcast, as ClipBERT)."""
    model = task.build_model(cfg).to(process.device)
    optimizer, sharding = build_distributed_optimizer(model, cfg, plan.gradient_accumulation_steps)
    if restored is not None:
        load_model_weights(model, restored["model"], restored_from, RESTORE_FIX)
    if collective and not process.elastic:
        check_same_restore_state(restored, cfg.output_dir)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        sharding.broadcast_state(optimizer)
    precision = build_precision(cfg, process.device)
    model, optimizer = precision.prepare(model, optimizer)
    return model, optimizer, sharding, precision


def _with_loader_and_checkpointer(parts: Components, task) -> Components:
    """The sampler and loader of ``parts.process``'s share, and the checkpointer over ``parts``."""
    cfg, process, dataset = parts.cfg, parts.process, parts.dataset
    if hasattr(dataset, "sizes") and hasattr(dataset, "ratios"):  # several datasets: ClipBERT's MetaLoader
        sampler = MetaSampler(dataset.sizes, dataset.ratios, cfg.train_batch_size, process.world,
                              process.rank, seed=cfg.seed)
    else:
        sampler = ResumableDistributedSampler(len(dataset), process.world, process.rank, shuffle=True,
                                              seed=cfg.seed)
    loader = build_train_dataloader(dataset, sampler, cfg.train_batch_size, parts.collate_fn, seed=cfg.seed,
                                    **loader_settings(cfg, process.device))
    commit_every = cfg.elastic_commit_steps if torchrun_restarts() > 0 else None  # restarts resume from it
    checkpointer = Checkpointer(parts.model, parts.optimizer, parts.precision, parts.sharding, process,
                                parts.outputs.restorer, cfg, (parts.plan.save_steps, commit_every))
    return replace(parts, sampler=sampler, loader=task.wrap_train_loader(loader, cfg, process.device),
                   checkpointer=checkpointer)


# ------------------------------------------------------------------------------------------ rebuilds
def rebuild(parts: Components, task, plan: RunPlan | None = None, outcome=None) -> Components:
    """Horovod elastic re-formed the job: this process's rank and the world size, a new sampler and
    loader for its share, the checkpointer; ``plan``/``outcome``: rank 0's (the sync). A process that
    became rank 0 (the old one is gone) now writes log.txt and the writers' files. The model, optimizer,
    precision and sharding are the same objects."""
    process = replace(parts.process, rank=hvd.rank(), world=hvd.size())
    outputs = parts.outputs
    if outcome is not None:
        outputs = replace(outputs, outcome=outcome)
    if process.is_main and not parts.process.is_main:
        outputs = replace(outputs, log_handler=_main_logging(outputs.log_dir))
        if outputs.accepted:
            outputs = replace(outputs, writers=tuple(default_writers(parts.cfg, outputs.log_dir)))
        logger.warning("elastic: this process is rank 0 now and writes log, checkpoints and metrics")
    new = replace(parts, process=process, outputs=outputs, plan=plan or parts.plan)
    return _with_loader_and_checkpointer(new, task)


def accept_run(parts: Components, task) -> Components:
    """The run goes ahead: only now are ``log/args.json`` (the run's config + ClipBERT's derived keys),
    ``log/run_plan.json``, ``log/model_config.json`` and rank 0's writers (TensorBoard, ...) made, so a
    refused or already finished rerun leaves the directory as it was (its log lines aside)."""
    outputs = parts.outputs
    writers: tuple[Writer, ...] = ()
    if parts.process.is_main:
        if outputs.run_dir is not None:
            outputs.run_dir.keep_previous_args()
        _write_json(outputs.log_dir, "args.json", {**parts.cfg.to_dict(), **parts.plan.clipbert_args()})
        _write_json(outputs.log_dir, "run_plan.json", parts.plan.to_dict())
        mc = task.model_config(parts.cfg)
        if mc is not None:
            _write_json(outputs.log_dir, "model_config.json", mc)
        writers = tuple(default_writers(parts.cfg, outputs.log_dir))
    return replace(parts, outputs=replace(outputs, accepted=True, writers=writers))


def _write_json(log_dir: str, name: str, obj) -> None:
    atomic_write_text(os.path.join(log_dir, name), json.dumps(obj, indent=4, default=str))


def default_writers(cfg, log_dir: str) -> list[Writer]:
    """Rank 0's writers of the event record: TensorBoard, log.txt, metrics.jsonl, progress and, with
    ``wandb_project``, W&B (``clipbert_legacy.training.wandb_logger``)."""
    writers = [TensorBoard(log_dir), LogLines(cfg.log_interval), MetricsJsonl(log_dir, cfg.log_interval),
               ProgressBar()]
    if cfg.wandb_project:
        writers.append(WandbLogger(cfg))
    return writers


def close_outputs(outputs: Outputs | None, raise_errors: bool) -> None:
    """Writers, log.txt, the lock. After a failure, a second failure here (the full disk again) is
    logged, not raised: the first error is the one to report."""
    if outputs is None:
        return
    errors = []
    # every writer, even after one failed (each holds its own file); the last opened first, so W&B
    # finishes its run before TensorBoard and log.txt close (the order before the writers existed)
    for w in reversed(outputs.writers):
        try:
            w.close()
        except UserError as e:
            errors.append(e)
    if outputs.log_handler is not None:
        remove_log_file(outputs.log_handler)
    if outputs.run_dir is not None:
        outputs.run_dir.release()
    if errors and raise_errors:
        raise errors[0]
    for e in errors:
        logger.warning("%s", e)
