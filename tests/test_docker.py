"""What can be verified of the Docker image without a Docker daemon: the stack resolves for the base image's
Python with pip and torch's CUDA major is the image's (docker/check_stack.py), the layers keep no pip cache,
the build extras (host pip setup) reach only the env stage, the context leaves out the host's env and data,
the scripts find the env through VENV_DIR, setup_env.sh stops on a pip failure, and launch_container.sh
works without a TTY, without GPUs and under low hard ulimits. The image itself: tests/test_docker_image.py
(opt-in, pytest -m docker)."""
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
# the build args of docker/build_local.sh: the CPU image on the local Debian base
CPU_ARGS = {"CUDA_IMAGE": "local/debian:bookworm", "PYTHON_VERSION": "3.11", "HOROVOD_BUILD": "cpu",
            "TORCH_SPEC": "torch==2.13.0+cpu"}


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
    with pytest.raises(ValueError, match="not an nvidia/cuda.*nor a known Ubuntu"):
        stack.image_facts("FROM alpine:3.20\n")
    assert stack.image_facts("FROM ubuntu:24.04\n")["python"] == "3.12"


def test_image_facts_of_the_cpu_build_on_the_local_debian_base():
    f = stack.image_facts(DOCKERFILE.read_text(), CPU_ARGS)
    assert (f["base"], f["cuda_major"]) == ("local/debian:bookworm", None)
    assert (f["python"], f["python_arg"]) == ("3.11", "3.11")
    assert "manylinux_2_36_x86_64" in f["platforms"] and "manylinux_2_37_x86_64" not in f["platforms"]
    assert (f["torch_spec"], f["horovod_build"]) == ("torch==2.13.0+cpu", "cpu")
    defaults = stack.image_facts(DOCKERFILE.read_text())
    assert (defaults["python_arg"], defaults["horovod_build"]) == ("3.12", "cuda")


def _fake_resolve(torch_deps):
    def resolve(reqs, python, platforms, no_deps=False, host_wheels=True):
        return {"install": [{"metadata": {"name": "torch", "requires_dist": torch_deps}}]}
    return resolve


# the build args of docker/build_local.sh --cuda: the GPU image on the stand-in CUDA base
CUDA_ARGS = {"CUDA_IMAGE": "local/cuda:13.0.3-devel-debian12", "PYTHON_VERSION": "3.11",
             "HOROVOD_BUILD": "cuda", "TORCH_SPEC": "torch==2.13.0"}


def test_the_standin_cuda_base_is_the_toolkit_torch_requires():
    f = stack.image_facts(DOCKERFILE.read_text(), CUDA_ARGS)
    assert (f["cuda_major"], f["cuda_version"], f["python"], f["standin"]) == (13, "13.0.3", "3.11", True)
    assert "manylinux_2_36_x86_64" in f["platforms"] and "manylinux_2_37_x86_64" not in f["platforms"]
    try:
        assert stack.check(DOCKERFILE.read_text(), build_args=CUDA_ARGS) == []
        want = stack.expected_versions(DOCKERFILE.read_text(), CUDA_ARGS)
    except stack.NetworkUnavailable as e:
        pytest.skip(f"cannot resolve wheels here and nothing cached: {e}")
    # PyPI's torch 2.13.0 for Python 3.11, not this host's local torch 2.13.0+cpu wheel (a CPU build)
    assert want == {"torch": "2.13.0", "cuda": "13.0", "nccl": "2.29.7", "nvcc": "13.0.88"}, want
    for script in ("docker/make_cuda_base.sh", "docker/build_local.sh"):  # the stand-in they make and use
        assert CUDA_ARGS["CUDA_IMAGE"] in (REPO / script).read_text(), script


