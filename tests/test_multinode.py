"""Multi-node launches for real on one machine, with 127.0.0.1 and 127.0.0.2 as the two "hosts",
through the shipped scripts (docs/scaling_out.md).

horovodrun reaches the second host over ssh (a throwaway sshd bound to loopback), torchrun joins two
separate launchers through a c10d rendezvous, and the SLURM batch scripts run under fake srun/scontrol.
Each must end with the weights of the single-host 2-process run of the same launcher: a job spread over
machines has to train exactly like one on a single machine.
"""
import os
import sys

import pytest

from tests import mp_utils
from tests import multinode_utils as mn
from tests.conftest import requires_horovod

pytestmark = pytest.mark.multiprocess
SCRIPTS = mn.REPO / "run_scripts"
TIMEOUT = 110


@pytest.fixture(scope="module")
def demo_cfg(tmp_path_factory):
    return mn.write_demo_config(tmp_path_factory.mktemp("multinode"))


@pytest.fixture(scope="module")
def horovod_ref(demo_cfg, tmp_path_factory):
    """`horovodrun -np 2 -H localhost:2`: the single-host run the multi-node ones must match."""
    out = tmp_path_factory.mktemp("horovod_ref") / "run"
    mp_utils.check(mp_utils.run_horovod(mn.train_args(demo_cfg, out), np=2, timeout=TIMEOUT))
    return out


@pytest.fixture(scope="module")
def torchrun_ref(demo_cfg, tmp_path_factory):
    """`torchrun --nproc_per_node 2`: the single-host run the multi-node ones must match."""
    out = tmp_path_factory.mktemp("torchrun_ref") / "run"
    mp_utils.check(mp_utils.run_torchrun(mn.train_args(demo_cfg, out), np=2, timeout=TIMEOUT))
    return out


def _ssh_env(sshd):
    """What multinode_horovod.sh needs to reach 127.0.0.2 through the test's sshd."""
    return {"NIC": "lo", "SSH_PORT": str(sshd["port"]), "SSH_KEY": str(sshd["key"]), "PATH": sshd["path"],
            "PYTHON": sys.executable, "HOROVOD_ARGS": "--gloo --gloo-timeout-seconds 60 --verbose"}


def _assert_rank1_went_through_ssh(proc, sshd):
    text = proc.stdout + proc.stderr
    assert f"127.0.0.2 -p {sshd['port']} -i {sshd['key']}" in text, text[-3000:]
    assert "Accepted publickey for" in sshd["log"].read_text()
    # each rank alone on its host: local size 1 on both
    assert text.count("local rank 0/1") == 2, text[-3000:]


# ---------------------------------------------------------------------------------------------
@requires_horovod
def test_horovodrun_over_ssh_matches_single_host(demo_cfg, horovod_ref, sshd, tmp_path):
    """HOSTS=127.0.0.1:1,127.0.0.2:1 NIC=lo multinode_horovod.sh: horovodrun -np 2 -H ...
    --network-interface lo, rank 1 started over ssh."""
    out = tmp_path / "two_hosts"
    env = dict(_ssh_env(sshd), HOSTS=",".join(f"{h}:1" for h in mn.HOSTS))
    proc = mp_utils.check(mp_utils._run([SCRIPTS / "multinode_horovod.sh"] + mn.train_args(demo_cfg, out),
                                        TIMEOUT, env, None))
    _assert_rank1_went_through_ssh(proc, sshd)
    mn.assert_same_weights(out, horovod_ref)


def test_torchrun_two_launchers_match_single_host(demo_cfg, torchrun_ref, tmp_path):
    """multinode_torchrun.sh on each "node": torchrun --nnodes 2 --node_rank {0,1} --rdzv-backend c10d."""
    out, port = tmp_path / "two_nodes", mp_utils.free_port()
    cmd = [SCRIPTS / "multinode_torchrun.sh"] + mn.train_args(demo_cfg, out)
    envs = [{"NNODES": "2", "NODE_RANK": str(node), "MASTER_ADDR": mn.HOSTS[0], "MASTER_PORT": str(port),
             "NPROC_PER_NODE": "1", "LOCAL_ADDR": mn.HOSTS[node], "PYTHON": sys.executable}
            for node in (0, 1)]
    logs = [tmp_path / f"node{node}.log" for node in (0, 1)]
    rcs = mn.run_together([cmd, cmd], envs, logs, TIMEOUT)
    text = "".join(log.read_text() for log in logs)
    assert rcs == [0, 0], f"exit codes {rcs}\n{text[-6000:]}"
    assert text.count("local rank 0/1") == 2, text[-3000:]
    mn.assert_same_weights(out, torchrun_ref)


def _slurm_env(tmp_path, hosts, **extra):
    bindir = mn.slurm_shims(tmp_path / "slurm_bin", hosts, tmp_path / "srun.log")
    path = os.pathsep.join([str(bindir), extra.pop("PATH", os.environ.get("PATH", ""))])
    return dict({"SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NNODES": str(len(hosts)), "SLURM_JOB_ID": "4242",
                 "SLURM_SUBMIT_DIR": str(mn.REPO), "PYTHON": sys.executable, "PATH": path}, **extra)


def test_slurm_torchrun_sbatch_matches_single_host(demo_cfg, torchrun_ref, tmp_path):
    """slurm_torchrun.sbatch under fake srun/scontrol: one torchrun per node, MASTER_ADDR = first node."""
    out = tmp_path / "slurm_torchrun"
    env = _slurm_env(tmp_path, mn.HOSTS, SLURM_GPUS_ON_NODE="1", MASTER_PORT=str(mp_utils.free_port()))
    mp_utils.check(mp_utils._run([SCRIPTS / "slurm_torchrun.sbatch"] + mn.train_args(demo_cfg, out),
                                 TIMEOUT, env, "/"))
    assert "--ntasks-per-node=1 --kill-on-bad-exit=1" in (tmp_path / "srun.log").read_text()
    mn.assert_same_weights(out, torchrun_ref)


@requires_horovod
def test_slurm_horovod_sbatch_matches_single_host(demo_cfg, horovod_ref, sshd, tmp_path):
    """slurm_horovod.sbatch under fake scontrol: horovodrun -H built from the allocation's nodes."""
    out = tmp_path / "slurm_horovod"
    env = _slurm_env(tmp_path, mn.HOSTS, GPUS_PER_NODE="1", **_ssh_env(sshd))
    proc = mp_utils.check(mp_utils._run([SCRIPTS / "slurm_horovod.sbatch"] + mn.train_args(demo_cfg, out),
                                        TIMEOUT, env, "/"))
    _assert_rank1_went_through_ssh(proc, sshd)
    mn.assert_same_weights(out, horovod_ref)
