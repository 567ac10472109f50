"""What the opt-in image tests share (tests/test_docker_image.py: the CPU image, test_docker_cuda_image.py:
the CUDA image): a Docker daemon (the running one, or one started by docker/start_dockerd.sh and stopped
after), a clean copy of the checkout (what git tracks or would), and the docker CLI with a timeout."""
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BASE = "local/debian:bookworm"
# the quick, container-sensitive subset of the suite that runs inside an image
IN_IMAGE_TESTS = ["tests/test_env.py", "tests/test_docker.py", "tests/test_run_scripts.py",
                  "tests/test_hvd.py"]


def docker(*args, timeout=120, **kw):
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)


def _daemon_answers():
    return shutil.which("docker") is not None and docker("info").returncode == 0


def start_daemon() -> int | None:
    """The pid of a daemon started here (None: one already answered); skips, saying why, where none can
    answer, or where the base image is missing and cannot be made (root and debootstrap)."""
    started = None
    if not _daemon_answers():
        if shutil.which("docker") is None or shutil.which("dockerd") is None or os.geteuid() != 0:
            pytest.skip("no Docker daemon answers and none can be started here (needs root, docker and "
                        "dockerd: apt-get install docker.io)")
        p = subprocess.run([str(REPO / "docker/start_dockerd.sh")], capture_output=True, text=True,
                           timeout=120)
        if p.returncode != 0:
            pytest.skip(f"could not start dockerd: {p.stderr.strip()}")
        started = int(p.stdout.strip())
    can_make_base = os.geteuid() == 0 and shutil.which("debootstrap")
    if docker("image", "inspect", BASE).returncode != 0 and not can_make_base:
        stop_daemon(started)
        pytest.skip(f"no base image {BASE} and it cannot be made here (needs root and debootstrap)")
    return started


def stop_daemon(pid: int | None):
    if pid:
        os.kill(pid, signal.SIGTERM)
        for _ in range(60):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(1)


def clean_copy(root: Path) -> Path:
    """The checkout as git sees it (tracked + untracked unignored files) under ``root``: no .venv, data,
    outputs or caches."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    return root


def host_ca_mount():
    """docker run arguments that give pip in the container the CA bundle pip uses here (a proxy's CA)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("check_stack", REPO / "docker/check_stack.py")
    stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack)
    cert = stack._pip_setting("cert")
    if not cert or not os.path.isfile(cert):
        return []
    return ["-v", f"{os.path.realpath(cert)}:/etc/host-pip-ca.crt:ro", "-e", "PIP_CERT=/etc/host-pip-ca.crt"]


def quickstart_scores(qs: Path) -> list[Path]:
    """The score files of the quickstart's four runs under ``qs`` (asserts each run wrote one)."""
    found = []
    for d in (qs / "demo_ret/results_retrieval_test", qs / "demo_ret/mc_results_mc_test",
              qs / "demo_qa_frameqa/results_frameqa_test", qs / "demo_qa_action/results_action_test"):
        here = list(d.glob("*/*scores.json"))
        assert here, f"no scores under {d}"
        found += here
    return found
