"""Train the toy task and record which examples every optimizer step trained on (elastic tests).

``elastic_train.py OUT_DIR LEDGER_DIR JSON_OVERRIDES [--kill_at STEP] [--grow_at STEP --trigger FILE]
[--sleep S]``

* every process appends ``{"t", "pid", "rank", "world", "step", "epoch", "ids"}`` per step to
  ``LEDGER_DIR/<pid>.jsonl`` (``tests/test_elastic.py`` reconstructs the steps that count);
* ``--kill_at``: the last rank of a 2-process world SIGKILLs itself after that step, once
  (``LEDGER_DIR/killed`` marks it done);
* ``--grow_at``: rank 0 creates ``--trigger`` after that step (the discovery script then reports a
  second host).
"""
import argparse
import json
import os
import signal
import time

import torch

from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.elastic import ElasticCommit
from clipbert_legacy.training.engine import Trainer
from tests.toy_task import ToyDataset, ToyTask, toy_cfg

torch.set_num_threads(1)


class IndexedToy(ToyDataset):
    def __getitem__(self, i):
        x, y = super().__getitem__(i)
        return x, y, i


def collate(items):
    return {"x": torch.stack([a for a, _, _ in items]), "y": torch.stack([b for _, b, _ in items]),
            "ids": [i for _, _, i in items], "n_examples_list": [1] * len(items)}


class RecordingTask(ToyTask):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.pending = []

    def build_train_data(self, cfg):
        return IndexedToy(self.n_train, seed=0), collate

    def forward_train(self, model, batch, cfg):
        self.pending.append(batch["ids"])
        return super().forward_train(model, batch, cfg)


class Ledger(Hook):
    def __init__(self, task, args):
        self.task, self.args = task, args
        self.path = os.path.join(args.ledger, f"{os.getpid()}.jsonl")

    def after_step(self, trainer, result):
        k = trainer.cfg.gradient_accumulation_steps
        rec = {"t": time.time(), "pid": os.getpid(), "rank": trainer.rank, "world": trainer.world,
               "step": trainer.global_step, "epoch": trainer.epoch,
               # the step's own micro-batches: forwards of a step cut short by a failure came before
               "ids": [i for ids in self.task.pending[-k:] for i in ids]}
        self.task.pending = []
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        a, marker = self.args, os.path.join(self.args.ledger, "killed")
        if (a.kill_at and trainer.global_step == a.kill_at and trainer.world == 2 and trainer.rank == 1
                and not os.path.exists(marker)):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if a.grow_at and trainer.global_step == a.grow_at and trainer.rank == 0:
            open(a.trigger, "w").close()
            wait_for_host_update(trainer)


def wait_for_host_update(trainer, timeout=90):
    """Hold the step until Horovod's driver has told this worker about the new host (the toy steps are
    too fast for a new worker to start otherwise); the next commit then re-forms the job."""
    state = next(h.state for h in trainer.hooks if isinstance(h, ElasticCommit))
    deadline = time.time() + timeout
    while state._host_messages.empty():
        if time.time() > deadline:
            raise TimeoutError(f"no host update from Horovod within {timeout}s")
        time.sleep(0.2)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("ledger")
    p.add_argument("overrides")
    p.add_argument("--kill_at", type=int, default=0)
    p.add_argument("--grow_at", type=int, default=0)
    p.add_argument("--trigger", default="")
    p.add_argument("--sleep", type=float, default=0.0)
    p.add_argument("--n_train", type=int, default=32)
    args = p.parse_args()
    task = RecordingTask(n_train=args.n_train, sleep=args.sleep, dropout=0.0)
    cfg = toy_cfg(args.out, **json.loads(args.overrides))
    summary = Trainer(cfg, task, hooks=[Ledger(task, args)]).train()
    print(json.dumps({"summary": summary}), flush=True)


if __name__ == "__main__":
    main()
