"""No Docker engine runs here: lint the Dockerfile's structure and the paths it references."""
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKERFILE = REPO / "docker/Dockerfile"
KNOWN = {"FROM", "ARG", "ENV", "RUN", "COPY", "WORKDIR", "CMD", "ENTRYPOINT", "LABEL", "EXPOSE",
         "USER", "VOLUME", "SHELL", "HEALTHCHECK", "ADD", "STOPSIGNAL", "ONBUILD"}


def _instructions():
    text = DOCKERFILE.read_text()
    joined = re.sub(r"\\\n", " ", text)  # line continuations
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word, rest.strip()))
    return out


def test_dockerfile_structure():
    ins = _instructions()
    assert all(w in KNOWN for w, _ in ins), [w for w, _ in ins if w not in KNOWN]
    first_non_arg = next(w for w, _ in ins if w != "ARG")
    assert first_non_arg == "FROM"
    base = next(r for w, r in ins if w == "FROM")
    args = {r.split("=")[0]: r.split("=", 1)[1] for w, r in ins if w == "ARG" and "=" in r}
    base = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)
    assert re.match(r"nvidia/cuda:12\.\d+(\.\d+)?-cudnn-devel-ubuntu\d+\.\d+$", base), base
    runs = " ".join(r for w, r in ins if w == "RUN")
    assert "run_scripts/setup_env.sh" in runs  # same install path as a laptop
    assert "APEX_TAG" in runs and "--cuda_ext" in runs


def test_dockerfile_copy_sources_exist():
    for w, rest in _instructions():
        if w == "COPY":
            *srcs, _dst = rest.split()
            for s in srcs:
                assert s == "." or (REPO / s).exists(), f"COPY source {s} missing"


def test_scripts_referenced_exist_and_are_executable():
    text = DOCKERFILE.read_text() + (REPO / "docker/launch_container.sh").read_text()
    for rel in set(re.findall(r"(?:\./)?((?:run_scripts|docker)/[\w./-]+\.sh)", text)):
        p = REPO / rel
        assert p.exists(), rel
        assert p.stat().st_mode & 0o111, f"{rel} is not executable"


def test_launch_container_mounts_and_usage():
    sh = (REPO / "docker/launch_container.sh").read_text()
    for dst in ("/clipbert", "/txt", "/img", "/storage", "/pretrain"):
        assert f"dst={dst}," in sh
    p = subprocess.run(["bash", str(REPO / "docker/launch_container.sh")], capture_output=True, text=True)
    assert p.returncode == 2 and "usage:" in p.stderr
    assert subprocess.run(["bash", "-n", str(REPO / "docker/launch_container.sh")]).returncode == 0
