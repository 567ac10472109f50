"""A hook that raises on one rank only: ``hook_raise.py OUT_DIR RANK STEP [kill]``.

The other ranks go on into the next step's collectives; the launcher must end the job. With ``kill``
the rank dies by SIGKILL instead (no exception, no clean-up: a node lost or an OOM kill).
"""
import os
import signal
import sys
import time

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.engine import Trainer
from tests.toy_task import ToyTask, toy_cfg

torch.set_num_threads(1)


class RaiseOnRank(Hook):
    def __init__(self, rank, step):
        self.rank, self.step = rank, step

    def after_step(self, trainer, result):
        if trainer.rank == self.rank and trainer.global_step == self.step:
            if KILL:
                print(f"rank {trainer.rank} kills itself at step {trainer.global_step} "
                      f"at t={time.time():.3f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            print(f"rank {trainer.rank} raises at t={time.time():.3f}", flush=True)
            raise RuntimeError(f"hook failed on rank {trainer.rank} at step {trainer.global_step}")


out, rank, step = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
KILL = sys.argv[4:] == ["kill"]
Trainer(toy_cfg(out, num_train_epochs=50, num_valid=1, min_valid_steps=1000, save_steps_ratio=1.0),
        ToyTask(n_train=32), hooks=[RaiseOnRank(rank, step)]).train()
print(f"rank {hvd.rank()} finished training", flush=True)
