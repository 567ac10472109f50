"""The multi-node and SLURM scripts' command lines, without launching anything: /bin/echo stands in
for python and horovodrun, fake srun/scontrol for SLURM (tests/test_multinode.py runs them for real)."""
import os
import re
import subprocess
import sys

import pytest

from tests import multinode_utils as mn

SCRIPTS = mn.REPO / "run_scripts"
NEW = ["multinode_horovod.sh", "multinode_torchrun.sh", "slurm_torchrun.sbatch", "slurm_horovod.sbatch"]
DEFAULT_JOB = ["src/tasks/run_video_retrieval.py", "--config", "configs/msrvtt_ret_base_resnet50.json",
               "--output_dir", "/storage/msrvtt_ret"]


def _run(script, *args, cwd=None, **env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    e.update(env)
    return subprocess.run([str(SCRIPTS / script), *args], env=e, capture_output=True, text=True, timeout=60,
                          cwd=cwd or "/")


def _slurm(tmp_path, hosts, **env):
    bindir = mn.slurm_shims(tmp_path / "bin", hosts, tmp_path / "srun.log")
    return dict({"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}", "SLURM_JOB_NODELIST": "gpu-[a-c]",
                 "SLURM_NNODES": str(len(hosts)), "SLURM_JOB_ID": "777", "SLURM_SUBMIT_DIR": str(mn.REPO)},
                **env)


@pytest.mark.parametrize("script", NEW)
def test_scripts_parse_and_are_executable(script):
    assert subprocess.run(["bash", "-n", str(SCRIPTS / script)]).returncode == 0
    assert os.access(SCRIPTS / script, os.X_OK)


def test_configs_named_by_slurm_scripts_exist():
    for script in NEW:
        for name in re.findall(r"configs/[\w.]+\.json", (SCRIPTS / script).read_text()):
            assert (mn.REPO / name).is_file(), f"{script}: {name}"


def test_horovod_hosts_become_np_and_h():
    p = _run("multinode_horovod.sh", "x.py", "--a", "1", HOSTS="host1:4,host2:4", NIC="eth0",
             SSH_PORT="2222", SSH_KEY="/k", HOROVOD_ARGS="--gloo --verbose", HOROVODRUN="/bin/echo",
             PYTHON="/opt/py")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["-np", "8", "-H", "host1:4,host2:4", "--network-interface", "eth0",
                                "--ssh-port", "2222", "--ssh-identity-file", "/k", "--gloo", "--verbose",
                                "/opt/py", "x.py", "--a", "1"]


@pytest.mark.parametrize("hosts", ["host1", "host1:0", "host1:4,host2", "host1:x"])
def test_horovod_bad_hosts_is_a_clear_error(hosts):
    p = _run("multinode_horovod.sh", "x.py", HOSTS=hosts, HOROVODRUN="/bin/echo")
    assert p.returncode == 2 and "is not host:slots" in p.stderr and p.stdout == ""


def test_missing_settings_print_usage():
    assert _run("multinode_horovod.sh", "x.py").returncode == 2
    p = _run("multinode_torchrun.sh", "x.py", NNODES="2", NODE_RANK="0")
    assert p.returncode == 2 and "usage: NNODES=N NODE_RANK=i MASTER_ADDR=host" in p.stderr


def test_torchrun_node_command():
    p = _run("multinode_torchrun.sh", "x.py", "--b", NNODES="2", NODE_RANK="1", MASTER_ADDR="host1",
             MASTER_PORT="1234", NPROC_PER_NODE="4", LOCAL_ADDR="host2", PYTHON="/bin/echo")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1",
                                "--nproc_per_node", "4", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                "host1:1234", "--rdzv-id", "clipbert", "--local-addr", "host2", "x.py", "--b"]


