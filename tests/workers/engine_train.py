"""Train the toy task once: ``engine_train.py OUT_DIR JSON_OVERRIDES [TASK_KWARGS_JSON]``.

Prints one JSON line ``{"summary": ...}``; the final weights are in OUT_DIR/ckpt/model_step_*.pt.
"""
import json
import sys

import torch

from clipbert_legacy.training.engine import Trainer
from tests.toy_task import ToyTask, toy_cfg

torch.set_num_threads(1)

out, overrides = sys.argv[1], json.loads(sys.argv[2])
task_kwargs = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
summary = Trainer(toy_cfg(out, **overrides), ToyTask(**task_kwargs)).train()
print(json.dumps({"summary": summary}), flush=True)
