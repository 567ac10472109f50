"""Two users' jobs on one machine: two ``horovodrun -np 2`` and two ``torchrun --nproc_per_node 2`` jobs
started at the same moment all finish with their own correct results (no port taken twice, no rank
talking to another job's ranks; issue 46)."""
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests import mp_utils
from tests.workers.user_job import data

pytestmark = [pytest.mark.multiprocess,
              pytest.mark.skipif(not mp_utils.horovodrun_available(), reason="Horovod not installed")]
WORKER = "tests/workers/user_job.py"
# 4 jobs x 2 processes on a 2-core machine: each job alone starts and ends in about 15 s idle
TIMEOUT_S = 600


def reference(tag):
    """One process, both ranks' rows: the weights the 2-rank job must end with (equal halves, so the
    average of the ranks' gradients is the whole batch's gradient)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = data(tag)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        grads = []
        for r in range(2):
            model.zero_grad()
            torch.nn.functional.mse_loss(model(x[r::2]), y[r::2]).backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        opt.step()
    return model.weight.detach().flatten().tolist(), model.bias.item()


def test_two_horovodrun_and_two_torchrun_jobs_at_once(tmp_path):
    jobs = [("horovod", 1), ("horovod", 2), ("torch", 3), ("torch", 4)]
    start = threading.Barrier(len(jobs))

    def run(job):
        launcher, tag = job
        out = tmp_path / f"{launcher}{tag}"
        out.mkdir()
        launch = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
        start.wait()
        proc = launch([WORKER, out, tag], timeout=TIMEOUT_S, env={"DIST_BACKEND": launcher})
        return job, proc, out

    with ThreadPoolExecutor(len(jobs)) as pool:
        done = list(pool.map(run, jobs))
    for (launcher, tag), proc, out in done:
        mp_utils.check(proc)
        res = json.loads((out / "result.json").read_text())
        assert res["size"] == 2 and res["backend"] == launcher, res
        assert res["sum"] == 2 * tag * 10 + 3 and res["gathered"] == [tag * 10 + 1, tag * 10 + 2], res
        weight, bias = reference(tag)
        assert res["weight"] == pytest.approx(weight, abs=1e-6), (launcher, tag)
        assert res["bias"] == pytest.approx(bias, abs=1e-6), (launcher, tag)
