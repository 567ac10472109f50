"""What a task supplies to the engine: model, training data, loss, evaluation (and optional hooks).

ClipBERT copied its training loop into every ``run_*.py``; here a task script subclasses :class:`Task`
(usually through ``clipbert_legacy.tasks.base.ClipBertTask``) and the one engine
(``clipbert_legacy.training.engine``) does
the rest. A task in the registry (``clipbert_legacy.tasks.registry``) also declares its ``spec`` (a
``clipbert_legacy.config.TaskSpec``: name, options, post-parse rule) and ``name = spec.name``; see
docs/adding_a_task.md.

Interface parameters an implementation does not use are named with a leading underscore there
(``def build_hooks(self, _cfg)``): ruff's unused-argument rules (ARG) accept them, and the engine
passes these arguments by position.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import torch

from clipbert_legacy.utils.device import move_to_device

if TYPE_CHECKING:
    from torch.utils.data import Dataset

    from clipbert_legacy.config import TaskSpec
    from clipbert_legacy.training.contracts import Hook


class OnDevice:
    """A loader whose batches are moved to ``device`` (the default training-loader wrapper)."""

    def __init__(self, loader, device: torch.device):
        self.loader, self.device = loader, device

    def __len__(self):
        return len(self.loader)

    def __iter__(self):
        for batch in self.loader:
            yield None if batch is None else move_to_device(batch, self.device)


class Task:
    """Override the methods marked *required*.

    ``main_metric``: key of :meth:`evaluate`'s (flattened) result used for the best checkpoint and
    early stopping when ``cfg.best_metric`` is unset. ``spec`` (a :class:`~clipbert_legacy.config.TaskSpec`)
    and ``name = spec.name``: the task's options and its registered name (clipbert_legacy.tasks.registry).
    """

    main_metric = "loss"
    curve_metrics: tuple[str, ...] = ()  # the validation curves tools/plot.py draws (default: main_metric)
    name: str = ""
    spec: TaskSpec | None = None

    def build_model(self, cfg) -> torch.nn.Module:  # required
        """The model; the engine moves it to the device."""
        raise NotImplementedError

    def build_train_data(self, cfg) -> tuple[Dataset, Any]:  # required
        """``(dataset, collate_fn)``; ``len(dataset)`` is the number of training groups."""
        raise NotImplementedError

    def wrap_train_loader(self, loader, _cfg, device: torch.device):
        """Wrap the engine's DataLoader; the batches it yields must be on ``device`` (the engine does
        not move them again). Default: :class:`OnDevice` (the batches moved, nothing else).

        The wrapper must yield one item per DataLoader batch, in order (the data position counts
        them); for a batch with nothing usable yield ``None``: the engine then runs a zero-loss
        micro-step so accumulation and the allreduce stay aligned across ranks.
        """
        return OnDevice(loader, device)

    def forward_train(self, model: torch.nn.Module, batch, cfg) -> torch.Tensor | dict:  # required
        """Mean loss of one micro-batch (scalar tensor), or a dict with 'loss' and extra scalars."""
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module, cfg, global_step: int) -> dict:  # required
        """Validation metrics at optimizer step ``global_step`` (called on every rank, model in eval mode
        under no_grad; most tasks ignore the step: ``_global_step``).

        Return a (possibly nested) dict of numbers, complete on rank 0 (gather across ranks with
        clipbert_legacy.utils.distributed.all_gather_list); nested keys are joined with '_'
        (``{"text2video": {"r1": ..}}`` -> ``text2video_r1``, TB tag ``valid/text2video_r1``).
        """
        raise NotImplementedError

    def build_hooks(self, _cfg) -> list[Hook]:
        """Extra hooks for this task, run after the engine's default hooks (default: none)."""
        return []

    def batch_size(self, batch) -> int:
        """Examples in a batch, for throughput logging."""
        if isinstance(batch, dict):
            if "n_examples_list" in batch:
                return len(batch["n_examples_list"])
            for v in batch.values():
                if torch.is_tensor(v) and v.dim() > 0:
                    return v.size(0)
        return 1

    def model_config(self, cfg) -> dict | None:
        """Dict written to ``log/model_config.json`` (default: the cfg.model_config file's content)."""
        path = cfg.model_config
        if path and os.path.isfile(path):
            with open(path) as f:
                return json.load(f)
        return None
