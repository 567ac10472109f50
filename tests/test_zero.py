"""``--zero_stage 1|2`` (clipbert_legacy.training.zero, clipbert_legacy.optimization.sharding): the
partition, the state dict between full layout and shard, and real ``torchrun --nproc_per_node 2`` runs
whose weights, restore files and resumes are bit-equal to the unsharded run's, with half the optimizer
state per rank."""
import glob
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
import torch

from clipbert_legacy.config.schema import ConfigError
from clipbert_legacy.optimization.param_groups import build_optimizer
from clipbert_legacy.optimization.sharding import (
    ShardLayout,
    merge_state_dicts,
    partition,
    shard_param_groups,
    shard_state_dict,
)
from clipbert_legacy.training import zero
from tests import mp_utils
from tests.conftest import requires_horovod
from tests.toy_task import ToyModel, toy_cfg

WORKERS = mp_utils.REPO / "tests" / "workers"
TRAIN = WORKERS / "engine_train.py"


# ------------------------------------------------------------------------------------------- units
def test_partition_is_balanced_largest_first_and_deterministic():
    # 10 -> rank 0; 8 -> rank 1; then the 3s: rank 1 (8 < 10), rank 0 (10 < 11); 1 -> rank 1 (11 < 13)
    assert partition([3, 10, 3, 8, 1], 2) == [1, 0, 0, 1, 1]
    assert partition([2, 2, 2, 2], 2) == [0, 1, 0, 1]  # ties: the earlier parameter, the lower rank
    assert partition([3, 10, 3, 8, 1], 2) == partition([3, 10, 3, 8, 1], 2)
    assert partition([5, 5, 5], 1) == [0, 0, 0]
    assert partition([4], 3) == [0]  # more ranks than parameters: the others own nothing
    owners = partition([7] * 9, 3)
    assert [owners.count(r) for r in range(3)] == [3, 3, 3]
    with pytest.raises(ValueError, match="world size must be >= 1"):
        partition([1], 0)


def _stepped_optimizer(tmp_path):
    torch.manual_seed(0)
    model = ToyModel()
    opt = build_optimizer(model, toy_cfg(tmp_path / "run", weight_decay=0.01))
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    return model, opt


def test_shard_and_merge_give_back_the_full_state_dict(tmp_path):
    model, opt = _stepped_optimizer(tmp_path)
    full = opt.state_dict()
    layouts = [ShardLayout.of(opt.param_groups, 2, r) for r in range(2)]
    shards = [shard_state_dict(full, lay) for lay in layouts]
    owned = [lay.owned() for lay in layouts]
    assert sorted(owned[0] + owned[1]) == list(range(12)) and owned[0] and owned[1]
    for r, sd in enumerate(shards):  # local indices 0..n-1, the owned tensors themselves
        assert sorted(sd["state"]) == list(range(len(owned[r])))
        assert [len(g["params"]) for g in sd["param_groups"]] == [
            sum(layouts[r].owners[i] == r for i in rng) for rng in layouts[r].group_ranges()]
        for j, i in enumerate(owned[r]):
            assert torch.equal(sd["state"][j]["exp_avg"], full["state"][i]["exp_avg"])
    merged = merge_state_dicts(shards, layouts[0])
    assert merged["param_groups"] == full["param_groups"]
    assert list(merged["state"]) == list(full["state"])
    for i, s in full["state"].items():
        assert s["step"] == merged["state"][i]["step"] == 1
        assert torch.equal(s["exp_avg_sq"], merged["state"][i]["exp_avg_sq"])


def test_sharded_groups_keep_their_structure_and_load_the_shard(tmp_path):
    model, opt = _stepped_optimizer(tmp_path)
    full = opt.state_dict()
    fresh = build_optimizer(model, toy_cfg(tmp_path / "run", weight_decay=0.01))
    layout = ShardLayout.of(fresh.param_groups, 2, 1)
    shard_param_groups(fresh.param_groups, layout)
    assert [g["name"] for g in fresh.param_groups] == [g["name"] for g in opt.param_groups]
    names = [n for g in fresh.param_groups for n in g["param_names"]]
    assert names == [layout.names[i] for i in layout.owned()]
    fresh.load_state_dict(shard_state_dict(full, layout))
    by_name = {n: p for g in opt.param_groups for n, p in zip(g["param_names"], g["params"])}
    for g in fresh.param_groups:
        for n, p in zip(g["param_names"], g["params"]):
            assert torch.equal(fresh.state[p]["exp_avg"], opt.state[by_name[n]]["exp_avg"])


