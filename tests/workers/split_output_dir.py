"""Each rank trains the toy task with its *own* output_dir (``split_output_dir.py BASE``): rank r uses
BASE/rank{r}, as ranks on machines without shared storage would. BASE/rank0 holds a restore file,
the others none."""
import os
import sys

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.tasks.entry import main
from tests.toy_task import ToyTask, toy_argv

torch.set_num_threads(1)
hvd.init()
sys.exit(main("shared", ToyTask, toy_argv(os.path.join(sys.argv[1], f"rank{hvd.rank()}"))))
