"""One optimizer step, read top to bottom (detectron2's ``SimpleTrainer.run_step``), and the batches it
reads.

:func:`run_step` takes the built components (``clipbert_legacy.training.build.Components``), the task, a batch
iterator and the run state: for each of the k micro-batches a forward, ``loss / k`` and backward inside
the precision's ``scale_loss`` (``delay_unscale`` on all but the last), with ``zero_none_grad`` +
``optimizer.synchronize()`` (the step's single allreduce) inside the last one; then the loss
statistics of all ranks (a stop signal rides along), the LR schedules by group role, gradient clipping
on the master params, the step in ``skip_synchronize()`` (``zero_stage`` 1/2: each rank steps the
parameters it owns and broadcasts them), ``zero_grad``. The engine runs it for training; the batch-size
finder runs it on trial components. fp32 / bf16 / amp O2 differ only inside
``clipbert_legacy.training.precision``.
"""
from __future__ import annotations

import time
from collections.abc import Iterator

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.optimization.param_groups import set_lr
from clipbert_legacy.optimization.sched import get_lr_sched
from clipbert_legacy.training.contracts import StepResult
from clipbert_legacy.utils.device import memory_mb, reset_peak_memory
from clipbert_legacy.utils.misc import zero_none_grad


class Diverged(Exception):
    """The step's loss was not finite more often in a row than the precision tolerates; raised before
    the optimizer step, so the weights are the last good ones (``clipbert_legacy.training.nonfinite`` reports
    it)."""

    def __init__(self, n_bad: int):
        super().__init__(f"non-finite loss in {n_bad} micro-batch(es)")
        self.n_bad = n_bad


class TimedBatches:
    """Batches from ``source`` and the seconds spent waiting for them since the last :meth:`waited`."""

    def __init__(self, source: Iterator):
        self.source, self.wait = source, 0.0

    def __next__(self):
        t = time.perf_counter()
        batch = next(self.source)
        self.wait += time.perf_counter() - t
        return batch  # on the device: Task.wrap_train_loader's contract

    def waited(self) -> float:
        wait, self.wait = self.wait, 0.0
        return wait


def batch_stream(parts, state) -> TimedBatches:
    """Training batches forever, epoch after epoch, from the data position (``state.examples_in_epoch``:
    consumed by all ranks together)."""
    def batches():
        sampler, span = parts.sampler, parts.cfg.train_batch_size * parts.process.world
        while True:
            sampler.set_epoch(state.epoch)
            sampler.start_at(state.examples_in_epoch)
            if len(sampler) > 0:
                for batch in parts.loader:
                    state.consumed(span, sampler.n)
                    yield batch
            state.next_epoch()
    return TimedBatches(batches())


def run_step(parts, task, batches: TimedBatches, state, stop_signal: bool = False) -> StepResult:
    """One optimizer step over ``gradient_accumulation_steps`` micro-batches, one allreduce."""
    k, opt, precision = parts.plan.gradient_accumulation_steps, parts.optimizer, parts.precision
    t0, n_examples, comm_wait = time.perf_counter(), 0, 0.0
    batches.waited()
    skipped_before = precision.skipped_steps()
    reset_peak_memory(parts.process.device)
    # loss sum, #non-finite, #finite, #ranks asked to stop (summed over ranks in one allreduce)
    stats = torch.zeros(4, dtype=torch.float64, device=parts.process.device)
    for micro in range(k):
        batch = next(batches)
        loss, extras = _forward(parts, task, batch, stats)
        n_examples += task.batch_size(batch) if batch is not None else 0
        last = micro == k - 1
        with precision.scale_loss(loss / k, opt, delay_unscale=not last) as scaled:
            scaled.backward()
            if last:  # the step's single allreduce, inside scale_loss (apex + Horovod recipe)
                zero_none_grad(parts.trainable)
                t_sync = time.perf_counter()
                opt.synchronize()  # waits for what the backward hooks started: the exposed part
                comm_wait = time.perf_counter() - t_sync
    stats[3] = float(stop_signal)
    loss, n_bad, n_stop = _reduce_loss_stats(stats, parts.process.world)
    streak = state.count_nonfinite(n_bad)
    if n_bad and streak > precision.tolerated_nonfinite_steps:
        raise Diverged(n_bad)  # before the step: a stop keeps the last good weights
    state.step_done(loss)
    lr_t, lr_c = _set_lr(parts, state)
    grad_norm = _clip_grad_norm(parts)
    with opt.skip_synchronize():
        opt.step()
    parts.sharding.after_step()  # zero_stage: owners broadcast the parameters they stepped
    opt.zero_grad()
    skipped_total = precision.skipped_steps()
    return StepResult(step=state.global_step, loss=loss, n_nonfinite=n_bad, grad_norm=grad_norm,
                      skipped=skipped_total > skipped_before, skipped_total=skipped_total,
                      loss_scale=precision.loss_scale(), lr_transformer=lr_t, lr_cnn=lr_c,
                      n_examples=n_examples, seconds=time.perf_counter() - t0, data_wait=batches.waited(),
                      extras=extras, comm_wait=comm_wait, stop_requested=n_stop > 0,
                      memory_mb=memory_mb(parts.process.device))


