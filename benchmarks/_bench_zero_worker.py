"""Worker of bench_zero.py (under ``torchrun --nproc_per_node 2``): train an MLP with the engine at
``zero_stage`` 0, 1, 2 in turn, settings alternated over rounds; rank 0 writes JSON with each rank's
optimizer-state bytes and every step's time.

    torchrun --nproc_per_node 2 benchmarks/_bench_zero_worker.py --out J [--fp16 1 --steps 12 ...]
"""
import argparse
import json
import os
import shutil
import tempfile

import torch
from torch import nn
from torch.utils.data import Dataset

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config import parse_args
from clipbert_legacy.training.engine import Hook, Task, Trainer
from clipbert_legacy.training.zero import optimizer_state_bytes


class Regression(Dataset):
    def __init__(self, n, dim):
        g = torch.Generator().manual_seed(0)
        self.x, self.y = torch.randn(n, dim, generator=g), torch.randn(n, 1, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def collate(items):
    return {"x": torch.stack([a for a, _ in items]), "y": torch.stack([b for _, b in items])}


class MLPTask(Task):
    """``layers`` Linear(dim, dim) + ReLU and a head: BERT-like parameter count per layer, no data cost."""

    def __init__(self, dim, layers, n):
        self.dim, self.layers, self.n = dim, layers, n

    def build_model(self, cfg):
        torch.manual_seed(0)
        body = [m for _ in range(self.layers) for m in (nn.Linear(self.dim, self.dim), nn.ReLU())]
        return nn.Sequential(*body, nn.Linear(self.dim, 1))

    def build_train_data(self, cfg):
        return Regression(self.n, self.dim), collate

    def forward_train(self, model, batch, cfg):
        return nn.functional.mse_loss(model(batch["x"]).float(), batch["y"])

    def evaluate(self, model, cfg, global_step):
        return {"loss": 0.0}

    def batch_size(self, batch):
        return len(batch["x"])


class Measure(Hook):
    def before_train(self, trainer):
        self.seconds = []

    def after_step(self, trainer, result):
        self.seconds.append(result.seconds)

    def after_train(self, trainer, summary):
        self.state_bytes = optimizer_state_bytes(trainer.optimizer, trainer.model)


def run(stage, args, out_dir):
    n = args.steps * args.batch * hvd.size()
    argv = ["--output_dir", out_dir, "--train_batch_size", str(args.batch), "--num_train_epochs", "1",
            "--zero_stage", str(stage), "--fp16", str(args.fp16), "--dist_backend", "torch",
            "--num_valid", "1", "--min_valid_steps", "1", "--n_workers", "0", "--log_interval", "1000",
            "--learning_rate", "1e-4", "--grad_norm", "1.0", "--existing_run", "restart"]
    m = Measure()
    Trainer(parse_args("shared", argv), MLPTask(args.dim, args.layers, n), hooks=[m]).train()
    return {"state_bytes": hvd.allgather_object(m.state_bytes), "seconds": m.seconds[args.warmup:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--fp16", type=int, default=0)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(1)
    hvd.set_backend("torch")
    hvd.init()
    base = hvd.broadcast_object(tempfile.mkdtemp(prefix="bench_zero_") if hvd.rank() == 0 else None)
    results = {str(z): {"state_bytes": None, "seconds": []} for z in (0, 1, 2)}
    for r in range(args.rounds):
        for z in ((0, 1, 2) if r % 2 == 0 else (2, 1, 0)):  # alternated: drift hits every setting alike
            res = run(z, args, os.path.join(base, f"z{z}_r{r}"))
            results[str(z)]["state_bytes"] = res["state_bytes"]
            results[str(z)]["seconds"] += res["seconds"]
    hvd.barrier()
    if hvd.rank() == 0:
        shutil.rmtree(base, ignore_errors=True)
        with open(args.out, "w") as f:
            json.dump({"world": hvd.size(), "args": vars(args), "results": results}, f)


if __name__ == "__main__":
    main()
