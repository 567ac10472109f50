"""The one training engine every task uses (ClipBERT copied its loop into each ``run_*.py``).

A task supplies a :class:`Task` (model, training data, loss, evaluation); :class:`Trainer` does the
rest, in ClipBERT's order (reference spec §6; Horovod + apex recipe in apex_amp_legacy.md §7):

setup: ``hvd.init()``, device ``cuda:local_rank`` (else CPU), seed, model, named param groups,
``hvd.DistributedOptimizer(backward_passes_per_step=gradient_accumulation_steps)``, parameter and
optimizer-state broadcast, then ``amp.initialize(O2, keep_batchnorm_fp32=True)`` when ``fp16``.

micro-step: forward, ``loss / gradient_accumulation_steps``, backward inside
``amp.scale_loss(delay_unscale=not boundary)``; at the boundary ``zero_none_grad`` and
``optimizer.synchronize()`` (the single allreduce of the step, still inside scale_loss), then the LR
schedules by group role, ``clip_grad_norm_(amp.master_params(opt), grad_norm)`` unless -1, the step
in ``skip_synchronize()``, ``zero_grad``. Validation every ``valid_steps`` and at the end, best
checkpoint / early stopping, restore file every ``save_steps``.

Documented differences from ClipBERT:

* the loss is divided by ``gradient_accumulation_steps`` (ClipBERT summed the micro-step gradients,
  so its effective LR grew with accumulation); k micro-batches of b equal one batch of k*b;
* gradients are allreduced once per optimizer step, not on every micro-step;
* ``sampler.set_epoch(epoch)`` is called (ClipBERT reused the first epoch's order forever);
* the restore file holds fp32 optimizer state, amp state, all ranks' RNG states and the data
  position, so a restarted run continues exactly (ClipBERT restarted the data and kept fp16 moments);
* the restore interval is ``max(1, int(save_steps_ratio*T))`` (ClipBERT crashed on 0);
* a non-finite loss (outside amp's own overflow skipping) stops the run with the step number and
  the last good weights saved;
* the "epoch" of multi_step schedules is the data loader's epoch (ClipBERT derived it from the
  step count, which is the same number up to rounding at epoch ends).
"""
import json
import logging
import math
import os
import sys
import time
from contextlib import nullcontext

import torch

import src.compat.hvd as hvd
from src.datasets.loaders import move_to_device
from src.optimization.param_groups import build_optimizer, set_lr
from src.optimization.sched import get_lr_sched
from src.training.checkpoint import ModelSaver, TrainingRestorer, fp32_state_dict
from src.training.data import ResumableDistributedSampler, build_train_dataloader
from src.utils.logger import RunningMeter, add_log_to_file, make_tb_logger, remove_log_file, setup_logging
from src.utils.misc import get_rng_states, set_random_seed, set_rng_states, zero_none_grad

logger = logging.getLogger(__name__)

