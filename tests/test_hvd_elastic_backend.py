"""``hvd.elastic`` belongs to Horovod (issue 50, item 4).

Horovod's elastic mode keeps the surviving workers running and re-forms them in-process; ``torchrun``
restarts every worker instead, so on the torch backend ``hvd.elastic`` is refused at once with one line
that says why and what to use (torchrun ``--max-restarts`` with the engine's restore file), instead of
Horovod's own module saying "Horovod has not been initialized" after the script called ``hvd.init()``.
Under horovodrun it stays Horovod's module and works."""
import json
import time

import pytest

from clipbert_legacy.compat.hvd import ELASTIC_ON_TORCH
from tests import mp_utils

WORKER = "tests/workers/hvd_elastic.py"
# start-up dominates: about 10 s for a 2-process job on an idle 2-core machine
JOB_TIMEOUT_S = 300
SINGLE_TIMEOUT_S = 120


def _assert_refused(proc, what):
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{what}: hvd.elastic worked on the torch backend:\n{out[-3000:]}"
    assert f"AttributeError: {ELASTIC_ON_TORCH}" in out, f"{what}: not the one-line refusal:\n{out[-3000:]}"
    assert "has not been initialized" not in out, out[-3000:]


@pytest.mark.multiprocess
def test_torchrun_refuses_hvd_elastic_at_once(tmp_path):
    proc = mp_utils.run_torchrun([WORKER, "--expect", "torch", "--out", tmp_path], timeout=JOB_TIMEOUT_S,
                                 env={"DIST_BACKEND": "auto"})
    ended = time.time()
    _assert_refused(proc, "torchrun")
    assert proc.stdout.count("uses hvd.elastic at t=") == 2, proc.stdout[-3000:]  # init and allreduce worked
    waited = mp_utils.seconds_since_failure(proc.stdout, ended)
    assert waited < mp_utils.ENDED_WITHIN_S, f"the job ended {waited:.0f} s after the refusal"
    assert not list(tmp_path.glob("elastic*.json"))


def test_one_process_torch_backend_refuses_hvd_elastic(tmp_path):
    """``DIST_BACKEND=torch`` without a launcher: the same refusal, after init and before it (the
    backend it would choose), and ``hasattr`` answers False."""
    proc = mp_utils.run_python([WORKER, "--expect", "torch", "--out", tmp_path], timeout=SINGLE_TIMEOUT_S,
                               env={"DIST_BACKEND": "torch"})
    _assert_refused(proc, "one process")
    check = ("import clipbert_legacy.compat.hvd as hvd\n"
             "assert not hasattr(hvd, 'elastic')\n"
             "try:\n    hvd.elastic\nexcept AttributeError as e:\n    print('REFUSED', e)\n")
    proc = mp_utils.run_python(["-c", check], timeout=SINGLE_TIMEOUT_S, env={"DIST_BACKEND": "torch"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"REFUSED {ELASTIC_ON_TORCH}" in proc.stdout, proc.stdout


@pytest.mark.multiprocess
def test_horovodrun_keeps_horovods_elastic_module(tmp_path):
    """Under horovodrun ``hvd.elastic`` is ``horovod.torch.elastic`` and its ``run`` syncs a
    ``TorchState`` from rank 0 (weights 1.0, epoch 5) to every rank."""
    if not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    proc = mp_utils.run_horovod([WORKER, "--expect", "horovod", "--out", tmp_path], timeout=JOB_TIMEOUT_S,
                                env={"DIST_BACKEND": "auto"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for r in range(2):
        got = json.loads((tmp_path / f"elastic{r}.json").read_text())
        assert got == {"rank": r, "weight": [1.0, 1.0], "epoch": 5, "module": "horovod.torch.elastic"}, got
