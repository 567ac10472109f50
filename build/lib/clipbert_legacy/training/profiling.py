"""``--profile_steps A-B``: a ``torch.profiler`` trace of optimizer steps A to B on rank 0.

The trace (CPU and, on a GPU, CUDA activities, with input shapes) goes to
``log/profile/steps_A-B.pt.trace.json``: TensorBoard's profiler plugin (``torch-tb-profiler``) reads the
folder, Perfetto (ui.perfetto.dev) and ``chrome://tracing`` open the file. The operators with the most
self time are logged when the window closes. Nothing else about the run changes (MMF's and
Lightning's ``profiler`` option).
"""
from __future__ import annotations

import logging
import os

import torch
from torch.profiler import ProfilerActivity, profile

from clipbert_legacy.training.contracts import Hook

logger = logging.getLogger(__name__)
TOP_OPERATORS = 15


class StepProfiler(Hook):
    """Profiles optimizer steps ``first`` to ``last`` (1-based, inclusive) on rank 0, with their hooks
    (validation, checkpoints): the last hook, it starts after step ``first - 1``'s other hooks."""

    def __init__(self, first: int, last: int):
        self.first, self.last = first, last
        self._prof = None

    def before_train(self, trainer):
        if not trainer.is_main:
            return
        if trainer.global_step >= self.first:
            self._nothing(f"the run resumes at step {trainer.global_step}, after the first step to profile")
        elif trainer.plan.stop_step < self.first:
            self._nothing(f"the run ends at step {trainer.plan.stop_step}, before the first step to profile")
        elif trainer.global_step + 1 == self.first:
            self._start()

    def _nothing(self, why: str) -> None:
        logger.warning("profile_steps %d-%d: %s; nothing is profiled", self.first, self.last, why)

    def after_step(self, trainer, _result):
        if not trainer.is_main:
            return
        step = trainer.global_step
        if self._prof is None and step + 1 == self.first:
            self._start()
        elif self._prof is not None and (step >= self.last or trainer.finished or trainer.at_end):
            self._finish(step, os.path.join(trainer.log_dir, "profile"))

    def _start(self):
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._prof = profile(activities=activities, record_shapes=True)
        self._prof.start()

    def _finish(self, step, folder):
        prof, self._prof = self._prof, None
        prof.stop()
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"steps_{self.first}-{step}.pt.trace.json")
        prof.export_chrome_trace(path)
        cuda = torch.cuda.is_available()
        table = prof.key_averages().table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total",
                                          row_limit=TOP_OPERATORS)
        logger.info("profile of steps %d-%d -> %s; top operators by self %s time:\n%s", self.first, step,
                    path, "CUDA" if cuda else "CPU", table)

    def close(self):
        if self._prof is not None:  # the run ended inside the window: drop the partial trace
            self._prof.stop()
            self._prof = None
