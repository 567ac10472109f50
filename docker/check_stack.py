"""Can the Docker image build on one stack? Checked without a Docker daemon, from the Dockerfile text and
the build args (``--build-arg K=V``, as given to docker build):

1. the base image's Python (the Ubuntu / Debian release's python3, which PYTHON_VERSION must name) has
   wheels for every pin in requirements.txt and for the torch pin: ``pip install --dry-run
   --only-binary=:all: --python-version X --platform manylinux_...`` resolves them all (wheel metadata
   only; nothing is downloaded beyond it), with this host's pip configuration (its index, CA, local wheels);
2. HOROVOD_BUILD=cuda: torch's CUDA major, from its wheel metadata (``cuda-toolkit==13.0.*``,
   ``nvidia-*-cu13``), equals the base image's (an nvidia/cuda devel image: its nvcc builds Horovod and
   apex); HOROVOD_BUILD=cpu: torch is a CPU build (a CUDA one would add gigabytes of unused libraries).

Resolutions are cached in ~/.cache/clipbert-legacy/docker-stack/ keyed by every input (failures only when
pip found no matching wheel, never a network error), so a repeated run needs no network.
``python docker/check_stack.py [DOCKERFILE] [--build-arg K=V ...]`` prints the problems.
"""
import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# release -> (its python3, its glibc): the interpreter the image's venv is made from
UBUNTU = {"20.04": ("3.8", (2, 31)), "22.04": ("3.10", (2, 35)), "24.04": ("3.12", (2, 39))}
DEBIAN = {"bookworm": ("3.11", (2, 36)), "12": ("3.11", (2, 36)), "trixie": ("3.13", (2, 41)),
          "13": ("3.13", (2, 41))}
BASE_RE = re.compile(r"nvidia/cuda:(\d+)\.(\d+)(?:\.\d+)?-(?:cudnn\d*-)?(?:devel|runtime|base)"
                     r"-ubuntu(\d+\.\d+)$")
# a plain distribution image, also a local one (docker/build_local.sh imports local/debian:bookworm)
DISTRO_RE = re.compile(r"(?:[\w.-]+/)*(ubuntu|debian):([\w.]+?)(?:-slim)?$")
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


def arg_defaults(text: str, build_args: dict | None = None) -> dict[str, str]:
    """The ARG defaults of the Dockerfile, overridden by ``build_args`` (docker build --build-arg)."""
    out = {r.split("=", 1)[0]: r.split("=", 1)[1].strip('"') for w, r in instructions(text)
           if w == "ARG" and "=" in r}
    return {**out, **(build_args or {})}


def base_image(text: str, build_args: dict | None = None) -> str:
    args = arg_defaults(text, build_args)
    base = next(r for w, r in instructions(text) if w == "FROM").split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], base)


def _release(base: str) -> tuple[int | None, str, tuple[int, int]]:
    """(CUDA major or None, python3 version, glibc) of a known base image; ValueError names the known ones."""
    m = BASE_RE.match(base)
    if m:
        if m.group(3) not in UBUNTU:
            raise ValueError(f"base image {base!r}: unknown Ubuntu release {m.group(3)} "
                             f"(known: {sorted(UBUNTU)})")
        return (int(m.group(1)), *UBUNTU[m.group(3)])
    m = DISTRO_RE.match(base)
    table = {"ubuntu": UBUNTU, "debian": DEBIAN}.get(m.group(1)) if m else None
    if not m or m.group(2) not in table:
        raise ValueError(f"base image {base!r} is not an nvidia/cuda:X.Y[.Z]-[cudnnN-]devel-ubuntuA.B image "
                         f"nor a known Ubuntu ({sorted(UBUNTU)}) / Debian ({sorted(DEBIAN)}) release")
    return (None, *table[m.group(2)])


