"""``log/metrics.jsonl``: one JSON line per logged training step and per validation, for scripts and
plots (tensorboard needs a server, log.txt a parser).

Lines are ``{"split": "train"|"valid", "step": N, "epoch": E, "time": unix seconds, <metric>: value}``.
A resumed run first drops the lines after the step it resumes from (they are redone), so every step
appears once. Written by rank 0 only.
"""
from __future__ import annotations

import json
import logging
import math
import os
import time

from clipbert_legacy.training.checkpoint_files import atomic_write_text
from clipbert_legacy.utils.errors import RunDirError, write_error
from clipbert_legacy.utils.safe_open import open_inside

logger = logging.getLogger(__name__)


class MetricsLog:
    def __init__(self, log_dir: str):
        self.path = os.path.join(log_dir, "metrics.jsonl")

    def truncate_after(self, step: int) -> None:
        """Keep only the lines of steps <= ``step`` (a resume redoes the rest)."""
        rows = [r for r in read_metrics(self.path) if r["step"] <= step]
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))

    def append(self, split: str, step: int, epoch: int, metrics: dict[str, float]) -> None:
        row = {"split": split, "step": step, "epoch": epoch, "time": round(time.time(), 3)}
        row.update({k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()})
        try:
            # never through a link planted at the name (clipbert_legacy.utils.safe_open)
            with os.fdopen(open_inside(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:
            raise write_error(self.path, e) from e


def read_metrics(path: str, split: str | None = None) -> list[dict]:
    """The lines of a ``metrics.jsonl`` (those of ``split`` only, when given); nan/inf back as floats.

    A last line without its newline that is not valid JSON is what a crash in the middle of an append
    leaves: it is dropped with a warning (the restore file holds everything it would have said). Any
    other unreadable line is an error naming the file and the line."""
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8-sig") as f:
        lines = f.read().split("\n")
    rows = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if lineno == len(lines):  # no newline after it: an interrupted append
                logger.warning("%s: dropping its last line, cut off by an interrupted write (%r)", path,
                               line[:80])
                break
            raise RunDirError(f"{path}:{lineno}: not a JSON line ({e.msg}); fix or delete that "
                              f"line") from None
        if split is None or row.get("split") == split:
            rows.append({k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in row.items()})
    return rows