def test_a_standin_toolkit_pin_off_torchs_cuda_toolkit_is_named(monkeypatch, tmp_path):
    pins = (REPO / "docker/cuda_base/toolkit.txt").read_text().replace("nvidia-cuda-nvcc==13.0.88",
                                                                      "nvidia-cuda-nvcc==13.0.48")
    (tmp_path / "toolkit.txt").write_text(pins)
    monkeypatch.setattr(stack, "TOOLKIT", tmp_path / "toolkit.txt")
    args = {**CUDA_ARGS, "CUDA_IMAGE": "local/cuda:13.0.1-devel-debian12"}
    try:
        problems = stack.check(DOCKERFILE.read_text(), build_args=args)
    except stack.NetworkUnavailable as e:
        pytest.skip(f"cannot resolve wheels here and nothing cached: {e}")
    assert problems == [
        "local/cuda:13.0.1-devel-debian12 is CUDA 13.0.1 but torch==2.13.0 requires cuda-toolkit==13.0.3: "
        "CUDA_BASE_IMAGE=local/cuda:13.0.3-devel-debian12 (make_cuda_base.sh)",
        "docker/cuda_base/toolkit.txt pins nvidia-cuda-nvcc==13.0.48 but cuda-toolkit==13.0.3 (torch's) has "
        "13.0.88"], problems


def test_exact_pins_read_cuda_toolkits_extras_and_wildcards():
    assert stack.exact_pins(['cuda-toolkit[cublas,cudart]==13.0.3; platform_system == "Linux"',
                             "nvidia-cuda-nvcc==13.0.88.*; extra == 'nvcc'",
                             "nvidia-cuda-nvcc==9.9; extra == 'x'", "nvidia-nvjitlink<14,>=13.0.88",
                             "filelock"]) == {
        "cuda-toolkit": "13.0.3", "nvidia-cuda-nvcc": "13.0.88"}


@pytest.mark.parametrize("args, deps, expected", [
    (CPU_ARGS, ["filelock"], []),
    (CPU_ARGS, ["nvidia-nccl-cu13==2.29.7"], ["HOROVOD_BUILD=cpu but torch==2.13.0+cpu is a CUDA 13 build"]),
    ({**CPU_ARGS, "PYTHON_VERSION": "3.12"}, ["filelock"],
     ["PYTHON_VERSION=3.12 but local/debian:bookworm has Python 3.11: --build-arg PYTHON_VERSION=3.11"]),
    ({**CPU_ARGS, "HOROVOD_BUILD": "cuda"}, ["nvidia-nccl-cu13==2.29.7"],
     ["HOROVOD_BUILD=cuda needs an nvidia/cuda devel base image (nvcc), not local/debian:bookworm"]),
    ({}, ["nvidia-nccl-cu13==2.29.7"], []),
])
def test_stack_problems_of_build_arg_combinations(monkeypatch, args, deps, expected):
    monkeypatch.setattr(stack, "resolve", _fake_resolve(deps))
    problems = stack.check(DOCKERFILE.read_text(), build_args=args)
    assert len(problems) == len(expected), problems
    assert all(p.startswith(e) for p, e in zip(problems, expected)), problems


def test_dockerfile_structure():
    ins = stack.instructions(DOCKERFILE.read_text())
    assert all(w in KNOWN for w, _ in ins), [w for w, _ in ins if w not in KNOWN]
    assert next(w for w, _ in ins if w != "ARG") == "FROM"
    runs = " ".join(r for w, r in ins if w == "RUN")
    assert "run_scripts/setup_env.sh" in runs  # same install path as a laptop
    assert "run_scripts/build_horovod_cuda.sh" in runs and "HOROVOD_BUILD_CUDA_CC_LIST" in runs
    assert 'APEX_TAG="${APEX_TAG}"' in runs
    assert "./run_scripts/install_horovod.sh" in runs  # HOROVOD_BUILD=cpu: Gloo, no nvcc
    assert stack.arg_defaults(DOCKERFILE.read_text())["HOROVOD_BUILD"] == "cuda"  # today's GPU stack
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


def _stages(text):
    """{stage name: its instructions}; the last, unnamed stage is "final"."""
    out, name = {}, None
    for w, rest in stack.instructions(text):
        if w == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) == 3 and parts[1].upper() == "AS" else "final"
            out[name] = []
        elif name:
            out[name].append((w, rest))
    return out


