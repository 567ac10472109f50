"""Worker for tests/test_amp_horovod.py: amp O2 + hvd.DistributedOptimizer in the legacy recipe.

Scenarios (one launch, every rank runs all of them and writes amp_<rank>.json):
* ``inf``:  an inf is injected into rank 1's gradient *after* synchronize() (rank-local), on step 2.
  Both ranks must skip that step, keep the same scale and identical weights. ``inf_nosync`` repeats
  it with AMP_SYNC_OVERFLOW=0, where only rank 1 skips (shows the flag allreduce is what does it).
* ``accum``: gradient accumulation over K micro-batches with delayed unscaling, once with
  backward_passes_per_step=K and one synchronize() per optimizer step, once with bpps=1 and
  synchronize() in every micro-step. Gradient allreduce launches are counted.
* ``guard``: amp's O2 zero_grad keeps the "zero_grad before synchronize" guard.
* ``bcast_state_dict`` / ``bcast_named``: the broadcast comes *after* ``amp.initialize`` (into
  ``model.state_dict()``, or into ``model.named_parameters()``), then ClipBERT's "quick hack"
  ``zero_grad(); step()`` and three training steps. apex created its masters lazily at that first
  ``zero_grad()``, copying the model as it was then, so the broadcast weights must survive the hack
  and the ranks must stay bit-equal.
"""
import argparse
import json
import os
import warnings

import torch
from torch import nn

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.compat import amp

K = 3
COUNT = {"n": 0}


def install_allreduce_counter():
    """Count gradient allreduce launches of the DistributedOptimizer (not amp's overflow flag)."""
    if hvd.backend_name() == "horovod":
        import horovod.torch.optimizer as hopt
        for fn in ("allreduce_async_", "grouped_allreduce_async_"):
            orig = getattr(hopt, fn)

            def wrapped(*a, _orig=orig, **kw):
                COUNT["n"] += 1
                return _orig(*a, **kw)
            setattr(hopt, fn, wrapped)
    else:
        import torch.distributed as dist
        orig = dist.all_reduce

        def wrapped(*a, **kw):
            if kw.get("async_op"):
                COUNT["n"] += 1
            return orig(*a, **kw)
        dist.all_reduce = wrapped


def build(bpps, lr=0.05, broadcast_first=True):
    torch.manual_seed(1234 + hvd.rank())  # different per rank: broadcast must make them equal
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=bpps)
    if broadcast_first:  # the legacy recipe's order
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(opt, root_rank=0)
    # start at 2**10 (not 2**16) so that only the injected inf overflows
    model, opt = amp.initialize(model, opt, opt_level="O2", keep_batchnorm_fp32=True, verbosity=0,
                                max_loss_scale=2. ** 10)
    return model, opt


def flat_model(model, buffers=True):
    tensors = list(model.parameters()) + (list(model.buffers()) if buffers else [])
    return torch.cat([t.detach().float().reshape(-1) for t in tensors]).tolist()


def scenario_broadcast_after_initialize(what):
    model, opt = build(bpps=1, broadcast_first=False)
    initial = flat_model(model)  # this rank's own (fp16-rounded) weights
    hvd.broadcast_parameters(model.state_dict() if what == "state_dict" else model.named_parameters(),
                             root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    with opt.skip_synchronize():  # ClipBERT's "quick hack for amp delay_unscale bug"
        opt.zero_grad()
        opt.step()
    after_hack = flat_model(model)
    for step in range(3):
        x, y = batches(step, 0)
        with amp.scale_loss(loss_of(model, x, y), opt) as s:
            s.backward()
            opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
    masters = torch.cat([p.detach().reshape(-1) for p in amp.master_params(opt)]).tolist()
    # parameters only: BatchNorm running stats follow each rank's own data, as in any Horovod run
    return {"initial": initial, "after_hack": after_hack, "final": flat_model(model, buffers=False),
            "masters": masters}


def batches(step, micro):
    g = torch.Generator().manual_seed(1000 * step + 10 * micro + hvd.rank())  # rank-specific data
    return torch.randn(8, 6, generator=g), torch.randn(8, 2, generator=g)


def loss_of(model, x, y):
    return ((model(x) - y) ** 2).mean()


def weights(opt):
    return [p.detach().double().sum().item() for p in amp.master_params(opt)]


def scenario_inf():
    model, opt = build(bpps=1)
    skipped0 = amp.num_skipped_steps()
    scales, skipped, wsum = [], [], []
    for step in range(4):
        x, y = batches(step, 0)
        with amp.scale_loss(loss_of(model, x, y), opt) as s:
            s.backward()
            opt.synchronize()
            if step == 2 and hvd.rank() == 1:
                model[0].weight.grad.view(-1)[3] = float("inf")
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
        scales.append(amp.state_dict()["loss_scaler0"]["loss_scale"])
        skipped.append(amp.num_skipped_steps() - skipped0)
        wsum.append(weights(opt))
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    return {"scales": scales, "skipped": skipped, "wsum": wsum, "flat": flat.tolist()}


def scenario_accum(bpps):
    model, opt = build(bpps=bpps)
    COUNT["n"] = 0
    skipped0 = amp.num_skipped_steps()
    for step in range(3):
        for i in range(K):
            x, y = batches(step, i)
            with amp.scale_loss(loss_of(model, x, y) / K, opt, delay_unscale=i < K - 1) as s:
                s.backward()
                if bpps == 1 or i == K - 1:
                    opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
    flat = torch.cat([p.detach().float().reshape(-1) for p in amp.master_params(opt)])
    return {"allreduce_launches_per_step": COUNT["n"] / 3, "flat": flat.tolist(),
            "scale": amp.state_dict()["loss_scaler0"]["loss_scale"],
            "skipped": amp.num_skipped_steps() - skipped0}


def scenario_guard():
    model, opt = build(bpps=1)
    x, y = batches(0, 0)
    with amp.scale_loss(loss_of(model, x, y), opt) as s:
        s.backward()
        try:
            opt.zero_grad()
            raised = False
        except AssertionError:
            raised = True
        opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    opt.zero_grad()  # allowed after step
    return {"zero_grad_guard_raised": raised}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="amp: fp16 on CPU")
    hvd.init()
    install_allreduce_counter()
    res = {"rank": hvd.rank(), "size": hvd.size(), "backend": hvd.backend_name()}
    res["inf"] = scenario_inf()
    os.environ["AMP_SYNC_OVERFLOW"] = "0"  # negative control: without the flag allreduce ranks diverge
    res["inf_nosync"] = scenario_inf()
    del os.environ["AMP_SYNC_OVERFLOW"]
    res["accum_k"] = scenario_accum(bpps=K)
    res["accum_1"] = scenario_accum(bpps=1)
    res["guard"] = scenario_guard()
    res["bcast_state_dict"] = scenario_broadcast_after_initialize("state_dict")
    res["bcast_named"] = scenario_broadcast_after_initialize("named_parameters")
    with open(os.path.join(a.out, f"amp_{hvd.rank()}.json"), "w") as f:
        json.dump(res, f)
    print(json.dumps({"rank": res["rank"], "done": True}))


if __name__ == "__main__":
    main()
