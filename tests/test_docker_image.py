"""The Docker image built and run on this machine (opt-in, minutes: ``pytest -m docker``).

docker/build_local.sh, run from a clean copy of the checkout (git's tracked and unignored files), builds
the CPU image (local Debian base, Horovod with Gloo) and runs ``QUICKSTART_FAST=1`` in it through
launch_container.sh, with the results on a host folder; then the container-sensitive tests pass inside the
image, the image holds none of the build extras, and a run under Docker's default 64 MB /dev/shm ends at
once with the one-line error. Skipped, saying why, where no daemon answers and none can be started (root
and dockerd), or where the base image is missing and cannot be made (root and debootstrap).
"""
import os
import subprocess
import time

import pytest

from tests.docker_utils import IN_IMAGE_TESTS, host_ca_mount, quickstart_scores, start_daemon, stop_daemon
from tests.docker_utils import clean_copy as _clean_copy
from tests.docker_utils import docker as _docker

# the first test includes the image build and the quickstart (pyproject's --timeout=600 is per test)
pytestmark = [pytest.mark.docker, pytest.mark.timeout(3600)]
IMAGE = "clipbert-legacy:test"


@pytest.fixture(scope="module")
def daemon():
    """A Docker daemon: the running one, or one started here (and stopped after the module)."""
    started = start_daemon()
    yield
    stop_daemon(started)


@pytest.fixture(scope="module")
def clean_copy(tmp_path_factory):
    """The checkout as git sees it (tracked + untracked unignored files): no .venv, data, outputs, caches."""
    return _clean_copy(tmp_path_factory.mktemp("docker_ctx") / "clipbert")


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
    assert all(f.stat().st_uid == os.getuid() for f in quickstart_scores(qs))  # written as the calling user
    assert (qs / "ret_train.wall").is_file()


def test_the_container_sensitive_tests_pass_inside_the_image(demo):
    assert demo["p"].returncode == 0, "the image did not build (see the previous test)"
    p = _docker("run", "--rm", "--network", "host", "--ipc=host", "-e", "SKIP_SYSTEM_PACKAGES=1",
                *host_ca_mount(), IMAGE, "./run_scripts/test.sh", "-p", "no:cacheprovider", "-rs",
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
