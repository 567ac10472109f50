"""``--find_batch_size power|binsearch``: the largest ``train_batch_size`` whose training steps fit the
device (Lightning's ``BatchSizeFinder``).

Before training, a few real optimizer steps (:data:`TRIAL_STEPS`: forward, backward, optimizer step,
under the run's precision) run at growing batch sizes from ``train_batch_size``: ``power`` doubles
until the device runs out of memory; ``binsearch`` then bisects between the last size that fit and the
first that did not (a first size that does not fit is halved until one does). After every trial the
weights, optimizer, loss scale, counters and RNGs are put back, so the run trains exactly as if it had
been started with the chosen size. The chosen size is the largest that fit times :data:`SAFETY`
(rounded down, at least 1): later batches can need more memory than the trial's (longer captions,
other videos) and the allocator fragments over a run. ``find_batch_size_keep_effective 1`` also sets
``gradient_accumulation_steps`` so that batch x accumulation stays at least the configured one.

The found values are this run's settings (``log/args.json``); a resumed run keeps them instead of
searching again. On the CPU the finder refuses: there, running out of memory ends the process (the
kernel's OOM killer) instead of raising an error a program can catch. It runs in a single process:
find the size there, then launch the job with it.
"""
from __future__ import annotations

import gc
import logging
import math

import torch

from src.training.data import ResumableDistributedSampler, build_train_dataloader
from src.training.plan import RunPlan
from src.utils.errors import UserError
from src.utils.misc import get_rng_states, set_rng_states

logger = logging.getLogger(__name__)

TRIAL_STEPS = 3
SAFETY = 0.9
FOUND_KEYS = ("train_batch_size", "gradient_accumulation_steps")


def search(fits, start: int, mode: str, limit: int) -> tuple[int, list[tuple[int, bool]]]:
    """The largest batch size ``fits(b)`` accepts, from ``start`` up to ``limit``; and the trials
    ``[(size, fitted), ...]`` in order. ``mode``: ``power`` (doubling) or ``binsearch`` (doubling,
    then bisection)."""
    tried = []

    def trial(b):
        ok = fits(b)
        tried.append((b, ok))
        return ok

    low, high = min(start, limit), None  # high: the smallest size known not to fit
    while not trial(low):
        if low == 1:
            raise UserError("find_batch_size: even train_batch_size 1 runs out of device memory; use a "
                            "smaller model, fewer frames (num_frm, train_n_clips) or smaller images")
        high, low = low, low // 2
    if high is None:  # the start fitted: grow
        while low * 2 <= limit:
            if trial(low * 2):
                low *= 2
            else:
                high = low * 2
                break
    if mode == "binsearch" and high is not None:
        while high - low > 1:
            mid = (low + high) // 2
            if trial(mid):
                low = mid
            else:
                high = mid
    return low, tried


# what CUDA libraries say instead of torch.OutOfMemoryError when an allocation fails (as Lightning checks)
_OOM_MESSAGES = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
                 "CUDNN_STATUS_ALLOC_FAILED", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED")


def is_out_of_memory(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or any(m in str(e) for m in _OOM_MESSAGES)


def choose(found: int) -> int:
    return max(1, int(found * SAFETY))


def check_device(device: torch.device, world: int) -> None:
    if device.type != "cuda":
        raise UserError("find_batch_size needs a CUDA device: on the CPU running out of memory kills the "
                        "process instead of raising an error that can be caught; set train_batch_size "
                        "yourself (and find_batch_size none)")
    if world > 1:
        raise UserError(f"find_batch_size runs in a single process, this job has {world}: run it once "
                        f"alone, then launch the job with the --train_batch_size it reports")


def apply(trainer, dataset, collate_fn) -> None:
    """Set ``train_batch_size`` (and with ``find_batch_size_keep_effective`` the accumulation) from the
    search, or from the stored run when resuming; rebuild the plan."""
    cfg = trainer.cfg
    check_device(trainer.device, trainer.world)
    stored = trainer.run_dir.stored_settings if trainer.run_dir is not None else None
    if trainer.run_outcome in ("resume", "extend", "finished") and stored:
        for key in FOUND_KEYS:
            cfg[key] = stored[key]
        logger.info("find_batch_size: the run keeps train_batch_size %d x accumulation %d found before",
                    cfg.train_batch_size, cfg.gradient_accumulation_steps)
    else:
        effective = cfg.train_batch_size * cfg.gradient_accumulation_steps
        found, tried = search(lambda b: _fits(trainer, dataset, collate_fn, b), cfg.train_batch_size,
                              cfg.find_batch_size, limit=len(dataset))
        cfg.train_batch_size = choose(found)
        if cfg.find_batch_size_keep_effective:
            cfg.gradient_accumulation_steps = max(1, math.ceil(effective / cfg.train_batch_size))
        logger.info("find_batch_size %s: tried %s; largest that fits %d, training with train_batch_size %d "
                    "(x%.1f safety) x accumulation %d", cfg.find_batch_size,
                    ", ".join(f"{b} {'ok' if ok else 'out of memory'}" for b, ok in tried), found,
                    cfg.train_batch_size, SAFETY, cfg.gradient_accumulation_steps)
    trainer.plan = RunPlan.build(cfg, len(dataset), trainer.world)


def _fits(trainer, dataset, collate_fn, batch_size: int) -> bool:
    """:data:`TRIAL_STEPS` real training steps at ``batch_size``; everything they changed is put back."""
    cfg = trainer.cfg
    snap, rngs, plan = trainer.snapshot(), get_rng_states(), trainer.plan
    trial_cfg = type(cfg)({**cfg, "train_batch_size": batch_size})
    loader = None
    try:
        trainer.plan = RunPlan.build(trial_cfg, len(dataset), trainer.world)
        sampler = ResumableDistributedSampler(len(dataset), 1, 0, shuffle=True, seed=cfg.seed)
        loader = build_train_dataloader(dataset, sampler, batch_size, collate_fn, n_workers=0, seed=cfg.seed)
        trainer._data = _forever(trainer.task.wrap_train_loader(loader, cfg, trainer.device))
        for _ in range(TRIAL_STEPS):
            trainer.run_step()
        return True
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if is_out_of_memory(e):
            return False
        raise
    finally:
        trainer._data = loader = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        trainer.optimizer.synchronize()
        trainer.load_snapshot(snap)
        set_rng_states(rngs)
        trainer.plan = plan


def _forever(loader):
    while True:
        yield from loader
