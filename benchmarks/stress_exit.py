"""Stress check (not a timing): do 2-process jobs end the way they should, every time? (issue 46)

Runs ``--jobs`` toy jobs (benchmarks/_stress_exit_worker.py) under each launcher (``torchrun
--nproc_per_node 2`` and ``horovodrun -np 2 --gloo``, through clipbert_legacy.compat.loopback), one after
another,
each ended one of four ways in turn (a normal end, a stop signal to one rank, an exception in a hook on
one rank, ``sys.exit(3)`` from a hook on every rank); every second round of the four runs with two CPU-bound
processes beside it (``--busy 0`` for none). A job exits abnormally when a process aborts or crashes
(``terminate called ...``, SIGABRT, SIGSEGV, ``Fatal Python error``), the job hangs past its
timeout, the launcher's status is not the expected one (0 for a normal end, else non-zero), or a rank
that should have ended by itself did not print its last line with the expected status.

    .venv/bin/python benchmarks/stress_exit.py [--jobs 200] [--launchers torchrun,horovodrun] [--log_dir D]

Exit status 1 when any job exited abnormally. The counts go to docs/benchmarks.md.
"""
import argparse
import collections
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "benchmarks", "_stress_exit_worker.py")
HOWS = ("end", "signal", "raise", "sysexit")
EXPECTED = {"end": {0: 0, 1: 0}, "signal": {0: 75, 1: 75}, "raise": {1: 1}, "sysexit": {0: 3, 1: 3}}
ABORTS = re.compile(r"terminate called|Aborted|core dumped|Segmentation fault|Fatal Python error|"
                    r"SIGABRT|SIGSEGV|exitcode\s*:\s*-(6|11)\b|[Ss]ignal 6\b|[Ss]ignal 11\b|"
                    r"status code (-6|-11|134|139)\b")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(launcher, out, how):
    loop = [sys.executable, "-m", "clipbert_legacy.compat.loopback"]
    if launcher == "torchrun":
        return loop + ["torchrun", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port",
                       str(_port()), WORKER, out, how]
    return loop + ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, WORKER, out, how]


def busy_loops(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def judge(how, rc, text):
    """Why this job's end was abnormal, or None."""
    found = ABORTS.search(text)
    if found:
        line = next(ln for ln in text.splitlines() if found.group(0) in ln)
        return f"abort/crash: {line.strip()[:200]}"
    if (rc == 0) != (how == "end"):
        return f"launcher exit status {rc} (expected {'0' if how == 'end' else 'non-zero'})"
    statuses = {int(r): s for r, s in re.findall(r"exit-status (\d) (\S+)", text)}
    for rank, want in EXPECTED[how].items():
        if statuses.get(rank) != str(want):
            return f"rank {rank} ended with {statuses.get(rank, 'no last line')} (expected {want})"
    return None


def run_job(launcher, how, busy, timeout_s, env):
    out = tempfile.mkdtemp(prefix="stress_exit_")
    loops = busy_loops(busy)
    try:
        p = subprocess.Popen(command(launcher, os.path.join(out, "run"), how), cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True)
        try:
            text, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            text, _ = p.communicate()
            return f"hung: no end within {timeout_s:g} s", text
        return judge(how, p.returncode, text), text
    finally:
        for q in loops:
            q.kill()
            q.wait()
        shutil.rmtree(out, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200, help="per launcher")
    ap.add_argument("--launchers", default="torchrun,horovodrun")
    ap.add_argument("--busy", type=int, default=2,
                    help="CPU-bound processes beside every second round of the four ends")
    ap.add_argument("--timeout_s", type=float, default=600, help="per job (an idle one takes about 15 s)")
    ap.add_argument("--log_dir", help="where the output of every abnormal job is written")
    ap.add_argument("--ends", default=",".join(HOWS), help="which ends, taken in turn")
    a = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    ends = a.ends.split(",")
    counts = collections.Counter()
    abnormal = []
    t0 = time.monotonic()
    for launcher in a.launchers.split(","):
        for i in range(a.jobs):
            how, busy = ends[i % len(ends)], a.busy if (i // len(ends)) % 2 else 0  # each end, idle and busy
            why, text = run_job(launcher, how, busy, a.timeout_s, env)
            key = (launcher, how, "busy" if busy else "idle")
            counts[key + ("jobs",)] += 1
            if why:
                counts[key + ("abnormal",)] += 1
                abnormal.append((launcher, i, how, busy, why))
                print(f"ABNORMAL {launcher} job {i} ({how}, {busy} busy): {why}", flush=True)
                if a.log_dir:
                    os.makedirs(a.log_dir, exist_ok=True)
                    with open(os.path.join(a.log_dir, f"{launcher}_{i}_{how}.log"), "w") as f:
                        f.write(text)
            if (i + 1) % 10 == 0:
                print(f"{launcher}: {i + 1}/{a.jobs} jobs, {sum(1 for x in abnormal if x[0] == launcher)} "
                      f"abnormal, {time.monotonic() - t0:.0f} s", flush=True)
    print(f"\n{'launcher':<11} {'end':<8} {'load':<5} {'jobs':>5} {'abnormal':>9}")
    for launcher in a.launchers.split(","):
        for how in HOWS:
            for load in ("idle", "busy"):
                n = counts[(launcher, how, load, "jobs")]
                if n:
                    bad = counts[(launcher, how, load, "abnormal")]
                    print(f"{launcher:<11} {how:<8} {load:<5} {n:>5} {bad:>9}")
    total = sum(v for k, v in counts.items() if k[-1] == "jobs")
    print(f"total: {len(abnormal)} abnormal of {total} jobs, {time.monotonic() - t0:.0f} s")
    sys.exit(1 if abnormal else 0)


if __name__ == "__main__":
    main()
