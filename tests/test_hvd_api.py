"""The horovod.torch API of clipbert_legacy.compat.hvd beyond the training path: autograd through collectives,
sparse gradients, mismatch errors, join with uneven inputs, and every collective's result against Horovod's
definition, SyncBatchNorm, timelines, re-initialisation. Each check runs under horovodrun -np 2 (real
Horovod: it pins what Horovod does) and under torchrun --nproc_per_node 2 (the torch backend).

Start-up dominates a 2-process job, so one job per launcher runs most checks in turn (worker
tests/workers/hvd_api.py), and re-initialisation, which makes new rendezvous, runs in a job of its own.
Each check's test reads only that check's files: a check that raised writes its traceback (its test
fails with it), and a job that ended early fails the tests of the checks it did not reach, with its
output; whether each job itself ended cleanly is one test of its own."""
import json
import os

import pytest
import torch

from tests import mp_utils

WORKER = "tests/workers/hvd_api.py"
LAUNCHERS = ["horovod", "torch"]
# join late (after it real Horovod's process sets hang), leave last (rank 1 ends its process);
# timeline: torch backend only
JOBS = {"main": {"horovod": "autograd,sparse,ops,syncbn,mismatch,join,leave",
                 "torch": "autograd,sparse,ops,syncbn,timeline,mismatch,join,leave"},
        "reinit": {"horovod": "reinit", "torch": "reinit"}}
# a 2-process job here: about 10 s to start and 20 s of checks on an idle 2-core machine
JOB_TIMEOUT_S = 600
pytestmark = pytest.mark.multiprocess


def _run(launcher, modes, out):
    if launcher == "horovod" and not mp_utils.horovodrun_available():
        if os.environ.get("CI") == "true":
            raise AssertionError("Horovod is not installed in CI; run ./run_scripts/setup_env.sh")
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    run = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
    env = {"DIST_BACKEND": launcher, "HOROVOD_DYNAMIC_PROCESS_SETS": "1"}
    try:
        return run([WORKER, "--modes", modes, "--out", out], timeout=JOB_TIMEOUT_S, env=env)
    except AssertionError as e:  # a timeout: the output so far, as the job's failure
        return e


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """``jobs(launcher, name)``: (output folder, finished process or the timeout's error) of that job,
    run once for the module."""
    done = {}

    def get(launcher, name):
        if (launcher, name) not in done:
            out = tmp_path_factory.mktemp(f"{launcher}_{name}")
            done[launcher, name] = (out, _run(launcher, JOBS[name][launcher], out))
        return done[launcher, name]
    return get


@pytest.fixture(scope="module")
def job(jobs):
    """``job(launcher, mode)``: the output folder holding that check's files for both ranks; fails with the
    check's traceback, or with the job's output when the job ended before writing them."""
    def get(launcher, mode):
        name = "reinit" if mode == "reinit" else "main"
        out, proc = jobs(launcher, name)
        for r in range(2):
            error = out / f"{mode}{r}.error"
            if error.exists():
                raise AssertionError(f"{launcher} rank {r}: check {mode!r} raised:\n{error.read_text()}")
        if not any(out.glob(f"{mode}*")):
            raise AssertionError(f"{launcher}: the {name} job ended before check {mode!r}:\n"
                                 f"{_describe(proc)}")
        return out
    return get


def _describe(proc):
    if isinstance(proc, AssertionError):
        return str(proc)
    return (f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-4000:]}\n"
            f"--- stderr ---\n{proc.stderr[-4000:]}")


