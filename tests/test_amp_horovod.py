"""amp O2 + DistributedOptimizer under real multi-process launches (2 ranks, gloo on CPU).

One launch per launcher runs every scenario of tests/workers/amp_hvd.py (see its docstring).

The broadcast-after-initialize checks encode apex.amp._process_optimizer.lazy_init_with_master_weights:
apex made the fp32 masters at the first ``zero_grad()`` (or backward) after ``amp.initialize``, copying
the model as it was then, so weights written into the model between ``initialize`` and ClipBERT's
``optimizer.zero_grad(); optimizer.step()`` were kept.
"""
import json

import numpy as np
import pytest

from tests import mp_utils
from tests.conftest import requires_horovod

pytestmark = pytest.mark.multiprocess  # every test here reads one 2-process job's results

WORKER = mp_utils.REPO / "tests" / "workers" / "amp_hvd.py"
K = 3


def _launch(tmp_path_factory, launcher):
    out = tmp_path_factory.mktemp(f"amp_{launcher}")
    run = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
    mp_utils.check(run([WORKER, "--out", out], np=2, timeout=150))
    return [json.load(open(out / f"amp_{r}.json")) for r in (0, 1)]


@pytest.fixture(scope="module")
def horovod_results(tmp_path_factory):
    return _launch(tmp_path_factory, "horovod")


@pytest.fixture(scope="module")
def torchrun_results(tmp_path_factory):
    return _launch(tmp_path_factory, "torch")


def _check_all(results, backend):
    r0, r1 = results
    assert r0["size"] == r1["size"] == 2 and r0["backend"] == r1["backend"] == backend
    # a rank-local inf (injected after synchronize, on rank 1 only, at step 2) skips on both ranks
    for r in results:
        assert r["inf"]["skipped"] == [0, 0, 1, 1]
        assert r["inf"]["scales"] == [1024.0, 1024.0, 512.0, 512.0]
        assert r["inf"]["wsum"][2] == r["inf"]["wsum"][1]  # the skipped step changed nothing
        assert r["inf"]["wsum"][3] != r["inf"]["wsum"][2]  # and training goes on
    assert r0["inf"]["flat"] == r1["inf"]["flat"]  # weights identical across ranks
    # control: with AMP_SYNC_OVERFLOW=0 only the rank that saw the inf skips, and the ranks diverge
    assert r0["inf_nosync"]["skipped"] == [0, 0, 0, 0] and r1["inf_nosync"]["skipped"] == [0, 0, 1, 1]
    assert r0["inf_nosync"]["flat"] != r1["inf_nosync"]["flat"]
    # bpps=K + delayed unscaling: one gradient allreduce round per optimizer step, not K
    for r in results:
        per_step_k = r["accum_k"]["allreduce_launches_per_step"]
        per_step_1 = r["accum_1"]["allreduce_launches_per_step"]
        assert per_step_k >= 1 and per_step_1 == K * per_step_k
        assert r["accum_k"]["skipped"] == r["accum_1"]["skipped"] == 0
        assert r["accum_k"]["scale"] == r["accum_1"]["scale"] == 1024.0
        # ... and the same weights as synchronizing every micro-step (fp16 grads: loose)
        a, b = np.array(r["accum_k"]["flat"]), np.array(r["accum_1"]["flat"])
        assert np.allclose(a, b, rtol=1e-3, atol=1e-3), np.abs(a - b).max()
        assert r["guard"]["zero_grad_guard_raised"] is True
    assert r0["accum_k"]["flat"] == r1["accum_k"]["flat"]
    assert r0["accum_1"]["flat"] == r1["accum_1"]["flat"]
    _check_broadcast_after_initialize(r0, r1)


def _check_broadcast_after_initialize(r0, r1):
    """Broadcast after amp.initialize + the quick hack: both ranks hold rank 0's weights, bit-equal."""
    for key in ("bcast_state_dict", "bcast_named"):
        a, b = r0[key], r1[key]
        assert a["initial"] != b["initial"]  # the ranks started apart
        assert a["after_hack"] == b["after_hack"] == a["initial"], key  # rank 0's weights survived
        assert a["final"] == b["final"] and a["masters"] == b["masters"], key  # and training stays equal
        assert a["final"] != a["after_hack"]


@requires_horovod
def test_amp_o2_under_horovodrun(horovod_results):
    _check_all(horovod_results, "horovod")
    # Horovod allreduces each parameter's gradient on its own: 6 tensors in the worker's model
    assert horovod_results[0]["accum_k"]["allreduce_launches_per_step"] == 6


def test_amp_o2_under_torchrun(torchrun_results):
    _check_all(torchrun_results, "torch")
