"""Worker of bench_trainer.py: run clipbert_legacy.training.engine.Trainer on pre-collated batches, time each
step.

Shared by the in-process overhead measurement (imported: :class:`BatchTask`, :class:`StepTimer`,
:func:`engine_cfg`) and the 1-vs-2-process scaling runs (launched as
``horovodrun -np N --gloo python benchmarks/_bench_trainer_worker.py --batches F --out J``; rank 0
writes J with the per-step times).
"""
import argparse
import copy
import json
import os
import tempfile
import time

import torch
from torch.utils.data import Dataset

from clipbert_legacy.config import parse_args
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.task import Task

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# optimizer hyper-parameters shared by the engine config and the hand-written baseline loop
OPT = dict(learning_rate=1e-4, cnn_learning_rate=1e-4, weight_decay=1e-3, cnn_weight_decay=1e-3,
           betas=[0.9, 0.98])


class BatchList(Dataset):
    """``n`` items cycling over pre-collated batches; with train_batch_size 1 and :func:`first` as
    collate_fn the engine's DataLoader yields exactly these batch objects (no copy, no decoding)."""

    def __init__(self, batches, n):
        self.batches, self.n = batches, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.batches[i % len(self.batches)]


def first(items):
    return items[0]


class BatchTask(Task):
    """A retrieval-style task over in-memory batches; remembers the last batch it trained on."""

    def __init__(self, template_model, batches, n_items):
        self.template, self.batches, self.n_items = template_model, batches, n_items
        self.last_batch = None

    def build_model(self, cfg):
        return copy.deepcopy(self.template)

    def build_train_data(self, cfg):
        return BatchList(self.batches, self.n_items), first

    def forward_train(self, model, batch, cfg):
        self.last_batch = batch
        return model(batch)["loss"]

    def evaluate(self, model, cfg, global_step):
        return {"loss": 0.0}

    def model_config(self, cfg):
        return None


class StepTimer(Hook):
    """Wall time of each engine step: from the end of the previous ``after_step`` to this one, so it
    holds everything the engine does per step (data, forward/backward, step, logging, checks) and
    nothing the hook itself does. ``between(trainer)``, if given, runs between two engine steps
    (the interleaved baseline step) outside the measured window. Wall time (``times``) and process
    CPU time (``cpu_times``: not inflated when other jobs on the machine take the core) are kept."""

    def __init__(self, between=None):
        self.times, self.cpu_times, self.between = [], [], between
        self._t = self._c = None

    def before_train(self, trainer):
        self._t, self._c = time.perf_counter(), time.process_time()

    def after_step(self, trainer, result):
        self.times.append(time.perf_counter() - self._t)
        self.cpu_times.append(time.process_time() - self._c)
        if self.between is not None:
            self.between(trainer)
        self._t, self._c = time.perf_counter(), time.process_time()


def engine_cfg(output_dir, n_items, **overrides):
    """Engine config: no clipping, constant LR (so the baseline does the same maths), validation
    and restore-file saving only after the last step (outside the timed window), no workers."""
    base = dict(output_dir=output_dir, train_batch_size=1, num_train_epochs=1, n_workers=0, pin_mem=0,
                grad_norm=-1, decay="constant", cnn_lr_decay="constant", warmup_ratio=0.0,
                num_valid=1, min_valid_steps=10 * n_items, save_steps_ratio=1.0, seed=42,
                **OPT)
    base.update(overrides)
    argv = []
    for k, v in base.items():
        argv += [f"--{k}"] + ([str(x) for x in v] if isinstance(v, list) else [str(v)])
    return parse_args("shared", argv)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", required=True, help="torch.save'd {'model_config', 'batches'}")
    ap.add_argument("--steps", type=int, required=True, help="timed steps per process")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    import logging
    logging.disable(logging.INFO)  # no log.txt/stdout noise from the engine or model building
    import clipbert_legacy.compat.hvd as hvd
    from clipbert_legacy.modeling.build import build_model
    data = torch.load(a.batches, weights_only=True)
    hvd.init()
    world = hvd.size()
    torch.manual_seed(0)
    model = build_model(dict(model_config=data["model_config"], task_type="retrieval", loss_type="ce"))
    per_rank = a.warmup + a.steps + 1  # +1: the last step (validation, restore file) is not timed
    task = BatchTask(model, data["batches"], per_rank * world)
    timer = StepTimer()
    with tempfile.TemporaryDirectory() as out:
        out = hvd.broadcast_object(out, root_rank=0)  # rank 0's dir: only rank 0 writes there
        Trainer(engine_cfg(out, per_rank * world), task, hooks=[timer]).train()
        if hvd.rank() == 0:
            times, cpu = timer.times[a.warmup:-1], timer.cpu_times[a.warmup:-1]
            with open(a.out, "w") as f:
                json.dump({"world": world, "step_times": times, "cpu_step_times": cpu,
                           "samples_per_step": world * len(data["batches"][0]["n_examples_list"]),
                           "threads": torch.get_num_threads()}, f)


if __name__ == "__main__":
    main()