def test_a_state_dict_of_another_model_is_refused_in_one_line(tmp_path):
    model, opt = _stepped_optimizer(tmp_path)
    full = opt.state_dict()
    full["param_groups"][0]["params"] = full["param_groups"][0]["params"][:-1]
    with pytest.raises(ValueError, match=r"param groups of \[.*\] parameters.*restore file is from another"):
        shard_state_dict(full, ShardLayout.of(opt.param_groups, 2, 0))


def test_horovod_backend_refuses_stage_2_and_elastic(monkeypatch):
    """Stage 2 needs a reduce onto one rank; Horovod elastic may grow from one worker to several (the
    owners would change): both refused from the start, naming what to use instead."""
    monkeypatch.setattr(zero.hvd, "backend_name", lambda: "horovod")
    zero.check_backend(1, 2)  # stage 1 rides on Horovod's own allreduce/broadcast
    zero.check_backend(2, 1)  # one plain process: nothing to shard
    with pytest.raises(ConfigError, match=r"^zero_stage=2 needs the torch.distributed backend: launch with "
                                          r"torchrun --nproc_per_node N and --dist_backend torch"):
        zero.check_backend(2, 2)
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    with pytest.raises(ConfigError, match=r"^zero_stage=1 does not work under Horovod elastic .* use "
                                          r"--zero_stage 0, or torchrun --max-restarts"):
        zero.check_backend(1, 1)
    zero.check_backend(0, 4)  # stage 0: any backend


def test_foreign_grads_are_dropped_and_own_grads_kept(tmp_path):
    model, opt = _stepped_optimizer(tmp_path)
    params = [p for g in opt.param_groups for p in g["params"]]
    layout = ShardLayout.of(opt.param_groups, 2, 0)
    zero.ZeroSharding(1, layout, params, world=2).drop_foreign_grads()
    assert [p.grad is not None for p in params] == [o == 0 for o in layout.owners]
    assert 0 < sum(o == 0 for o in layout.owners) < len(params)


# ------------------------------------------------------------------------------------ torchrun -np 2
def final_weights(run_dir):
    path = max(glob.glob(os.path.join(run_dir, "ckpt", "model_step_*.pt")),
               key=lambda p: int(p.rsplit("_", 1)[1][:-3]))
    return int(path.rsplit("_", 1)[1][:-3]), torch.load(path)


def assert_same_tensors(a, b, what):
    assert a.keys() == b.keys(), what
    for k in a:
        assert torch.equal(a[k], b[k]), f"{what}: {k}"


def assert_same_restore(a_dir, b_dir):
    a, b = (torch.load(os.path.join(d, "ckpt", "restore.pt"), weights_only=True) for d in (a_dir, b_dir))
    assert a["global_step"] == b["global_step"] > 0
    assert_same_tensors(a["model"], b["model"], "restore.pt model")
    assert a["optimizer"]["param_groups"] == b["optimizer"]["param_groups"]
    assert list(a["optimizer"]["state"]) == list(b["optimizer"]["state"]) == list(range(12))
    for i, s in a["optimizer"]["state"].items():
        t = b["optimizer"]["state"][i]
        assert s["step"] == t["step"] and torch.equal(s["exp_avg"], t["exp_avg"]), i
        assert torch.equal(s["exp_avg_sq"], t["exp_avg_sq"]), i
    assert a["amp"] == b["amp"]


