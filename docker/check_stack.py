"""Can the Docker image build on one CUDA stack? Checked without a Docker daemon, from the Dockerfile text:

1. the base image's Python (the Ubuntu release's python3) has wheels for every pin in requirements.txt and
   for the torch pin: ``pip install --dry-run --only-binary=:all: --python-version X --platform
   manylinux_...`` resolves them all (wheel metadata only; nothing is downloaded beyond it);
2. torch's CUDA major, from its wheel metadata (``cuda-toolkit==13.0.*``, ``nvidia-*-cu13``), equals the
   base image's CUDA major (the nvcc that builds Horovod and apex).

Resolutions are cached in ~/.cache/clipbert-legacy/docker-stack/ keyed by every input (failures only when
pip found no matching wheel, never a network error), so a repeated run needs no network.
``python docker/check_stack.py [DOCKERFILE]`` prints the problems.
"""
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Ubuntu release -> (its python3, its glibc): the interpreter the image's venv is made from
UBUNTU = {"20.04": ("3.8", (2, 31)), "22.04": ("3.10", (2, 35)), "24.04": ("3.12", (2, 39))}
BASE_RE = re.compile(r"nvidia/cuda:(\d+)\.(\d+)(?:\.\d+)?-(?:cudnn\d*-)?(?:devel|runtime|base)"
                     r"-ubuntu(\d+\.\d+)$")
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "clipbert-legacy" / "docker-stack"


class NetworkUnavailable(Exception):
    """The package index cannot be reached and no cached resolution exists."""


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) pairs, line continuations joined, comments dropped."""
    out = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def arg_defaults(text: str) -> dict[str, str]:
    return {r.split("=", 1)[0]: r.split("=", 1)[1].strip('"') for w, r in instructions(text)
            if w == "ARG" and "=" in r}


def base_image(text: str) -> str:
    args = arg_defaults(text)
    base = next(r for w, r in instructions(text) if w == "FROM").split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)


def image_facts(text: str) -> dict:
    """CUDA major, Python version and manylinux platforms of the Dockerfile's base image."""
    base = base_image(text)
    m = BASE_RE.match(base)
    if not m:
        raise ValueError(f"base image {base!r} is not an nvidia/cuda:X.Y[.Z]-[cudnnN-]devel-ubuntuA.B image")
    if m.group(3) not in UBUNTU:
        raise ValueError(f"base image {base!r}: unknown Ubuntu release {m.group(3)} "
                         f"(known: {sorted(UBUNTU)})")
    python, (_, glibc_minor) = UBUNTU[m.group(3)]
    plats = [f"manylinux_2_{v}_x86_64" for v in range(glibc_minor, 16, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return {"base": base, "cuda_major": int(m.group(1)), "python": python, "platforms": plats,
            "torch_spec": arg_defaults(text).get("TORCH_SPEC", "torch==2.13.0")}


def requirement_lines(path: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def _index_reachable() -> str | None:
    """None if the package index answers, else why not."""
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple/")
    try:
        urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/pip/", method="HEAD"), timeout=15)
        return None
    except Exception as e:  # URLError, timeout, SSL: all mean "cannot check here"
        return f"{url} unreachable ({type(e).__name__}: {e})"


def resolve(reqs: list[str], python: str, platforms: list[str], no_deps: bool = False) -> dict:
    """pip's --dry-run --report for ``reqs`` on (python, platforms); raises RuntimeError with pip's error."""
    key = json.dumps([reqs, python, platforms, no_deps], sort_keys=True)
    cached = CACHE / (hashlib.sha256(key.encode()).hexdigest()[:24] + ".json")
    if cached.is_file():
        out = json.loads(cached.read_text())
        if "error" in out:
            raise RuntimeError(out["error"])
        return out
    reason = _index_reachable()
    if reason:
        raise NetworkUnavailable(reason)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
               "--only-binary=:all:", "--python-version", python, "--target", os.path.join(tmp, "t"),
               "--report", report, "--disable-pip-version-check"]
        cmd += [a for p in platforms for a in ("--platform", p)] + (["--no-deps"] if no_deps else []) + reqs
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if p.returncode != 0:
            errors = [re.sub(r" \(from versions: [^)]*\)", "", ln) for ln in p.stderr.splitlines()
                      if ln.startswith("ERROR")]
            msg = "; ".join(errors) or p.stderr[-800:]
            if "No matching distribution" in msg:  # a fact about the index, not a network failure
                cached.write_text(json.dumps({"error": msg}))
            raise RuntimeError(msg)
        out = json.load(open(report))
    cached.write_text(json.dumps(out))
    return out


def torch_cuda_major(report: dict) -> int | None:
    """CUDA major a torch wheel is built for, from its Requires-Dist (None: a CPU build)."""
    torch = next(i for i in report["install"] if i["metadata"]["name"].lower() == "torch")
    majors = set()
    for dep in torch["metadata"].get("requires_dist", []):
        req = dep.split(";")[0]
        majors.update(int(m) for m in re.findall(r"^cuda-toolkit\S*==(\d+)", req))
        majors.update(int(m) for m in re.findall(r"^nvidia-[\w-]+-cu(\d+)", req))
    if len(majors) > 1:
        raise RuntimeError(f"torch requires several CUDA majors: {sorted(majors)}")
    return majors.pop() if majors else None


def check(dockerfile_text: str, requirements: Path = REPO / "requirements.txt") -> list[str]:
    """Problems of the image's stack (empty: consistent). Raises NetworkUnavailable if it cannot check."""
    f = image_facts(dockerfile_text)
    problems = []
    try:
        tmajor = torch_cuda_major(resolve([f["torch_spec"]], f["python"], f["platforms"], no_deps=True))
        if tmajor != f["cuda_major"]:
            problems.append(f"{f['torch_spec']} is built for CUDA {tmajor} but {f['base']} has CUDA "
                            f"{f['cuda_major']} (nvcc builds Horovod/apex against torch's CUDA)")
    except RuntimeError as e:
        problems.append(f"{f['torch_spec']} has no wheel for Python {f['python']}: {e}")
    try:
        resolve(requirement_lines(requirements) + [f["torch_spec"]], f["python"], f["platforms"])
    except RuntimeError as e:
        problems.append(f"requirements.txt + {f['torch_spec']} do not resolve for Python {f['python']} "
                        f"({f['base']}): {e}")
    return problems


def main(argv=None) -> int:
    path = Path((argv or sys.argv[1:] or [str(REPO / "docker/Dockerfile")])[0])
    facts = image_facts(path.read_text())
    print(f"{path}: base {facts['base']}, CUDA {facts['cuda_major']}, Python {facts['python']}, "
          f"{facts['torch_spec']}")
    problems = check(path.read_text())
    for p in problems:
        print("PROBLEM:", p)
    print("stack consistent" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