def test_build_extras_reach_only_the_env_stage():
    stages = _stages(DOCKERFILE.read_text())
    assert list(stages) == ["base", "env", "source", "final"]
    for name, ins in stages.items():
        text = " ".join(r for _, r in ins)
        if name == "env":
            assert "COPY docker/build_extras /tmp/build-extras" in " ".join(f"{w} {r}" for w, r in ins)
            assert all("with_build_extras.sh /tmp/build-extras" in r for w, r in ins
                       if w == "RUN" and "./run_scripts/" in r)
        elif name == "source":
            assert ins == [("COPY", ". /clipbert"), ("RUN", "find /clipbert/docker/build_extras -mindepth 1 "
                                                    "-maxdepth 1 ! -name README.md -exec rm -rf {} +")]
        else:
            assert "build_extras" not in text and "build-extras" not in text, name
    final = " ".join(f"{w} {r}" for w, r in stages["final"])
    assert "COPY --from=env /opt/venv /opt/venv" in final
    assert "COPY --from=source /clipbert /clipbert" in final
    assert "COPY . " not in final  # the context (with the extras) is copied only by the source stage


def test_stage_build_extras_passes_what_a_container_can_use(tmp_path):
    spec = importlib.util.spec_from_file_location("stage_build_extras", REPO / "docker/stage_build_extras.py")
    sbe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sbe)
    wheels, ca, out = tmp_path / "wheels", tmp_path / "ca.pem", tmp_path / "extras"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"w")
    ca.write_text("CERT")
    out.mkdir()
    (out / "README.md").write_text("kept")
    (out / "stale.whl").write_text("old")
    report = sbe.stage({"index-url": "https://pypi.org/simple", "cert": str(ca), "find-links": str(wheels),
                        "extra-index-url": "file:///opt/pypi/simple https://mirror.example/simple"}, [], out)
    conf = (out / "pip.conf").read_text()
    assert "index-url = https://pypi.org/simple" in conf
    assert "extra-index-url = https://mirror.example/simple" in conf
    assert "file://" not in conf and f"cert = {sbe.IN_BUILD}/ca.crt" in conf
    assert f"find-links = {sbe.IN_BUILD}/wheels" in conf and (out / "ca.crt").read_text() == "CERT"
    assert (out / "wheels" / "torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl").read_bytes() == b"w"
    assert not (out / "stale.whl").exists() and (out / "README.md").read_text() == "kept"
    assert any("file:///opt/pypi/simple: left out" in r for r in report)
    p = subprocess.run([str(REPO / "docker/with_build_extras.sh"), str(out), "env"], capture_output=True,
                       text=True, env={"PATH": os.environ["PATH"]})
    env = dict(ln.split("=", 1) for ln in p.stdout.splitlines())
    assert env["PIP_CONFIG_FILE"] == f"{out}/pip.conf" and env["PIP_CERT"] == f"{out}/ca.crt"
    assert env["PIP_FIND_LINKS"] == f"{out}/wheels" and env["GIT_SSL_CAINFO"] == f"{out}/ca.crt"


def test_stage_build_extras_for_the_cuda_image_passes_only_the_wheel_cache(tmp_path):
    spec = importlib.util.spec_from_file_location("stage_build_extras", REPO / "docker/stage_build_extras.py")
    sbe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sbe)
    host, cache, out = tmp_path / "host_wheels", tmp_path / "cache", tmp_path / "extras"
    cuda_torch = "torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    for d, names in ((host, ["torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl"]),
                     (cache, [cuda_torch, "horovod-0.28.1.tar.gz"])):
        d.mkdir()
        for name in names:
            (d / name).write_bytes(b"w")
    report = sbe.stage({"index-url": "https://pypi.org/simple", "find-links": str(host)}, [str(cache)], out,
                       host_wheels=False, index=False)
    conf = (out / "pip.conf").read_text()
    assert "no-index = true" in conf and "index-url" not in conf, conf
    assert sorted(p.name for p in (out / "wheels").iterdir()) == [  # Horovod's sdist (no index to fetch it)
        "horovod-0.28.1.tar.gz", cuda_torch]  # PyPI's CUDA torch, not the host's CPU one
    assert f"find-links {host}: left out (--no-host-wheels)" in report
    build = (REPO / "docker/build_local.sh").read_text()
    assert "stage_build_extras.py --no-host-wheels --no-index --wheels" in build
    # the Horovod dependencies build_local.sh caches are the ones install_horovod.sh installs
    hvd = (REPO / "run_scripts/install_horovod.sh").read_text()
    deps = re.search(r"HOROVOD_DEPS=\(([^)]*)\)", build).group(1).split()
    assert deps == re.findall(r'\("([\w-]+)", "[\w]+"\)', hvd.split("runtime_deps() {")[1].split("PY\n")[0])


