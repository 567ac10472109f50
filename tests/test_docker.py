"""What can be verified of the Docker image without a Docker daemon: the stack resolves for the base image's
Python with pip and torch's CUDA major is the image's (docker/check_stack.py), the layers keep no pip cache,
the context leaves out the host's env and data, the scripts find the env through VENV_DIR, setup_env.sh
stops on a pip failure, and launch_container.sh works without a TTY."""
import importlib.util
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker/Dockerfile"
KNOWN = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "CMD", "ENTRYPOINT", "LABEL", "EXPOSE",
         "USER", "VOLUME", "SHELL", "HEALTHCHECK", "ADD", "STOPSIGNAL", "ONBUILD"}
_spec = importlib.util.spec_from_file_location("check_stack", REPO / "docker/check_stack.py")
stack = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stack)
# the Dockerfile before issue 16: Python 3.10 (no numpy 2.4.6 wheel) and CUDA 12 under torch 2.13.0's CUDA 13
OLD_DOCKERFILE = """ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04
FROM ${CUDA_IMAGE}
ARG TORCH_SPEC="torch==2.13.0"
"""


def _checked(text):
    try:
        return stack.check(text)
    except stack.NetworkUnavailable as e:
        pytest.skip(f"cannot resolve wheels here and nothing cached: {e}")


def test_image_stack_resolves_and_torch_cuda_matches_the_base_image():
    facts = stack.image_facts(DOCKERFILE.read_text())
    assert facts["cuda_major"] == 13 and facts["python"] == "3.12", facts
    assert _checked(DOCKERFILE.read_text()) == []


def test_the_old_base_image_is_rejected_for_both_reasons():
    problems = _checked(OLD_DOCKERFILE)
    assert len(problems) == 2, problems
    assert "built for CUDA 13" in problems[0] and "has CUDA 12" in problems[0]
    assert "Python 3.10" in problems[1] and "numpy==2.4.6" in problems[1]


def test_torch_cuda_major_comes_from_its_requirements():
    def report(*deps):
        return {"install": [{"metadata": {"name": "torch", "requires_dist": list(deps)}}]}
    assert stack.torch_cuda_major(report('cuda-toolkit[cublas]==13.0.3; platform_system == "Linux"',
                                         "nvidia-nccl-cu13==2.29.7")) == 13
    assert stack.torch_cuda_major(report("nvidia-nccl-cu12==2.27.3", "filelock")) == 12
    assert stack.torch_cuda_major(report("filelock", "sympy>=1.13.3")) is None  # a CPU build
    with pytest.raises(RuntimeError, match="several CUDA majors"):
        stack.torch_cuda_major(report("nvidia-nccl-cu12==2.27.3", "nvidia-cudnn-cu13==9.20.0.48"))


def test_image_facts_resolve_args_and_platforms():
    f = stack.image_facts(OLD_DOCKERFILE)
    assert f["base"] == "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04" and f["python"] == "3.10"
    assert "manylinux_2_35_x86_64" in f["platforms"] and "manylinux_2_36_x86_64" not in f["platforms"]
    assert "manylinux2014_x86_64" in f["platforms"] and f["torch_spec"] == "torch==2.13.0"
    with pytest.raises(ValueError, match="not an nvidia/cuda"):
        stack.image_facts("FROM ubuntu:24.04\n")


def test_dockerfile_structure():
    ins = stack.instructions(DOCKERFILE.read_text())
    assert all(w in KNOWN for w, _ in ins), [w for w, _ in ins if w not in KNOWN]
    assert next(w for w, _ in ins if w != "ARG") == "FROM"
    runs = " ".join(r for w, r in ins if w == "RUN")
    assert "run_scripts/setup_env.sh" in runs  # same install path as a laptop
    assert "run_scripts/build_horovod_cuda.sh" in runs and "HOROVOD_BUILD_CUDA_CC_LIST" in runs
    assert 'APEX_TAG="${APEX_TAG}"' in runs
    build = (REPO / "run_scripts/build_horovod_cuda.sh").read_text()
    assert "--cuda_ext" in build and "HOROVOD_NCCL_HOME" in build
    cc = stack.arg_defaults(DOCKERFILE.read_text())["CUDA_CC_LIST"].split(",")
    assert "70" not in cc and "80" in cc  # CUDA 13 has no Volta


def test_no_pip_cache_in_layers_and_a_home_for_any_user():
    ins = stack.instructions(DOCKERFILE.read_text())
    env = " ".join(r for w, r in ins if w == "ENV")
    first_pip = next(i for i, (w, r) in enumerate(ins) if w == "RUN" and ("pip" in r or "setup_env" in r))
    set_at = next(i for i, (w, r) in enumerate(ins) if w == "ENV" and "PIP_NO_CACHE_DIR=1" in r)
    assert set_at < first_pip
    assert "HOME=/home/clipbert" in env and "CLIPBERT_ENV_FROZEN=1" in env and "VENV_DIR=/opt/venv" in env
    assert any("chmod 1777 /home/clipbert" in r for w, r in ins if w == "RUN")


