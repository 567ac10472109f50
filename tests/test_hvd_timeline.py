"""Horovod's timeline on the torch backend (issue 50, item 5): rank 0 writes the file while the job
runs, a Chrome trace that parses at any moment, with Horovod's event names (``NEGOTIATE_ALLREDUCE``, one
``X`` per rank, ``ALLREDUCE``, ``GLOO_ALLREDUCE``, ``CYCLE_START``), tensors named as Horovod names them
(``allreduce.test_allreduce``); ``start_timeline``/``stop_timeline`` switch files."""
import json
import subprocess
import sys
import time

import pytest

from tests import mp_utils

WORKER = "tests/workers/hvd_timeline.py"
# start-up of a 2-process job: about 10 s on an idle 2-core machine; the checks need a second
JOB_TIMEOUT_S = 300


def _events(path):
    trace = json.loads(path.read_text())
    assert isinstance(trace, list) and trace[0]["args"]["start_time_since_epoch_in_micros"] > 0
    pids = {e["pid"]: e["args"]["name"] for e in trace if e.get("name") == "process_name" and e["pid"]}
    spans = {}
    for e in trace:
        if e.get("ph") in ("B", "X") and e.get("pid") in pids:
            spans.setdefault(pids[e["pid"]], []).append((e["ph"], e["name"]))
    return trace, spans


def _balanced(trace):
    depth = {}
    for e in trace:
        if e.get("ph") == "B":
            depth[e["pid"]] = depth.get(e["pid"], 0) + 1
        elif e.get("ph") == "E":
            depth[e["pid"]] -= 1
            assert depth[e["pid"]] >= 0, e
    return all(d == 0 for d in depth.values())


