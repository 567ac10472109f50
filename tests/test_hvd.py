"""clipbert_legacy.compat.hvd: real multi-process runs under horovodrun (Gloo) and torchrun."""
import json
import os

import pytest
import torch

from tests import mp_utils

WORKER = "tests/workers/hvd_train.py"


@pytest.fixture(scope="module")
def single_ref(tmp_path_factory):
    """``single_ref(bpps)``: the weights of the single-process run (5 steps), run once for the module; both
    launchers' 2-process runs are checked against it."""
    done = {}

    def get(bpps):
        if bpps not in done:
            out = tmp_path_factory.mktemp(f"single{bpps}")
            mp_utils.check(mp_utils.run_python([WORKER, "--out", out, "--bpps", bpps, "--steps", 5],
                                               env={"DIST_BACKEND": "torch"}))
            done[bpps] = torch.load(out / "w0.pt")
        return done[bpps]
    return get


def _assert_ranks_match_single(out, ref):
    w0, w1 = torch.load(out / "w0.pt"), torch.load(out / "w1.pt")
    for k in w0:
        assert torch.equal(w0[k], w1[k]), f"{k} differs between ranks"
        torch.testing.assert_close(w0[k], ref[k], atol=1e-6, rtol=0, msg=f"{k} != single process")
    # training actually moved the weights away from their (rank-0) init
    assert not torch.allclose(w0["0.weight"], torch.zeros_like(w0["0.weight"]))


def _launcher(name):
    if name == "horovod" and not mp_utils.horovodrun_available():
        if os.environ.get("CI") == "true":
            raise AssertionError("Horovod is not installed in CI; run ./run_scripts/setup_env.sh")
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    return mp_utils.run_horovod if name == "horovod" else mp_utils.run_torchrun


@pytest.fixture(scope="module")
def train_job(tmp_path_factory):
    """``train_job(launcher, bpps)``: (folder, process) of that 2-process training job, run once for the
    module; bpps 1 also runs the all_gather_list checks after training (one job start instead of two)."""
    done = {}

    def get(launcher, bpps):
        if (launcher, bpps) not in done:
            run = _launcher(launcher)
            out = tmp_path_factory.mktemp(f"{launcher}{bpps}")
            spin = launcher == "horovod" and bpps == 2
            args = [WORKER, "--out", out, "--bpps", bpps, "--wait_probe", 2]
            args += ["--gather"] if bpps == 1 else []
            env = {"CLIPBERT_HVD_WAIT": "spin"} if spin else None
            done[launcher, bpps] = out, run(args, timeout=180, env=env)
        out, proc = done[launcher, bpps]
        mp_utils.check(proc)
        return out, proc
    return get


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torch"])
@pytest.mark.parametrize("bpps", [1, 2])
def test_two_processes_match_single_process(train_job, single_ref, launcher, bpps):
    """horovodrun -np 2 (real Horovod) and torchrun (torch backend): same weights as 1 process. Then rank 1
    sends its gradients 2 s late: rank 0's wait in ``synchronize()`` sleeps (hvd.horovod_wait) instead of
    spinning a core; with ``CLIPBERT_HVD_WAIT=spin`` (bpps 2) Horovod's own wait, which spins, and the same
    weights."""
    out, p = train_job(launcher, bpps)
    ref = single_ref(bpps)
    assert f'"backend": "{launcher}"' in p.stdout and '"size": 2' in p.stdout
    _assert_ranks_match_single(out, ref)
    probe = json.loads((out / "wait0.json").read_text())
    assert probe["wait_wall_s"] > 1.5, probe  # it did wait for rank 1
    if launcher == "horovod" and bpps == 2:  # the control: Horovod's yield loop keeps the thread on a CPU
        assert probe["wait_cpu_s"] > 0.15 * probe["wait_wall_s"], probe  # (a share of one on a busy machine)
    else:
        assert probe["wait_cpu_s"] < 0.1 * probe["wait_wall_s"], probe


