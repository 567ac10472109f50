"""A rank that leaves its peers' path ends the wait at once, and many init/shutdown cycles in one job work
(issue 50), on 2 real processes under ``horovodrun`` (real Horovod) and ``torchrun`` (the torch backend).

Horovod's own test file, run in one job as Horovod's CI runs it, shows both: a racy test fails on one rank
only, which runs ``tearDown`` (``hvd.shutdown()``) or goes on to the next test while its peer still waits;
and every test initialises Horovod again (about 115 cycles). Worker: tests/workers/hvd_paths.py."""
import json
import os
import time

import pytest

from tests import mp_utils

WORKER = mp_utils.REPO / "tests" / "workers" / "hvd_paths.py"
LAUNCHERS = ["horovod", "torch"]
# a 2-process job: about 10 s to start and a few s of work on an idle 2-core machine; 30 cycles about
# 25 s under horovodrun (Gloo's rendezvous each time), 15 s under torchrun
JOB_TIMEOUT_S = 600
# an error "at once": the torch backend's report after 1 s of waiting plus a few store round trips; real
# Horovod's shutdown within a cycle. 60 s on a loaded machine, far below the job's timeout.
AT_ONCE_S = 60
pytestmark = pytest.mark.multiprocess


def _run(launcher, mode, out, *extra):
    if launcher == "horovod" and not mp_utils.horovodrun_available():
        if os.environ.get("CI") == "true":
            raise AssertionError("Horovod is not installed in CI; run ./run_scripts/setup_env.sh")
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    run = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
    return run([WORKER, "--mode", mode, "--out", out, *extra], timeout=JOB_TIMEOUT_S,
               env={"DIST_BACKEND": launcher})


# the modes that end well share one job per launcher (each mode from hvd.init() to hvd.shutdown(); a mode
# that raises writes its traceback and the next one still runs)
SHARED = {"horovod": "shutdown,cycles", "torch": "shutdown,diverge,cycles"}


@pytest.fixture(scope="module")
def shared_job(tmp_path_factory):
    """``shared_job(launcher)``: (folder, process) of the launcher's one job over its SHARED modes."""
    done = {}

    def get(launcher):
        if launcher not in done:
            out = tmp_path_factory.mktemp(f"paths_{launcher}")
            done[launcher] = out, _run(launcher, SHARED[launcher], out, "--cycles", "30")
        return done[launcher]
    return get


def _result(out, mode, rank, proc=None):
    path = out / f"{mode}{rank}.json"
    if (out / f"{mode}{rank}.error").exists():
        raise AssertionError(f"rank {rank}: {mode} raised:\n{(out / f'{mode}{rank}.error').read_text()}")
    if not path.is_file() and proc is not None:
        mp_utils.check(proc)
    assert path.is_file(), f"rank {rank} wrote no {path.name}"
    return json.loads(path.read_text())


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_peer_that_shut_down_fails_the_barrier_at_once(shared_job, launcher):
    """Rank 1 shuts down (as Horovod's tearDown does after a failed test) while rank 0 waits in a barrier:
    rank 0 gets "Horovod has been shut down" at once, and after shutdown/init both go on together."""
    out, proc = shared_job(launcher)
    res = _result(out, "shutdown", 0, proc)
    assert res["error"] is not None and "shut down" in res["error"], res
    assert res["seconds"] < AT_ONCE_S, res
    for r in range(2):
        assert _result(out, "shutdown", r, proc)["after"] == [3.0, 3.0]


def test_ranks_on_different_paths_both_fail_at_once(shared_job):
    """Torch backend: rank 0 waits in a barrier; rank 1 went on to an allreduce rank 0 never submits.
    Neither can go on: both get an error naming where each waits (real Horovod stalls here, logging a
    warning a minute, unless HOROVOD_STALL_SHUTDOWN_TIME_SECONDS is set); then shutdown/init works."""
    out, proc = shared_job("torch")
    for r, where in ((0, "rank 0 waits in BARRIER"), (1, "rank 1 waits in ALLREDUCE 'only-rank-1'")):
        res = _result(out, "diverge", r, proc)
        assert res["error"] and res["error"].startswith("HorovodInternalError"), res
        assert "every rank waits on an operation that another rank has not submitted" in res["error"], res
        assert where in res["error"], res
        assert res["seconds"] < AT_ONCE_S, res
        assert res["after"] == [3.0, 3.0]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_rank_that_raises_ends_the_job(tmp_path, launcher):
    """Rank 1 raises while rank 0 waits in an allreduce it will never get: the launcher ends the job
    (non-zero status) soon after, not at the job's timeout."""
    proc = _run(launcher, "raise", tmp_path)
    ended = time.time()
    assert proc.returncode != 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "rank 1 failed" in proc.stdout + proc.stderr
    assert not (tmp_path / "raise0.json").exists()  # rank 0 never got past its allreduce
    waited = mp_utils.seconds_since_failure(proc.stdout + proc.stderr, ended)
    assert waited < mp_utils.ENDED_WITHIN_S, f"the job ended {waited:.0f} s after rank 1 failed"


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_thirty_init_shutdown_cycles_in_one_job(shared_job, launcher):
    """30 x (hvd.init(), a checked allreduce and broadcast, hvd.shutdown()) in one job, after the modes
    above: every cycle's numbers are right and the job ends cleanly (no abort at exit, no rendezvous left
    behind)."""
    out, proc = shared_job(launcher)
    for r in range(2):
        assert _result(out, "cycles", r, proc)["cycles"] == 30
    mp_utils.check(proc)
    assert "terminate called" not in proc.stderr and "Fatal Python error" not in proc.stderr
