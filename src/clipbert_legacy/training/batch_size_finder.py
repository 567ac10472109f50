"""``--find_batch_size power|binsearch``: the largest ``train_batch_size`` whose training steps fit the
device (Lightning's ``BatchSizeFinder``).

The second step of the build (``clipbert_legacy.training.build``: parse, find the batch size, plan,
components):
after the training data and before the plan, a few real optimizer steps (:data:`TRIAL_STEPS`: forward,
backward, optimizer step, under the run's precision) run on trial components (a model, optimizer and
loader built for each size, then dropped) at growing batch sizes from ``train_batch_size``: ``power``
doubles until the device runs out of memory; ``binsearch`` then bisects between the last size that fit
and the first that did not (a first size that does not fit is halved until one does). The RNGs are put
back after the trials and the run's components are built only then, from a config holding the found
size, so the run trains exactly as if it had been started with it; nothing built is changed afterwards.
The chosen size is the largest that fit times :data:`SAFETY`
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

from clipbert_legacy.utils.errors import UserError

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


def settle(cfg, device, world: int, stored: dict | None, fits, limit: int):
    """The run's config with ``train_batch_size`` (and with ``find_batch_size_keep_effective`` the
    accumulation) found by the search (``fits(b)``: do trial steps at batch ``b`` fit), or taken from
    ``stored`` (the earlier run's settings, when resuming it). ``cfg`` itself is not changed: the
    builder makes the plan and the components from the config returned."""
    if cfg.find_batch_size == "none":
        return cfg
    check_device(device, world)
    if stored:
        found = {key: stored[key] for key in FOUND_KEYS}
        logger.info("find_batch_size: the run keeps train_batch_size %d x accumulation %d found before",
                    *found.values())
        return type(cfg)({**cfg, **found})
    effective = cfg.train_batch_size * cfg.gradient_accumulation_steps
    largest, tried = search(fits, cfg.train_batch_size, cfg.find_batch_size, limit=limit)
    found = {"train_batch_size": choose(largest)}
    found["gradient_accumulation_steps"] = (max(1, math.ceil(effective / found["train_batch_size"]))
                                            if cfg.find_batch_size_keep_effective
                                            else cfg.gradient_accumulation_steps)
    logger.info("find_batch_size %s: tried %s; largest that fits %d, training with train_batch_size %d "
                "(x%.1f safety) x accumulation %d", cfg.find_batch_size,
                ", ".join(f"{b} {'ok' if ok else 'out of memory'}" for b, ok in tried), largest,
                found["train_batch_size"], SAFETY, found["gradient_accumulation_steps"])
    return type(cfg)({**cfg, **found})


def trial_fits(step_once) -> bool:
    """:data:`TRIAL_STEPS` calls of ``step_once()`` (real training steps on trial components the caller
    built for one batch size): whether they ran without the device running out of memory."""
    try:
        for _ in range(TRIAL_STEPS):
            step_once()
        return True
    except (torch.OutOfMemoryError, RuntimeError) as e:
        if is_out_of_memory(e):
            return False
        raise
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