def test_single_process_without_launcher():
    import clipbert_legacy.compat.hvd as hvd
    hvd.init()
    assert (hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size()) == (0, 1, 0, 1)
    t = torch.arange(4.0)
    assert torch.equal(hvd.allreduce(t), t) and torch.equal(hvd.allgather(t), t)
    assert hvd.allgather_object({"a": 1}) == [{"a": 1}]
    assert hvd.broadcast_object("x", 0) == "x"
    m = torch.nn.Linear(2, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1),
                                   named_parameters=m.named_parameters())
    assert isinstance(opt, torch.optim.SGD)
    m(torch.ones(1, 2)).sum().backward()
    before = m.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, m.weight)


def test_bad_arguments_are_clear():
    import clipbert_legacy.compat.hvd as hvd
    hvd.init()
    m = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        hvd.DistributedOptimizer(torch.optim.SGD(m.parameters(), lr=0.1), backward_passes_per_step=0)
    with pytest.raises(ValueError, match="dist_backend"):
        hvd.set_backend("mpi")


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torch"])
def test_step_misuse_raises_instead_of_hanging(tmp_path, launcher):
    run = _launcher(launcher)
    p = run([WORKER, "--out", tmp_path, "--mode", "misuse", "--bpps", 1], timeout=90)
    assert p.returncode != 0
    assert "more than backward_passes_per_step" in p.stdout + p.stderr


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torch"])
def test_all_gather_list_small_and_10mb(train_job, launcher):
    """(A rank that raises ends the job: tests/test_hvd_failing_rank.py.)"""
    out, _ = train_job(launcher, 1)
    for r in range(2):
        res = json.load(open(out / f"gather{r}.json"))
        assert res["small"] == ["x", "y"]
        assert res["big"] == [[10 * 2 ** 20, 0, 0], [10 * 2 ** 20, 1, 1]]
        assert res["mixed"] == [[None, "rank1"], "from root"]
        assert res["fresh"] == [True, True, [0, 1]]  # own entry a copy too (ClipBERT unpickled it)


def test_all_gather_list_returns_fresh_copies_in_one_process():
    """ClipBERT's distributed.all_gather_list pickled every rank's object into a buffer and returned
    ``pickle.loads`` of each entry, the caller's own included: the result never aliases the input."""
    from clipbert_legacy.utils.distributed import all_gather_list, any_broadcast
    data = {"k": [1, 2]}
    out = all_gather_list(data)
    assert out == [data] and out[0] is not data
    out[0]["k"].append(3)
    assert data == {"k": [1, 2]}
    b = any_broadcast(data)
    b["k"].clear()
    assert data == {"k": [1, 2]}


@pytest.mark.parametrize(("launcher", "given", "gpu", "expect"), [
    ("horovodrun", None, False, "20"), ("horovodrun", "3", False, "3"), ("horovodrun", None, True, None),
    ("torchrun", None, False, None)])
def test_the_task_entry_chooses_a_cpu_cycle_time_only_when_none_is_given(monkeypatch, launcher, given, gpu,
                                                                         expect):
    """The project's task entry (not clipbert_legacy.compat.hvd, see tests/test_hvd_numerics.py) sets
    HOROVOD_CYCLE_TIME=20 (ms) for its CPU jobs under horovodrun when the user set none (Horovod's 1 ms
    default costs CPU ranks compute: benchmarks/bench_scaling.py); a given value, a GPU or torchrun: none."""
    from clipbert_legacy.tasks import cpu
    for k in ("HOROVOD_RANK", "HOROVOD_CYCLE_TIME"):  # set first: then the undo removes what the entry sets
        monkeypatch.setenv(k, "")  # (delenv of an absent variable records nothing to undo: it leaked into
        monkeypatch.delenv(k)      # later tests of the worker, e.g. test_hvd_numerics' cycle-time check)
    if launcher == "horovodrun":
        monkeypatch.setenv("HOROVOD_RANK", "0")
    if given:
        monkeypatch.setenv("HOROVOD_CYCLE_TIME", given)
    monkeypatch.setattr(cpu.torch.cuda, "is_available", lambda: gpu)
    assert cpu.horovod_cycle_time() == (expect is not None and given is None)
    assert os.environ.get("HOROVOD_CYCLE_TIME") == expect
