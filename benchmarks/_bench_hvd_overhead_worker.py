"""Worker of benchmarks/bench_hvd_overhead.py (run under torchrun; rank 0 prints one JSON line).

``step``: DistributedOptimizer steps of a stack of Linear layers (the fused gradient path), per-step
wall time after ``--warmup`` steps. ``ops``: latency of small user-facing collectives through
``clipbert_legacy.compat.hvd`` (negotiated by name, checked) next to the same collective called directly on a
``torch.distributed`` group of the same ranks.
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import clipbert_legacy.compat.hvd as hvd


def step_times(a):
    torch.manual_seed(0)
    width = int((a.params_m * 1e6 / a.layers) ** 0.5)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(a.layers)])
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=1e-3),
                                   named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    x = torch.randn(a.batch, width)
    times, cpu = [], []
    for _ in range(a.warmup + a.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)  # every thread of the process (gloo's, the executors')
    return {"step_ms": 1000 * statistics.median(times[a.warmup:]),
            "cpu_ms": 1000 * statistics.median(cpu[a.warmup:]),
            "params_m": sum(p.numel() for p in model.parameters()) / 1e6}


def op_latencies(a):
    group = dist.new_group(list(range(hvd.size())))
    out = {}
    for name, hvd_call, direct in (
            ("allreduce", lambda t: hvd.allreduce(t, op=hvd.Sum), lambda t: dist.all_reduce(t, group=group)),
            ("broadcast", lambda t: hvd.broadcast(t, 0), lambda t: dist.broadcast(t, 0, group=group))):
        for label, fn in (("hvd", hvd_call), ("direct", direct)):
            t = torch.ones(16)
            for _ in range(5):
                fn(t)
            times = []
            for _ in range(a.steps):
                t0 = time.perf_counter()
                fn(t)
                times.append(time.perf_counter() - t0)
            out[f"{name}_{label}_ms"] = 1000 * statistics.median(times)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["step", "ops"], required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--params_m", type=float, default=12.0)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    res = step_times(a) if a.mode == "step" else op_latencies(a)
    if hvd.rank() == 0:
        print(json.dumps({"result": res, "hvd": hvd.__file__}), flush=True)


if __name__ == "__main__":
    main()