@pytest.mark.parametrize("name", sorted(JOBS))
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_job_ends_cleanly(jobs, launcher, name):
    """Each job ends with status 0 and the backend it was meant to use, on 2 processes (an abort at exit,
    or a hang, fails this test alone)."""
    _, proc = jobs(launcher, name)
    assert not isinstance(proc, AssertionError), str(proc)
    assert proc.returncode == 0, _describe(proc)
    assert f'"backend": "{launcher}"' in proc.stdout and '"size": 2' in proc.stdout, _describe(proc)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """One process, no launcher, the whole batch: the references of autograd and syncbn."""
    out = tmp_path_factory.mktemp("single")
    mp_utils.check(mp_utils.run_python([WORKER, "--modes", "autograd,syncbn", "--out", out],
                                       env={"DIST_BACKEND": "torch"}))
    return out


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_autograd_through_allgather_matches_one_process(job, single, launcher):
    """A contrastive-style loss on hvd.allgather of every rank's features: the parameter gradients,
    summed over the ranks, equal one process's gradients on the whole batch (before: the gathered
    tensor had no grad_fn and only the local rows trained)."""
    ref = torch.load(single / "autograd0.pt")
    out = job(launcher, "autograd")
    for r in range(2):
        got = torch.load(out / f"autograd{r}.pt")
        torch.testing.assert_close(got["loss"], ref["loss"], rtol=0, atol=1e-6)
        for k in ("weight", "bias"):
            assert ref[k].abs().max() > 1e-3, "the reference gradient is trivial"
            torch.testing.assert_close(got[k], ref[k], rtol=1e-5, atol=1e-6, msg=f"{launcher} rank {r}: {k}")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sparse_embedding_trains_equal_to_dense(job, launcher):
    """nn.Embedding(sparse=True) through DistributedOptimizer (indices and values allgathered, or
    sparse_as_dense=True) ends with the weights of the same training with a dense embedding."""
    out = job(launcher, "sparse")
    for r in range(2):
        res = json.load(open(out / f"sparse{r}.json"))
        for variant, v in res.items():
            assert v["sparse_grad_was_sparse"], (launcher, variant)
            assert v["moved"] > 0.1, (launcher, variant, "training did not move the weights")
            assert v["max_diff"] < 1e-6, (launcher, r, variant, v)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_mismatched_collectives_are_one_clear_error_on_every_rank(job, launcher):
    """Different shapes / dtypes / roots per rank, a model that differs: an error on every rank within
    seconds (no abort, no hang), and the job can go on with a matching collective."""
    out = job(launcher, "mismatch")  # a hang would end the job at its timeout
    words = {"shape": "shape", "dtype": "type", "root": "root", "allgather_dims": "shape",
             "model": "shape" if launcher == "horovod" else "parameters differ"}
    for r in range(2):
        res = json.load(open(out / f"mismatch{r}.json"))
        assert res["after"] == [2.0, 2.0]
        for case, word in words.items():
            err = res["errors"][case]
            assert err is not None and word in err.lower(), (launcher, r, case, err)
            if launcher == "torch" and case != "model":
                assert "HorovodInternalError" in err and "rank 0" in err and "rank 1" in err, err