@pytest.mark.parametrize("addr", ["127.0.0.1", "localhost"])
def test_torchrun_one_node_on_the_loopback_binds_it(addr):
    p = _run("multinode_torchrun.sh", "x.py", NNODES="1", NODE_RANK="0", MASTER_ADDR=addr, MASTER_PORT="1234",
             NPROC_PER_NODE="2", PYTHON="/bin/echo")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:5] == ["-m", "clipbert_legacy.compat.loopback", "torchrun", "--nnodes", "1"]
    p = _run("multinode_torchrun.sh", "x.py", NNODES="2", NODE_RANK="0", MASTER_ADDR=addr, PYTHON="/bin/echo")
    assert p.stdout.split()[:2] == ["-m", "torch.distributed.run"]  # two nodes: the network is needed


def test_slurm_torchrun_one_launcher_per_node(tmp_path):
    """--nnodes from SLURM_NNODES, --node_rank from SLURM_NODEID, the rendezvous on the first node."""
    env = _slurm(tmp_path, ["gpu-a", "gpu-b", "gpu-c"], SLURM_GPUS_ON_NODE="8", PYTHON="/bin/echo")
    p = _run("slurm_torchrun.sbatch", **env)
    assert p.returncode == 0, p.stderr
    lines = sorted(p.stdout.splitlines())
    assert len(lines) == 3
    for rank, line in enumerate(lines):
        assert line.split() == ["-m", "torch.distributed.run", "--nnodes", "3", "--node_rank", str(rank),
                                "--nproc_per_node", "8", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                                "gpu-a:29500", "--rdzv-id", "777"] + DEFAULT_JOB
    srun = (tmp_path / "srun.log").read_text().split()
    assert srun[:3] == ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
    assert srun[3].endswith("run_scripts/multinode_torchrun.sh")


def test_slurm_horovod_hosts_from_the_allocation(tmp_path):
    env = _slurm(tmp_path, ["gpu-a", "gpu-b"], SLURM_GPUS_ON_NODE="4", PYTHON="/opt/py",
                 HOROVODRUN="/bin/echo")
    p = _run("slurm_horovod.sbatch", "x.py", "--c", **env)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["-np", "8", "-H", "gpu-a:4,gpu-b:4", "/opt/py", "x.py", "--c"]
    assert not (tmp_path / "srun.log").exists()


def test_slurm_horovod_srun_mode_command(tmp_path):
    """LAUNCH=srun: srun starts one rank per GPU with PMIx (for an MPI-built Horovod)."""
    env = _slurm(tmp_path, ["gpu-a", "gpu-b"], GPUS_PER_NODE="4", PYTHON="/bin/echo", LAUNCH="srun")
    p = _run("slurm_horovod.sbatch", **env)
    assert p.returncode == 0, p.stderr
    srun = (tmp_path / "srun.log").read_text().split()
    assert srun == ["srun", "--ntasks-per-node=4", "--mpi=pmix", "--kill-on-bad-exit=1",
                    "/bin/echo"] + DEFAULT_JOB


def test_slurm_horovod_srun_mode_refuses_horovod_without_mpi(tmp_path):
    hvd = pytest.importorskip("horovod.torch", reason="Horovod not installed")
    if hvd.mpi_built():
        pytest.skip("this Horovod has MPI: LAUNCH=srun is allowed")
    env = _slurm(tmp_path, ["gpu-a"], PYTHON=sys.executable, LAUNCH="srun")
    p = _run("slurm_horovod.sbatch", **env)
    assert p.returncode == 2 and "LAUNCH=srun needs Horovod built with MPI" in p.stderr
    assert not (tmp_path / "srun.log").exists()


@pytest.mark.parametrize("script", ["slurm_torchrun.sbatch", "slurm_horovod.sbatch"])
def test_sbatch_outside_the_repository_is_a_clear_error(tmp_path, script):
    env = _slurm(tmp_path, ["gpu-a"], SLURM_SUBMIT_DIR=str(tmp_path), PYTHON="/bin/echo")
    p = _run(script, **env)
    assert p.returncode == 2 and "is not the clipbert-legacy repository" in p.stderr
