"""Helpers for the multi-node tests: a loopback sshd, fake SLURM commands, the demo job, weight checks.

127.0.0.1 and 127.0.0.2 play two hosts. Horovod treats 127.0.0.2 as remote (it is not an address of
any interface), so it starts that rank over ssh exactly as on a cluster.
"""
import json
import os
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from tests import mp_utils

REPO = mp_utils.REPO
SSHD = Path("/usr/sbin/sshd")
HOSTS = ("127.0.0.1", "127.0.0.2")
TRAIN_SCRIPT = "src/tasks/run_video_retrieval.py"


def write_demo_config(root: Path) -> Path:
    """16 training videos, batch 4 per rank: 2 steps on 2 processes, then validation on 4 videos."""
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    data = root / "data"
    build_demo_data(str(data), n_train=16, n_val=4, n_test=4, img_size=64, n_frames=12, fps=10,
                    num_workers=1, log=lambda *a: None)
    cfg = json.load(open(REPO / "configs" / "demo_ret.json"))
    db = {"name": "demo", "img": str(data / "vis_db")}
    cfg.update({
        "train_datasets": [dict(db, txt=str(data / "txt/retrieval_train.jsonl"))],
        "val_datasets": [dict(db, txt=str(data / "txt/retrieval_val.jsonl"))],
        "model_config": str(REPO / "configs/model/tiny_model.json"), "bert_weights_path": None,
        "cnn_weights_path": None, "max_img_size": 64, "itm_neg_size": 1, "train_batch_size": 4,
        "num_train_epochs": 1, "train_n_clips": 1, "num_frm": 2, "num_valid": 1, "min_valid_steps": 100,
        "eval_retrieval_batch_size": 4, "inference_batch_size": 4, "n_workers": 0,
    })
    path = root / "demo_ret_multinode.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def train_args(cfg: Path, out: Path) -> list:
    return [TRAIN_SCRIPT, "--config", str(cfg), "--output_dir", str(out)]


# ---------------------------------------------------------------------------------------------
# weights
def final_model(out: Path) -> dict:
    """The model of a finished 2-process run of 2 steps (its restore file)."""
    state = torch.load(out / "ckpt" / "restore.pt", map_location="cpu", weights_only=True)
    assert state["finished"] and state["world_size"] == 2 and state["global_step"] == 2, \
        {k: state[k] for k in ("finished", "world_size", "global_step")}
    assert (out / "ckpt" / "model_step_2.pt").is_file()
    return state["model"]


def assert_same_weights(out: Path, ref: Path):
    """The tolerance of tests/test_hvd.py's 2-process vs single-process comparison."""
    w, w_ref = final_model(out), final_model(ref)
    assert w.keys() == w_ref.keys()
    for k in w:
        torch.testing.assert_close(w[k], w_ref[k], atol=1e-6, rtol=0, msg=f"{k}: multi-node != single host")


# ---------------------------------------------------------------------------------------------
# processes
def run_together(cmds, envs, logs, timeout):
    """Start every command, wait for all; on a timeout kill them all and fail with their output.
    Returns the exit codes."""
    procs = []
    for cmd, env, log in zip(cmds, envs, logs):
        with open(log, "w") as f:
            procs.append(subprocess.Popen([str(c) for c in cmd], cwd=str(REPO), env=mp_utils._env(env),
                                          stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
    deadline = time.time() + timeout
    try:
        return [p.wait(timeout=max(1, deadline - time.time())) for p in procs]
    except subprocess.TimeoutExpired:
        raise AssertionError(f"timed out after {timeout}s:\n" + "\n".join(
            f"--- {log} ---\n{Path(log).read_text()[-3000:]}" for log in logs)) from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


def write_executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def slurm_shims(bindir: Path, hosts, srun_log: Path) -> Path:
    """Fake `scontrol show hostnames` (prints `hosts`) and `srun` (logs its options, then runs the
    command once per node here, with SLURM_NODEID/SLURM_PROCID set, and returns the worst exit code)."""
    bindir.mkdir(parents=True, exist_ok=True)
    names = " ".join(hosts)
    write_executable(bindir / "scontrol", "#!/bin/sh\n"
                     "[ \"$1 $2\" = 'show hostnames' ] || { echo \"fake scontrol: $*\" >&2; exit 1; }\n"
                     f"printf '%s\\n' {names}\n")
    write_executable(bindir / "srun", "#!/usr/bin/env bash\n"
                     f"echo \"srun $*\" >> {srun_log}\n"
                     "while [[ \"${1:-}\" == -* ]]; do shift; done\n"
                     "pids=()\n"
                     "for ((n = 0; n < SLURM_NNODES; n++)); do\n"
                     "  SLURM_NODEID=$n SLURM_PROCID=$n \"$@\" & pids+=($!)\n"
                     "done\n"
                     "rc=0; for p in \"${pids[@]}\"; do wait \"$p\" || rc=$?; done; exit \"$rc\"\n")
    return bindir


# ---------------------------------------------------------------------------------------------
# sshd on loopback
def _sshd_config(tmp: Path, port: int) -> str:
    lines = [f"Port {port}", *(f"ListenAddress {h}" for h in HOSTS), f"HostKey {tmp / 'host_key'}",
             f"PidFile {tmp / 'sshd.pid'}", f"AuthorizedKeysFile {tmp / 'authorized_keys'}",
             "PermitRootLogin yes", "StrictModes no", "UsePAM no", "PasswordAuthentication no",
             "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "LogLevel INFO"]
    return "\n".join(lines) + "\n"


def _wait_listening(host, port, proc, log: Path, timeout=15):
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"sshd exited with {proc.returncode}:\n{log.read_text()}"
        try:
            socket.create_connection((host, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"sshd is not listening on {host}:{port} after {timeout}s:\n{log.read_text()}")


def sshd_unavailable_reason():
    """Why the loopback sshd cannot run here (the tests skip with it), or None."""
    if not SSHD.exists():
        return f"{SSHD} missing: install openssh-server (./run_scripts/install_test_deps.sh does, as root)"
    if shutil.which("ssh") is None or shutil.which("ssh-keygen") is None:
        return "ssh / ssh-keygen missing: install openssh-client"
    if os.geteuid() != 0:
        return "the loopback sshd needs root (privilege separation directory /run/sshd, login as root)"
    return None


@contextmanager
def loopback_sshd(tmp: Path):
    """A private sshd on both loopback hosts with a throwaway host key and user key. Yields the port,
    the user key, a PATH whose `ssh` keeps host keys in `tmp` (not in ~/.ssh), and sshd's log."""
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp / name)], check=True)
    shutil.copy(tmp / "user_key.pub", tmp / "authorized_keys")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    port = mp_utils.free_port()
    (tmp / "sshd_config").write_text(_sshd_config(tmp, port))
    (tmp / "bin").mkdir()
    write_executable(tmp / "bin" / "ssh", f"#!/bin/sh\nexec {shutil.which('ssh')} -o UserKnownHostsFile="
                     f"{tmp / 'known_hosts'} -o GlobalKnownHostsFile=/dev/null -o LogLevel=ERROR \"$@\"\n")
    log = tmp / "sshd.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(tmp / "sshd_config")], stdout=f, stderr=f)
    try:
        _wait_listening(HOSTS[1], port, proc, log)
        path = os.pathsep.join([str(tmp / "bin"), str(mp_utils.BIN), os.environ.get("PATH", "")])
        yield {"port": port, "key": tmp / "user_key", "path": path, "log": log}
    finally:
        proc.terminate()
        proc.wait(timeout=10)
