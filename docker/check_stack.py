"""Can the Docker image build on one stack? Checked without a Docker daemon, from the Dockerfile text and
the build args (``--build-arg K=V``, as given to docker build):

1. the base image's Python (the Ubuntu / Debian release's python3, which PYTHON_VERSION must name) has
   wheels for every pin in requirements.txt and for the torch pin: ``pip install --dry-run
   --only-binary=:all: --python-version X --platform manylinux_...`` resolves them all (wheel metadata
   only; nothing is downloaded beyond it), with this host's pip configuration (its index, CA, local wheels);
2. HOROVOD_BUILD=cuda: torch's CUDA major, from its wheel metadata (``cuda-toolkit==13.0.*``,
   ``nvidia-*-cu13``), equals the base image's (an nvidia/cuda devel image: its nvcc builds Horovod and
   apex); HOROVOD_BUILD=cpu: torch is a CPU build (a CUDA one would add gigabytes of unused libraries);
3. on the stand-in CUDA base (``local/cuda:X.Y.Z-devel-debian12``, docker/make_cuda_base.sh), the
   toolkit is exactly the one torch requires: the tag's X.Y.Z is torch's ``cuda-toolkit==X.Y.Z`` and every
   pin of docker/cuda_base/toolkit.txt is that cuda-toolkit release's version of the package.
``expected_versions()`` gives what the built image must report (tests/test_docker_cuda_image.py).

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
# nvidia/cuda:13.0.1-devel-ubuntu24.04, or the stand-in local/cuda:13.0.3-devel-debian12 (make_cuda_base.sh)
BASE_RE = re.compile(r"(?:[\w.-]+/)*cuda:(\d+\.\d+(?:\.\d+)?)-(?:cudnn\d*-)?(?:devel|runtime|base)"
                     r"-(ubuntu|debian)(\d+(?:\.\d+)?)$")
STANDIN = "local/cuda:"  # the stand-in base: its toolkit is docker/cuda_base/toolkit.txt
TOOLKIT = REPO / "docker/cuda_base/toolkit.txt"
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


def _release(base: str) -> tuple[str | None, str, tuple[int, int]]:
    """(CUDA version X.Y[.Z] or None, python3 version, glibc) of a known base image; ValueError names the
    known ones."""
    m = BASE_RE.match(base)
    if m:
        table = {"ubuntu": UBUNTU, "debian": DEBIAN}[m.group(2)]
        if m.group(3) not in table:
            raise ValueError(f"base image {base!r}: unknown {m.group(2).title()} release {m.group(3)} "
                             f"(known: {sorted(table)})")
        return (m.group(1), *table[m.group(3)])
    m = DISTRO_RE.match(base)
    table = {"ubuntu": UBUNTU, "debian": DEBIAN}.get(m.group(1)) if m else None
    if not m or m.group(2) not in table:
        raise ValueError(f"base image {base!r} is not an nvidia/cuda:X.Y[.Z]-[cudnnN-]devel-ubuntuA.B image "
                         f"(nor the stand-in local/cuda:X.Y.Z-devel-debian12) nor a known Ubuntu "
                         f"({sorted(UBUNTU)}) / Debian ({sorted(DEBIAN)}) release")
    return (None, *table[m.group(2)])


def image_facts(text: str, build_args: dict | None = None) -> dict:
    """CUDA major (None: no CUDA), Python version, manylinux platforms, torch pin and Horovod build."""
    base = base_image(text, build_args)
    cuda, python, (_, glibc_minor) = _release(base)
    args = arg_defaults(text, build_args)
    plats = [f"manylinux_2_{v}_x86_64" for v in range(glibc_minor, 16, -1)]
    plats += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
    return {"base": base, "cuda_major": int(cuda.split(".")[0]) if cuda else None, "cuda_version": cuda,
            "standin": base.startswith(STANDIN), "python": python, "platforms": plats,
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


def resolve(reqs: list[str], python: str, platforms: list[str], no_deps: bool = False,
            host_wheels: bool = True) -> dict:
    """pip's --dry-run --report for ``reqs`` on (python, platforms); raises RuntimeError with pip's error.
    ``host_wheels=False``: without this host's find-links folders, as the CUDA image's build runs
    (build_local.sh --cuda: a local CPU torch 2.13.0+cpu would otherwise win over PyPI's CUDA 2.13.0)."""
    key = json.dumps([reqs, python, platforms, no_deps] + ([] if host_wheels else ["no-host-wheels"]),
                     sort_keys=True)
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
        env = dict(os.environ)
        if not host_wheels:  # an empty folder replaces the find-links of pip's config files and variables
            os.mkdir(os.path.join(tmp, "no-wheels"))
            env["PIP_FIND_LINKS"] = os.path.join(tmp, "no-wheels")
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
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


def exact_pins(requires: list[str]) -> dict[str, str]:
    """{name: version} of the ``name[extras]==version`` (or ``==version.*``) requirements, markers ignored;
    the first pin of a name wins (cuda-toolkit lists a package once per extra, always at one version)."""
    out = {}
    for dep in requires:
        m = re.match(r"^\s*([A-Za-z0-9][\w.-]*)(?:\[[^\]]*\])?\s*==\s*([\w.+]+?)(?:\.\*)?\s*(?:;|$)", dep)
        if m:
            out.setdefault(m.group(1).lower(), m.group(2))
    return out


def _torch_requires(report: dict) -> list[str]:
    torch = next(i for i in report["install"] if i["metadata"]["name"].lower() == "torch")
    return torch["metadata"].get("requires_dist", [])


def toolkit_pins(path: Path | None = None) -> dict[str, str]:
    """The stand-in base's toolkit wheels, {name: version} (docker/cuda_base/toolkit.txt)."""
    return exact_pins(requirement_lines(path or TOOLKIT))


def torch_cuda_major(report: dict) -> int | None:
    """CUDA major a torch wheel is built for, from its Requires-Dist (None: a CPU build)."""
    majors = set()
    for dep in _torch_requires(report):
        req = dep.split(";")[0]
        majors.update(int(m) for m in re.findall(r"^cuda-toolkit\S*==(\d+)", req))
        majors.update(int(m) for m in re.findall(r"^nvidia-[\w-]+-cu(\d+)", req))
    if len(majors) > 1:
        raise RuntimeError(f"torch requires several CUDA majors: {sorted(majors)}")
    return majors.pop() if majors else None


def _resolve(f: dict, reqs: list[str], no_deps: bool = False) -> dict:
    """resolve() for the image of facts ``f``: the CUDA build sees none of this host's local wheels."""
    if f["horovod_build"] == "cuda":
        return resolve(reqs, f["python"], f["platforms"], no_deps=no_deps, host_wheels=False)
    return resolve(reqs, f["python"], f["platforms"], no_deps=no_deps)


def _torch_report(f: dict) -> dict:
    return _resolve(f, [f["torch_spec"]], no_deps=True)


def _toolkit_problems(f: dict, torch_report: dict) -> list[str]:
    """The stand-in's toolkit against torch's ``cuda-toolkit==X.Y.Z``: the tag and every toolkit.txt pin."""
    want = exact_pins(_torch_requires(torch_report)).get("cuda-toolkit")
    if want is None:
        return [f"{f['torch_spec']} names no cuda-toolkit==X.Y.Z: the stand-in's toolkit cannot be checked"]
    problems = []
    if f["cuda_version"] != want:
        problems.append(f"{f['base']} is CUDA {f['cuda_version']} but {f['torch_spec']} requires "
                        f"cuda-toolkit=={want}: CUDA_BASE_IMAGE={STANDIN}{want}-devel-debian12 "
                        f"(make_cuda_base.sh)")
    release = exact_pins(_resolve(f, [f"cuda-toolkit=={want}"], no_deps=True)
                         ["install"][0]["metadata"].get("requires_dist", []))
    for name, version in toolkit_pins().items():
        if release.get(name) != version:
            problems.append(f"docker/cuda_base/toolkit.txt pins {name}=={version} but cuda-toolkit=={want} "
                            f"(torch's) has {release.get(name) or 'no such package'}")
    return problems


def expected_versions(text: str, build_args: dict | None = None) -> dict[str, str]:
    """What the built CUDA image reports: torch's version and CUDA X.Y, the NCCL of torch's nvidia-nccl
    wheel and, on the stand-in base, nvcc's version (toolkit.txt). Resolves torch's wheel metadata."""
    f = image_facts(text, build_args)
    requires = _torch_requires(_torch_report(f))
    pins = exact_pins(requires)
    nccl = next((v for k, v in pins.items() if re.fullmatch(r"nvidia-nccl-cu\d+", k)), None)
    toolkit = pins.get("cuda-toolkit") or ""
    out = {"torch": f["torch_spec"].split("==")[-1], "cuda": ".".join(toolkit.split(".")[:2]), "nccl": nccl}
    if f["standin"]:
        out["nvcc"] = toolkit_pins()["nvidia-cuda-nvcc"]
    return out


def _torch_problems(f: dict) -> list[str]:
    try:
        report = _torch_report(f)
        tmajor = torch_cuda_major(report)
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
    return _toolkit_problems(f, report) if f["standin"] else []


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
        _resolve(f, requirement_lines(requirements) + [f["torch_spec"]])
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
    print(f"{a.dockerfile}: base {facts['base']}, CUDA {facts['cuda_version']}, Python {facts['python']}, "
          f"{facts['torch_spec']}, HOROVOD_BUILD={facts['horovod_build']}")
    problems = check(text, build_args=build_args)
    for p in problems:
        print("PROBLEM:", p)
    print("stack consistent" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