def _join_reference():
    """Horovod's join: after rank 0 runs out of batches it adds zeros; Average still divides by 2.
    Returns the weights after each step."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    g = torch.Generator().manual_seed(5)
    batches = [torch.randn(4, 3, generator=g) for _ in range(8)]
    after = []
    for step in range(4):
        grads = []
        for rank in ((0, 1) if step < 2 else (1,)):
            model.zero_grad()
            model(batches[2 * step + rank]).pow(2).mean().backward()
            grads.append([p.grad.clone() for p in model.parameters()])
        with torch.no_grad():
            for i, p in enumerate(model.parameters()):
                p -= 0.1 * sum(gr[i] for gr in grads) / 2
        after.append({k: v.clone() for k, v in model.state_dict().items()})
    return after


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_join_with_uneven_inputs(job, launcher):
    """Rank 0 has 2 batches, rank 1 has 4: rank 0 joins and adds zeros to rank 1's gradient and loss
    allreduces; each rank ends with the reference weights after its own steps (a joined rank no longer
    steps); join returns rank 1 on both."""
    out = job(launcher, "join")
    ref = _join_reference()
    got = [torch.load(out / f"join{r}.pt") for r in range(2)]
    for r, res in enumerate(got):
        assert res["last"] == 1, (launcher, r, res["last"])
        steps = len(res["losses"])
        for k in ("weight", "bias"):
            torch.testing.assert_close(res[k], ref[steps - 1][k], rtol=1e-5, atol=1e-6,
                                       msg=f"{launcher} rank {r}: {k}")
    assert len(got[0]["losses"]) == 2 and len(got[1]["losses"]) == 4
    assert got[0]["losses"] == got[1]["losses"][:2]


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_collectives_equal_horovods_definitions(job, launcher):
    """reducescatter (uneven split, scale factors, integer average), alltoall (splits / equal), grouped,
    async with poll/synchronize, in-place, integer scaling, Min/Max/Product, objects, process sets:
    each result equals the value computed from Horovod's definition (real Horovod agrees under
    horovodrun)."""
    out = job(launcher, "ops")
    for r in range(2):
        res = json.load(open(out / f"ops{r}.json"))
        assert len(res) >= 22
        bad = {k: v for k, v in res.items() if v is not None}
        assert not bad, (launcher, r, bad)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_sync_batch_norm_on_cpu_matches_whole_batch(job, single, launcher):
    """hvd.SyncBatchNorm on CPU tensors (Horovod's needs CUDA): 2 ranks with half a batch each give
    torch's BatchNorm1d on the whole batch: outputs, running statistics, input and parameter gradients."""
    ref = torch.load(single / "syncbn0.pt")
    out = job(launcher, "syncbn")
    for r in range(2):
        got = torch.load(out / f"syncbn{r}.pt")
        for k, v in ref.items():
            torch.testing.assert_close(got[k], v, rtol=1e-5, atol=1e-5, msg=f"{launcher} rank {r}: {k}")


def test_timeline_is_a_chrome_trace_of_the_collectives(job):
    """torchrun: hvd.start_timeline / stop_timeline write Horovod's timeline (rank 0 only, as Horovod):
    a JSON list with the named allreduce as Horovod names it and its negotiation, operation and Gloo
    activity (tests/test_hvd_timeline.py checks the file while a job runs)."""
    out = job("torch", "timeline")
    trace = json.loads((out / "timeline0.json").read_text())
    pid = next(e["pid"] for e in trace if e.get("args", {}).get("name") == "allreduce.timeline.allreduce")
    names = [e["name"] for e in trace if e.get("pid") == pid and e["ph"] == "B"]
    assert names == ["NEGOTIATE_ALLREDUCE", "ALLREDUCE", "GLOO_ALLREDUCE"], names
    assert not (out / "timeline1.json").exists()


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_init_shutdown_init(job, launcher):
    """hvd.init() after hvd.shutdown() works (under torchrun too: the second rendezvous has its own store
    prefix), process sets included; is_initialized() follows."""
    out = job(launcher, "reinit")
    for r in range(2):
        seen = json.load(open(out / f"reinit{r}.json"))
        assert seen == [[True, 3.0, None, r, 2], False, [True, 3.0, 1.0 if r == 1 else None, r, 2], False,
                        [True, 3.0, None, r, 2], False], (launcher, r, seen)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_a_rank_that_exits_fails_the_operation_its_peer_waits_on(job, launcher):
    """Rank 1's process ends cleanly while rank 0 waits in an allreduce: rank 0 gets Horovod's
    HorovodInternalError ("Horovod has been shut down") at once, as under real Horovod, not a hang."""
    out = job(launcher, "leave")
    assert json.load(open(out / "leave1.json")) == {"left": True}
    res = json.load(open(out / "leave0.json"))
    assert res["error"] is not None and res["error"].startswith("HorovodInternalError"), res
    assert "has been shut down" in res["error"], res
    assert res["seconds"] < 60, res  # "at once": about 1 s idle; else rank 0 waits until the job's timeout
