"""Worker of bench_restore_save.py (under ``horovodrun -np 2`` or ``torchrun --nproc_per_node 2``): trains
bench_zero's MLP at ``zero_stage 1`` with a restore file every step, timing every ``save_restore`` call.
Each round runs the engine twice, the order alternated: with the gather of the optimizer shards (and amp
O2 masters) as the project does it (``allgather_with_tensors``: one flat byte tensor), and as the
previous version did (``hvd.allgather_object``: the shard pickled, then copied into a ByteTensor).
Rank 0 writes JSON: per way, the seconds of every save and of its parts (gather, file write) on rank 0.

    horovodrun -np 2 python benchmarks/_bench_restore_worker.py --backend horovod --out J [--fp16 1 ...]
"""
import argparse
import json
import os
import shutil
import tempfile
import time

import torch

import clipbert_legacy.compat.hvd as hvd
import clipbert_legacy.training.zero as zero
from benchmarks._bench_zero_worker import MLPTask
from clipbert_legacy.config import parse_args
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.engine import Trainer

CURRENT_GATHER = zero.allgather_with_tensors


def previous_gather(obj, name):
    """The previous version's gather: the object allgather of CPU copies (zero.py before issue 38)."""
    if "state" in obj and "param_groups" in obj:  # the optimizer shard
        obj = {"state": {k: {n: v.detach().cpu().clone() if torch.is_tensor(v) else v for n, v in s.items()}
                         for k, s in obj["state"].items()}, "param_groups": obj["param_groups"]}
    else:  # amp O2's masters by name
        obj = {n: v.detach().float().cpu() for n, v in obj.items()}
    return hvd.allgather_object(obj, name=name)


class TimedSaves(Hook):
    """Wraps the checkpointer's ``save_restore``, the gathers and the file write it calls: per save, the
    seconds of the whole save, of its gathers and (rank 0) of writing the file."""

    def __init__(self, gather):
        self.gather, self.rows, self._gather_s, self._write_s = gather, [], 0.0, 0.0

    def before_train(self, trainer):
        ckpt = trainer.checkpointer
        save, write = ckpt.save_restore, ckpt.restorer.save

        def timed_save(counters):
            self._gather_s = self._write_s = 0.0
            t = time.perf_counter()
            written = save(counters)
            self.rows.append((time.perf_counter() - t, self._gather_s, self._write_s))
            return written

        def timed_write(state):
            t = time.perf_counter()
            write(state)
            self._write_s += time.perf_counter() - t
        ckpt.save_restore, ckpt.restorer.save = timed_save, timed_write

    def timed_gather(self, obj, name):
        t = time.perf_counter()
        out = self.gather(obj, name)
        self._gather_s += time.perf_counter() - t
        return out


def run(way, args, out_dir):
    n = args.steps * args.batch * hvd.size()
    argv = ["--output_dir", out_dir, "--train_batch_size", str(args.batch), "--num_train_epochs", "1",
            "--zero_stage", "1", "--fp16", str(args.fp16), "--dist_backend", args.backend,
            "--num_valid", "1", "--min_valid_steps", "1", "--n_workers", "0", "--log_interval", "1000",
            "--learning_rate", "1e-4", "--save_steps_ratio", "0.001", "--existing_run", "restart"]
    timer = TimedSaves(previous_gather if way == "previous" else CURRENT_GATHER)
    zero.allgather_with_tensors = timer.timed_gather
    try:
        Trainer(parse_args("shared", argv), MLPTask(args.dim, args.layers, n), hooks=[timer]).train()
    finally:
        zero.allgather_with_tensors = CURRENT_GATHER
    size = os.path.getsize(os.path.join(out_dir, "ckpt", "restore.pt")) if hvd.rank() == 0 else 0
    return timer.rows[args.warmup:], size


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--backend", choices=("horovod", "torch"), required=True)
    ap.add_argument("--fp16", type=int, default=0)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.set_backend(args.backend)
    hvd.init()
    base = hvd.broadcast_object(tempfile.mkdtemp(prefix="bench_restore_") if hvd.rank() == 0 else None)
    res = {w: {"saves": [], "file_bytes": 0} for w in ("previous", "current")}
    for r in range(args.rounds):
        for way in (("previous", "current") if r % 2 == 0 else ("current", "previous")):
            rows, size = run(way, args, os.path.join(base, f"{way}_{r}"))
            res[way]["saves"] += rows  # (save, gather, write) seconds per save
            res[way]["file_bytes"] = size
    hvd.barrier()
    if hvd.rank() == 0:
        shutil.rmtree(base, ignore_errors=True)
        with open(args.out, "w") as f:
            json.dump({"backend": args.backend, "world": hvd.size(), "args": vars(args), "results": res}, f)


if __name__ == "__main__":
    main()
