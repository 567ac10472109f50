"""Train uninterrupted, train again but crash after a step, resume from disk; compare final weights.

``engine_resume.py BASE_DIR [CONFIG_OVERRIDES_JSON]`` (plain python or under horovodrun). Rank 0
prints one JSON line ``{"T", "resumed_from", "world", "max_diff", "moved", ...}``.
"""
import json
import os
import sys

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.nonfinite import NonFiniteLossError
from tests.toy_task import ToyTask, toy_cfg

torch.set_num_threads(1)

CRASH_AT = 5


class Crash(RuntimeError):
    pass


class CrashAt(Hook):
    def after_step(self, trainer, result):
        if trainer.global_step == CRASH_AT:
            raise Crash(f"simulated crash after step {CRASH_AT}")


base = sys.argv[1]
opts = dict(train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=2, save_steps_ratio=0.25,
            num_valid=2, min_valid_steps=1)
opts.update(json.loads(sys.argv[2]) if len(sys.argv) > 2 else {})
u = Trainer(toy_cfg(os.path.join(base, "u"), **opts), ToyTask(n_train=32)).train()
try:
    Trainer(toy_cfg(os.path.join(base, "r"), **opts), ToyTask(n_train=32), hooks=[CrashAt()]).train()
    raise SystemExit("the crash hook did not fire")
except Crash:
    pass
at_crash = torch.load(os.path.join(base, "r", "ckpt", "restore.pt"), weights_only=True)
resumed_from = at_crash["global_step"]
r = Trainer(toy_cfg(os.path.join(base, "r"), **opts), ToyTask(n_train=32)).train()
T = u["global_step"]
wu = torch.load(os.path.join(base, "u", "ckpt", f"model_step_{T}.pt"))
wr = torch.load(os.path.join(base, "r", "ckpt", f"model_step_{T}.pt"))
# a NaN loss on the last rank only: every rank must stop at the same step (no hang)
nan_msg = None
try:
    Trainer(toy_cfg(os.path.join(base, "nan"), **opts),
            ToyTask(n_train=32, nan_at_forward=5 if hvd.rank() == hvd.size() - 1 else None)).train()
except NonFiniteLossError as e:
    nan_msg = str(e)
nan_msgs = hvd.allgather_object(nan_msg)
flat = torch.cat([v.flatten() for v in wr.values()])
flats = hvd.allgather_object(flat)
if hvd.rank() == 0:
    print(json.dumps({"T": T, "resumed_from": resumed_from, "world": hvd.size(),
                      "max_diff": max((wu[k] - wr[k]).abs().max().item() for k in wu),
                      "moved": max((wr[k] - at_crash["model"][k]).abs().max().item() for k in wr),
                      "best_u": u["best"], "best_r": r["best"],
                      "ranks_equal": all(torch.equal(flats[0], f) for f in flats),
                      "nan_msgs": nan_msgs}), flush=True)
