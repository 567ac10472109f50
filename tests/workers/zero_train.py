"""Train the toy task with ``zero_stage`` 0, 1 and 2 in turn (under torchrun; ``dist_backend`` torch
unless the overrides say otherwise): ``zero_train.py BASE JSON_OVERRIDES [STAGES, default 012]``.
Outputs go to BASE/z0, BASE/z1, BASE/z2; rank 0 prints one JSON line
``{"stages": {"0": {"state_bytes": [per rank], "owned": [per rank], "masters": [per rank],
"skipped": [per rank]}, ...}, "world": N}``.
"""
import json
import os
import sys

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.training.engine import Hook, Trainer
from clipbert_legacy.training.zero import optimizer_state_bytes
from tests.toy_task import ToyTask, toy_cfg

torch.set_num_threads(1)


class Measure(Hook):
    """After training: this rank's optimizer-state bytes, parameters it steps, separate fp32 masters,
    steps amp skipped (amp's counter is per process: counted from before_train)."""

    def before_train(self, trainer):
        self.skipped_before = trainer.precision.skipped_steps()

    def after_train(self, trainer, summary):
        params = [p for g in trainer.optimizer.param_groups for p in g["params"]]
        model_ids = {id(p) for p in trainer.model.parameters()}
        self.out = {"state_bytes": optimizer_state_bytes(trainer.optimizer, trainer.model),
                    "owned": len(params), "masters": sum(id(p) not in model_ids for p in params),
                    "skipped": trainer.precision.skipped_steps() - self.skipped_before}


base, overrides = sys.argv[1], {"dist_backend": "torch", **json.loads(sys.argv[2])}
stages = {}
for z in (int(c) for c in (sys.argv[3] if len(sys.argv) > 3 else "012")):
    m = Measure()
    cfg = toy_cfg(os.path.join(base, f"z{z}"), zero_stage=z, **overrides)
    Trainer(cfg, ToyTask(n_train=32), hooks=[m]).train()
    per_rank = hvd.allgather_object(m.out)
    stages[str(z)] = {k: [r[k] for r in per_rank] for k in ("state_bytes", "owned", "masters")}
    stages[str(z)]["skipped"] = [r["skipped"] for r in per_rank]
if hvd.rank() == 0:
    print(json.dumps({"stages": stages, "world": hvd.size()}), flush=True)
