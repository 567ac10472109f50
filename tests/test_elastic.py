"""Elastic training: the global data position, the rescaled plan, and real elastic launches.

* Horovod elastic on loopback (127.0.0.1 and 127.0.0.2 as two hosts, the second reached over a
  throwaway sshd as in tests/test_multinode.py): a worker killed mid-epoch, the job finishes on the
  other; a job that grows from one worker to two.
* ``torchrun --max-restarts 1``: a killed worker, all restarted from the last commit (restore file).
* A rerun on fewer processes continues the epoch exactly.

Every run records which examples each optimizer step trained on (tests/workers/elastic_train.py);
the steps that count are the last ones done for each step number (a rollback redoes steps), and every
epoch must hold every example once, plus only the sampler's end-of-epoch padding.
"""
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch

from clipbert_legacy.training import elastic
from clipbert_legacy.training.data import MetaSampler, ResumableDistributedSampler
from clipbert_legacy.training.plan import RunPlan
from tests import mp_utils
from tests import multinode_utils as mn
from tests.conftest import requires_horovod

WORKER = "tests/workers/elastic_train.py"
TIMEOUT = 240
N_TRAIN = 32


# ---------------------------------------------------------------------------------------------
# the sampler and the plan
def _drain(sampler, n_per_rank):
    """Take ``n_per_rank`` samples from every rank of ``sampler``'s world (a step of batch n)."""
    out = []
    for r in range(sampler.world):
        sampler.reshard(sampler.world, r)
        out += [i for i, _ in sampler][:n_per_rank]
    return out


@pytest.mark.parametrize("n,first,second", [(37, 3, 1), (37, 1, 3), (40, 2, 4), (5, 2, 1)])
def test_sampler_reshard_mid_epoch_reads_every_example_once(n, first, second):
    s = ResumableDistributedSampler(n, first, 0, seed=11)
    s.set_epoch(3)
    seen = _drain(s, 2)  # one step of batch 2 on `first` ranks
    consumed = 2 * first
    s.reshard(second, 0)
    s.set_epoch(3)
    s.start_at(consumed)
    rest = []
    for r in range(second):
        s.reshard(second, r)
        rest += [i for i, _ in s]
    counts = Counter(seen + rest)
    assert set(counts) == set(range(n))
    assert sum(counts.values()) - n < second  # only the end-of-epoch padding repeats
    assert not set(seen) & set(rest[:max(0, n - consumed)]) or n - consumed < 0


def test_sampler_start_at_equals_old_skip_and_distributed_sampler_from_zero():
    s = ResumableDistributedSampler(11, 2, 1, seed=4)
    s.set_epoch(1)
    full = [i for i, _ in s]
    s.start_at(6)  # 3 samples of each of the 2 ranks
    assert [i for i, _ in s] == full[3:] and len(s) == len(full) - 3
    s.skip(3)
    assert [i for i, _ in s] == full[3:]
    s.start_at(11)
    assert list(s) == [] and len(s) == 0


def test_meta_sampler_clamped_epoch_end_is_not_replayed():
    s = MetaSampler([6, 4], [1, 1], batch_size=2, num_replicas=2, rank=0, seed=1)
    s.set_epoch(0)
    assert len(s) == 6  # 3 steps of 2 on this rank
    s.start_at(10)  # the engine's position after the last step: min(3 * 4, n)
    assert len(s) == 0 and list(s) == []
    s.start_at(4)
    assert len(s) == 4


def test_plan_rescaled_keeps_the_examples_left():
    p = RunPlan(n_examples=32, world_size=2, train_batch_size=4, gradient_accumulation_steps=1,
                num_train_steps=8, stop_step=8, valid_steps=4, save_steps=2)
    q = p.rescaled(1, 2)  # 6 steps of 8 examples left -> 12 steps of 4
    assert (q.world_size, q.num_train_steps, q.stop_step, q.valid_steps, q.save_steps) == (1, 14, 14, 4, 2)
    assert q.rescaled(2, 14).num_train_steps == 14
    r = q.rescaled(3, 5)  # 9 steps of 4 = 36 examples left -> 3 steps of 12
    assert r.num_train_steps == 8


