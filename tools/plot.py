"""Curves of a run as one PNG: ``python tools/plot.py OUTPUT_DIR [--out FILE] [--metrics a b]``.

Reads ``OUTPUT_DIR/log/metrics.jsonl`` (clipbert_legacy.training.metrics_log) and draws the training loss, the
learning rates and the validation metrics against the step, for people who would rather look than
read (tensorboard needs a server; this needs nothing). Written to ``OUTPUT_DIR/log/curves.png``
unless ``--out`` says otherwise. The validation curves drawn by default are those the run's metrics
hold of the tasks' own ``curve_metrics`` (their main metric unless they name more;
clipbert_legacy.tasks.registry).
"""
from __future__ import annotations

import argparse
import os
import sys

from clipbert_legacy.tasks.registry import load_builtin_tasks
from clipbert_legacy.training.metrics_log import read_metrics


def default_metrics() -> list[str]:
    """Every built-in task's curve metrics (``Task.curve_metrics``, else its ``main_metric``), in order."""
    tasks = load_builtin_tasks()
    return list(dict.fromkeys(m for cls in tasks for m in (cls.curve_metrics or (cls.main_metric,))))


def _series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def plot_run(output_dir: str, out: str | None = None, metrics: list[str] | None = None) -> str:
    """Draw the curves of ``output_dir``; returns the PNG path. Raises FileNotFoundError without data."""
    import matplotlib
    matplotlib.use("Agg")  # no display on clusters and CI
    import matplotlib.pyplot as plt

    path = os.path.join(output_dir, "log", "metrics.jsonl")
    train, valid = read_metrics(path, "train"), read_metrics(path, "valid")
    if not train and not valid:
        raise FileNotFoundError(f"{path} has no metrics (is {output_dir} a training run of this "
                                f"project that logged at least one step?)")
    names = metrics or [k for k in default_metrics() if any(k in r for r in valid)] or \
        sorted({k for r in valid for k in r} - {"split", "step", "epoch", "time"})[:4]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(*_series(train, "loss"), label="train loss")
    axes[0].set_title("training loss")
    for key in ("lr_transformer", "lr_cnn"):
        axes[1].plot(*_series(train, key), label=key)
    axes[1].set_title("learning rate")
    for key in names:
        axes[2].plot(*_series(valid, key), marker="o", label=key)
    axes[2].set_title("validation")
    for ax in axes:
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.suptitle(os.path.basename(os.path.normpath(output_dir)))
    fig.tight_layout()
    out = out or os.path.join(output_dir, "log", "curves.png")
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("output_dir")
    ap.add_argument("--out", help="PNG path (default OUTPUT_DIR/log/curves.png)")
    ap.add_argument("--metrics", nargs="+", help="validation metrics to draw (default: the task's main ones)")
    a = ap.parse_args(argv)
    try:
        print(plot_run(a.output_dir, a.out, a.metrics))
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
