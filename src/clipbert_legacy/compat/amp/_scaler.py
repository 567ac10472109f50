"""apex's loss scaler: dynamic (start 2**16, x2 after ``scale_window`` clean steps, /2 on overflow,
optional min/max caps) or a static scale that never skips a step."""
from __future__ import annotations


class LossScaler:
    """apex's loss scaler: dynamic (x2 every ``scale_window`` clean updates, /2 on overflow) or static."""

    def __init__(self, loss_scale: float | str, init_scale: float = 2. ** 16, scale_factor: float = 2.,  # noqa: ARG002 (apex's signature; see below)
                 scale_window: int = 2000, min_loss_scale: float | None = None,
                 max_loss_scale: float | None = 2. ** 24) -> None:
        # scale_factor is accepted and ignored: apex hard-codes 2.
        self._max_loss_scale = max_loss_scale
        self._min_loss_scale = min_loss_scale
        self._scale_seq_len = scale_window
        self._unskipped = 0
        self._has_overflow = False
        if loss_scale == "dynamic":
            self.dynamic = True
            start = init_scale if max_loss_scale is None else min(max_loss_scale, init_scale)
            self._loss_scale = float(start)
        else:
            self.dynamic = False
            self._loss_scale = float(loss_scale)

    def loss_scale(self) -> float:
        return self._loss_scale

    def clear_overflow_state(self) -> None:
        self._has_overflow = False

    def update_scale(self) -> bool:
        """Apply the overflow state of the last unscale; returns True when the step must be skipped."""
        if self._has_overflow and self.dynamic:
            should_skip = True
            new = self._loss_scale / 2.
            self._loss_scale = max(self._min_loss_scale, new) if self._min_loss_scale else new
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len and self.dynamic:
            new = self._loss_scale * 2.
            self._loss_scale = min(self._max_loss_scale, new) if self._max_loss_scale else new
            self._unskipped = 0
        return should_skip