# ---------------------------------------------------------------------------------------------
# the ledger of trained examples
def counted_steps(ledger: Path) -> dict:
    """{step: [records]} of the steps that count: records in time order; a step number seen again
    (a rollback redoing it) drops it and everything after it."""
    recs = sorted((json.loads(line) for f in ledger.glob("*.jsonl") for line in f.read_text().splitlines()),
                  key=lambda r: r["t"])
    steps: dict = {}
    for r in recs:
        s = r["step"]
        if any(k > s for k in steps) or any(x["rank"] == r["rank"] for x in steps.get(s, [])):
            steps = {k: v for k, v in steps.items() if k < s}
        steps.setdefault(s, []).append(r)
    return steps


def assert_epochs_exact(steps: dict, n: int, epochs: int):
    assert sorted(steps) == list(range(1, len(steps) + 1)), sorted(steps)
    for e in range(epochs):
        ids = [i for s in steps.values() for r in s if r["epoch"] == e for i in r["ids"]]
        counts = Counter(ids)
        assert set(counts) == set(range(n)), f"epoch {e}: missing {sorted(set(range(n)) - set(counts))}"
        worlds = {r["world"] for s in steps.values() for r in s if r["epoch"] == e}
        assert len(ids) - n < max(worlds), f"epoch {e}: {len(ids) - n} repeats {counts.most_common(3)}"
    for s, recs in steps.items():
        assert len(recs) == recs[0]["world"], f"step {s}: {len(recs)} records for world {recs[0]['world']}"


def final_restore(out: Path) -> dict:
    return torch.load(out / "ckpt" / "restore.pt", map_location="cpu", weights_only=True)


def _overrides(**kw):
    base = {"num_train_epochs": 2, "train_batch_size": 4, "elastic_commit_steps": 2, "save_steps_ratio": 0.25,
            "log_interval": 1}
    base.update(kw)
    return json.dumps(base)


def _worker(out, ledger, overrides, *extra):
    return [WORKER, out, ledger, overrides, "--n_train", str(N_TRAIN), *extra]


# ---------------------------------------------------------------------------------------------
def _discovery(path: Path, trigger: Path | None) -> Path:
    """Both loopback hosts; with ``trigger``, the second only once that file exists."""
    second = f"[ -f {trigger} ] && echo {mn.HOSTS[1]}:1\n" if trigger else f"echo {mn.HOSTS[1]}:1\n"
    return mn.write_executable(path, f"#!/bin/sh\necho {mn.HOSTS[0]}:1\n{second}exit 0\n")


def _horovod_elastic(sshd, discovery: Path, np: int, args: list):
    cmd = [str(mp_utils.BIN / "horovodrun"), "-np", str(np), "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(discovery), "--network-interface", "lo",
           "--ssh-port", str(sshd["port"]), "--ssh-identity-file", str(sshd["key"]),
           "--gloo-timeout-seconds", "30", sys.executable] + [str(a) for a in args]
    env = {"PATH": sshd["path"], "TOY_DIST_BACKEND": "horovod"}
    return mp_utils.check(mp_utils._run(cmd, TIMEOUT, env, None))


pytestmark = pytest.mark.multiprocess


@requires_horovod
def test_horovod_elastic_worker_killed_job_finishes_with_one(sshd, tmp_path):
    """2 workers on two hosts, one SIGKILLed after step 3 (commits every 2 steps): the other goes back
    to step 2, continues alone on the rest of epoch 0 and epoch 1, 12 steps of 4 instead of 6 of 8."""
    out, ledger = tmp_path / "run", tmp_path / "ledger"
    ledger.mkdir()
    proc = _horovod_elastic(sshd, _discovery(tmp_path / "discover.sh", None), 2,
                            _worker(out, ledger, _overrides(), "--kill_at", "3"))
    assert (ledger / "killed").exists()
    state = final_restore(out)
    assert state["finished"] and state["world_size"] == 1 and state["global_step"] == 14, \
        {k: state[k] for k in ("finished", "world_size", "global_step")}
    log = (out / "log" / "log.txt").read_text() + proc.stdout + proc.stderr
    assert "back to the last commit (step 2)" in log and "2 -> 1 processes at step 2" in log, log[-4000:]
    steps = counted_steps(ledger)
    assert len(steps) == 14 and [steps[s][0]["world"] for s in (1, 2, 3, 14)] == [2, 2, 1, 1]
    assert_epochs_exact(steps, N_TRAIN, epochs=2)


