"""Launch real multi-process jobs (`horovodrun -np N --gloo`, `torchrun`) from tests.

Every launch has a hard timeout so that a hang fails the test instead of stalling CI.
"""
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def horovodrun_available():
    try:
        import horovod.torch  # noqa: F401
    except Exception:
        return False
    return shutil.which("horovodrun", path=str(BIN)) is not None


# Both launchers through clipbert_legacy.compat.loopback: the job's servers listen on 127.0.0.1 only.
def run_horovod(args, np=2, timeout=180, env=None, cwd=None):
    """Run `horovodrun -np N --gloo python <args...>`; returns CompletedProcess (text)."""
    cmd = [sys.executable, "-m", "clipbert_legacy.compat.loopback", "horovodrun", "-np", str(np),
           "-H", f"localhost:{np}",
           "--gloo", "--gloo-timeout-seconds", "60", sys.executable] + [str(a) for a in args]
    return _run(cmd, timeout, env, cwd)


def run_torchrun(args, np=2, timeout=180, env=None, cwd=None):
    """Run `torchrun --nproc_per_node N <args...>` (static rendezvous on a free port)."""
    cmd = [sys.executable, "-m", "clipbert_legacy.compat.loopback", "torchrun", "--nproc_per_node", str(np),
           "--master_addr", "127.0.0.1", "--master_port", str(free_port())] + [str(a) for a in args]
    return _run(cmd, timeout, env, cwd)


def run_python(args, timeout=180, env=None, cwd=None):
    return _run([sys.executable] + [str(a) for a in args], timeout, env, cwd)


def _run(cmd, timeout, env, cwd):
    try:
        return subprocess.run(cmd, cwd=str(cwd or REPO), env=_env(env), capture_output=True,
                              text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = (e.stderr or b"").decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        raise AssertionError(f"command timed out after {timeout}s: {' '.join(cmd)}\n"
                             f"--- stdout ---\n{out[-4000:]}\n--- stderr ---\n{err[-4000:]}") from None


def check(proc):
    """Assert success, showing the tail of both streams on failure."""
    assert proc.returncode == 0, (f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout[-6000:]}"
                                  f"\n--- stderr ---\n{proc.stderr[-6000:]}")
    return proc
