"""detectron2.checkpoint: DetectionCheckpointer / Checkpointer over the project's safe loaders."""
from .detection_checkpoint import Checkpointer, DetectionCheckpointer

__all__ = ["DetectionCheckpointer", "Checkpointer", "PeriodicCheckpointer"]


class PeriodicCheckpointer:
    """fvcore's: ``step(iteration)`` saves ``model_{iteration:07d}`` every ``period`` iterations and
    ``model_final`` at ``max_iter - 1``."""

    def __init__(self, checkpointer, period, max_iter=None):
        self.checkpointer, self.period, self.max_iter = checkpointer, int(period), max_iter

    def step(self, iteration, **kwargs):
        iteration = int(iteration)
        extra = {"iteration": iteration, **kwargs}
        if (iteration + 1) % self.period == 0:
            self.checkpointer.save(f"model_{iteration:07d}", **extra)
        if self.max_iter is not None and iteration >= self.max_iter - 1:
            self.checkpointer.save("model_final", **extra)

    def save(self, name, **kwargs):
        self.checkpointer.save(name, **kwargs)
