"""Worker for tests/test_row_sparse.py: the same steps through a dense and a row-sparse
DistributedOptimizer (two copies of one model); prints, per step, whether every averaged gradient
matched bit for bit and how many table rows the row-sparse reduction moved.

``row_sparse.py MODE:BPPS:COMPRESSION [...]``: one job runs every case given, one after another, and
prints a line per case (its error instead where it raised); MODE: overlap (ranks touch overlapping row
sets), idle (rank 1 never uses the table in step 1), tied (the table is also the output layer: every row
has a gradient).
"""
import copy
import json
import sys
import traceback

import torch
from torch import nn

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.compat.hvd import row_sparse as _row_sparse

ROWS, DIM = 3000, 8


class Net(nn.Module):
    def __init__(self, tied):
        super().__init__()
        self.emb = nn.Embedding(ROWS, DIM)
        self.out = nn.Linear(DIM, ROWS if tied else 3)
        if tied:
            self.out.weight = self.emb.weight

    def forward(self, ids, use_table=True):
        h = self.emb(ids) if use_table else torch.ones(len(ids), DIM)
        return self.out(h).pow(2).mean()


def ids_for(rank, step, micro):
    start = 100 * step + 7 * micro + (40 if rank else 0)
    return torch.arange(start, start + 60) % ROWS  # ranks share 20 rows


def run_case(case, rank):
    mode, bpps, comp = case.split(":")
    bpps = int(bpps)
    torch.manual_seed(0)
    compression = hvd.Compression.fp16 if comp == "fp16" else hvd.Compression.none
    ref = Net(tied=mode == "tied")
    sp = copy.deepcopy(ref)
    opts = []
    for tag, m, rs in (("dense", ref, ()), ("sparse", sp, (sp.emb.weight,))):
        opts.append(hvd.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=0.5), named_parameters=[(f"{case}.{tag}.{n}", p) for n, p in
                                                                      m.named_parameters()],
            compression=compression, backward_passes_per_step=bpps, row_sparse=rs))
    report = []
    for step in range(3):
        use = not (mode == "idle" and rank == 1 and step == 1)
        for m, opt in zip((ref, sp), opts):  # one optimizer's collectives after the other's
            for micro in range(bpps):
                m(ids_for(rank, step, micro), use_table=use).backward()
            opt.synchronize()
        same = all(torch.equal(a.grad, b.grad) for a, b in zip(ref.parameters(), sp.parameters()))
        nonzero = int(ref.emb.weight.grad.ne(0).any(1).sum())
        report.append({"same": same, "rows": _row_sparse.LAST["rows"], "dense": _row_sparse.LAST["dense"],
                       "nonzero_rows": nonzero})
        for opt in opts:
            with opt.skip_synchronize():
                opt.step()
            opt.zero_grad()
    same_w = all(torch.equal(a, b) for a, b in zip(ref.parameters(), sp.parameters()))
    return {"steps": report, "same_weights": same_w}


def main():
    torch.set_num_threads(1)
    hvd.init()
    rank = hvd.rank()
    for case in sys.argv[1:]:
        try:
            res = run_case(case, rank)
        except Exception:
            res = {"error": traceback.format_exc()}
        print(json.dumps({"rank": rank, "case": case, **res}), flush=True)


if __name__ == "__main__":
    main()
