"""What tools/gpu_check.py prepares around the parts: the bundle's install and the Horovod build.

Standard library only (it runs before anything is installed).
"""
import glob
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HVD_SDIST = "horovod-0.28.1.tar.gz"


def cuda_visible() -> bool:
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def apex_wheel(bundle: str) -> str | None:
    found = sorted(glob.glob(os.path.join(bundle, "apex", "apex-*.whl")))
    return found[-1] if found else None


def _dist_name(wheel: str) -> str:
    return os.path.basename(wheel).split("-")[0]


def _installed(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _pip_install(wheels: list, timeout: float, extra: list) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "install", "--no-index", "--no-deps",
           *extra, *wheels]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def install_bundle(bundle: str, work: str, timeout: float) -> dict:
    """Install the bundle's wheels this python lacks (``pip install --no-index --no-deps``; a package
    already installed is kept, whatever its version). Where pip may not write to this python's
    site-packages (externally managed, read-only), they go to ``<work>/site`` on PYTHONPATH instead.
    The record (``<work>/bundle_install.json``) is what part 1 reports."""
    t0 = time.time()
    rec = {"bundle": bundle, "installed": [], "kept": [], "method": None}
    manifest = os.path.join(bundle, "bundle.json")
    here = "{}.{}".format(*sys.version_info[:2])
    if not os.path.isfile(manifest):
        rec["error"] = (f"no bundle at {bundle} (no bundle.json): make one with run_scripts/gpu_bundle.sh "
                        "on a machine with network and copy it there, or pass --bundle DIR")
    else:
        with open(manifest) as f:
            rec["made_for_python"] = json.load(f)["python"]
        if rec["made_for_python"] != here:
            rec["error"] = (f"{manifest} was made for Python {rec['made_for_python']}, this is {here}: "
                            f"rerun BUNDLE_PYTHON_VERSION={here} run_scripts/gpu_bundle.sh")
    if "error" not in rec:
        _install(sorted(glob.glob(os.path.join(bundle, "wheels", "*.whl"))), rec, work, timeout)
    rec["seconds"] = round(time.time() - t0, 1)
    with open(os.path.join(work, "bundle_install.json"), "w") as f:
        json.dump(rec, f, indent=1)
    print(f"[gpu_check] bundle: installed {', '.join(rec['installed']) or 'nothing'}; "
          f"already here, kept: {', '.join(rec['kept']) or 'none'}"
          + (f"; ERROR: {rec['error']}" if "error" in rec else ""), flush=True)
    return rec


def _install(wheels: list, rec: dict, work: str, timeout: float) -> None:
    missing = []
    for w in wheels:
        have = _installed(_dist_name(w))
        (rec["kept"].append(f"{_dist_name(w)} {have}") if have else missing.append(w))
    if not missing:
        return
    p = _pip_install(missing, timeout, [])
    rec["method"] = "pip install --no-index --no-deps (this python's site-packages)"
    if p.returncode != 0 and "externally-managed-environment" in p.stderr:
        # a distribution's python (PEP 668): only packages it lacks are added, nothing is replaced; the
        # Horovod build's pip calls inherit the permission
        os.environ["PIP_BREAK_SYSTEM_PACKAGES"] = "1"
        p = _pip_install(missing, timeout, [])
        rec["method"] += ", PIP_BREAK_SYSTEM_PACKAGES=1 (externally managed python)"
    if p.returncode != 0:
        site = os.path.join(work, "site")
        first_error = p.stderr.strip()[-400:]
        p = _pip_install(missing, timeout, ["--target", site])
        rec["method"] = (f"pip install --no-index --no-deps --target {site} "
                         f"(site-packages refused: {first_error})")
        os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (site, os.environ.get("PYTHONPATH")) if x)
    if p.returncode != 0:
        rec["error"] = f"pip install failed: {(p.stdout + p.stderr).strip()[-1500:]}"
        return
    rec["installed"] = [os.path.basename(w) for w in missing]


def cuda_arch(env_file: str) -> str | None:
    """The local GPU's compute capability as Horovod's list wants it ("90"), from part 1's file or torch;
    None where neither tells."""
    try:
        with open(env_file) as f:
            cap = json.load(f)["gpu"]["capability"]
    except (OSError, ValueError, KeyError, TypeError):
        probe = "import torch; print('%d.%d' % torch.cuda.get_device_capability(0))"
        cap = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip()
    return cap.replace(".", "") if re.fullmatch(r"\d+\.\d+", cap or "") else None


def start_horovod_build(a, env_file: str) -> subprocess.Popen:
    """Start the Horovod build in the background (niced); it writes ``<work>/horovod_build.{log,rc}``
    and part 7 waits for it. GPU: build_horovod_cuda.sh with NCCL for this GPU only, from the bundle's
    sdist, against this python's torch. Dry run: install_horovod.sh for this python (Gloo), which
    installs the cached wheel where HOROVOD_WHEEL_CACHE has one instead of compiling."""
    env = dict(os.environ)
    sdist = os.path.join(a.bundle, HVD_SDIST)
    if os.path.isfile(sdist):
        env["HOROVOD_SDIST"] = sdist
    if a.cpu_dry_run:
        script = os.path.join(REPO, "run_scripts", "install_horovod.sh")
        env["HOROVOD_PYTHON"] = sys.executable
        how = ("dry run: run_scripts/install_horovod.sh for this python (Gloo, CPU): the cached wheel where "
               "HOROVOD_WHEEL_CACHE has one, else compiled from "
               + env.get("HOROVOD_SDIST", "a downloaded sdist"))
    else:
        script = os.path.join(REPO, "run_scripts", "build_horovod_cuda.sh")
        env.pop("VENV_DIR", None)
        arch = cuda_arch(env_file)
        jobs = max(2, (os.cpu_count() or 4) - 5)  # cores left for the loader part's workers
        env.update(PYTHON=sys.executable, ALLOW_CUDA_MISMATCH="1", MAKEFLAGS=f"-j{jobs}")
        if arch:  # else build_horovod_cuda.sh's default list (every arch: slower)
            env["HOROVOD_BUILD_CUDA_CC_LIST"] = arch
        src = env.get("HOROVOD_SDIST", "PyPI (no sdist in the bundle)")
        archs = f"sm_{arch} only" if arch else "the default arch list"
        how = (f"run_scripts/build_horovod_cuda.sh: Horovod 0.28.1 from {src} with NCCL for {archs}, "
               f"-j{jobs}, niced, against {sys.executable}'s torch")
    work = a.work
    with open(os.path.join(work, "horovod_build.started"), "w") as f:
        f.write(how + "\n")
    print(f"[gpu_check] background: {how}", flush=True)
    wrapper = 'nice -n 10 "$0" > "$1" 2>&1; echo $? > "$2.tmp" && mv "$2.tmp" "$2"'
    cmd = ["bash", "-c", wrapper, script, os.path.join(work, "horovod_build.log"),
           os.path.join(work, "horovod_build.rc")]
    return subprocess.Popen(cmd, cwd=REPO, env=env, start_new_session=True)
