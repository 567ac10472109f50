"""Worker for tests/test_hvd_api.py: checks of the horovod.torch API (``--modes``, run in order in one job),
under horovodrun (real Horovod) or torchrun (the torch backend); each rank writes ``OUT/<mode><rank>.json``
(or ``.pt``), or ``OUT/<mode><rank>.error`` (the traceback) when the check raised, and then stops.

Modes:
  autograd  a loss computed on ``hvd.allgather`` of every rank's features; writes the parameter
            gradients summed over ranks (with ``--world 2`` and no launcher: the one-process gradients on the
  whole batch) sparse    nn.Embedding(sparse=True) vs a dense copy, both through DistributedOptimizer; final
  weights mismatch  an allreduce of different shapes per rank (then one that matches); the errors join
  uneven batches (rank 0: 2, rank 1: 4) with DistributedOptimizer and a per-step loss
            allreduce, then hvd.join(); final weights, join's return, the loss sums
  ops       reducescatter / alltoall / grouped / async / in-place / integer / process-set results
            checked against Horovod's definitions (each check's expected value is computed here)
  syncbn    hvd.SyncBatchNorm on CPU, each rank one part of a batch; outputs, running stats and
            gradients (with ``--world 2`` and no launcher: torch's BatchNorm1d on the whole batch)
  timeline  start_timeline / an allreduce / stop_timeline; rank 0 writes the trace
  reinit    init / collectives / shutdown, three times; is_initialized() along the way
  leave     (last) rank 1 ends its process while rank 0 waits in an allreduce: rank 0's error and how long
it took"""
import argparse
import json
import os
import time
import traceback

import torch
import torch.nn.functional as F

import clipbert_legacy.compat.hvd as hvd

DIM, FEAT, B = 4, 3, 4  # input dim, feature dim, rows per rank


def global_batch(world):
    g = torch.Generator().manual_seed(3)
    return torch.randn(world * B, DIM, generator=g)


def autograd(a, r, n):
    torch.manual_seed(0)
    model = torch.nn.Linear(DIM, FEAT)
    x = global_batch(a.world)
    local = x[r * B:(r + 1) * B] if n > 1 else x
    feats = model(local)
    gathered = hvd.allgather(feats) if n > 1 else feats  # the whole batch, in rank order
    logits = gathered @ gathered.t() / 0.5
    loss = F.cross_entropy(logits, torch.arange(logits.shape[0]))  # the same loss on every rank
    loss.backward()
    grads = {k: p.grad for k, p in model.named_parameters()}
    if n > 1:  # each rank holds its part of the whole-batch gradient: their sum is the gradient
        grads = {k: hvd.allreduce(g, op=hvd.Sum, name=f"grad.{k}") for k, g in grads.items()}
    torch.save({"loss": loss.detach(), **grads}, os.path.join(a.out, f"autograd{r}.pt"))


def sparse(a, r, _n):
    out = {}
    for as_dense in (False, True):
        torch.manual_seed(0)
        emb_sparse = torch.nn.Embedding(10, 3, sparse=True)
        emb_dense = torch.nn.Embedding(10, 3)
        emb_dense.load_state_dict(emb_sparse.state_dict())
        init = emb_dense.weight.detach().clone()
        opt_s = hvd.DistributedOptimizer(torch.optim.SGD(emb_sparse.parameters(), lr=0.5),
                                         named_parameters=[(f"s{as_dense}.w", emb_sparse.weight)],
                                         sparse_as_dense=as_dense)
        opt_d = hvd.DistributedOptimizer(torch.optim.SGD(emb_dense.parameters(), lr=0.5),
                                         named_parameters=[(f"d{as_dense}.w", emb_dense.weight)])
        for step in range(3):
            ids = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]] if r == 0 else [[1, 3, 4], [4, 7, 9]])
            ids = (ids + step % 2) % 10
            for emb, opt in ((emb_sparse, opt_s), (emb_dense, opt_d)):
                opt.zero_grad()
                (emb(ids) ** 2).sum().backward()
                opt.step()
        out[f"as_dense={as_dense}"] = {"sparse_grad_was_sparse": emb_sparse.weight.grad.is_sparse,
                                       "max_diff": float((emb_sparse.weight - emb_dense.weight).abs().max()),
                                       "moved": float((emb_dense.weight - init).abs().max())}
    json.dump(out, open(os.path.join(a.out, f"sparse{r}.json"), "w"))


def mismatch(a, r, _n):
    errors = {}
    for case, fn in (("shape", lambda: hvd.allreduce(torch.ones(3 + r), name="mismatch.shape")),
                     ("dtype", lambda: hvd.allreduce(torch.ones(3, dtype=[torch.float32, torch.int32][r]))),
                     ("root", lambda: hvd.broadcast(torch.ones(3), root_rank=r)),
                     ("allgather_dims", lambda: hvd.allgather(torch.ones(2, 3 + r)))):
        try:
            fn()
            errors[case] = None
        except RuntimeError as e:  # Horovod raises HorovodInternalError (a RuntimeError) for all of them
            errors[case] = f"{type(e).__name__}: {e}"
    model = torch.nn.Linear(3, 2 + r)  # a model that differs between the ranks
    try:
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters())
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        errors["model"] = None
    except (RuntimeError, ValueError) as e:  # torch backend: when the optimizer is made; Horovod: at step
        errors["model"] = f"{type(e).__name__}: {e}"
    after = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="after").tolist()  # the job goes on
    json.dump({"errors": errors, "after": after}, open(os.path.join(a.out, f"mismatch{r}.json"), "w"))


