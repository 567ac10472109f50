"""Worker for tests/test_hvd_numerics.py: the numbers of one 2-process job, for comparison with real
Horovod's bit for bit. ``--module horovod.torch`` runs real Horovod (under horovodrun), otherwise
``clipbert_legacy.compat.hvd`` (``DIST_BACKEND`` chooses the backend). Each rank writes
``OUT/<mode><rank>.pt`` (``.json`` for ``cycle``), or ``OUT/<mode><rank>.error`` (the traceback).

Modes:
  fp16      64,000 fixed fp32 values per rank (a quarter in fp16's subnormal range, a quarter whose sums
            overflow fp16) through fp16 compression: hvd.allreduce (Average, Sum, with prescale and
            postscale factors), grouped_allreduce, allreduce_async of an fp16 tensor, and
            DistributedOptimizer (with and without gradient_predivide_factor, two parameters in one
            fusion, op=Sum, and uncompressed fp32 with a predivide factor)
  optstate  broadcast_optimizer_state on fresh optimizers (AdamW with weight decay, SGD with momentum and
            weight decay, plain SGD over a sparse embedding with ``model=``), rank 1 created with other
            hyper-parameters; then three training steps: the parameters after the broadcast, the losses,
            the final parameters and optimizer state. With ``--clean`` (ours only) also the opt-in
            ``zero_grad_step=False``.
  cycle     (ours under horovodrun, last) HOROVOD_CYCLE_TIME before and after hvd.init() with none set, and
            Horovod's cycle time from one second of its timeline (mark_cycles: the median gap between cycles);
            then the same after a re-initialisation with 20 ms set (needs HOROVOD_TIMELINE=DYNAMIC)
"""
import argparse
import importlib
import json
import os
import re
import time
import traceback

import torch
import torch.nn.functional as F

N = 16000  # values per kind; 4 kinds = 64,000 per rank


def values(rank):
    """Fixed fp32 inputs of one rank: fp16 subnormals, small, unit and overflowing values, and edges."""
    g = torch.Generator().manual_seed(50 + rank)
    sub = (torch.rand(N, generator=g) * 2 - 1) * 6.2e-5  # |x| < 6.10e-5: fp16 subnormals (and the edge)
    small = torch.randn(N, generator=g) * 1e-3
    unit = torch.randn(N, generator=g)
    sign = torch.where(torch.rand(N - 12, generator=g) < 0.5, -1.0, 1.0)
    big = sign * (30000 + torch.rand(N - 12, generator=g) * 35000)  # two ranks' sum may pass 65504
    edges = torch.tensor([65504.0, 65519.0, 65520.0, -65504.0, 6.1035156e-05, 5.9604645e-08, 2.9802322e-08,
                          8.9406967e-08, 1e-8, -1e-8, 0.0, -0.0])
    return torch.cat([sub, small, unit, big, edges])


def fp16(hvd, r, out):
    x = values(r)
    c = hvd.Compression.fp16
    res = {
        "allreduce_avg": hvd.allreduce(x, name="n.avg", compression=c, op=hvd.Average),
        "allreduce_scaled": hvd.allreduce(x, name="n.scaled", compression=c, op=hvd.Average,
                                          prescale_factor=0.3, postscale_factor=3.0),
        "allreduce_sum": hvd.allreduce(x, name="n.sum", compression=c, op=hvd.Sum),
    }
    grouped = hvd.grouped_allreduce([x[:30000], x[30000:]], name="n.grouped", compression=c, op=hvd.Average)
    res["grouped_avg"] = torch.cat(grouped)
    res["async_fp16_avg"] = hvd.synchronize(hvd.allreduce_async(x.half(), name="n.async", op=hvd.Average))
    variants = {"opt_fp16": {"compression": c}, "opt_fp16_predivide3": {"compression": c,
                                                                         "gradient_predivide_factor": 3.0},
                "opt_fp16_sum": {"compression": c, "op": hvd.Sum},
                "opt_fp32_predivide3": {"gradient_predivide_factor": 3.0}}
    for name, kwargs in variants.items():
        res[name] = _optimizer_grads(hvd, name, x, [x.numel()], kwargs)
    res["opt_fp16_two_params"] = _optimizer_grads(hvd, "two", x, [30000, 34000], {"compression": c})
    torch.save(res, os.path.join(out, f"fp16{r}.pt"))


def _optimizer_grads(hvd, name, x, sizes, kwargs):
    """DistributedOptimizer's reduced gradient when this rank's gradient is ``x`` (split over parameters)."""
    params = [torch.nn.Parameter(torch.zeros(n)) for n in sizes]
    names = [(f"{name}.{i}", p) for i, p in enumerate(params)]
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=0.0), named_parameters=names, **kwargs)
    sum((p * part).sum() for p, part in zip(params, x.split(sizes))).backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    return torch.cat([p.grad.detach().clone() for p in params])