@requires_horovod
def test_horovod_elastic_grows_from_one_to_two(sshd, tmp_path):
    """1 worker; after step 2 the discovery script reports a second host: at the next commit both
    continue (the new one from the first one's state), the epoch's rest split between them."""
    out, ledger, trigger = tmp_path / "run", tmp_path / "ledger", tmp_path / "grow"
    ledger.mkdir()
    proc = _horovod_elastic(sshd, _discovery(tmp_path / "discover.sh", trigger), 1,
                            _worker(out, ledger, _overrides(num_train_epochs=1), "--grow_at", "2",
                                    "--trigger", trigger))
    state = final_restore(out)
    log = (out / "log" / "log.txt").read_text() + proc.stdout + proc.stderr
    assert state["finished"] and state["world_size"] == 2, log[-4000:]
    steps = counted_steps(ledger)
    worlds = [steps[s][0]["world"] for s in sorted(steps)]
    k = worlds.index(2)  # the first step on two workers: right after a commit
    assert worlds[:k] == [1] * k and set(worlds[k:]) == {2} and k % 2 == 0 and k >= 2, worlds
    assert len(steps) == k + (N_TRAIN - 4 * k) // 8, worlds
    assert "1 -> 2 processes" in log, log[-4000:]
    assert_epochs_exact(steps, N_TRAIN, epochs=1)


def test_torchrun_max_restarts_resumes_from_the_last_commit(tmp_path):
    """torchrun --max-restarts 1, rank 1 SIGKILLed after step 3: torchrun restarts both workers, which
    resume from ckpt/restore.pt written at step 2 (elastic_commit_steps) and finish."""
    out, ledger = tmp_path / "run", tmp_path / "ledger"
    ledger.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--max-restarts", "1",
           "--master_addr", "127.0.0.1", "--master_port", str(mp_utils.free_port())] + \
        _worker(out, ledger, _overrides(save_steps_ratio=1.0), "--kill_at", "3")
    proc = mp_utils.check(mp_utils._run(cmd, TIMEOUT, {"TOY_DIST_BACKEND": "torch"}, None))
    assert (ledger / "killed").exists()
    state = final_restore(out)
    assert state["finished"] and state["world_size"] == 2 and state["global_step"] == 8
    assert "resumed from" in (out / "log" / "log.txt").read_text()
    steps = counted_steps(ledger)
    assert len(steps) == 8
    assert_epochs_exact(steps, N_TRAIN, epochs=2)
    assert proc.returncode == 0


@requires_horovod
def test_rerun_on_fewer_processes_continues_the_epoch_exactly(tmp_path):
    """A 2-process run killed after step 3 (restore file at step 2), rerun as 1 process: the epoch's
    rest, then epoch 1, each example once; 2 + 12 steps as the rescaled plan says."""
    out, ledger = tmp_path / "run", tmp_path / "ledger"
    ledger.mkdir()
    first = mp_utils.run_horovod(_worker(out, ledger, _overrides(), "--kill_at", "3"), np=2, timeout=TIMEOUT,
                                 env={"TOY_DIST_BACKEND": "horovod"})
    assert first.returncode != 0 and final_restore(out)["global_step"] == 2
    mp_utils.check(mp_utils.run_python(_worker(out, ledger, _overrides()), timeout=TIMEOUT))
    state = final_restore(out)
    assert state["finished"] and state["world_size"] == 1
    steps = counted_steps(ledger)
    assert_epochs_exact(steps, N_TRAIN, epochs=2)
    assert "the epoch continues after its 16 consumed examples" in (out / "log" / "log.txt").read_text()
    assert os.path.exists(out / "ckpt" / f"model_step_{state['global_step']}.pt")


