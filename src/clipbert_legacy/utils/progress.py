"""Progress of long loops that reads well wherever it goes.

A live tqdm bar only suits an interactive terminal with one process: under ``horovodrun`` every write is
prefixed with ``[0]<stderr>:`` and tqdm's carriage returns turn into one ever-growing line, and log
files / SLURM outputs keep every redraw. So the bar is used only when stderr is a terminal and no
launcher started us; otherwise plain lines are printed every ``interval`` seconds and at the end::

    train: 21/169 (12%) 3.4 it/s elapsed 0:00:06 ETA 0:00:43 loss 0.6931

``CLIPBERT_PROGRESS=bar|lines|off`` overrides the choice, ``CLIPBERT_PROGRESS_INTERVAL`` the seconds
between lines (default 30).
"""
from __future__ import annotations

import os
import sys
import time

from clipbert_legacy.compat import launcher_env

MODES = ("bar", "lines", "off")


def progress_mode(stream=None) -> str:
    """'bar', 'lines' or 'off' for this process (see the module docstring)."""
    forced = os.environ.get("CLIPBERT_PROGRESS", "").strip().lower()
    if forced:
        if forced not in MODES:
            raise ValueError(f"CLIPBERT_PROGRESS={forced!r}; use one of {'|'.join(MODES)}")
        return forced
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    return "bar" if tty and not launcher_env.launched() else "lines"


def _hms(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


class Progress:
    """``update(n=1, **postfix)`` and ``close()``; ``enabled=False`` (other ranks) does nothing."""

    def __init__(self, total: int | None, desc: str, initial: int = 0, enabled: bool = True,
                 interval: float | None = None, stream=None):
        self.total, self.desc, self.n, self.start_n = total, desc, initial, initial
        self.stream = stream or sys.stderr
        self.mode = progress_mode(self.stream) if enabled else "off"
        self.interval = float(os.environ.get("CLIPBERT_PROGRESS_INTERVAL", 30) if interval is None
                              else interval)
        self.t0 = self.last = time.monotonic()
        self.postfix: dict = {}
        self._bar = None
        if self.mode == "bar":
            from tqdm import tqdm
            self._bar = tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, mininterval=2.0,
                             file=self.stream)

    def update(self, n: int = 1, **postfix) -> None:
        self.n += n
        self.postfix.update(postfix)
        if self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix(postfix, refresh=False)
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self.last >= self.interval or (self.total is not None and self.n >= self.total):
                self.last = now
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def line(self) -> str:
        """``desc: n/total (pct) rate elapsed ETA postfix``."""
        elapsed = time.monotonic() - self.t0
        done = self.n - self.start_n
        rate = done / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.desc}: {self.n}" + (f"/{self.total} ({100 * self.n / max(self.total, 1):.0f}%)"
                                              if self.total else "")]
        parts.append(f"{rate:.3g} it/s elapsed {_hms(elapsed)}")
        if self.total and rate > 0:
            parts.append(f"ETA {_hms((self.total - self.n) / rate)}")
        parts += [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in self.postfix.items()]
        return " ".join(parts)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self.mode = "off"
