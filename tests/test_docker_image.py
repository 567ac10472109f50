"""The Docker image built and run on this machine (opt-in, minutes: ``pytest -m docker``).

docker/build_local.sh, run from a clean copy of the checkout (git's tracked and unignored files), builds
the CPU image (local Debian base, Horovod with Gloo) and runs ``QUICKSTART_FAST=1`` in it through
launch_container.sh, with the results on a host folder; then the container-sensitive tests pass inside the
image, the image holds none of the build extras, and a run under Docker's default 64 MB /dev/shm ends at
once with the one-line error. Skipped, saying why, where no daemon answers and none can be started (root
and dockerd), or where the base image is missing and cannot be made (root and debootstrap).
"""
import importlib.util
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

# the first test includes the image build and the quickstart (pyproject's --timeout=600 is per test)
pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]
REPO = Path(__file__).resolve().parents[1]
IMAGE = "clipbert-legacy:test"
BASE = "local/debian:bookworm"
IN_IMAGE_TESTS = ["tests/test_env.py", "tests/test_docker.py", "tests/test_run_scripts.py",
                  "tests/test_hvd.py"]


def _docker(*args, timeout=120, **kw):
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, **kw)


def _daemon_answers():
    return shutil.which("docker") is not None and _docker("info").returncode == 0


@pytest.fixture(scope="module")
def daemon():
    """A Docker daemon: the running one, or one started here (and stopped after the module)."""
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
    if _docker("image", "inspect", BASE).returncode != 0 and not can_make_base:
        pytest.skip(f"no base image {BASE} and it cannot be made here (needs root and debootstrap)")
    yield
    if started:
        os.kill(started, signal.SIGTERM)
        for _ in range(60):
            if not Path(f"/proc/{started}").exists():
                break
            time.sleep(1)


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory):
    """The checkout as git sees it (tracked + untracked unignored files): no .venv, data, outputs, caches."""
    root = tmp_path_factory.mktemp("docker_ctx") / "clipbert"
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    return root


@pytest.fixture(scope="module")
def demo(daemon, clean_copy, tmp_path_factory):
    """build_local.sh from the clean copy: image build, then QUICKSTART_FAST=1 in it."""
    out = tmp_path_factory.mktemp("docker_demo")
    t = time.time()
    p = subprocess.run([str(clean_copy / "docker/build_local.sh")], cwd=clean_copy, capture_output=True,
                       text=True, timeout=2700,
                       env=dict(os.environ, CLIPBERT_IMAGE=IMAGE, QUICKSTART_FAST="1", DEMO_OUT=str(out)))
    print(f"build_local.sh (build + QUICKSTART_FAST=1): {time.time() - t:.0f} s")
    print("\n".join(ln for ln in p.stdout.splitlines() if ln.startswith("[build_local]")))
    return {"p": p, "out": out, "repo": clean_copy}


def test_build_local_builds_the_image_and_runs_the_quickstart_in_it(demo):
    p, qs = demo["p"], demo["out"] / "quickstart"
    assert p.returncode == 0, f"{p.stdout[-6000:]}\n{p.stderr[-4000:]}"
    assert f"built {IMAGE} in" in p.stdout and "7/7 results" in p.stdout and "R@1" in p.stdout
    scores = [qs / "demo_ret/results_retrieval_test", qs / "demo_ret/mc_results_mc_test",
              qs / "demo_qa_frameqa/results_frameqa_test", qs / "demo_qa_action/results_action_test"]
    for d in scores:
        found = list(d.glob("*/*scores.json"))
        assert found, f"no scores under {d}"
        assert all(f.stat().st_uid == os.getuid() for f in found)  # written as the calling user
    assert (qs / "ret_train.wall").is_file()


def _host_ca_mount():
    """docker run arguments that give pip in the container the CA bundle pip uses here (a proxy's CA)."""
    spec = importlib.util.spec_from_file_location("check_stack", REPO / "docker/check_stack.py")
    stack = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stack)
    cert = stack._pip_setting("cert")
    if not cert or not os.path.isfile(cert):
        return []
    return ["-v", f"{os.path.realpath(cert)}:/etc/host-pip-ca.crt:ro", "-e", "PIP_CERT=/etc/host-pip-ca.crt"]


def test_the_container_sensitive_tests_pass_inside_the_image(demo):
    assert demo["p"].returncode == 0, "the image did not build (see the previous test)"
    p = _docker("run", "--rm", "--network", "host", "--ipc=host", "-e", "SKIP_SYSTEM_PACKAGES=1",
                *_host_ca_mount(), IMAGE, "./run_scripts/test.sh", "-p", "no:cacheprovider", "-rs",
                *IN_IMAGE_TESTS, timeout=1500)
    tail = p.stdout[-4000:] + p.stderr[-2000:]
    assert p.returncode == 0, tail
    assert " passed" in p.stdout and " failed" not in p.stdout, tail
    assert "cannot resolve wheels here" not in p.stdout, tail  # check_stack's tests ran, not skipped


def test_the_image_holds_no_build_extras(demo):
    assert demo["p"].returncode == 0, "the image did not build"
    p = _docker("run", "--rm", "--network", "none", IMAGE, "sh", "-c",
                "ls -A /clipbert/docker/build_extras; echo ---; find / -xdev \\( -name build-extras "
                "-o -name 'torch-*.whl' -o -name pip.conf -o -name ca.crt \\) -print; echo ---; "
                "pip config list")
    assert p.returncode == 0, p.stderr
    extras, found, pip_config = p.stdout.split("---\n")
    assert extras.split() == ["README.md"]  # as in git: the staged pip.conf, CA and wheels are not there
    assert found.strip() == "", found
    assert "cert" not in pip_config and "find-links" not in pip_config and "index-url" not in pip_config


def test_a_small_dev_shm_ends_the_run_at_once_with_one_line(demo):
    assert demo["p"].returncode == 0, "the image did not build"
    run = "/storage/quickstart/demo_qa_frameqa"  # the frame-QA run of the quickstart above
    t = time.time()
    infer = ["python", "src/tasks/run_video_qa.py", "--do_inference", "1", "--output_dir", run,
             "--inference_model_step", "-1", "--inference_txt_db", "data/demo/txt/frameqa_test.jsonl",
             "--inference_img_db", "data/demo/vis_db"]
    p = _docker("run", "--rm", "--network", "host", "--user", f"{os.getuid()}:{os.getgid()}",  # no --shm-size
                "-v", f"{demo['repo']}:/clipbert", "-v", f"{demo['out']}:/storage", "-w", "/clipbert", IMAGE,
                "horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", *infer, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "error: SharedMemoryError: /dev/shm has 64 MiB free" in out and "--shm-size" in out, out[-3000:]
    assert time.time() - t < 300