def test_dockerignore_leaves_out_the_host_env_data_and_history():
    lines = {ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()}
    for entry in (".git", ".venv", "data", "output", "**/__pycache__", "*.egg-info"):
        assert entry in lines, entry
    for w, rest in stack.instructions(DOCKERFILE.read_text()):
        if w == "COPY":  # what the Dockerfile copies by name must not be ignored
            assert not {s.split("/")[0] for s in rest.split()[:-1]} & lines


def test_dockerfile_copy_sources_exist():
    for w, rest in stack.instructions(DOCKERFILE.read_text()):
        if w == "COPY":
            *srcs, _dst = rest.split()
            for s in srcs:
                assert s == "." or (REPO / s).exists(), f"COPY source {s} missing"


def test_scripts_find_the_env_through_venv_dir():
    for rel in ("run_scripts/_launch.sh", "run_scripts/quickstart.sh", "run_scripts/test.sh",
                "run_scripts/gpu_check.sh", "run_scripts/setup_env.sh"):
        text = (REPO / rel).read_text()
        assert "VENV_DIR" in text and "$REPO/.venv/bin/" not in text, rel
    p = subprocess.run(["bash", "-c", f'source {REPO}/run_scripts/_launch.sh; echo "$PY"'],
                       env=dict(os.environ, VENV_DIR="/opt/venv"), capture_output=True, text=True)
    assert p.stdout.strip() == "/opt/venv/bin/python"


def _fake_venv(tmp_path, body):
    py = tmp_path / "venv/bin/python"
    py.parent.mkdir(parents=True)
    py.write_text("#!/bin/sh\n" + body)
    py.chmod(py.stat().st_mode | stat.S_IEXEC)
    return tmp_path / "venv"


def test_setup_env_stops_on_a_pip_failure(tmp_path):
    # torch and every package import, so only pip's own exit status shows that requirements failed
    venv = _fake_venv(tmp_path, 'case "$*" in *"-m pip"*) echo "ERROR: boom from pip" >&2; exit 1;; esac\n'
                                'case "$2" in *"print(torch.__version__)"*) echo 2.13.0;; esac\nexit 0\n')
    p = subprocess.run([str(REPO / "run_scripts/setup_env.sh")], env=dict(os.environ, VENV_DIR=str(venv)),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "boom from pip" in p.stdout + p.stderr
    assert "pip could not install requirements.txt" in p.stderr


def test_setup_env_in_a_frozen_image_verifies_and_never_installs(tmp_path):
    venv = _fake_venv(tmp_path, f'case "$*" in *"-m pip"*) touch {tmp_path}/pip-ran;; esac\nexit 0\n')
    p = subprocess.run([str(REPO / "run_scripts/setup_env.sh")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, VENV_DIR=str(venv), CLIPBERT_ENV_FROZEN="1"))
    assert p.returncode == 0 and "frozen environment verified" in p.stdout, p.stdout + p.stderr
    assert not (tmp_path / "pip-ran").exists()


def _launch(tmp_path, **env):
    dirs = [tmp_path / d for d in ("txt", "img", "out", "pre")]
    for d in dirs[:2] + dirs[3:]:
        d.mkdir()
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\nfor a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    p = subprocess.run(["bash", str(REPO / "docker/launch_container.sh"), *map(str, dirs), "echo", "hi"],
                       env=dict(os.environ, DOCKER=str(fake), **env), capture_output=True, text=True,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


def test_launch_container_without_a_tty(tmp_path):
    args = _launch(tmp_path)
    assert "-it" not in args and "-t" not in args
    assert args[args.index("--ulimit") + 1] == "memlock=-1" and "stack=67108864" in args
    assert args[args.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert "--network" not in args and args[-2:] == ["echo", "hi"]


def test_launch_container_host_network_and_root(tmp_path):
    args = _launch(tmp_path, HOST_NETWORK="1", CONTAINER_USER="root")
    assert args[args.index("--network") + 1] == "host" and "--user" not in args


def test_launch_container_mounts_and_usage():
    sh = (REPO / "docker/launch_container.sh").read_text()
    for dst in ("/clipbert", "/txt", "/img", "/storage", "/pretrain"):
        assert f"dst={dst}," in sh
    p = subprocess.run(["bash", str(REPO / "docker/launch_container.sh")], capture_output=True, text=True)
    assert p.returncode == 2 and "usage:" in p.stderr


def test_scripts_referenced_exist_and_are_executable():
    text = DOCKERFILE.read_text() + (REPO / "docker/launch_container.sh").read_text()
    for rel in set(re.findall(r"(?:\./)?((?:run_scripts|docker)/[\w./-]+\.sh)", text)):
        p = REPO / rel
        assert p.exists(), rel
        assert p.stat().st_mode & 0o111, f"{rel} is not executable"
