"""A tiny task for engine tests: noisy linear regression with ClipBERT-style parameter names."""
import os
import time

import torch
from torch import nn
from torch.utils.data import Dataset

from clipbert_legacy.config import parse_args
from clipbert_legacy.training.task import Task

DIM = 6


class ToyDataset(Dataset):
    """Fixed features/targets; __getitem__ adds noise from the global torch RNG (an 'augmentation')."""

    def __init__(self, n, seed=0, noise=0.05):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, DIM, generator=g)
        w = torch.randn(DIM, 1, generator=g)
        self.y = self.x @ w + 0.1
        self.noise = noise

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i] + self.noise * torch.randn(DIM), self.y[i]


def collate(items):
    return {"x": torch.stack([a for a, _ in items]), "y": torch.stack([b for _, b in items]),
            "n_examples_list": [1] * len(items)}


class ToyModel(nn.Module):
    def __init__(self, dropout=0.1):
        super().__init__()
        self.cnn = nn.Sequential()
        self.cnn.add_module("feature", nn.Linear(DIM, DIM))
        self.cnn.add_module("grid_encoder", nn.Linear(DIM, DIM))
        self.transformer = nn.Module()
        self.transformer.dense = nn.Linear(DIM, DIM)
        self.transformer.LayerNorm = nn.LayerNorm(DIM)
        self.transformer.drop = nn.Dropout(dropout)
        self.transformer.head = nn.Linear(DIM, 1)
        self.transformer.unused_head = nn.Linear(DIM, 1)  # never in the graph: zero_none_grad

    def forward(self, x):
        h = torch.relu(self.cnn(x))
        h = self.transformer.LayerNorm(self.transformer.dense(h) + h)
        return self.transformer.head(self.transformer.drop(h))


class ToyTask(Task):
    main_metric = "loss"

    def __init__(self, n_train=32, dropout=0.1, nan_at_forward=None, sleep=0.0, metric_curve=None,
                 multi_ratios=None):
        self.n_train, self.dropout, self.multi_ratios = n_train, dropout, multi_ratios
        self.nan_at_forward, self.sleep = nan_at_forward, sleep
        self.metric_curve = metric_curve
        self.n_forward = 0
        self.val = ToyDataset(16, seed=1, noise=0.0)

    def build_model(self, cfg):
        return ToyModel(self.dropout)

    def build_train_data(self, cfg):
        if self.multi_ratios:  # several datasets (MetaSampler): dataset d's targets are offset by 10 * d
            from clipbert_legacy.datasets.multi import MultiDataset
            parts = [ToyDataset(self.n_train, seed=d) for d in range(len(self.multi_ratios))]
            for d, part in enumerate(parts):
                part.y = part.y + 10.0 * d
            return MultiDataset(parts, self.multi_ratios, [f"toy{d}" for d in range(len(parts))]), collate
        return ToyDataset(self.n_train, seed=0), collate

    def forward_train(self, model, batch, cfg):
        self.n_forward += 1
        if self.sleep:
            time.sleep(self.sleep)
        loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
        if self.nan_at_forward is not None and self.n_forward >= self.nan_at_forward:
            loss = loss * float("nan")
        return loss

    def evaluate(self, model, cfg, global_step):
        loss = nn.functional.mse_loss(model(self.val.x), self.val.y).item()
        out = {"loss": loss, "extra": {"neg_loss": -loss}}
        if self.metric_curve is not None:
            out["score"] = self.metric_curve(global_step)
        return out


def toy_cfg(output_dir, **overrides):
    """A validated config (through clipbert_legacy.config) for the toy task."""
    return parse_args("shared", toy_argv(output_dir, **overrides))


TOY_DEFAULTS = {"train_batch_size": 4, "num_train_epochs": 2, "learning_rate": 1e-2,
                "cnn_learning_rate": 2e-2, "cnn_lr_mul": 2.0, "num_valid": 2, "min_valid_steps": 1,
                "save_steps_ratio": 0.25,
                "n_workers": 0, "seed": 7, "warmup_ratio": 0.1, "log_interval": 5}


def toy_argv(output_dir, **overrides):
    """The command line of :func:`toy_cfg` (for ``clipbert_legacy.tasks.entry.main("shared", ...)``)."""
    base = {"output_dir": str(output_dir), **TOY_DEFAULTS,
            "dist_backend": os.environ.get("TOY_DIST_BACKEND", "auto")}
    base.update(overrides)
    argv = []
    for k, v in base.items():
        argv += [f"--{k}"] + ([str(x) for x in v] if isinstance(v, list) else [str(v)])
    return argv
