"""The toy task slowed down (0.1 s a step, 48 steps), for signals sent from outside while it trains:
``slow_toy.py OUT_DIR`` (real entry point)."""
import sys

import torch

from clipbert_legacy.tasks.entry import main
from tests.toy_task import ToyTask, toy_argv

torch.set_num_threads(1)


class SlowToy(ToyTask):
    def __init__(self):
        super().__init__(sleep=0.1)


sys.exit(main("shared", SlowToy, toy_argv(sys.argv[1], num_train_epochs=6)))
