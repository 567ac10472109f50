"""benchmarks/profile_threads.py's reading of /proc and of the run's metrics (issue 51): a busy thread's CPU
time is found under its group, a window subtracts its start, and the logged training step is read
from a metrics file with a line still being written."""
import json
import os
import threading
import time

from benchmarks import profile_threads as pt


def test_a_busy_thread_is_measured_and_grouped():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    t = threading.Thread(target=spin, name="spinner")
    t.start()
    try:
        pid = os.getpid()
        before = {pid: pt.read_threads(pid)}
        time.sleep(0.6)
        after = {pid: pt.read_threads(pid)}
    finally:
        stop.set()
        t.join()
    tid = t.native_id
    assert tid in after[pid] and after[pid][tid]["cpu_s"] > before[pid][tid]["cpu_s"]
    names = {pid: {tid: "hvd-executor-clipbert/hvd/none/0/1/ps0/"}}
    groups, threads = pt._by_group(after, names, since=before)
    assert groups["py: hvd-executor"]["threads"] == 1 and groups["py: hvd-executor"]["cpu_s"] > 0
    assert "main (compute)" in groups  # the thread whose id is the process's
    whole, _ = pt._by_group(after, {})
    assert whole["native: " + after[pid][tid]["comm"]]["cpu_s"] >= groups["py: hvd-executor"]["cpu_s"]


def test_the_last_logged_training_step(tmp_path):
    m = tmp_path / "metrics.jsonl"
    assert pt.train_step(str(m)) == 0  # not written yet
    rows = [{"split": "train", "step": 3}, {"split": "valid", "step": 9}, {"split": "train", "step": 4}]
    m.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"split": "tra')
    assert pt.train_step(str(m)) == 4
