"""Stress check (not a timing): many ``hvd.init(); allreduce; hvd.shutdown()`` cycles in one job (issue 50).

Horovod's own test file, run in one job as Horovod's CI runs it, initialises and shuts Horovod down once
per test (about 115 times). This runs ``--cycles`` such cycles (init, a checked named allreduce, a
checked unnamed broadcast, shutdown) in one 2-process job, ``--runs`` times under each launcher
(``horovodrun -np 2 --gloo`` and ``torchrun --nproc_per_node 2``, through
clipbert_legacy.compat.loopback), one job at a time, and counts the jobs that passed, failed (an error, a
wrong sum, a missing last line), aborted (``terminate called``, SIGABRT, SIGSEGV, ``Fatal Python
error``) or hung (no end within ``--timeout_s``). ``--module horovod.torch`` runs real Horovod (only
under horovodrun) as the baseline.

    nice -n 10 .venv/bin/python benchmarks/stress_hvd_cycles.py [--cycles 100] [--runs 10] \\
        [--launchers horovodrun,torchrun] [--module clipbert_legacy.compat.hvd] [--log_dir D]

Exit status 1 when any job did not pass. The counts go to docs/benchmarks.md.
"""
import argparse
import collections
import os
import re
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ABORTS = re.compile(r"terminate called|Aborted|core dumped|Segmentation fault|Fatal Python error|"
                    r"SIGABRT|SIGSEGV|exitcode\s*:\s*-(6|11)\b|[Ss]ignal 6\b|[Ss]ignal 11\b|"
                    r"status code (-6|-11|134|139)\b")


def worker(module: str, cycles: int) -> None:
    import importlib

    import torch
    hvd = importlib.import_module(module)
    t0 = time.monotonic()
    for i in range(cycles):
        hvd.init()
        size, rank = hvd.size(), hvd.rank()
        got = hvd.allreduce(torch.ones(3) * (rank + 1), op=hvd.Sum, name=f"cycle.{i}")
        if got.tolist() != [size * (size + 1) / 2] * 3:
            raise SystemExit(f"cycle {i}: allreduce gave {got.tolist()}")
        b = hvd.broadcast(torch.full((2,), float(rank + i)), root_rank=0)
        if b.tolist() != [float(i)] * 2:
            raise SystemExit(f"cycle {i}: broadcast gave {b.tolist()}")
        hvd.shutdown()
    print(f"rank {rank}: ok {cycles} cycles in {time.monotonic() - t0:.1f} s", flush=True)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(launcher: str, module: str, cycles: int) -> list:
    me = [sys.executable, os.path.abspath(__file__), "--worker", module, "--cycles", str(cycles)]
    loop = [sys.executable, "-m", "clipbert_legacy.compat.loopback"]
    if launcher == "horovodrun":
        return loop + ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo",
                       "--gloo-timeout-seconds", "60", *me]
    return loop + ["torchrun", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                   str(_port()), *me[1:]]


def run_job(launcher: str, module: str, cycles: int, timeout_s: float) -> tuple:
    """(outcome, seconds, output) of one job: passed / failed / aborted / hung."""
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.monotonic()
    proc = subprocess.Popen(command(launcher, module, cycles), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
        return "hung", time.monotonic() - t0, out
    seconds = time.monotonic() - t0
    if ABORTS.search(out):
        return "aborted", seconds, out
    ok = all(f"rank {r}: ok {cycles} cycles" in out for r in (0, 1))
    return ("passed" if ok and proc.returncode == 0 else "failed"), seconds, out


def first_problem(out: str) -> str:
    for line in out.splitlines():
        if ABORTS.search(line) or "Error" in line or "error" in line:
            return line.strip()[:240]
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1][:240] if lines else "(no output)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--cycles", type=int, default=100)
    ap.add_argument("--runs", type=int, default=10, help="jobs per launcher, one at a time")
    ap.add_argument("--launchers", default="horovodrun,torchrun")
    ap.add_argument("--module", default="clipbert_legacy.compat.hvd", help="horovod.torch: the baseline")
    ap.add_argument("--timeout_s", type=float, default=0, help="per job (default: 60 s + 3 s a cycle)")
    ap.add_argument("--log_dir", help="keep every job's output here")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.cycles)
    timeout_s = a.timeout_s or 60 + 3 * a.cycles  # a cycle takes 0.1-0.5 s on the idle 2-core machine
    bad = 0
    for launcher in a.launchers.split(","):
        counts, secs = collections.Counter(), []
        for r in range(a.runs):
            outcome, seconds, out = run_job(launcher, a.module, a.cycles, timeout_s)
            counts[outcome] += 1
            secs.append(seconds)
            if a.log_dir:
                os.makedirs(a.log_dir, exist_ok=True)
                with open(os.path.join(a.log_dir, f"{launcher}-{r}-{outcome}.log"), "w") as f:
                    f.write(out)
            print(f"{launcher} run {r + 1}/{a.runs}: {outcome} in {seconds:.0f} s"
                  + ("" if outcome == "passed" else f"  -- {first_problem(out)}"), flush=True)
        bad += a.runs - counts["passed"]
        print(f"{a.module} under {launcher}, {a.cycles} cycles a job: {counts['passed']}/{a.runs} passed, "
              f"{counts['failed']} failed, {counts['aborted']} aborted, {counts['hung']} hung "
              f"(median {sorted(secs)[len(secs) // 2]:.0f} s a job)", flush=True)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