@pytest.mark.multiprocess
def test_timeline_is_written_while_the_job_runs(tmp_path):
    """A paused torchrun job: rank 0's file exists and parses with the events so far; after the job, the
    environment's file and ``start_timeline``'s file each hold their part."""
    mp_utils._require_serial("torchrun")
    path = tmp_path / "timeline.json"
    cmd = [sys.executable, "-m", "clipbert_legacy.compat.loopback", "torchrun", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(mp_utils.free_port()), WORKER,
           "--out", str(tmp_path)]
    env = mp_utils._env({"DIST_BACKEND": "torch", "HOROVOD_TIMELINE": str(path),
                         "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    job = subprocess.Popen(cmd, cwd=mp_utils.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        mp_utils.wait_until(lambda: (tmp_path / "paused").exists(), "the workers' first collectives",
                            timeout=JOB_TIMEOUT_S, proc=job)
        # the job is paused: the file is there and parses, with the events so far
        deadline = time.monotonic() + 30  # the writer thread flushes within milliseconds of an event
        while True:
            trace, spans = _events(path)
            if "allgather.gather" in spans and _balanced(trace) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert job.poll() is None, "the job ended before the timeline was read"
        assert spans["allreduce.test_allreduce"] == [("B", "NEGOTIATE_ALLREDUCE"), ("X", "0"), ("X", "1"),
                                                     ("B", "ALLREDUCE"), ("B", "GLOO_ALLREDUCE")] or \
            spans["allreduce.test_allreduce"] == [("B", "NEGOTIATE_ALLREDUCE"), ("X", "1"), ("X", "0"),
                                                  ("B", "ALLREDUCE"), ("B", "GLOO_ALLREDUCE")], spans
        assert [s for s in spans["broadcast.noname.0"] if s[0] == "B"] == [
            ("B", "NEGOTIATE_BROADCAST"), ("B", "BROADCAST"), ("B", "GLOO_BCAST")], spans
        assert ("B", "GLOO_ALLGATHER") in spans["allgather.gather"], spans
        assert sum(e.get("name") == "CYCLE_START" for e in trace) == 3, trace
        assert _balanced(trace), trace
        ends = [e for e in trace if e.get("ph") == "E" and e.get("args")]
        assert {"dtype": "HOROVOD_FLOAT32", "shape": "[3]"} in [e["args"] for e in ends], ends
    finally:
        (tmp_path / "go").touch()
        try:
            out, err = job.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            job.kill()
            out, err = job.communicate()
            raise AssertionError(f"the job did not end within {JOB_TIMEOUT_S} s of 'go':\n"
                                 f"{err[-3000:]}") from None
    assert job.returncode == 0, f"exit code {job.returncode}\n{out[-3000:]}\n{err[-3000:]}"
    # after the job: the env's file holds everything before the API's switch, the API's file its part
    trace, spans = _events(path)
    assert _balanced(trace) and "allreduce.api_allreduce" not in spans, spans
    api_trace, api_spans = _events(tmp_path / "api.json")
    assert set(api_spans) == {"allreduce.api_allreduce"}, api_spans
    assert [s for s in api_spans["allreduce.api_allreduce"] if s[0] == "B"] == [
        ("B", "NEGOTIATE_ALLREDUCE"), ("B", "ALLREDUCE"), ("B", "GLOO_ALLREDUCE")], api_spans
    assert not any(e.get("name") == "CYCLE_START" for e in api_trace) and _balanced(api_trace)


ONE_PROCESS = r"""
import json, sys, torch
import clipbert_legacy.compat.hvd as hvd
hvd.init()
hvd.allreduce(torch.ones(3), name='a "quoted" name')
text = open(sys.argv[1]).read()  # still open: parses whatever the writer has flushed so far
json.loads(text)
"""


def test_one_process_timeline_from_the_environment(tmp_path):
    """``DIST_BACKEND=torch`` without a launcher (a set of one rank negotiates in the caller's thread):
    the same events (no Gloo activity: nothing travels); the file parses while open and after exit
    without ``shutdown()`` (the writer thread is joined at exit); a name with quotes is escaped."""
    path = tmp_path / "one.json"
    proc = mp_utils.run_python(["-c", ONE_PROCESS, path], timeout=120,
                               env={"DIST_BACKEND": "torch", "HOROVOD_TIMELINE": str(path),
                                    "HOROVOD_TIMELINE_MARK_CYCLES": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    trace, spans = _events(path)
    assert spans == {'allreduce.a "quoted" name': [("B", "NEGOTIATE_ALLREDUCE"), ("X", "0"),
                                                   ("B", "ALLREDUCE")]}, spans
    assert _balanced(trace) and sum(e.get("name") == "CYCLE_START" for e in trace) == 1


def test_writer_bounds_its_name_table_and_survives_a_failing_disk(tmp_path, monkeypatch, caplog):
    from clipbert_legacy.compat.hvd.torch_backend import timeline
    monkeypatch.setattr(timeline, "_NAMES_MAX", 4)
    writer = timeline.TimelineWriter(str(tmp_path / "t.json"), mark_cycles=False)
    for i in range(10):
        writer.event(f"allreduce.t{i % 6}", "B", "ALLREDUCE")
        writer.event(f"allreduce.t{i % 6}", "E")
    writer.close()
    assert len(writer._pids) == 4  # bounded: the oldest names were dropped
    trace = json.loads((tmp_path / "t.json").read_text())
    names = [e["args"]["name"] for e in trace if e.get("name") == "process_name" and e["pid"]]
    assert len(trace) == 2 + 20 + 2 * len(names) and len(names) > 6  # re-registered names: new pids
    assert _balanced(trace)

    writer = timeline.TimelineWriter(str(tmp_path / "full.json"), mark_cycles=False)

    def full_disk(_data):
        raise OSError(28, "No space left on device")
    writer._append = full_disk  # the next batch fails to write
    writer.event("allreduce.x", "B", "ALLREDUCE")
    deadline = time.monotonic() + 30
    while not writer._failed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert writer._failed, "the writer did not notice the failed write within 30 s"
    for _ in range(timeline._QUEUE_MAX + 10):  # nothing is kept, and no producer waits
        writer.event("allreduce.x", "E")
    assert not writer._events
    writer.close()
    assert "No space left on device" in caplog.text
