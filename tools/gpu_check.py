"""The driver of run_scripts/gpu_check.sh: every part of the GPU check in its own process, results first.

Parts, in order of importance, each writing ``OUT/<n>_<part>.json`` the moment it has a figure (and
``OUT/summary.md`` after each part; 8 files in all):

  1 env         GPU, driver, torch / CUDA / cuDNN / NCCL versions, TF32 flags, packages
  2 amp_o2      amp O2 vs fp32 (TF32 off) step rate and peak memory on the base model
  3 bf16        bf16, and fp32 with TF32 on
  4 amp_oracle  real apex.amp (the bundle's wheel) vs ours, O2 then O1
  5 cuda_tests  the project's tests that need a GPU
  6 loader      decoded clips/s through the CUDA PrefetchLoader vs what amp O2 consumes
  7 horovod     torchrun NCCL allreduce; Horovod 0.28.1 built with NCCL for this GPU (started in the
                background after part 3, so it cannot skew the timed parts), horovodrun -np 1 --fp16 1 steps

A part that fails or runs out of time records its error in its file and the next part runs. Every
timeout sits inside one overall budget (``--budget-s``, default 540 s: 9 minutes), so the whole check
ends in time; a part that would start with too little time left records a skip. Before the parts, the
bundle (run_scripts/gpu_bundle.sh) is installed into this python with ``pip --no-index --no-deps``, one
wheel per package this python lacks (nothing installed is replaced).
This file uses only the standard library: it must run before anything is installed.

    python tools/gpu_check.py [--cpu-dry-run] [--out DIR] [--bundle DIR] [--parts env,amp_o2,...]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import _gpu_check_report as report
import _gpu_check_setup as setup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PARTS_DIR = os.path.join(REPO, "tools", "gpu_check_parts")
# name, result file, budget in seconds (the most it may take; usually far less on an H100)
PARTS = [("env", "1_env.json", 60), ("amp_o2", "2_amp_o2.json", 180), ("bf16", "3_bf16.json", 120),
         ("amp_oracle", "4_amp_oracle.json", 180), ("cuda_tests", "5_cuda_tests.json", 120),
         ("loader", "6_loader.json", 90), ("horovod", "7_horovod.json", 300)]
# the Horovod build starts before the first of these (after the timed parts 2 and 3)
AFTER_TIMED = ("amp_oracle", "cuda_tests", "loader", "horovod")
MIN_PART_S = 15  # a part with less time than this left is skipped, not started
ACTIVE: list = []  # the running part and the background build: ended with the driver (SIGTERM/SIGINT)


def part_command(name: str, a, files: dict, timeout: float) -> list:
    """The command line of one part."""
    py, parts, dry = sys.executable, PARTS_DIR, ["--cpu-dry-run"] if a.cpu_dry_run else []
    common = ["--result", files[name], "--work", a.work, *dry]
    if name == "env":
        return [py, os.path.join(parts, "env_part.py"), *common]
    if name in ("amp_o2", "bf16"):
        modes = ["fp32", "amp_O2"] if name == "amp_o2" else ["bf16", "fp32_tf32"]
        return [py, os.path.join(parts, "precision_part.py"), *common, "--part", name, "--modes", *modes,
                "--baseline", files["amp_o2"]]
    if name == "amp_oracle":
        cmd = [py, os.path.join(REPO, "tools", "amp_oracle.py"), "--out", os.path.join(a.work, "oracle"),
               "--result", files[name], "--if-no-apex", "skip", "--skip-reason",
               "skipped: no apex wheel in the bundle", "--timeout", str(int(timeout))]
        wheel = setup.apex_wheel(a.bundle)
        cmd += ["--apex-wheel", wheel] if wheel else []
        return cmd + (dry or ["--steps", "300", "--levels", "O2", "O1"])
    if name == "cuda_tests":
        return [py, os.path.join(parts, "cuda_tests_part.py"), *common]
    if name == "loader":
        return [py, os.path.join(parts, "loader_part.py"), *common, "--baseline", files["amp_o2"]]
    return [py, os.path.join(parts, "horovod_part.py"), *common]


def run_part(name: str, path: str, cmd: list, timeout: float, work: str) -> dict:
    """Run one part in its own process group; on failure or timeout add the error to its file."""
    log = os.path.join(work, f"{name}.log")
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        ACTIVE.append(proc)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            rc = None
        ACTIVE.remove(proc)
    data = read_json(path) or {"part": name}
    if rc == 0 and data.get("status") in ("ok", "skipped"):
        return data
    with open(log, errors="replace") as f:
        tail = f.read()[-3000:]
    if rc is None:
        data.update(status="error", error=f"timeout: killed after {timeout:.0f} s", log_tail=tail)
    elif data.get("status") in (None, "running"):
        data.update(status="error", error=f"exit {rc}", log_tail=tail)
    data.setdefault("seconds", round(time.time() - t0, 1))
    write_json(path, data)
    return data


def kill_group(proc: subprocess.Popen) -> None:
    """SIGTERM the part's process group (its torchrun/horovodrun children too), SIGKILL what remains."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def end_active(signum, frame) -> None:
    """The driver is being stopped: its part and the build go with it (what is on disk stays)."""
    for proc in list(ACTIVE):
        kill_group(proc)
    sys.exit(128 + signum)


