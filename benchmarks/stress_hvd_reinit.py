"""Stress check of ``hvd.shutdown(); hvd.init()`` under ``horovodrun -np 2 --gloo`` (issue 46), not a timing.

Each job re-initialises ``--reinits`` times in a row (init, a checked allreduce, shutdown), and
``--jobs`` such jobs run at once, ``--rounds`` times; the script counts the failed jobs of two variants
from the same run:

* ``baseline``: Horovod's own ``horovod.torch`` init/shutdown (the launcher's rendezvous server reused:
  a rank can read its peer's address from the previous rendezvous);
* ``ours``: ``clipbert_legacy.compat.hvd`` (every re-init gets a rendezvous of its own:
  ``compat.hvd.horovod_rendezvous``).

    .venv/bin/python benchmarks/stress_hvd_reinit.py [--reinits 20] [--jobs 3] [--rounds 3] [--variants ours]

Exit status 1 when ``ours`` had a failure. The counts go to docs/benchmarks.md.
"""
import argparse
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ERRORS = ("Connect timeout", "Connection refused", "Timed out", "timed out", "Error", "error")


def worker(variant: str, reinits: int) -> None:
    import torch
    if variant == "ours":
        import clipbert_legacy.compat.hvd as hvd
        total = lambda t, i: hvd.allreduce(t, op=hvd.Sum, name=f"reinit.{i}")  # noqa: E731
    else:
        import horovod.torch as hvd
        total = lambda t, i: hvd.allreduce(t, op=hvd.Sum, name=f"reinit.{i}")  # noqa: E731
    for i in range(reinits):
        hvd.init()
        got = total(torch.ones(1) * (hvd.rank() + 1), i).item()
        if got != hvd.size() * (hvd.size() + 1) / 2:
            raise SystemExit(f"re-init {i}: allreduce gave {got}")
        hvd.shutdown()
    print(f"ok {reinits} re-inits", flush=True)


def launch(variant: str, reinits: int, timeout_s: float) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "clipbert_legacy.compat.loopback", "horovodrun", "-np", "2", "-H",
           "localhost:2", "--gloo",
           "--gloo-timeout-seconds", "60", sys.executable, os.path.abspath(__file__), "--worker", variant,
           "--reinits", str(reinits)]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def first_error(out: str) -> str:
    for line in out.splitlines():
        if any(word in line for word in ERRORS):
            return line.strip()[:200]
    return out.strip().splitlines()[-1][:200] if out.strip() else "(no output)"


def round_of(variant: str, jobs: int, reinits: int, timeout_s: float) -> list:
    procs = [launch(variant, reinits, timeout_s) for _ in range(jobs)]
    failures = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, _ = p.communicate()
            failures.append(f"hung: no end within {timeout_s:g} s; " + first_error(out))
            continue
        if p.returncode != 0 or f"ok {reinits} re-inits" not in out:
            failures.append(f"exit {p.returncode}: {first_error(out)}")
    return failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", choices=("ours", "baseline"), help=argparse.SUPPRESS)
    ap.add_argument("--reinits", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=3, help="jobs started at once")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--variants", default="baseline,ours")
    ap.add_argument("--timeout_s", type=float, default=0, help="per round (default: 30 s + 15 s a re-init)")
    a = ap.parse_args()
    if a.worker:
        return worker(a.worker, a.reinits)
    timeout_s = a.timeout_s or 30 + 15 * a.reinits  # a re-init takes about 1 s on the idle 2-core machine
    counts = {}
    for variant in a.variants.split(","):
        t0, failed = time.monotonic(), []
        for r in range(a.rounds):
            got = round_of(variant, a.jobs, a.reinits, timeout_s)
            failed += got
            print(f"{variant} round {r + 1}/{a.rounds}: {a.jobs - len(got)}/{a.jobs} jobs ok"
                  + "".join(f"\n    {f}" for f in got), flush=True)
        counts[variant] = len(failed)
        print(f"{variant}: {len(failed)} failed of {a.rounds * a.jobs} jobs ({a.rounds * a.jobs * a.reinits} "
              f"re-inits, {a.jobs} jobs at once), {time.monotonic() - t0:.0f} s", flush=True)
    if counts.get("ours"):
        sys.exit(1)


if __name__ == "__main__":
    main()
