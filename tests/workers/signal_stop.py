"""Send a real signal to one rank at a step:
``signal_stop.py OUT_DIR RANK STEP SIGNAL [N_SIGNALS [--option value ...]]``.

Runs the toy task through the real entry point (``clipbert_legacy.tasks.entry.main``, so the exit status is
the one a launcher sees). The signal goes to one rank only (as when a scheduler signals one node first);
every rank must still stop at the same step. ``N_SIGNALS`` 2 sends it twice (= stop now).
"""
import os
import signal
import sys

import torch

from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.contracts import Hook
from tests.toy_task import ToyTask, toy_argv

torch.set_num_threads(1)


class SignalOnRank(Hook):
    def __init__(self, rank, step, sig, times):
        self.rank, self.step, self.sig, self.times = rank, step, sig, times

    def after_step(self, trainer, result):
        if trainer.rank == self.rank and trainer.global_step == self.step:
            print(f"rank {trainer.rank} sends itself {self.sig.name} at step {self.step}", flush=True)
            for _ in range(self.times):
                os.kill(os.getpid(), self.sig)


class SignalledToy(ToyTask):
    def build_hooks(self, cfg):
        return [SignalOnRank(int(sys.argv[2]), int(sys.argv[3]), signal.Signals[sys.argv[4]],
                             int(sys.argv[5]) if len(sys.argv) > 5 else 1)]


extra = sys.argv[6:]  # more command-line options for the run
sys.exit(main("shared", SignalledToy, toy_argv(sys.argv[1]) + extra))