def read_json(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=str)
    os.replace(tmp, path)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="every part on CPU with the tiny model")
    ap.add_argument("--out", default=os.path.join(REPO, "output", "gpu_check"), help="the result folder")
    ap.add_argument("--bundle", default=os.path.join(REPO, "third_party_wheels", "gpu_bundle"),
                    help="run_scripts/gpu_bundle.sh's folder")
    ap.add_argument("--parts", default=",".join(p[0] for p in PARTS), help="comma-separated subset")
    ap.add_argument("--budget-s", type=float, default=540, help="the whole check's time limit")
    ap.add_argument("--work", default=None, help="scratch folder (default: a temporary one, removed)")
    a = ap.parse_args(argv)
    unknown = set(a.parts.split(",")) - {p[0] for p in PARTS}
    if unknown:
        ap.error(f"--parts: unknown {sorted(unknown)}; the parts are {','.join(p[0] for p in PARTS)}")
    a.out, a.bundle = os.path.abspath(a.out), os.path.abspath(a.bundle)
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    deadline = time.time() + a.budget_s
    if not a.cpu_dry_run and not setup.cuda_visible():
        sys.exit("[gpu_check] ERROR: no CUDA device visible to torch; use --cpu-dry-run on a CPU machine")
    keep_work = a.work is not None
    a.work = os.path.abspath(a.work or tempfile.mkdtemp(prefix="gpu_check_"))
    os.makedirs(a.out, exist_ok=True)
    os.makedirs(a.work, exist_ok=True)
    setup.install_bundle(a.bundle, a.work, min(90.0, a.budget_s / 6))
    files = {name: os.path.join(a.out, fname) for name, fname, _ in PARTS}
    chosen = a.parts.split(",")
    results, build = {}, None
    for name, _, budget in PARTS:
        if name not in chosen:
            continue
        timeout = min(budget, deadline - time.time())
        if timeout < MIN_PART_S:
            results[name] = {"part": name, "status": "skipped",
                             "reason": f"no time left in the {a.budget_s:.0f} s budget"}
            write_json(files[name], results[name])
        else:
            if "horovod" in chosen and build is None and name in AFTER_TIMED:
                build = setup.start_horovod_build(a, files["env"])  # after the timed parts 2 and 3
                ACTIVE.append(build)
            print(f"[gpu_check] {name}: up to {timeout:.0f} s", flush=True)
            cmd = part_command(name, a, files, timeout)
            results[name] = run_part(name, files[name], cmd, timeout, a.work)
        print(report.one_line(results[name]), flush=True)
        report.write_summary(a.out, files, a.cpu_dry_run)
    if build is not None and build.poll() is None:
        kill_group(build)
    with open(os.path.join(a.out, "summary.md")) as f:
        print(f.read())
    print(f"[gpu_check] results in {a.out}")
    if not keep_work:
        shutil.rmtree(a.work, ignore_errors=True)
    return 0 if all(r["status"] in ("ok", "skipped") for r in results.values()) else 1


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, end_active)
    signal.signal(signal.SIGINT, end_active)
    sys.exit(main())
