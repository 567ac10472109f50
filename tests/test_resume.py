"""Exact resume: kill -9 mid-run, rerun the same command, same final weights (bitwise on CPU);
and under horovodrun -np 2 an interrupted-and-resumed run matches within 1e-6."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests import mp_utils
from tests.conftest import requires_horovod

WORKER = mp_utils.REPO / "tests" / "workers" / "engine_train.py"
OPTS = dict(train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=3, save_steps_ratio=0.1,
            num_valid=2, min_valid_steps=1, dist_backend="torch")
T = 36  # ceil(3 * 48 / (2 * 2))


def final(out):
    return torch.load(os.path.join(out, "ckpt", f"model_step_{T}.pt"))


def test_kill9_then_rerun_resumes_bitwise(tmp_path):
    """Dropout, noisy 'augmentation', accumulation 2, 3 epochs: the killed-and-rerun run ends with
    exactly the weights of the uninterrupted one."""
    opts, task = json.dumps(OPTS), json.dumps({"n_train": 48, "sleep": 0.02})
    u, r = str(tmp_path / "u"), str(tmp_path / "r")
    mp_utils.check(mp_utils.run_python([WORKER, u, opts, task], timeout=90))
    proc = subprocess.Popen([sys.executable, str(WORKER), r, opts, task], cwd=str(mp_utils.REPO),
                            env=mp_utils._env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    restore = os.path.join(r, "ckpt", "restore.pt")
    mp_utils.wait_until(lambda: os.path.exists(restore), f"the first restore file {restore}", proc=proc)
    time.sleep(0.15)  # a few more steps, so the kill lands between (or during) restore saves
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    assert proc.returncode == -signal.SIGKILL
    assert not os.path.exists(os.path.join(r, "ckpt", f"model_step_{T}.pt")), "killed too late"
    killed_at = torch.load(restore, weights_only=True)["global_step"] if os.path.exists(restore) else \
        torch.load(restore.replace("restore.pt", "restore_backup.pt"), weights_only=True)["global_step"]
    assert 0 < killed_at < T
    res = mp_utils.check(mp_utils.run_python([WORKER, r, opts, task], timeout=90))
    assert f"at step {killed_at} (epoch" in res.stderr  # "resumed from ... at step N"
    wu, wr = final(u), final(r)
    assert wu.keys() == wr.keys()
    for k in wu:
        assert torch.equal(wu[k], wr[k]), k
    summary = json.loads(res.stdout.strip().splitlines()[-1])["summary"]
    assert summary["global_step"] == T


RESUME_WORKER = mp_utils.REPO / "tests" / "workers" / "engine_resume.py"


def _result(stdout):
    line = [x for x in stdout.splitlines() if '{"T"' in x][-1]
    return json.loads(line[line.index('{"T"'):])


@pytest.mark.multiprocess
@requires_horovod
def test_resume_under_horovodrun_np2(tmp_path):
    res = mp_utils.check(mp_utils.run_horovod([RESUME_WORKER, tmp_path], np=2, timeout=150))
    out = _result(res.stdout)
    assert out["world"] == 2 and out["T"] == 8 and out["resumed_from"] == 4
    assert out["moved"] > 1e-3  # training after the resume point changed the weights
    assert out["max_diff"] <= 1e-6 and out["ranks_equal"]
    assert out["best_u"] == out["best_r"]
    # NaN on one rank only (its 5th micro-batch = step 3): both ranks stop there with the message
    assert len(out["nan_msgs"]) == 2 and all(m and "training stopped at step 3" in m for m in out["nan_msgs"])


def test_resume_fp16_amp_o2_exact(tmp_path):
    """amp O2 on CPU: fp32 masters, optimizer state and the loss scale come back exactly."""
    res = mp_utils.check(mp_utils.run_python([RESUME_WORKER, tmp_path, json.dumps(
        {"fp16": 1, "dist_backend": "torch"})], timeout=90))
    out = _result(res.stdout)
    assert out["world"] == 1 and out["resumed_from"] == 4 and out["moved"] > 1e-3
    assert out["max_diff"] == 0.0
    assert out["nan_msgs"] == [None]  # fp16: amp skips the overflowing steps, training goes on
