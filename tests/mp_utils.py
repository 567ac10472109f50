"""Launch real multi-process jobs (`horovodrun -np N --gloo`, `torchrun`) from tests.

Every launch has a hard timeout so that a hang fails the test instead of stalling CI.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PORT_TAKEN = "cannot listen on 127.0.0.1:"  # compat.loopback: the launcher's store port was taken
# Set by conftest for the running test: whether it is in the xdist "serial" group (marker ``multiprocess``).
# A 2-process job started beside the other worker's tests overloads the 2 cores CI has (issue 46).
RUNNING_TEST = {"name": None, "serial": None}


def _require_serial(what):
    if RUNNING_TEST["serial"] is False:
        raise AssertionError(f"{RUNNING_TEST['name']} starts a {what} job but is not marked "
                             f"@pytest.mark.multiprocess (conftest runs those one at a time): add the marker")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    if os.environ.get("CLIPBERT_TEST_TMP"):  # the run's own folder (tests/leftovers.py), removed at its end
        env["TMPDIR"] = os.environ["CLIPBERT_TEST_TMP"]
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def horovodrun_available():
    try:
        import horovod.torch  # noqa: F401
    except Exception:
        return False
    return shutil.which("horovodrun", path=str(BIN)) is not None


# Both launchers through clipbert_legacy.compat.loopback: the job's servers listen on 127.0.0.1 only.
def run_horovod(args, np=2, timeout=180, env=None, cwd=None):
    """Run `horovodrun -np N --gloo python <args...>`; returns CompletedProcess (text)."""
    _require_serial("horovodrun")
    cmd = [sys.executable, "-m", "clipbert_legacy.compat.loopback", "horovodrun", "-np", str(np),
           "-H", f"localhost:{np}",
           "--gloo", "--gloo-timeout-seconds", "60", sys.executable] + [str(a) for a in args]
    return _run(cmd, timeout, env, cwd)


def run_torchrun(args, np=2, timeout=180, env=None, cwd=None):
    """Run `torchrun --nproc_per_node N <args...>` (static rendezvous on a free port). The port is free
    when chosen; another job on the machine may take it before the launcher listens there (then the
    launcher fails at once, before any worker started): a new port, up to 3 times."""
    _require_serial("torchrun")
    for _ in range(3):
        cmd = [sys.executable, "-m", "clipbert_legacy.compat.loopback", "torchrun", "--nproc_per_node",
               str(np), "--master_addr", "127.0.0.1", "--master_port", str(free_port()), *map(str, args)]
        proc = _run(cmd, timeout, env, cwd)
        if not (proc.returncode and PORT_TAKEN in proc.stderr and "Address already in use" in proc.stderr):
            break
    return proc


def run_python(args, timeout=180, env=None, cwd=None):
    return _run([sys.executable] + [str(a) for a in args], timeout, env, cwd)


def _run(cmd, timeout, env, cwd):
    return run_tree(cmd, timeout, _env(env), cwd or REPO)


def process_tree(pid):
    """``pid``'s process and every process below it, alive now (launchers start their workers in sessions
    and process groups of their own, so the tree is what counts; [] once ``pid`` has ended)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def kill_all(procs):
    """SIGKILL each of ``procs`` (psutil processes) that is still there."""
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass


def kill_tree(pid):
    """SIGKILL ``pid`` and every process below it; returns how many were alive."""
    tree = process_tree(pid)
    kill_all(tree)
    return len(tree)


def run_tree(cmd, timeout, env, cwd):
    """Run ``cmd`` (its own session) with ``env`` as given; past ``timeout`` s the command and every process
    below it are killed (:func:`kill_tree`) and the test fails saying what timed out, with the output so
    far."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=str(cwd), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed = kill_tree(proc.pid)
        out, err = proc.communicate()
        raise AssertionError(f"command timed out after {timeout}s ({killed} processes killed): "
                             f"{' '.join(map(str, cmd))}\n--- stdout ---\n{out[-4000:]}\n"
                             f"--- stderr ---\n{err[-4000:]}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# A failure test's timing: a worker prints ``at t=<time.time()>`` where it fails, and the test measures from
# there to the job's end (the launcher's reaction), not the start-up, which a busy machine stretches.
ENDED_WITHIN_S = 45  # the launcher ends a failed 2-process job in a few seconds on an idle machine


def seconds_since_failure(text, ended_at):
    """Seconds from the worker's ``at t=...`` mark in ``text`` to ``ended_at`` (the job's end)."""
    marks = re.findall(r"at t=(\d+\.\d+)", text)
    assert marks, f"no worker printed its failure time ('at t=...'):\n{text[-3000:]}"
    return ended_at - float(marks[0])


def wait_until(pred, what, timeout=300, proc=None):
    """Poll ``pred`` until true; fails saying ``what`` it waited for (or that ``proc`` ended first). The
    default suits a process's start-up and first steps: seconds idle, minutes on a busy machine."""
    deadline = time.monotonic() + timeout
    while not pred():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read()[-3000:] if proc.stdout else ""
            raise AssertionError(f"the worker ended (status {proc.returncode}) before {what}:\n{out}")
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout}s for {what}")
        time.sleep(0.01)


def check(proc):
    """Assert success, showing the tail of both streams on failure."""
    assert proc.returncode == 0, (f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}"
                                  f"\n--- stderr ---\n{proc.stderr[-6000:]}")
    return proc
