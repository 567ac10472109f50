"""cpu_sched_batch: CPU jobs run under SCHED_BATCH, threads started before and after included."""
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies only")

# Runs in a fresh interpreter: the policy would otherwise stick to the pytest process.
PROBE = r"""
import os, sys, threading
sys.path.insert(0, sys.argv[1])
os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not inherited from a batch-scheduled pytest
stop = threading.Event()
before = threading.Thread(target=stop.wait); before.start()
from clipbert_legacy.tasks.cpu import batch_scheduling
applied = batch_scheduling(sys.argv[2] == "1")
after = threading.Thread(target=stop.wait); after.start()
policies = {t: os.sched_getscheduler(int(t)) for t in os.listdir("/proc/self/task")}
stop.set()
names = {os.SCHED_BATCH: "batch", os.SCHED_OTHER: "other"}
print(applied, sorted({names.get(p, str(p)) for p in policies.values()}), len(policies))
"""


def _probe(enabled):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "-c", PROBE, REPO, "1" if enabled else "0"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split("\n")[-2]


def test_batch_scheduling_covers_every_thread():
    line = _probe(True)
    assert line.startswith("True ['batch'] "), line
    assert int(line.rsplit(" ", 1)[1]) >= 3  # main + the threads started before and after the call


def test_batch_scheduling_off_keeps_the_default_policy():
    line = _probe(False)
    assert line.startswith("False ['other'] "), line