def image_facts(text: str, build_args: dict | None = None) -> dict:
    """CUDA major (None: no CUDA), Python version, manylinux platforms, torch pin and Horovod build."""
    base = base_image(text, build_args)
    cuda_major, python, (_, glibc_minor) = _release(base)
    args = arg_defaults(text, build_args)
    plats = [f"manylinux_2_{v}_x86_64" for v in range(glibc_minor, 16, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return {"base": base, "cuda_major": cuda_major, "python": python, "platforms": plats,
            "torch_spec": args.get("TORCH_SPEC", "torch==2.13.0"),
            "python_arg": args.get("PYTHON_VERSION", python),
            "horovod_build": args.get("HOROVOD_BUILD", "cuda")}


def requirement_lines(path: Path) -> list[str]:
    return [ln.split("#")[0].strip() for ln in path.read_text().splitlines() if ln.split("#")[0].strip()]


def _pip_setting(key: str) -> str | None:
    """A value of this host's pip configuration (files and PIP_* variables), as pip itself uses it."""
    env = os.environ.get("PIP_" + key.upper().replace("-", "_"))
    if env:
        return env
    p = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    for line in p.stdout.splitlines():
        k, _, v = line.partition("=")
        if k.split(".", 1)[-1] == key:
            return v.strip().strip("'\"")
    return None


def _index_reachable() -> str | None:
    """None if the package index answers, else why not (checked with pip's CA bundle, as pip will)."""
    url = _pip_setting("index-url") or "https://pypi.org/simple/"
    if not url.startswith(("http://", "https://")):
        return None  # a local index: nothing to reach
    cafile = _pip_setting("cert")
    ctx = ssl.create_default_context(cafile=cafile if cafile and os.path.isfile(cafile) else None)
    try:
        urllib.request.urlopen(urllib.request.Request(url.rstrip("/") + "/pip/", method="HEAD"), timeout=15,
                               context=ctx if url.startswith("https") else None)
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


def _torch_problems(f: dict) -> list[str]:
    try:
        tmajor = torch_cuda_major(resolve([f["torch_spec"]], f["python"], f["platforms"], no_deps=True))
    except RuntimeError as e:
        return [f"{f['torch_spec']} has no wheel for Python {f['python']}: {e}"]
    if f["horovod_build"] == "cpu":
        return [] if tmajor is None else [
            f"HOROVOD_BUILD=cpu but {f['torch_spec']} is a CUDA {tmajor} build (gigabytes of unused CUDA "
            f"libraries): use a CPU torch, e.g. TORCH_SPEC=torch==2.13.0+cpu"]
    if f["cuda_major"] is None:
        return [f"HOROVOD_BUILD=cuda needs an nvidia/cuda devel base image (nvcc), not {f['base']}: "
                f"use HOROVOD_BUILD=cpu there"]
    if tmajor != f["cuda_major"]:
        return [f"{f['torch_spec']} is built for CUDA {tmajor} but {f['base']} has CUDA "
                f"{f['cuda_major']} (nvcc builds Horovod/apex against torch's CUDA)"]
    return []


def check(dockerfile_text: str, requirements: Path = REPO / "requirements.txt",
          build_args: dict | None = None) -> list[str]:
    """Problems of the image's stack (empty: consistent). Raises NetworkUnavailable if it cannot check."""
    f = image_facts(dockerfile_text, build_args)
    problems = []
    if f["python_arg"] != f["python"]:
        problems.append(f"PYTHON_VERSION={f['python_arg']} but {f['base']} has Python {f['python']}: "
                        f"--build-arg PYTHON_VERSION={f['python']}")
    problems += _torch_problems(f)
    try:
        resolve(requirement_lines(requirements) + [f["torch_spec"]], f["python"], f["platforms"])
    except RuntimeError as e:
        problems.append(f"requirements.txt + {f['torch_spec']} do not resolve for Python {f['python']} "
                        f"({f['base']}): {e}")
    return problems


def main(argv=None) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dockerfile", nargs="?", default=str(REPO / "docker/Dockerfile"))
    ap.add_argument("--build-arg", action="append", default=[], metavar="K=V")
    a = ap.parse_args(argv)
    build_args = dict(kv.split("=", 1) for kv in a.build_arg)
    text = Path(a.dockerfile).read_text()
    facts = image_facts(text, build_args)
    print(f"{a.dockerfile}: base {facts['base']}, CUDA {facts['cuda_major']}, Python {facts['python']}, "
          f"{facts['torch_spec']}, HOROVOD_BUILD={facts['horovod_build']}")
    problems = check(text, build_args=build_args)
    for p in problems:
        print("PROBLEM:", p)
    print("stack consistent" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
