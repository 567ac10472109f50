"""Single-machine launches listen on the loopback only (issue 38, item 14).

torch's TCPStore server and horovodrun's rendezvous server take unauthenticated commands and listen
on every interface by default; our scripts launch single-machine jobs through clipbert_legacy.compat.loopback.
Every TCP listener of the job's processes is read from /proc while it runs (the same table ``ss -ltnp``
shows) and must be on 127.0.0.0/8 or ::1; the plain launcher, measured the same way, is not."""
import ipaddress
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from clipbert_legacy.compat.loopback import is_loopback
from tests import mp_utils

REPO = Path(__file__).resolve().parents[1]
SLOW_TOY = REPO / "tests" / "workers" / "slow_toy.py"
pytestmark = pytest.mark.multiprocess


def _listening_inodes():
    """{socket inode: (address, port)} of every listening TCP socket of this network namespace."""
    out = {}
    for table, family in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 6)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if f[3] != "0A":  # LISTEN
                continue
            hex_addr, hex_port = f[1].split(":")
            raw = bytes.fromhex(hex_addr)
            if family == 4:
                addr = ipaddress.IPv4Address(raw[::-1])
            else:  # four little-endian 32-bit words
                addr = ipaddress.IPv6Address(b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            out[f[9]] = (addr, int(hex_port, 16))
    return out


def _descendants(root):
    """{pid: command} of ``root`` and every process below it (mp_utils.process_tree)."""
    tree = {}
    for p in mp_utils.process_tree(root):
        try:
            tree[p.pid] = p.name()
        except psutil.NoSuchProcess:  # ended meanwhile
            continue
    return tree


def _tree_listeners(root):
    """[(address, port, pid, command)] of the listening sockets held by ``root``'s process tree."""
    inodes, found = _listening_inodes(), []
    for pid, comm in _descendants(root).items():
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:[") and target[8:-1] in inodes:
                    found.append((*inodes[target[8:-1]], pid, comm))
        except OSError:  # the process ended meanwhile
            continue
    return found


def _listeners_of(cmd, env, timeout=240):
    """Run ``cmd``; every listener its process tree held while it ran (polled every 50 ms)."""
    proc = subprocess.Popen([str(c) for c in cmd], cwd=REPO, env=mp_utils._env(env), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen, deadline = set(), time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        seen.update(_tree_listeners(proc.pid))
        time.sleep(0.05)
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    out = proc.communicate()[0]
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-4000:]}"
    return seen


def _launch_sh(tmp_path, **env):
    """run_scripts/_launch.sh's ``launch`` (what train_*.sh and inference_*.sh run) on the slow toy."""
    script = f'source {REPO}/run_scripts/_launch.sh; launch {SLOW_TOY} {tmp_path / "run"}'
    return ["bash", "-c", script], dict(env, PYTHON=sys.executable)


@pytest.mark.parametrize("launcher", ["horovodrun", "torchrun"])
def test_single_machine_jobs_of_our_scripts_listen_on_the_loopback_only(tmp_path, launcher):
    if launcher == "horovodrun" and not mp_utils.horovodrun_available():
        pytest.skip("horovodrun not installed")
    cmd, env = _launch_sh(tmp_path, NP="2", LAUNCHER=launcher)
    seen = _listeners_of(cmd, env)
    assert seen, "no listener seen: the job's rendezvous server must have been missed"
    outside = [s for s in seen if not s[0].is_loopback]
    assert not outside, f"listening beyond the loopback: {sorted(map(str, outside))}"


def test_the_plain_launcher_listens_on_every_interface(tmp_path):
    """The measurement can fail: plain torchrun with --master_addr 127.0.0.1 binds its store to ``*``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(mp_utils.free_port()), SLOW_TOY, tmp_path / "run"]
    seen = _listeners_of(cmd, {})
    assert any(not s[0].is_loopback for s in seen), sorted(map(str, seen))


def test_multinode_torchrun_with_one_node_on_the_loopback(tmp_path):
    """run_scripts/multinode_torchrun.sh with NNODES=1 MASTER_ADDR=127.0.0.1 (c10d rendezvous)."""
    env = {"NNODES": "1", "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(mp_utils.free_port()), "NPROC_PER_NODE": "2", "PYTHON": sys.executable}
    seen = _listeners_of([REPO / "run_scripts" / "multinode_torchrun.sh", SLOW_TOY, tmp_path / "run"], env)
    assert seen and all(s[0].is_loopback for s in seen), sorted(map(str, seen))


@pytest.mark.parametrize("argv,why", [
    (["torchrun", "--nnodes", "2", "--nproc_per_node", "1", "x.py"], "torchrun --nnodes 2 means several"),
    (["torchrun", "--nproc_per_node", "1", "--master_addr", "192.0.2.7", "x.py"],
     "the rendezvous host '192.0.2.7' is not a loopback address"),
    (["horovodrun", "-np", "2", "-H", "localhost:1,node2:1", "python", "x.py"], "-H names host 'node2'"),
    (["mpirun", "x"], "usage: python -m clipbert_legacy.compat.loopback {torchrun|horovodrun}"),
])
def test_jobs_beyond_this_machine_are_refused(argv, why):
    if argv[0] == "horovodrun" and not mp_utils.horovodrun_available():
        pytest.skip("horovodrun not installed")
    p = mp_utils.run_python(["-m", "clipbert_legacy.compat.loopback", *argv], timeout=120)
    assert p.returncode == 2 and why in p.stderr, p.stderr[-2000:]
    assert len(p.stderr.strip().splitlines()) == 1


def test_is_loopback():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"]))
    assert not any(map(is_loopback, ["0.0.0.0", "192.0.2.7", "::", "no-such-host.invalid"]))
