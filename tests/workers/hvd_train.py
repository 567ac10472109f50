"""Worker for tests/test_hvd.py: train a tiny model with rank-specific data, dump the weights.

Rank r of R gets rows [r*b:(r+1)*b] of each global batch of R*b rows, so the averaged gradient
equals the single-process gradient on the whole global batch (run with size 1 and --world R).
"""
import argparse
import json
import os
import time

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.utils.distributed import all_gather_list, any_broadcast


def gather(a, r):
    """all_gather_list / any_broadcast: small, 10 MB, mixed types, fresh copies (gather<r>.json)."""
    small = all_gather_list(b"x" if r == 0 else b"y")
    big = all_gather_list(bytes([r]) * (10 * 2 ** 20))
    # objects of different types per rank (Horovod would name the ops differently and hang)
    mixed = all_gather_list(None if r == 0 else f"rank{r}")
    root = any_broadcast("from root" if r == 0 else None)
    mine = {"rank": r, "items": [r]}
    gathered = all_gather_list(mine)
    gathered[r]["items"].append("edited")  # must not reach the caller's object
    json.dump({"small": [s.decode() for s in small],
               "big": [[len(x), x[0], x[-1]] for x in big],
               "mixed": [mixed, root],
               "fresh": [mine == {"rank": r, "items": [r]}, gathered[r] is not mine,
                         [g["rank"] for g in gathered]]},
              open(os.path.join(a.out, f"gather{r}.json"), "w"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--bpps", type=int, default=1)
    ap.add_argument("--world", type=int, default=2, help="number of data shards per global batch")
    ap.add_argument("--b", type=int, default=4)
    ap.add_argument("--mode", default="train", choices=["train", "misuse"])
    ap.add_argument("--gather", action="store_true", help="after training: the all_gather_list checks")
    ap.add_argument("--wait_probe", type=float, default=0.0,
                    help="after training: rank 1 starts its backward this many seconds late; rank 0 "
                         "reports the CPU its optimizer.synchronize() used while waiting")
    a = ap.parse_args()
    torch.set_num_threads(1)
    hvd.init()
    r, n = hvd.rank(), hvd.size()

    torch.manual_seed(100 + r)  # different init per rank: broadcast_parameters must fix it
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1),
                                torch.nn.Linear(1, 1))  # last layer unused below
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   backward_passes_per_step=a.bpps)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)

    if a.mode == "misuse":
        x = torch.randn(2, 6)
        for _ in range(a.bpps + 1):  # one backward too many before step()
            model[:3](x).sum().backward()
        return

    g = torch.Generator().manual_seed(7)
    shard = a.world // n
    for _ in range(a.steps):
        for _ in range(a.bpps):
            x = torch.randn(a.world * a.b, 6, generator=g)
            y = torch.randn(a.world * a.b, 1, generator=g)
            rows = slice(r * shard * a.b, (r + 1) * shard * a.b)
            loss = ((model[:3](x[rows]) - y[rows]) ** 2).mean() / a.bpps
            loss.backward()
        opt.synchronize()
        with opt.skip_synchronize():
            opt.step()
        opt.zero_grad()
    torch.save(dict(model.state_dict()), os.path.join(a.out, f"w{r}.pt"))
    print(json.dumps({"rank": r, "size": n, "backend": hvd.backend_name()}), flush=True)
    if a.wait_probe:
        if r == 1:
            time.sleep(a.wait_probe)
        for _ in range(a.bpps):
            model[:3](torch.randn(2, 6)).sum().backward()
        cpu, wall = time.thread_time(), time.perf_counter()
        opt.synchronize()  # rank 0 waits here for rank 1's late gradients
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        opt.zero_grad()
        with open(os.path.join(a.out, f"wait{r}.json"), "w") as f:
            json.dump({"rank": r, "wait_cpu_s": round(cpu, 4), "wait_wall_s": round(wall, 4)}, f)
    if a.gather:
        gather(a, r)


if __name__ == "__main__":
    main()