def _forward(parts, task, batch, stats: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """fp32 loss of one micro-batch (added to ``stats``) and the task's extra scalars."""
    if batch is None:  # nothing usable (e.g. every video undecodable): a zero loss that touches
        # every parameter keeps accumulation and the gradient hooks aligned across ranks
        return sum(p.sum() for p in parts.trainable) * 0.0, {}
    with parts.precision.autocast():
        out = task.forward_train(parts.model, batch, parts.cfg)
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


def _reduce_loss_stats(stats: torch.Tensor, world: int) -> tuple[float, int, int]:
    if world > 1:
        stats = hvd.allreduce(stats, op=hvd.Sum, name="engine.loss_stats")
    loss_sum, n_bad, n_ok, n_stop = stats.tolist()
    return (loss_sum / n_ok if n_ok > 0 else float("nan")), int(n_bad), int(n_stop)


def _set_lr(parts, state) -> tuple[float, float]:
    cfg, step, total = parts.cfg, state.global_step, parts.plan.num_train_steps
    lr_t = get_lr_sched(step, cfg.decay, cfg.learning_rate, total, cfg.warmup_ratio,
                        cfg.step_decay_epochs or [], state.epoch)
    lr_c = get_lr_sched(step, cfg.cnn_lr_decay, cfg.cnn_learning_rate, total, cfg.warmup_ratio,
                        cfg.cnn_step_decay_epochs or [], state.epoch)
    set_lr(parts.optimizer, {"transformer": lr_t, "cnn": lr_c})
    return lr_t, lr_c


def _clip_grad_norm(parts) -> float | None:
    if parts.cfg.grad_norm == -1:
        return None
    params = parts.precision.master_params(parts.optimizer)
    return parts.sharding.clip_grad_norm(params, parts.cfg.grad_norm)  # bit-equal for every zero_stage


def step_scalars(result: StepResult, running_loss: float | None, world: int) -> dict[str, float]:
    """The step's training scalars under their TensorBoard tags (the event record's ``train`` values)."""
    logs = {"train/loss": running_loss if running_loss is not None else result.loss,
            "train/lr_transformer": result.lr_transformer, "train/lr_cnn": result.lr_cnn}
    if result.grad_norm is not None:
        logs["train/grad_norm"] = result.grad_norm
    if result.loss_scale is not None:
        logs["train/loss_scale"] = result.loss_scale
        logs["train/skipped_steps"] = result.skipped_total
    logs["train/nonfinite_microbatches"] = result.n_nonfinite
    for k, v in result.extras.items():
        logs[f"train/{k}"] = float(v)
    seconds = max(result.seconds, 1e-9)
    logs["perf/examples_per_s"] = result.n_examples * world / seconds
    logs["perf/data_wait_ratio"] = result.data_wait / seconds
    logs["perf/comm_wait_ratio"] = result.comm_wait / seconds
    logs["perf/memory_mb"] = result.memory_mb  # peak CUDA memory of the step, or the CPU RSS
    return logs