MAX_FP16_NONFINITE_STEPS = 20  # consecutive optimizer steps with a non-finite loss under fp16


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN/inf loss; the message names the step and the last good checkpoint."""


class Task:
    """What a task script supplies. Override the methods marked *required*.

    ``main_metric``: key of :meth:`evaluate`'s (flattened) result used for the best checkpoint and
    early stopping when ``cfg.best_metric`` is unset.
    """
    main_metric = "loss"

    def build_model(self, cfg):  # required
        """The model (``nn.Module``); the engine moves it to the device."""
        raise NotImplementedError

    def build_train_data(self, cfg):  # required
        """``(dataset, collate_fn)``; ``len(dataset)`` is the number of training groups."""
        raise NotImplementedError

    def wrap_train_loader(self, loader, cfg, device):
        """Wrap the engine's DataLoader (e.g. in a PrefetchLoader). Default: unchanged.

        The wrapper must yield one item per DataLoader batch, in order (the data position counts
        them); for a batch with nothing usable yield ``None``: the engine then runs a zero-loss
        micro-step so accumulation and the allreduce stay aligned across ranks.
        """
        return loader

    def forward_train(self, model, batch, cfg):  # required
        """Mean loss of one micro-batch (scalar tensor), or a dict with 'loss' and extra scalars."""
        raise NotImplementedError

    def evaluate(self, model, cfg, global_step):  # required
        """Validation metrics (called on every rank, model in eval mode under no_grad).

        Return a (possibly nested) dict of numbers, complete on rank 0 (gather across ranks with
        src.utils.distributed.all_gather_list); nested keys are joined with '_'
        (``{"text2video": {"r1": ..}}`` -> ``text2video_r1``, TB tag ``valid/text2video_r1``).
        """
        raise NotImplementedError

    def batch_size(self, batch):
        """Examples in a batch, for throughput logging."""
        if isinstance(batch, dict):
            if "n_examples_list" in batch:
                return len(batch["n_examples_list"])
            for v in batch.values():
                if torch.is_tensor(v) and v.dim() > 0:
                    return v.size(0)
        return 1

    def model_config(self, cfg):
        """Dict written to ``log/model_config.json`` (default: the cfg.model_config file's content)."""
        path = cfg.get("model_config")
        if path and os.path.isfile(path):
            with open(path) as f:
                return json.load(f)
        return None


class Hook:
    """Optional callbacks; subclass and override what you need."""

    def on_train_start(self, trainer):
        pass

    def on_step_end(self, trainer):
        pass

    def on_validation_end(self, trainer, metrics):
        pass

    def on_train_end(self, trainer, summary):
        pass


def flatten_metrics(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}_{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(flatten_metrics(v, key))
        elif isinstance(v, bool):
            out[key] = float(v)
        elif isinstance(v, (int, float)):
            out[key] = float(v)
        elif torch.is_tensor(v) and v.numel() == 1:
            out[key] = float(v.item())
    return out


def num_train_steps(n_examples, epochs, world, batch_size, accum):
    """ClipBERT: ``ceil(epochs * n_groups / (n_gpu * bsz * accum))``."""
    return int(math.ceil(epochs * n_examples / (world * batch_size * accum)))


def valid_interval(total_steps, num_valid, min_valid_steps):
    """ClipBERT: ``ceil(T / num_valid / min_valid_steps) * min_valid_steps`` (T=1234 -> 100)."""
    return int(math.ceil(total_steps / num_valid / min_valid_steps)) * min_valid_steps


def save_interval(total_steps, save_steps_ratio):
    return max(1, int(save_steps_ratio * total_steps))


def metric_mode(name, mode="auto"):
    if mode != "auto":
        return mode
    low = name.lower()
    return "min" if low.endswith("loss") or low.endswith("medianr") or low.endswith("meanr") else "max"


class Trainer:
    """``Trainer(cfg, task, hooks=()).train()`` -> summary dict (see :meth:`train`)."""

    def __init__(self, cfg, task, hooks=()):
        if not cfg.get("output_dir"):
            raise ValueError("output_dir is not set: give --output_dir (or output_dir in the JSON config)")
        self.cfg, self.task, self.hooks = cfg, task, list(hooks)
        self.global_step = 0
        self.epoch = 0
        self.batches_in_epoch = 0
        self.best = {"metric": None, "value": None, "step": None, "bad_validations": 0}
        self.finished = False
        self.last_metrics = None
        self.model = self.optimizer = None
        self.amp = None

    # ------------------------------------------------------------------------------------------
    def _setup(self):
        cfg = self.cfg
        if not hvd.is_initialized():
            hvd.set_backend(cfg.get("dist_backend", "auto"))
        hvd.init()
        self.rank, self.world = hvd.rank(), hvd.size()
        self.is_main = self.rank == 0
        if torch.cuda.is_available():
            torch.cuda.set_device(hvd.local_rank())
            self.device = torch.device("cuda", hvd.local_rank())
        else:
            self.device = torch.device("cpu")
        set_random_seed(cfg.seed)
        out = cfg.output_dir
        self.log_dir, self.ckpt_dir = os.path.join(out, "log"), os.path.join(out, "ckpt")
        self._log_handler = None
        if self.is_main:
            os.makedirs(self.log_dir, exist_ok=True)
            os.makedirs(self.ckpt_dir, exist_ok=True)
            setup_logging()
            self._log_handler = add_log_to_file(os.path.join(self.log_dir, "log.txt"))
        else:  # as ClipBERT: progress lines from rank 0 only; other ranks still report warnings
            logging.getLogger().setLevel(logging.WARNING)
        self.tb = make_tb_logger(self.log_dir, self.is_main)
        self.saver = ModelSaver(self.ckpt_dir) if self.is_main else None
        self.restorer = TrainingRestorer(self.ckpt_dir)

        model = self.task.build_model(cfg).to(self.device)
        dataset, collate_fn = self.task.build_train_data(cfg)
        self.n_examples = len(dataset)
        accum = cfg.gradient_accumulation_steps
        self.total_steps = num_train_steps(self.n_examples, cfg.num_train_epochs, self.world,
                                           cfg.train_batch_size, accum)
        self.stop_step = min(self.total_steps, 3) if cfg.get("debug") else self.total_steps
        self.valid_steps = valid_interval(self.total_steps, cfg.num_valid, cfg.min_valid_steps)
        self.save_steps = save_interval(self.total_steps, cfg.save_steps_ratio)
        cfg.num_train_steps, cfg.valid_steps, cfg.save_steps = self.total_steps, self.valid_steps, self.save_steps
        cfg.n_gpu = self.world
        self.best["metric"] = cfg.get("best_metric") or self.task.main_metric
        self.best_mode = metric_mode(self.best["metric"], cfg.get("best_metric_mode", "auto"))
        if self.is_main:
            self._write_json("args.json", cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg))
            mc = self.task.model_config(cfg)
            if mc is not None:
                self._write_json("model_config.json", mc)

        optimizer = build_optimizer(model, cfg)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             backward_passes_per_step=accum)
        state = self.restorer.load()
        if state is not None:
            model.load_state_dict(state["model"])
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        if cfg.fp16:
            from src.compat import amp
            self.amp = amp
            model, optimizer = amp.initialize(model, optimizer, opt_level="O2",
                                              keep_batchnorm_fp32=True, verbosity=0)
        self.model, self.optimizer = model, optimizer
        # after amp.initialize (which may cast them): the parameters the per-step code touches
        self._trainable = [p for p in model.parameters() if p.requires_grad]
        self.running_loss = RunningMeter("loss")
        self.sampler = ResumableDistributedSampler(self.n_examples, self.world, self.rank, shuffle=True,
                                                   seed=cfg.seed)
        loader = build_train_dataloader(dataset, self.sampler, cfg.train_batch_size, collate_fn,
                                        cfg.n_workers, cfg.pin_mem and self.device.type == "cuda",
                                        seed=cfg.seed)
        self.loader = self.task.wrap_train_loader(loader, cfg, self.device)
        if state is not None:
            self._load_restore_state(state)
        logger.info("training: %d examples, %d processes, batch %d x accum %d -> %d steps; validate every "
                    "%d, restore file every %d steps", self.n_examples, self.world, cfg.train_batch_size,
                    accum, self.total_steps, self.valid_steps, self.save_steps)

    def _write_json(self, name, obj):
        with open(os.path.join(self.log_dir, name), "w") as f:
            json.dump(obj, f, indent=4, default=str)

    # ------------------------------------------------------------------------------------------
    def _master_params(self):
        if self.amp is not None:
            return list(self.amp.master_params(self.optimizer))
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def _masters_by_name(self):
        """Parameter name -> the tensor the optimizer updates (the fp32 master under amp O2)."""
        out = {}
        for g in self.optimizer.param_groups:
            for n, p in zip(g["param_names"], g["params"]):
                out[n] = p
        return out

    def model_state_dict(self):
        return fp32_state_dict(self.model, masters_by_name=self._masters_by_name() if self.amp else None)

    def _restore_state(self):
        rngs = hvd.allgather_object(get_rng_states())
        return {
            "global_step": self.global_step, "epoch": self.epoch,
            "batches_in_epoch": self.batches_in_epoch, "world_size": self.world,
            "train_batch_size": self.cfg.train_batch_size, "num_train_steps": self.total_steps,
            "model": self.model_state_dict(), "optimizer": self.optimizer.state_dict(),
            "amp": self.amp.state_dict() if self.amp is not None else None,
            "rng": rngs, "best": dict(self.best), "finished": self.finished,
            "running_loss": self.running_loss.val,
        }

    def save_restore(self):
        state = self._restore_state()  # collective: every rank calls it
        if self.is_main:
            self.restorer.save(state)

    def _load_restore_state(self, state):
        cfg = self.cfg
        self.optimizer.load_state_dict(state["optimizer"])
        if self.amp is not None:
            masters = self._masters_by_name()
            with torch.no_grad():
                for n, p in masters.items():
                    p.copy_(state["model"][n])
                for n, p in self.model.named_parameters():
                    if n in masters:
                        p.copy_(state["model"][n])
            if state.get("amp") is not None:
                self.amp.load_state_dict(state["amp"])
        self.global_step = state["global_step"]
        self.epoch, self.batches_in_epoch = state["epoch"], state["batches_in_epoch"]
        self.best.update(state["best"])
        self.finished = state.get("finished", False)
        if state.get("running_loss") is not None:
            self.running_loss(state["running_loss"])
        if state["num_train_steps"] != self.total_steps:
            logger.warning("resume: the run was planned for %d steps, now %d (config changed?)",
                           state["num_train_steps"], self.total_steps)
        same_layout = (state["world_size"] == self.world
                       and state["train_batch_size"] == cfg.train_batch_size)
        if same_layout:
            set_rng_states(state["rng"][self.rank])
        else:
            consumed = state["batches_in_epoch"] * state["train_batch_size"] * state["world_size"]
            self.batches_in_epoch = consumed // (cfg.train_batch_size * self.world)
            set_random_seed(cfg.seed + 1000 * self.rank + self.global_step)
            logger.warning("resume: saved with %d processes x batch %d, now %d x %d; the data position "
                           "is rescaled and RNGs reseeded, so the continuation is not bit-exact",
                           state["world_size"], state["train_batch_size"], self.world, cfg.train_batch_size)
        logger.info("resumed from %s at step %d (epoch %d, %d batches into it)", self.restorer.path,
                    self.global_step, self.epoch, self.batches_in_epoch)

    # ------------------------------------------------------------------------------------------
    def _batches(self):
        """(epoch, batch) forever, continuing at the saved data position."""
        while True:
            self.sampler.set_epoch(self.epoch)
            self.sampler.skip(self.batches_in_epoch * self.cfg.train_batch_size)
            if len(self.sampler) > 0:
                it = iter(self.loader)
                while True:
                    t0 = time.perf_counter()
                    try:
                        batch = next(it)
                    except StopIteration:
                        break
                    self._data_wait += time.perf_counter() - t0
                    self.batches_in_epoch += 1
                    yield batch
            self.epoch += 1
            self.batches_in_epoch = 0

    def _lrs(self):
        cfg = self.cfg
        lr_t = get_lr_sched(self.global_step, cfg.decay, cfg.learning_rate, self.total_steps,
                            cfg.warmup_ratio, cfg.step_decay_epochs or [], self.epoch)
        lr_c = get_lr_sched(self.global_step, cfg.cnn_lr_decay, cfg.cnn_learning_rate, self.total_steps,
                            cfg.warmup_ratio, cfg.cnn_step_decay_epochs or [], self.epoch)
        return lr_t, lr_c

    def _loss_scale(self):
        try:
            sd = self.amp.state_dict()
            return float(next(iter(sd.values()))["loss_scale"])
        except Exception:
            return None

    def train(self):
        """Train to ``num_train_steps`` (resuming from ``ckpt/restore.pt`` if present).

        Returns ``{"global_step", "num_train_steps", "best": {metric, value, step}, "last_metrics",
        "stopped_early"}``.
        """
        try:
            self._setup()
            for h in self.hooks:
                h.on_train_start(self)
            if self.finished or self.global_step >= self.stop_step:
                logger.info("training already finished at step %d (%s); nothing to do", self.global_step,
                            self.restorer.path)
                return self._summary()
            self._loop()
            summary = self._summary()
            for h in self.hooks:
                h.on_train_end(self, summary)
            return summary
        finally:
            self.tb.close()
            if getattr(self, "_log_handler", None) is not None:
                remove_log_file(self._log_handler)

    def _summary(self):
        return {"global_step": self.global_step, "num_train_steps": self.total_steps,
                "best": {k: self.best[k] for k in ("metric", "value", "step")},
                "last_metrics": self.last_metrics, "stopped_early": self.finished and
                self.global_step < self.stop_step}

    def _loop(self):
        cfg, model, opt = self.cfg, self.model, self.optimizer
        accum = cfg.gradient_accumulation_steps
        model.train()
        if self.amp is not None:  # ClipBERT's "quick hack for amp delay_unscale bug": lazy init
            with opt.skip_synchronize():
                opt.zero_grad()
                if self.global_step == 0:
                    opt.step()
        opt.zero_grad()
        autocast = (lambda: torch.autocast(self.device.type, dtype=torch.bfloat16)) if cfg.get("bf16") \
            else nullcontext
        pbar = None
        if self.is_main:
            from tqdm import tqdm
            pbar = tqdm(total=self.stop_step, initial=self.global_step, desc="train", dynamic_ncols=True,
                        mininterval=2.0, file=sys.stderr)
        try:
            self._steps(pbar, autocast, accum)
        finally:
            if pbar is not None:
                pbar.close()

    def _steps(self, pbar, autocast, accum):
        cfg, model, opt = self.cfg, self.model, self.optimizer
        self._data_wait = 0.0
        t_log, n_ex, wait_log, micro = time.perf_counter(), 0, 0.0, 0
        # [loss sum, non-finite count, finite count] of this step's micro-batches, kept on the device
        # so that reading the loss costs one sync per optimizer step, not one per micro-step
        acc = torch.zeros(3, dtype=torch.float64, device=self.device)
        extra = {}
        fp16_bad_steps = 0
        for batch in self._batches():
            micro += 1
            boundary = micro == accum
            if batch is None:  # nothing usable in this batch (e.g. every video undecodable):
                # a zero-loss micro-step keeps accumulation and gradient hooks aligned across ranks
                loss = sum(p.sum() for p in self._trainable) * 0.0
            else:
                batch = move_to_device(batch, self.device)
                n_ex += self.task.batch_size(batch)
                with autocast():
                    out = self.task.forward_train(model, batch, cfg)
                if isinstance(out, dict):
                    loss = out["loss"]
                    for k, v in out.items():
                        if k != "loss":
                            extra[k] = float(v)
                else:
                    loss = out
                lv = loss.detach().double()
                fin = torch.isfinite(lv)
                acc += torch.stack([torch.where(fin, lv, torch.zeros_like(lv)), (~fin).double(), fin.double()])
            loss = loss.float() / accum
            if self.amp is not None:
                with self.amp.scale_loss(loss, opt, delay_unscale=not boundary) as scaled:
                    scaled.backward()
                    if boundary:
                        zero_none_grad(self._trainable)
                        opt.synchronize()
            else:
                loss.backward()
                if boundary:
                    zero_none_grad(self._trainable)
                    opt.synchronize()
            if not boundary:
                continue
            # ---- optimizer step ----
            micro = 0
            stats = hvd.allreduce(acc, op=hvd.Sum, name="engine.loss_stats") if self.world > 1 else acc
            stats = stats.tolist()
            acc.zero_()
            g_bad = int(stats[1])
            if g_bad:
                if self.amp is None:
                    self._abort_nonfinite(int(g_bad))
                fp16_bad_steps += 1
                if fp16_bad_steps > MAX_FP16_NONFINITE_STEPS:
                    self._abort_nonfinite(int(g_bad), fp16=True)
            else:
                fp16_bad_steps = 0
            g_ok = stats[2]
            step_loss = stats[0] / g_ok if g_ok > 0 else float("nan")
            self.global_step += 1
            lr_t, lr_c = self._lrs()
            set_lr(opt, {"transformer": lr_t, "cnn": lr_c})
            grad_norm = None
            if cfg.grad_norm != -1:
                grad_norm = float(torch.nn.utils.clip_grad_norm_(self._master_params(), cfg.grad_norm))
            with opt.skip_synchronize():
                opt.step()
            opt.zero_grad()
            # ---- logging ----
            if math.isfinite(step_loss):
                self.running_loss(step_loss)
            logs = {"train/loss": self.running_loss.val if self.running_loss.val is not None else step_loss,
                    "train/lr_transformer": lr_t, "train/lr_cnn": lr_c}
            if grad_norm is not None:
                logs["train/grad_norm"] = grad_norm
            if self.amp is not None:
                scale = self._loss_scale()
                if scale is not None:
                    logs["train/loss_scale"] = scale
            for k, v in extra.items():
                logs[f"train/{k}"] = v
            now = time.perf_counter()
            dt = max(now - t_log, 1e-9)
            logs["perf/examples_per_s"] = n_ex * self.world / dt
            logs["perf/data_wait_ratio"] = (self._data_wait - wait_log) / dt
            self.tb.log_scalar_dict(logs, step=self.global_step)
            if self.global_step % cfg.get("log_interval", 100) == 0 or self.global_step == self.stop_step:
                logger.info("step %d/%d epoch %d: loss %.4f lr %.3g/%.3g%s %.1f ex/s data wait %.0f%%",
                            self.global_step, self.total_steps, self.epoch, logs["train/loss"], lr_t, lr_c,
                            f" grad_norm {grad_norm:.3f}" if grad_norm is not None else "",
                            logs["perf/examples_per_s"], 100 * logs["perf/data_wait_ratio"])
            if pbar is not None:
                pbar.update(1)
            # ---- validation / checkpoints ----
            last = self.global_step >= self.stop_step
            if self.global_step % self.valid_steps == 0 or last:
                self._validate()
            if self.global_step % self.save_steps == 0 or last or self.finished:
                if last:
                    self.finished = True
                self.save_restore()
            for h in self.hooks:
                h.on_step_end(self)
            if last or self.finished:
                break
            t_log, n_ex, wait_log = time.perf_counter(), 0, self._data_wait  # excl. validation/saving

    def _abort_nonfinite(self, n_bad, fp16=False):
        """Collective (every rank sees the same allreduced count): save the good weights and stop."""
        path = os.path.join(self.ckpt_dir, f"model_step_{self.global_step}.pt")
        if self.is_main:
            self.saver.save(self.model_state_dict(), self.global_step)
        restore_step = None
        if os.path.exists(self.restorer.path):
            restore_step = torch.load(self.restorer.path, map_location="cpu", weights_only=False)["global_step"]
        what = (f"{MAX_FP16_NONFINITE_STEPS} consecutive steps with a non-finite loss under fp16"
                if fp16 else f"non-finite loss (nan/inf) in {n_bad} micro-batch(es)")
        msg = (f"training stopped at step {self.global_step + 1} (epoch {self.epoch}): {what}; last good "
               f"weights (after step {self.global_step}) saved to {path}; "
               + (f"ckpt/restore.pt holds step {restore_step} to resume from; " if restore_step is not None
                  else "no restore file yet; ")
               + "lower learning_rate, check the data or enable grad_norm clipping")
        logger.error(msg)
        raise NonFiniteLossError(msg)

    def _validate(self):
        model = self.model
        model.eval()
        with torch.no_grad():
            metrics = self.task.evaluate(model, self.cfg, self.global_step)
        model.train()
        metrics = flatten_metrics(metrics or {})
        metrics = hvd.broadcast_object(metrics, root_rank=0)
        self.last_metrics = metrics
        self.tb.log_scalar_dict({f"valid/{k}": v for k, v in metrics.items()}, step=self.global_step)
        logger.info("validation at step %d: %s", self.global_step,
                    ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        state = self.model_state_dict() if self.is_main else None
        if self.is_main:
            self.saver.save(state, self.global_step)
        name = self.best["metric"]
        if name not in metrics:
            raise KeyError(f"best_metric={name!r} is not among the validation metrics "
                           f"({', '.join(sorted(metrics))}); set --best_metric to one of them")
        value = metrics[name]
        prev = self.best["value"]
        better = prev is None or (value > prev if self.best_mode == "max" else value < prev)
        if better:
            self.best.update(value=value, step=self.global_step, bad_validations=0)
            if self.is_main:
                self.saver.save_best(state)
                self._write_json("best_metric.json", {"metric": name, "value": value, "step": self.global_step,
                                                      "mode": self.best_mode})
        else:
            self.best["bad_validations"] += 1
            patience = self.cfg.get("early_stop_patience", -1)
            if patience != -1 and self.best["bad_validations"] >= patience:
                logger.info("early stopping at step %d: %s has not improved on %.4f (step %d) for %d "
                            "validations", self.global_step, name, self.best["value"], self.best["step"],
                            patience)
                self.finished = True
        for h in self.hooks:
            h.on_validation_end(self, metrics)
