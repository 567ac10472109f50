"""tests/mp_utils.py's launcher wrapper: a command past its timeout is killed with every process below it,
also those in process groups of their own (as torchrun starts its workers), and the test fails saying so."""
import os
import sys

import psutil
import pytest

from tests import mp_utils

# bash starts a child in a session (and process group) of its own, writes its pid, then becomes `sleep`
SPAWN = 'setsid sleep 600 & echo $! > "$1"; echo started; sleep 600'


def test_a_timed_out_command_and_its_detached_child_are_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    with pytest.raises(AssertionError, match=r"command timed out after 10s \(2 processes killed\)") as e:
        mp_utils.run_tree(["bash", "-c", SPAWN, "spawn", pid_file], 10, dict(os.environ), tmp_path)
    assert "started" in str(e.value)  # the output so far is in the message
    child = int(pid_file.read_text())
    try:  # killed: gone once init has reaped it
        psutil.Process(child).wait(timeout=30)
    except psutil.NoSuchProcess:
        pass
    assert not psutil.pid_exists(child), f"the detached child {child} survived"


def test_a_command_within_its_timeout_returns_its_output(tmp_path):
    p = mp_utils.run_tree([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
                          60, dict(os.environ), tmp_path)
    assert (p.returncode, p.stdout, p.stderr) == (0, "out\n", "err\n")