@pytest.mark.multiprocess
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_stages_1_and_2_match_the_unsharded_run_bitwise(tmp_path, precision):
    """Accumulation 2, clipping on (the norm is above grad_norm every step); amp O2 skips steps."""
    opts = {"gradient_accumulation_steps": 2, "grad_norm": 0.5, "num_train_epochs": 4}
    if precision != "fp32":
        opts[precision] = 1
    res = mp_utils.check(mp_utils.run_torchrun([WORKERS / "zero_train.py", tmp_path, json.dumps(opts)],
                                               timeout=240))
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["world"] == 2
    step, w0 = final_weights(tmp_path / "z0")
    assert step == 8
    for z in ("z1", "z2"):
        assert_same_tensors(w0, final_weights(tmp_path / z)[1], f"{z} final weights")
        assert_same_restore(tmp_path / "z0", tmp_path / z)
    norms = [json.loads(ln)["grad_norm"] for ln in open(tmp_path / "z0" / "log" / "metrics.jsonl")
             if '"train"' in ln]
    assert norms and min(norms) > 0.5  # clipping took effect
    s = out["stages"]
    full = s["0"]["state_bytes"][0]
    assert s["0"]["state_bytes"] == [full, full] and s["0"]["owned"] == [12, 12]
    for z in ("1", "2"):
        assert sum(s[z]["state_bytes"]) == full  # each moment (and master) lives on one rank
        assert max(s[z]["state_bytes"]) <= 0.6 * full  # ~1/2 per rank (whole tensors: not exactly)
        assert sum(s[z]["owned"]) == 12 and min(s[z]["owned"]) > 0
        assert s[z]["skipped"] == s["0"]["skipped"]  # same overflow decisions, both ranks
    if precision == "fp16":
        assert s["0"]["masters"] == [12, 12] and s["1"]["masters"] == s["1"]["owned"]
        assert s["0"]["skipped"][0] == s["0"]["skipped"][1] > 0
    else:
        assert s["1"]["masters"] == [0, 0]


KILL_OPTS = dict(train_batch_size=2, gradient_accumulation_steps=2, num_train_epochs=3, save_steps_ratio=0.1,
                 num_valid=2, min_valid_steps=1, dist_backend="torch", fp16=1, grad_norm=0.5)
KILL_T = 18  # ceil(3 * 48 / (2 ranks * 2 * 2))


