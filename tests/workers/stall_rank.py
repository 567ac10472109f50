"""One rank stalls at a step: ``stall_rank.py OUT_DIR RANK STEP MODE`` (toy task, real entry point).

MODE ``stop``: the rank stops itself with SIGSTOP (a frozen node: every thread stops). ``gil``: it
holds the GIL for 12 s in one C call inside ``hvd.busy()`` (a large checkpoint written to slow storage),
which the peers must allow. ``sleep``: it sleeps 12 s without the GIL (a slow evaluation on one rank).
"""
import ctypes
import os
import signal
import sys
import time

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.contracts import Hook
from tests.toy_task import ToyTask, toy_argv

torch.set_num_threads(1)
OUT, RANK, STEP, MODE = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


class Stall(Hook):
    def after_step(self, trainer, result):
        if trainer.rank != RANK or trainer.global_step != STEP:
            return
        print(f"rank {RANK} stalls ({MODE}) at step {STEP}, pid {os.getpid()} at t={time.time():.3f}",
              flush=True)
        if MODE == "stop":
            os.kill(os.getpid(), signal.SIGSTOP)
        elif MODE == "gil":
            with hvd.busy():
                ctypes.PyDLL(None).sleep(12)  # libc sleep(3), called with the GIL held
        else:
            time.sleep(12)


class StallingToy(ToyTask):
    def build_hooks(self, cfg):
        return [Stall()]


sys.exit(main("shared", StallingToy, toy_argv(OUT, num_train_epochs=4)))
