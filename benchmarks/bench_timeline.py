"""What the torch backend's timeline costs a negotiated operation, measured in the same job.

``torchrun --nproc_per_node 2`` (Gloo, CPU): ``--ops`` ``hvd.allreduce`` calls of 16 floats without a
timeline (the baseline) and with ``hvd.start_timeline(path, mark_cycles=True)`` (ours: every call
records NEGOTIATE_ALLREDUCE, two rank arrivals, ALLREDUCE, GLOO_ALLREDUCE and a CYCLE_START through
the writer thread), alternated ``--rounds`` times; the median time per call of each and the ratio.
``DistributedOptimizer``'s gradient buckets are not recorded, so a training step's fused path pays nothing.

    .venv/bin/python benchmarks/bench_timeline.py [--rounds 5] [--ops 300]
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(rounds: int, ops: int, out: str) -> None:
    import torch

    import clipbert_legacy.compat.hvd as hvd
    hvd.init()
    x = torch.ones(16)
    for i in range(20):  # warm-up: the groups, the store connections
        hvd.allreduce(x, name=f"warm.{i}")
    times = {"baseline": [], "timeline": []}
    for r in range(rounds):
        for mode in ("baseline", "timeline") if r % 2 == 0 else ("timeline", "baseline"):
            if mode == "timeline":
                hvd.start_timeline(os.path.join(out, f"timeline{r}.json"), mark_cycles=True)
            hvd.barrier()
            t0 = time.perf_counter()
            for i in range(ops):
                hvd.allreduce(x, name=f"{mode}.{r}.{i}")
            times[mode].append((time.perf_counter() - t0) / ops)
            if mode == "timeline":
                hvd.stop_timeline()
    if hvd.rank() == 0:
        with open(os.path.join(out, "times.json"), "w") as f:
            json.dump(times, f)
    hvd.shutdown()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--ops", type=int, default=300)
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.rounds, a.ops, a.worker)
        return
    with tempfile.TemporaryDirectory() as out:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "clipbert_legacy.compat.loopback", "torchrun", "--nproc_per_node", "2",
               "--master_addr", "127.0.0.1", "--master_port", str(port), os.path.abspath(__file__),
               "--rounds", str(a.rounds), "--ops", str(a.ops), "--worker", out]
        env = {**os.environ, "DIST_BACKEND": "torch", "OMP_NUM_THREADS": "1"}
        subprocess.run(cmd, cwd=REPO, env=env, check=True)
        times = json.load(open(os.path.join(out, "times.json")))
        events = len(json.load(open(os.path.join(out, "timeline0.json"))))
    base, ours = (statistics.median(times[m]) * 1e3 for m in ("baseline", "timeline"))
    print(f"hvd.allreduce of 16 floats, 2 ranks, {a.ops} calls x {a.rounds} rounds (medians):")
    print(f"  baseline (no timeline): {base:.3f} ms/call")
    print(f"  ours (timeline):        {ours:.3f} ms/call  ({events} records in one round's file)")
    print(f"  ratio: {ours / base:.3f}x")


if __name__ == "__main__":
    main()
