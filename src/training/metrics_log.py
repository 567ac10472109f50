"""``log/metrics.jsonl``: one JSON line per logged training step and per validation, for scripts and
plots (tensorboard needs a server, log.txt a parser).

Lines are ``{"split": "train"|"valid", "step": N, "epoch": E, "time": unix seconds, <metric>: value}``.
A resumed run first drops the lines after the step it resumes from (they are redone), so every step
appears once. Written by rank 0 only.
"""
from __future__ import annotations

import json
import math
import os
import time


class MetricsLog:
    def __init__(self, log_dir: str):
        self.path = os.path.join(log_dir, "metrics.jsonl")

    def truncate_after(self, step: int) -> None:
        """Keep only the lines of steps <= ``step`` (a resume redoes the rest)."""
        rows = [r for r in read_metrics(self.path) if r["step"] <= step]
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        os.replace(tmp, self.path)

    def append(self, split: str, step: int, epoch: int, metrics: dict[str, float]) -> None:
        row = {"split": split, "step": step, "epoch": epoch, "time": round(time.time(), 3)}
        row.update({k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()})
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")


def read_metrics(path: str, split: str | None = None) -> list[dict]:
    """The lines of a ``metrics.jsonl`` (those of ``split`` only, when given); nan/inf back as floats."""
    if not os.path.exists(path):
        return []
    rows = []
    with open(path) as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                if split is None or row.get("split") == split:
                    rows.append({k: float(v) if v in ("nan", "inf", "-inf") else v for k, v in row.items()})
    return rows