def _dense_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))


class _SparseModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.emb = torch.nn.Embedding(10, 4, sparse=True)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, ids):
        return self.head(self.emb(ids))


def _batch(kind, r, step):
    g = torch.Generator().manual_seed(1000 * r + step)
    if kind == "sparse":
        return torch.randint(0, 10, (4,), generator=g), torch.randn(4, 2, generator=g)
    return torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)


OPTIMIZERS = {  # rank 1 gets other hyper-parameters: the broadcast gives it rank 0's (where Horovod does)
    "adamw": ("dense", lambda ps, r: torch.optim.AdamW(ps, lr=0.01 * (1 + r), weight_decay=0.1 * (1 + r))),
    "sgd_momentum": ("dense", lambda ps, r: torch.optim.SGD(ps, lr=0.1 * (1 + r), momentum=0.9,
                                                            weight_decay=0.01 * (1 + r))),
    "sgd_sparse": ("sparse", lambda ps, r: torch.optim.SGD(ps, lr=0.1 * (1 + r))),
}


def optstate(hvd, r, out, clean):
    res = {}
    for name, (kind, make) in OPTIMIZERS.items():
        for zero_grad_step in ([True, False] if clean else [True]):
            key = name if zero_grad_step else f"{name}.clean"
            model = _SparseModel() if kind == "sparse" else _dense_model()
            if r == 1:  # other initial weights: broadcast_parameters gives every rank rank 0's
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(1.0)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            opt = hvd.DistributedOptimizer(make(model.parameters(), r), named_parameters=[
                (f"{key}.{n}", p) for n, p in model.named_parameters()])
            extra = {} if zero_grad_step else {"zero_grad_step": False}
            sparse_model = model if kind == "sparse" else None
            hvd.broadcast_optimizer_state(opt, root_rank=0, model=sparse_model, **extra)
            row = {"after_broadcast": [p.detach().clone() for p in model.parameters()],
                   "hyper": [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups],
                   "losses": []}
            for step in range(3):
                inp, target = _batch(kind, r, step)
                opt.zero_grad()
                loss = F.mse_loss(model(inp), target)
                loss.backward()
                opt.step()
                row["losses"].append(loss.detach().clone())
            row["final"] = [p.detach().clone() for p in model.parameters()]
            row["state"] = {i: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                            for i, s in opt.state_dict()["state"].items()}
            res[key] = row
    torch.save(res, os.path.join(out, f"optstate{r}.pt"))


def _cycle_ms(hvd, out, r, tag):
    """Horovod's cycle time as its timeline shows it: the median gap between CYCLE_START marks (ms) over
    about a second (rank 0 writes the timeline)."""
    path = os.path.join(out, f"timeline_{tag}_{r}.json")
    hvd.start_timeline(path, mark_cycles=True)
    time.sleep(1.0)
    hvd.stop_timeline()
    hvd.allreduce(torch.ones(1), name=f"cycle.flush.{tag}")
    time.sleep(0.5)  # Horovod's timeline writer thread
    if r:
        return None
    ts = [int(t) for t in re.findall(r'"name": "CYCLE_START", "ts": (\d+)', open(path).read())]
    gaps = sorted(b - a for a, b in zip(ts, ts[1:]))
    return {"cycles": len(ts), "median_gap_ms": gaps[len(gaps) // 2] / 1000 if gaps else None}


def cycle(hvd, r, out, env):
    """``env``: HOROVOD_CYCLE_TIME before and after main()'s hvd.init()."""
    res = dict(env)
    res["default"] = _cycle_ms(hvd, out, r, "default")
    hvd.shutdown()
    os.environ["HOROVOD_CYCLE_TIME"] = "20"
    hvd.init()
    res["set_20ms"] = _cycle_ms(hvd, out, r, "20ms")
    json.dump(res, open(os.path.join(out, f"cycle{r}.json"), "w"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", default="clipbert_legacy.compat.hvd")
    ap.add_argument("--modes", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--clean", action="store_true")
    a = ap.parse_args()
    env = {"before_init": os.environ.get("HOROVOD_CYCLE_TIME")}
    hvd = importlib.import_module(a.module)
    hvd.init()
    env["after_init"] = os.environ.get("HOROVOD_CYCLE_TIME")
    r = hvd.rank()
    print(json.dumps({"module": a.module, "size": hvd.size(), "rank": r}), flush=True)
    for mode in a.modes.split(","):
        try:
            if mode == "cycle":
                cycle(hvd, r, a.out, env)
            elif mode == "optstate":
                optstate(hvd, r, a.out, a.clean)
            else:
                globals()[mode](hvd, r, a.out)
        except Exception:
            with open(os.path.join(a.out, f"{mode}{r}.error"), "w") as f:
                f.write(traceback.format_exc())
            raise
    hvd.shutdown()


if __name__ == "__main__":
    main()