def test_dockerignore_leaves_out_the_host_env_data_and_history():
    lines = {ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()}
    for entry in (".git", ".venv", "data", "output", "**/__pycache__", "*.egg-info"):
        assert entry in lines, entry
    # in the image: .ci (tests/test_env.py reads it) and the build extras (the env stage reads them)
    assert not {".ci", "docker", "docker/build_extras"} & lines
    for w, rest in stack.instructions(DOCKERFILE.read_text()):
        if w == "COPY":  # what the Dockerfile copies by name must not be ignored
            assert not {s.split("/")[0] for s in rest.split()[:-1]} & lines


def test_dockerfile_copy_sources_exist():
    for w, rest in stack.instructions(DOCKERFILE.read_text()):
        if w == "COPY" and not rest.startswith("--from="):  # --from: a path of another stage
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
    # not frozen, also inside the image (whose CLIPBERT_ENV_FROZEN=1 would make setup_env.sh only verify)
    env = {k: v for k, v in os.environ.items() if k != "CLIPBERT_ENV_FROZEN"}
    p = subprocess.run([str(REPO / "run_scripts/setup_env.sh")], env=dict(env, VENV_DIR=str(venv)),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "boom from pip" in p.stdout + p.stderr
    assert "pip could not install requirements.txt" in p.stderr


def test_setup_env_constrains_torch_to_the_installed_distribution_version(tmp_path):
    # PyPI's CUDA torch: the distribution is 2.13.0, torch.__version__ says 2.13.0+cu130; a constraint
    # torch==2.13.0+cu130 matched nothing and the CUDA image's requirements did not resolve
    seen = tmp_path / "constraints-seen"
    venv = _fake_venv(tmp_path, f'case "$*" in *"-m pip"*) prev=; for a in "$@"; do '
                                f'[ "$prev" = -c ] && cp "$a" {seen}; prev=$a; done; exit 0;; esac\n'
                                'case "$2" in *\'m.version("torch")\'*) echo 2.13.0;; '
                                '*"torch.__version__"*) echo 2.13.0+cu130;; esac\nexit 0\n')
    env = {k: v for k, v in os.environ.items() if k != "CLIPBERT_ENV_FROZEN"}
    p = subprocess.run([str(REPO / "run_scripts/setup_env.sh")], capture_output=True, text=True, timeout=60,
                       env=dict(env, VENV_DIR=str(venv), SKIP_HOROVOD="1", SKIP_PROJECT_INSTALL="1"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert seen.read_text().strip() == "torch==2.13.0"


def test_setup_env_in_a_frozen_image_verifies_and_never_installs(tmp_path):
    venv = _fake_venv(tmp_path, f'case "$*" in *"-m pip"*) touch {tmp_path}/pip-ran;; esac\nexit 0\n')
    p = subprocess.run([str(REPO / "run_scripts/setup_env.sh")], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, VENV_DIR=str(venv), CLIPBERT_ENV_FROZEN="1"))
    assert p.returncode == 0 and "frozen environment verified" in p.stdout, p.stdout + p.stderr
    assert not (tmp_path / "pip-ran").exists()


def _launch(tmp_path, limits="", path_prefix=None, rc=0, **env):
    """launch_container.sh with a fake docker that prints its arguments (``docker info``: the runtimes in
    FAKE_RUNTIMES, default runc); ``limits``: ulimit commands first; ``rc``: the exit status expected."""
    dirs = [tmp_path / d for d in ("txt", "img", "out", "pre")]
    for d in dirs[:2] + dirs[3:]:
        d.mkdir(exist_ok=True)
    fake = tmp_path / "docker"
    fake.write_text('#!/bin/sh\n[ "$1" = info ] && { echo "${FAKE_RUNTIMES:-runc} "; exit 0; }\n'
                    'for a in "$@"; do echo "$a"; done\n')
    fake.chmod(0o755)
    unset = ("GPUS", "CUDA_VISIBLE_DEVICES", "DOCKER_RUN_ARGS")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    if path_prefix:
        base["PATH"] = f"{path_prefix}:{base['PATH']}"
    cmd = " ".join(f"'{a}'" for a in [REPO / "docker/launch_container.sh", *dirs, "echo", "hi"])
    p = subprocess.run(["bash", "-c", f"{limits} exec {cmd}"], env=dict(base, DOCKER=str(fake), **env),
                       capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if p.returncode == 99:
        pytest.skip(f"cannot set the hard limits here ({limits})")
    assert p.returncode == rc, p.stderr
    return p.stdout.splitlines(), p.stderr


def test_launch_container_without_a_tty(tmp_path):
    args, _ = _launch(tmp_path)
    assert "-it" not in args and "-t" not in args and "--ipc=host" in args
    assert args[args.index("--user") + 1] == f"{os.getuid()}:{os.getgid()}"
    assert "--network" not in args and args[-2:] == ["echo", "hi"]


def test_launch_container_host_network_and_root(tmp_path):
    args, _ = _launch(tmp_path, HOST_NETWORK="1", CONTAINER_USER="root")
    assert args[args.index("--network") + 1] == "host" and "--user" not in args


def test_launch_container_gpus_only_where_the_nvidia_toolkit_is(tmp_path):
    no_toolkit = tmp_path / "bin0"
    no_toolkit.mkdir()
    for d in os.environ["PATH"].split(":"):
        if Path(d, "nvidia-container-cli").exists() or Path(d, "nvidia-ctk").exists():
            pytest.skip(f"this host has the NVIDIA container toolkit ({d})")
    assert "--gpus" not in _launch(tmp_path)[0]
    toolkit = tmp_path / "bin"
    toolkit.mkdir()
    (toolkit / "nvidia-container-cli").write_text("#!/bin/sh\n")
    (toolkit / "nvidia-container-cli").chmod(0o755)
    args, _ = _launch(tmp_path, path_prefix=toolkit)
    assert args[args.index("--gpus") + 1] == "all"
    args, _ = _launch(tmp_path, path_prefix=toolkit, CUDA_VISIBLE_DEVICES="1,3")
    assert args[args.index("--gpus") + 1] == '"device=1,3"'
    assert "--gpus" not in _launch(tmp_path, path_prefix=toolkit, CUDA_VISIBLE_DEVICES="")[0]  # none, not all
    assert "--gpus" not in _launch(tmp_path, path_prefix=toolkit, GPUS="none")[0]
    args, _ = _launch(tmp_path, path_prefix=toolkit, GPUS="0")
    assert args[args.index("--gpus") + 1] == '"device=0"'


@pytest.mark.parametrize("gpus", ["all", "0,1"])
def test_launch_container_gpus_without_the_nvidia_runtime_is_one_line(tmp_path, gpus):
    for d in os.environ["PATH"].split(":"):
        if Path(d, "nvidia-container-cli").exists() or Path(d, "nvidia-ctk").exists():
            pytest.skip(f"this host has the NVIDIA container toolkit ({d})")
    args, err = _launch(tmp_path, rc=2, GPUS=gpus)
    assert args == []  # docker run never started (it would fail with rc 125 and a daemon message)
    assert err.count("\n") == 1 and err.startswith(f"[launch_container] ERROR: GPUS={gpus} but this host "
                                                    "has no NVIDIA container runtime"), err
    assert "GPUS=none" in err
    args, _ = _launch(tmp_path, GPUS=gpus, FAKE_RUNTIMES="nvidia runc")  # a daemon with the nvidia runtime
    assert "--gpus" in args


def test_launch_container_ulimits_only_where_the_host_allows_them(tmp_path):
    args, err = _launch(tmp_path, limits="ulimit -l 1024 || exit 99; ulimit -s 4096 || exit 99;")
    assert not [a for a in args if a.startswith(("memlock=", "stack="))]
    assert "hard memlock limit 1024 kB" in err and "hard stack limit 4096 kB" in err
    raise_limits = "ulimit -H -l unlimited || exit 99; ulimit -H -s unlimited || exit 99;"  # root can
    args, err = _launch(tmp_path, limits=raise_limits)
    assert "memlock=-1" in args and "stack=67108864" in args and err == ""


def test_launch_container_passes_extra_docker_run_arguments(tmp_path):
    args, _ = _launch(tmp_path, DOCKER_RUN_ARGS="--shm-size 2g -e QUICKSTART_FAST=1")
    image = args.index("clipbert-legacy:latest")
    assert args.index("--shm-size") < image and args[args.index("--shm-size") + 1] == "2g"
    assert args[args.index("-e") + 1] == "QUICKSTART_FAST=1" and args.index("-e") < image


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
