"""pytest plugin (tests/conftest.py loads its hooks): no process started during a test run outlives it,
and nothing the run's processes put in the temporary directory stays behind.

At start-up the run marks its environment (``CLIPBERT_TEST_RUN=<id>``; pytest-xdist's workers inherit the
controller's mark), so every process started under it carries the mark, also one that a launcher
started and that was re-parented when the launcher died. At the end of the run (in the controller,
after pytest-xdist ended its workers) any marked process still alive ``GRACE_S`` later is listed, killed,
and fails the run (exit status 1).

The run also makes a folder of its own in the temporary directory (``CLIPBERT_TEST_TMP``), which
``tests/mp_utils`` gives the processes it starts as ``TMPDIR``: what they leave there (torchrun's
``torchelastic_*`` folders, one per job and never removed by torch) goes with the folder at the end of the
run. pytest's own ``tmp_path`` folders are not in it (pytest keeps the last runs' for a look after a failure).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid

import psutil
import pytest

from tests.mp_utils import kill_all

MARK = "CLIPBERT_TEST_RUN"
TMP_MARK = "CLIPBERT_TEST_TMP"
# what a process a test just ended (SIGTERM, then its launcher's clean-up) may still need; test_leftovers.py
# gives its sample runs a shorter one (their leaked process sleeps: it never ends within any grace)
GRACE_S = float(os.environ.get("CLIPBERT_TEST_GRACE_S", "15"))


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or the only process): a mark of its own
        os.environ[MARK] = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        os.environ[TMP_MARK] = tempfile.mkdtemp(prefix="clipbert-test-run-")


def survivors(mark: str, grace_s: float = GRACE_S) -> list[psutil.Process]:
    """The processes carrying ``mark``, and this process's descendants, that are still alive after
    ``grace_s`` seconds (this process and its ancestors excluded; zombies are dead)."""
    own = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
    deadline = time.monotonic() + grace_s
    while True:
        found = [p for p in _children() if p.pid not in own]  # also those given an environment of their own
        for proc in psutil.process_iter():
            if proc.pid in {p.pid for p in found}:
                continue
            if proc.pid in own:
                continue
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(MARK) == mark:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _children() -> list[psutil.Process]:
    alive = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def describe(proc: psutil.Process) -> str:
    try:
        age = time.time() - proc.create_time()
        return f"pid {proc.pid} (parent {proc.ppid()}, {age:.0f} s old): {' '.join(proc.cmdline())[:300]}"
    except psutil.Error:
        return f"pid {proc.pid} (gone meanwhile)"


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own pytest_sessionfinish ended its workers
def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput") or MARK not in os.environ:
        return
    left = survivors(os.environ[MARK])
    lines = [describe(p) for p in left]
    kill_all(left)
    if TMP_MARK in os.environ:  # every process of the run has ended (or was just killed): nobody writes there
        shutil.rmtree(os.environ[TMP_MARK], ignore_errors=True)
    if not left:
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    text = (f"{len(left)} process(es) started during this test run outlived it (now killed); the tests that "
            "start them must end them:\n  " + "\n  ".join(lines))
    if reporter is not None:
        reporter.write_line("")
        reporter.write_line(text, red=True, bold=True)
    else:
        print(text)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
