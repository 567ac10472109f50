"""Fill the output disk at a step: ``fill_disk.py OUT_DIR STEP`` (the toy task, real entry point).

At STEP, rank 0 writes ``OUT_DIR/filler`` until the file system reports it full (ENOSPC), as a
colleague's job filling a shared scratch disk would. The run must then end by itself with one line.
"""
import errno
import os
import sys

import torch

from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.contracts import Hook
from tests.toy_task import ToyTask, toy_argv

torch.set_num_threads(1)


class FillDisk(Hook):
    def __init__(self, path, step):
        self.path, self.step = path, step

    def after_step(self, trainer, result):
        if trainer.global_step != self.step:
            return
        print(f"filling the disk at step {self.step}", flush=True)
        with open(self.path, "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
        with open(self.path, "ab", buffering=0) as f:  # the last bytes of a partly free block
            try:
                while True:
                    f.write(b"\0")
            except OSError:
                pass


class FillingToy(ToyTask):
    def build_hooks(self, cfg):
        return [FillDisk(os.path.join(sys.argv[1], "filler"), int(sys.argv[2]))]


sys.exit(main("shared", FillingToy, toy_argv(sys.argv[1], log_interval=100)))