@pytest.mark.multiprocess
def test_kill9_under_zero_stage_2_resumes_to_the_unsharded_weights(tmp_path):
    """amp O2 + zero_stage 2 under torchrun -np 2, the whole job killed by SIGKILL mid-run and rerun:
    the final weights equal those of an uninterrupted zero_stage 0 run."""
    task = json.dumps({"n_train": 48, "sleep": 0.05})
    u, r = tmp_path / "u", tmp_path / "r"
    mp_utils.check(mp_utils.run_torchrun([TRAIN, u, json.dumps({**KILL_OPTS, "zero_stage": 0}), task],
                                         timeout=180))
    args = [TRAIN, r, json.dumps({**KILL_OPTS, "zero_stage": 2}), task]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(mp_utils.free_port())] + [str(a) for a in args]
    proc = subprocess.Popen(cmd, cwd=str(mp_utils.REPO), env=mp_utils._env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    restore = r / "ckpt" / "restore.pt"
    mp_utils.wait_until(restore.exists, f"the first restore file {restore}", proc=proc)
    time.sleep(0.3)  # a few more steps, so the kill lands between (or during) restore saves
    mp_utils.kill_tree(proc.pid)  # the launcher and both ranks (own process groups)
    proc.wait(timeout=10)
    time.sleep(0.5)
    assert not (r / "ckpt" / f"model_step_{KILL_T}.pt").exists(), "killed too late"
    killed_at = torch.load(restore if restore.exists() else r / "ckpt" / "restore_backup.pt",
                           weights_only=True)["global_step"]
    assert 0 < killed_at < KILL_T
    res = mp_utils.check(mp_utils.run_torchrun(args, timeout=180))
    assert f"at step {killed_at} (epoch" in res.stderr  # "resumed from ... at step N"
    assert_same_tensors(final_weights(u)[1], final_weights(r)[1], "final weights")
    assert final_weights(r)[0] == KILL_T


WORLD_OPTS = dict(gradient_accumulation_steps=2, num_train_epochs=4, dist_backend="torch", fp16=1,
                  grad_norm=0.5)


def _stopped_run(out, world, zero_stage):
    """The toy run (amp O2) stopped by SIGTERM on rank 0 after step 3: the restore file is written at
    the next step boundary and the job exits 75, on 1 or 2 processes."""
    extra = [x for k, v in {**WORLD_OPTS, "zero_stage": zero_stage}.items() for x in (f"--{k}", str(v))]
    args = [WORKERS / "signal_stop.py", out, 0, 3, "SIGTERM", 1] + extra
    run = mp_utils.run_torchrun if world == 2 else mp_utils.run_python
    res = run(args, timeout=180)
    assert res.returncode == 75 or (world == 2 and res.returncode == 1 and "exitcode  : 75" in res.stderr), \
        res.stderr[-3000:]
    return torch.load(out / "ckpt" / "restore.pt", weights_only=True)["global_step"]


def _resume(out, world, zero_stage, at_step):
    args = [TRAIN, out, json.dumps({**WORLD_OPTS, "zero_stage": zero_stage})]
    run = mp_utils.run_torchrun if world == 2 else mp_utils.run_python
    res = mp_utils.check(run(args, timeout=180))
    assert f"at step {at_step} (epoch" in res.stderr
    return final_weights(out)


@pytest.mark.multiprocess
def test_restore_file_moves_between_world_sizes_and_stages(tmp_path):
    """2 -> 1: the zero_stage 2 run's restore file equals the unsharded run's and resumes on one
    process to the same weights. 1 -> 2: an unsharded single-process restore file, resharded on load,
    continues under zero_stage 2 exactly as under zero_stage 0."""
    at = _stopped_run(tmp_path / "a2", 2, zero_stage=2)
    assert 3 <= at < 8 and _stopped_run(tmp_path / "b2", 2, zero_stage=0) == at
    assert_same_restore(tmp_path / "a2", tmp_path / "b2")
    wa, wb = _resume(tmp_path / "a2", 1, 0, at), _resume(tmp_path / "b2", 1, 0, at)
    assert wa[0] == wb[0] > at
    assert_same_tensors(wa[1], wb[1], "2 -> 1 final weights")

    at = _stopped_run(tmp_path / "one", 1, zero_stage=0)
    shutil.copytree(tmp_path / "one", tmp_path / "one_z0")
    w2, w0 = _resume(tmp_path / "one", 2, 2, at), _resume(tmp_path / "one_z0", 2, 0, at)
    assert w2[0] == w0[0] > at
    assert_same_tensors(w2[1], w0[1], "1 -> 2 final weights")


@requires_horovod
@pytest.mark.multiprocess
def test_horovodrun_stage_1_matches_unsharded_and_stage_2_is_refused(tmp_path):
    """Real Horovod's allreduce, broadcast and allgather carry stage 1 (amp O2 here, bit-equal to stage
    0); its optimizer hooks allreduce every gradient, so stage 2 stops with one line naming torchrun."""
    opts = {"dist_backend": "horovod", "gradient_accumulation_steps": 2, "grad_norm": 0.5,
            "num_train_epochs": 4, "fp16": 1}
    res = mp_utils.check(mp_utils.run_horovod([WORKERS / "zero_train.py", tmp_path, json.dumps(opts), "01"],
                                              np=2, timeout=180))
    out = json.loads(res.stdout.strip().splitlines()[-1].split("<stdout>:", 1)[1])
    assert out["world"] == 2 and sum(out["stages"]["1"]["masters"]) == 12
    assert max(out["stages"]["1"]["state_bytes"]) <= 0.6 * out["stages"]["0"]["state_bytes"][0]
    assert_same_tensors(final_weights(tmp_path / "z0")[1], final_weights(tmp_path / "z1")[1], "final weights")
    assert_same_restore(tmp_path / "z0", tmp_path / "z1")

    res = mp_utils.run_horovod([WORKERS / "toy_main.py", tmp_path / "run",
                                json.dumps({"zero_stage": 2, "dist_backend": "horovod"})], np=2, timeout=120)
    assert res.returncode != 0
    lines = {ln.split("error: ", 1)[1] for ln in (res.stdout + res.stderr).splitlines()
             if "error: ConfigError: zero" in ln}
    assert lines == {"ConfigError: zero_stage=2 needs the torch.distributed backend: launch with torchrun "
                     "--nproc_per_node N and --dist_backend torch (real Horovod's DistributedOptimizer "
                     "allreduces every gradient in its own hooks, it cannot sum one onto its owner), or use "
                     "--zero_stage 1 under horovodrun"}
    assert "<stderr>:Traceback" not in res.stderr  # no rank's traceback (horovodrun prints its own)
    assert not (tmp_path / "run" / "ckpt" / "restore.pt").exists()
