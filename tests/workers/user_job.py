"""Worker for tests/test_concurrent_jobs.py: one user's small job, with results that name the job:
``user_job.py OUT TAG``. Every rank allreduces and allgathers values made from TAG, then trains a
linear model on TAG's data (rank r takes rows r::2 of every batch) with DistributedOptimizer; rank 0
writes ``OUT/result.json``. A job that talked to another job's ranks would get the other TAG's values."""
import json
import os
import sys

import torch

import clipbert_legacy.compat.hvd as hvd

STEPS, ROWS = 6, 8


def data(tag):
    g = torch.Generator().manual_seed(tag)
    return torch.randn(STEPS, ROWS, 3, generator=g), torch.randn(STEPS, ROWS, 1, generator=g)


def main():
    out, tag = sys.argv[1], int(sys.argv[2])
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()
    mine = torch.tensor([tag * 10.0 + r + 1])
    total = hvd.allreduce(mine, op=hvd.Sum, name="user.sum").item()
    gathered = hvd.allgather(mine, name="user.gather").tolist()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    xs, ys = data(tag)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x[r::n]), y[r::n]).backward()
        opt.step()
    if r == 0:
        result = {"size": n, "backend": hvd.backend_name(), "sum": total, "gathered": gathered,
                  "weight": model.weight.detach().flatten().tolist(), "bias": model.bias.item()}
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