def test_torchrun_nnodes_range_continues_without_a_lost_node(tmp_path):
    """torchrun --nnodes 1:2 on two launchers; after step 3 the launcher that does not host the c10d
    rendezvous store (is_host=0) is SIGKILLed with its worker: the other node's agent restarts its
    worker in a new rendezvous of one node, which resumes from the restore file (the last commit) on 1
    process and finishes the run with every example once per epoch."""
    out, ledger = tmp_path / "run", tmp_path / "ledger"
    ledger.mkdir()
    port = mp_utils.free_port()
    logs = [tmp_path / f"node{i}.log" for i in (0, 1)]
    procs = []
    try:
        for node, log in enumerate(logs):  # node 0 hosts the c10d rendezvous store, which must survive
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1:2", "--nproc_per_node", "1",
                   "--max-restarts", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                   "--rdzv-id", "elastic-test",
                   "--rdzv-conf", f"is_host={int(node == 0)},join_timeout=60,last_call_timeout=5"] + \
                _worker(out, ledger, _overrides(), "--sleep", "0.3")
            procs.append(subprocess.Popen([str(c) for c in cmd], cwd=str(mp_utils.REPO),
                                          start_new_session=True, stdout=open(log, "w"),
                                          env=mp_utils._env({"TOY_DIST_BACKEND": "torch"}),
                                          stderr=subprocess.STDOUT))
        victim = _wait_for_step(ledger, 3, procs, logs)
        os.killpg(procs[1].pid, signal.SIGKILL)
        os.kill(victim, signal.SIGKILL)  # its worker, if torchrun started it in a session of its own
        assert procs[0].wait(timeout=TIMEOUT) == 0, logs[0].read_text()[-6000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    state = final_restore(out)
    assert state["finished"] and state["world_size"] == 1, logs[0].read_text()[-4000:]
    steps = counted_steps(ledger)
    assert {steps[s][0]["world"] for s in (1, 2)} == {2} and steps[max(steps)][0]["world"] == 1
    assert_epochs_exact(steps, N_TRAIN, epochs=2)


def _wait_for_step(ledger: Path, step: int, procs, logs, timeout=TIMEOUT) -> int:
    """Wait until node 1's worker has recorded ``step``; return its pid."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for f in ledger.glob("*.jsonl"):
            recs = [json.loads(line) for line in f.read_text().splitlines() if line.endswith("}")]
            if any(r["step"] >= step and r["world"] == 2 for r in recs):
                pid = recs[0]["pid"]
                if _child_of(pid, procs[1].pid):
                    return pid
        if any(p.poll() is not None for p in procs):
            raise AssertionError("a launcher ended early:\n" + "\n".join(x.read_text()[-3000:] for x in logs))
        time.sleep(0.05)
    raise AssertionError(f"step {step} not reached in {timeout}s")


def _child_of(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_rollback_to_a_snapshot_redoes_the_same_steps(tmp_path, precision):
    """What a failed worker's survivors do: back to the commit (weights, fp32 masters and loss scale
    under amp O2, optimizer state, counters, data position), then the same steps again give the same
    weights as the first time (no dropout: the toy task is then deterministic)."""
    from clipbert_legacy.training.engine import Trainer
    from tests.toy_task import ToyTask, toy_cfg

    cfg = toy_cfg(tmp_path / precision, fp16=int(precision == "fp16"), dist_backend="torch")
    t = Trainer(cfg, ToyTask(n_train=24, dropout=0.0))
    t.setup()
    batches = t.batches()
    for _ in range(2):
        t.run_step(batches)
    snap = elastic.snapshot(t)
    for _ in range(5):  # past the end of epoch 0 (6 steps of 4)
        t.run_step(batches)
    first = (t.checkpointer.model_state_dict(), t.global_step, t.epoch, t.state.examples_in_epoch)
    assert first[2] == 1
    elastic.load_snapshot(t, snap)
    assert (t.global_step, t.epoch, t.state.examples_in_epoch) == (2, 0, 8)
    for k, v in t.checkpointer.model_state_dict().items():
        torch.testing.assert_close(v, snap["model"][k], rtol=0, atol=0, msg=k)
    batches = t.batches()
    for _ in range(5):
        t.run_step(batches)
    assert (t.global_step, t.epoch, t.state.examples_in_epoch) == first[1:]
    for k, v in t.checkpointer.model_state_dict().items():
        torch.testing.assert_close(v, first[0][k], rtol=0, atol=0, msg=k)


def test_task_validation_data_is_rebuilt_when_the_world_changes(monkeypatch):
    """Tasks build their validation share once; after an elastic change of workers, again."""
    import clipbert_legacy.compat.hvd as hvd
    from clipbert_legacy.tasks.base import ClipBertTask
    task, builds = ClipBertTask(), []

    def build():
        builds.append((hvd.rank(), hvd.size()))
        return len(builds)
    monkeypatch.setattr(hvd, "rank", lambda: 1)
    monkeypatch.setattr(hvd, "size", lambda: 2)
    assert task.val_data(build) == 1 and task.val_data(build) == 1
    monkeypatch.setattr(hvd, "rank", lambda: 0)
    monkeypatch.setattr(hvd, "size", lambda: 1)
    assert task.val_data(build) == 2 and builds == [(1, 2), (0, 1)]


@requires_horovod
def test_demo_retrieval_under_horovod_elastic_survives_a_lost_host(sshd, tmp_path):
    """The real task (LMDB videos, a DataLoader worker, distributed retrieval validation): the worker
    on 127.0.0.2 is SIGKILLed after step 4; the job finishes on 127.0.0.1 alone, validating there."""
    cfg_path = mn.write_demo_config(tmp_path)
    cfg = json.loads(cfg_path.read_text())
    cfg.update({"num_train_epochs": 4, "elastic_commit_steps": 2, "n_workers": 1, "num_valid": 2,
                "min_valid_steps": 1, "log_interval": 1})
    cfg_path.write_text(json.dumps(cfg))
    out, log = tmp_path / "run", tmp_path / "horovodrun.log"
    cmd = [str(mp_utils.BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "2",
           "--host-discovery-script", str(_discovery(tmp_path / "discover.sh", None)),
           "--network-interface", "lo", "--ssh-port", str(sshd["port"]),
           "--ssh-identity-file", str(sshd["key"]), "--gloo-timeout-seconds", "30",
           sys.executable] + mn.train_args(cfg_path, out)
    with open(log, "w") as f:
        proc = subprocess.Popen([str(c) for c in cmd], cwd=str(mp_utils.REPO), stdout=f,
                                stderr=subprocess.STDOUT, env=mp_utils._env({"PATH": sshd["path"]}),
                                start_new_session=True)
    try:
        deadline = time.time() + TIMEOUT
        while "step 4/" not in log.read_text():
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        victim = _worker_on_host(mn.HOSTS[1])
        os.kill(victim, signal.SIGKILL)
        assert proc.wait(timeout=TIMEOUT) == 0, log.read_text()[-4000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    state = final_restore(out)
    assert state["finished"] and state["world_size"] == 1 and state["global_step"] > 8
    text = log.read_text()
    assert "2 -> 1 processes" in text and f"validation at step {state['global_step']}" in text, text[-4000:]


def _worker_on_host(host: str) -> int:
    """The training process Horovod started for ``host`` (not its DataLoader workers: their parent
    is a training process too)."""
    procs = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        ours = any(a.endswith(b"run_video_retrieval.py") for a in argv)
        if ours and f"HOROVOD_HOSTNAME={host}".encode() in env:
            procs[int(pid)] = ppid
    roots = [p for p, parent in procs.items() if parent not in procs]
    assert len(roots) == 1, procs
    return roots[0]