def join(a, r, n):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    g = torch.Generator().manual_seed(5)
    batches = [torch.randn(4, 3, generator=g) for _ in range(2 * 4)]  # 4 steps x 2 ranks
    mine = [batches[2 * s + r] for s in range(2 if r == 0 else 4)] if n > 1 else batches
    losses = []
    for x in mine:
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        losses.append(float(hvd.allreduce(loss.detach(), op=hvd.Sum, name="join.loss")))
    last = hvd.join()
    torch.save({"last": last, "losses": losses, **model.state_dict()}, os.path.join(a.out, f"join{r}.pt"))


def syncbn(a, r, n):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(a.world * B, 4, 3, generator=g) * 3 + 1  # (N, C, L)
    w = torch.randn(a.world * B, 4, 3, generator=g)
    if n > 1:
        bn = hvd.SyncBatchNorm(4)
        x, w = x[r * B:(r + 1) * B], w[r * B:(r + 1) * B]
    else:
        bn = torch.nn.BatchNorm1d(4)
    x.requires_grad_()
    out = bn(x)
    (out * w).sum().backward()
    grads = {"x": x.grad, "weight": bn.weight.grad, "bias": bn.bias.grad}
    if n > 1:  # the input gradient is each rank's rows; parameter gradients are summed by the optimizer
        grads = {"x": hvd.allgather(grads["x"]), "weight": hvd.allreduce(grads["weight"], op=hvd.Sum),
                 "bias": hvd.allreduce(grads["bias"], op=hvd.Sum)}
        out = hvd.allgather(out.detach())
    torch.save({"out": out.detach(), "running_mean": bn.running_mean, "running_var": bn.running_var, **grads},
               os.path.join(a.out, f"syncbn{r}.pt"))


def timeline(a, r, _n):
    path = os.path.join(a.out, f"timeline{r}.json")
    hvd.start_timeline(path)
    hvd.allreduce(torch.ones(3), name="timeline.allreduce")
    hvd.stop_timeline()


def reinit(a, r, _n):
    seen = []
    for i in range(3):
        hvd.init()
        ps = hvd.add_process_set([1]) if i == 1 else None
        total = hvd.allreduce(torch.ones(1) * (r + 1), op=hvd.Sum, name=f"reinit.{i}").item()
        in_set = hvd.allreduce(torch.ones(1), op=hvd.Sum, process_set=ps).item() if ps and r == 1 else None
        seen.append([hvd.is_initialized(), total, in_set, hvd.rank(), hvd.size()])
        hvd.barrier()  # rank 0 is not in the set: without this it shuts down before rank 1's allreduce ends
        hvd.shutdown()
        seen.append(hvd.is_initialized())
    hvd.init()
    json.dump(seen, open(os.path.join(a.out, f"reinit{r}.json"), "w"))


def leave(a, r, _n):
    if r == 1:  # the job's loop ends here: this process exits cleanly with rank 0 still waiting
        json.dump({"left": True}, open(os.path.join(a.out, "leave1.json"), "w"))
        return
    t0 = time.monotonic()
    try:
        hvd.allreduce(torch.ones(2), name="leave.after")
        error = None
    except Exception as e:  # Horovod: HorovodInternalError (a RuntimeError) naming the shutdown
        error = f"{type(e).__name__}: {e}"
    json.dump({"error": error, "seconds": time.monotonic() - t0},
              open(os.path.join(a.out, "leave0.json"), "w"))


MODES = ["autograd", "sparse", "mismatch", "join", "ops", "syncbn", "timeline", "reinit", "leave"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", required=True, help=f"comma-separated, in order: {','.join(MODES)}")
    ap.add_argument("--out", required=True)
    ap.add_argument("--world", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    for mode in a.modes.split(","):  # one job, several checks: each leaves the job usable
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}; modes: {', '.join(MODES)}")
        try:
            if mode == "ops":
                from tests.workers.hvd_api_ops import run_checks
                json.dump(run_checks(hvd), open(os.path.join(a.out, f"ops{hvd.rank()}.json"), "w"))
            else:
                globals()[mode](a, hvd.rank(), hvd.size())
        except Exception:  # that check's test reports it; the ranks may now disagree: no further check
            with open(os.path.join(a.out, f"{mode}{hvd.rank()}.error"), "w") as f:
                f.write(traceback.format_exc())
            raise
    print(json.dumps({"rank": hvd.rank(), "size": hvd.size(), "backend": hvd.backend_name()}), flush=True)


if __name__ == "__main__":
    main()
