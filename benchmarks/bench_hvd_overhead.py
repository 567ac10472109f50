"""What the torch backend's Horovod semantics cost, measured against a baseline in the same run.

1. The training step's fused gradient path (``DistributedOptimizer`` over ``torchrun --nproc_per_node
   2``): the same job with this checkout's ``clipbert_legacy.compat.hvd`` and with a baseline checkout's
   (``--baseline``: e.g. ``git worktree add /tmp/base <ref>``; its ``src/`` (the package's parent) is put
   first on PYTHONPATH), alternated ``--rounds`` times; median step times (wall, and CPU time of all the
   process's threads, which a shared machine disturbs less) and their ratios. The fused path does no
   negotiation: one 3-integer async allreduce per step (the join header) is all it adds.
2. Small user-facing collectives (``hvd.allreduce`` / ``hvd.broadcast`` of 16 floats): through
   ``clipbert_legacy.compat.hvd`` (matched by name and checked through the launcher's store, run by the
   process set's executor thread) and directly on a ``torch.distributed`` group, in one job; the ratio.

    .venv/bin/python benchmarks/bench_hvd_overhead.py --baseline /tmp/base [--rounds 3] [--params_m 12]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "benchmarks", "_bench_hvd_overhead_worker.py")


def _port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(mode, checkout, extra):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DIST_BACKEND": "torch",
           "PYTHONPATH": os.path.join(checkout, "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
           "127.0.0.1", "--master_port", str(_port()), WORKER, "--mode", mode, *extra]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith('{"result"')]
    if p.returncode or not lines:
        raise SystemExit(f"{mode} with {checkout} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    out = json.loads(lines[-1])
    if not out["hvd"].startswith(os.path.realpath(checkout)):
        raise SystemExit(f"{checkout}: the job imported {out['hvd']}, not that checkout's src")
    return out["result"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="a checkout to compare with (its src/ is used)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--params_m", type=float, default=12.0)
    a = ap.parse_args()
    extra = ["--steps", str(a.steps), "--params_m", str(a.params_m)]
    times = {"baseline": [], "ours": []}
    cpu = {"baseline": [], "ours": []}
    for r in range(a.rounds):  # alternated: slow phases of a shared machine hit both
        for label, checkout in (("baseline", os.path.realpath(a.baseline)), ("ours", REPO)):
            res = run("step", checkout, extra)
            times[label].append(res["step_ms"])
            cpu[label].append(res["cpu_ms"])
            print(f"round {r + 1}: {label}: {res['step_ms']:.1f} ms/step, CPU {res['cpu_ms']:.1f} ms/step "
                  f"({res['params_m']:.1f}M params)", flush=True)
    for what, d in (("wall", times), ("CPU time (all threads)", cpu)):
        base, ours = statistics.median(d["baseline"]), statistics.median(d["ours"])
        print(f"fused gradient path, 2 ranks, {what}: baseline {base:.1f} ms/step, ours {ours:.1f} ms/step, "
              f"ratio {ours / base:.3f}")
    ops = run("ops", REPO, ["--steps", "200"])
    for name in ("allreduce", "broadcast"):
        h, d = ops[f"{name}_hvd_ms"], ops[f"{name}_direct_ms"]
        print(f"hvd.{name} (16 floats): {h:.2f} ms, torch.distributed directly: {d:.2f} ms, "
              f"ratio {h / d:.1f}")
    print(json.dumps({"step_ms": times, "cpu_ms": cpu, "ops_ms": ops}))


if __name__ == "__main__":
    main()
