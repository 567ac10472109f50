"""Train the toy task and SIGKILL this process inside its N-th restore-file save.

``kill_mid_save.py OUT_DIR PHASE N``; PHASE ``tmp``: half of the temp file is written (a kill during
``torch.save``); ``swap``: the temp file is complete and the old ``restore.pt`` has already become
``restore_backup.pt``, the new one is not yet in place (a kill between the two renames).
"""
import io
import os
import signal
import sys

import torch

from clipbert_legacy.training import checkpoint_files as checkpoint
from clipbert_legacy.training.engine import Trainer
from tests.toy_task import ToyTask, toy_cfg

torch.set_num_threads(1)
out, phase, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
real_save = checkpoint.TrainingRestorer.save
calls = []


def dying_save(self, state):
    calls.append(state["global_step"])
    if len(calls) < n:
        return real_save(self, state)
    buf = io.BytesIO()
    torch.save(state, buf)
    data = buf.getvalue()
    tmp = f"{self.path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(data if phase == "swap" else data[:len(data) // 2])
    if phase == "swap":
        os.replace(self.path, self.backup)
    print(f"killing myself in the save of step {state['global_step']}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


checkpoint.TrainingRestorer.save = dying_save
Trainer(toy_cfg(out), ToyTask()).train()
print("the kill did not happen", flush=True)
