"""Worker of stress_exit.py: the toy task through the real entry point, ended one of four ways:
``_stress_exit_worker.py OUT_DIR HOW`` with HOW =

* ``end``: trains to the end (exit 0);
* ``signal``: rank 1 sends itself SIGUSR1 at step 3: every rank stops at the same step (exit 75);
* ``raise``: a hook raises on rank 1 at step 3 (rank 1 exits 1 with the traceback; the launcher ends
  rank 0);
* ``sysexit``: a hook calls ``sys.exit(3)`` on every rank at step 3.

Each rank prints ``exit-status RANK STATUS`` as its last line (an atexit function registered first, so
it runs after every other one): a rank that printed it and still did not exit with that status died
in the interpreter's finalization.
"""
import atexit
import os
import signal
import sys

import torch

from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.contracts import Hook
from tests.toy_task import ToyTask, toy_argv  # the driver puts the checkout on PYTHONPATH

torch.set_num_threads(1)
STATUS = {"code": None}


class EndAt(Hook):
    def __init__(self, how):
        self.how = how

    def after_step(self, trainer, result):
        if trainer.global_step != 3:
            return
        if self.how == "signal" and trainer.rank == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        elif self.how == "raise" and trainer.rank == 1:
            raise RuntimeError("stress_exit: a hook raises on rank 1")
        elif self.how == "sysexit":
            STATUS["code"] = 3
            sys.exit(3)


class Toy(ToyTask):
    def build_hooks(self, cfg):
        return [EndAt(sys.argv[2])]


def _last_line():
    rank = os.environ.get("RANK", os.environ.get("HOROVOD_RANK", "?"))
    print(f"exit-status {rank} {STATUS['code']}", flush=True)


atexit.register(_last_line)
try:
    STATUS["code"] = main("shared", Toy, toy_argv(sys.argv[1], num_train_epochs=2))
except SystemExit as e:
    STATUS["code"] = e.code
    raise
except BaseException:
    STATUS["code"] = 1
    raise
sys.exit(STATUS["code"])
