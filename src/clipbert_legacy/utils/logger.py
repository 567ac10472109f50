"""Logging in ClipBERT's layout: a module LOGGER, log.txt, a rank-0 tensorboardX writer, RunningMeter.

``LOGGER`` and ``TB_LOGGER`` are ClipBERT-compatible names, kept at ClipBERT's import path for users'
scripts (``from clipbert_legacy.utils.logger import LOGGER, TB_LOGGER``); this project's code uses module
loggers and :func:`make_tb_logger` instead.
"""
import logging
import math
import os
import sys
import time

from clipbert_legacy.utils.errors import one_line, write_error
from clipbert_legacy.utils.misc import NoOp

_FMT = "%(asctime)s - %(levelname)s - %(name)s -   %(message)s"
_DATEFMT = "%m/%d/%Y %H:%M:%S"
LOGGER = logging.getLogger("__main__")  # ClipBERT's scripts log under '__main__'


def setup_logging(level=logging.INFO):
    """Console logging in ClipBERT's format (called by entry points, not at import)."""
    logging.basicConfig(format=_FMT, datefmt=_DATEFMT, level=level)


def add_log_to_file(log_path):
    """Also write every log record (root logger) to ``log_path`` in ClipBERT's format."""
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    root, target = logging.getLogger(), os.path.abspath(log_path)
    for h in root.handlers:
        if isinstance(h, logging.FileHandler) and os.path.abspath(h.baseFilename) == target:
            return h
    fh = _RunLogFile(log_path)
    fh.setFormatter(logging.Formatter(_FMT, datefmt=_DATEFMT))
    fh.setLevel(logging.INFO)
    root.addHandler(fh)
    if root.getEffectiveLevel() > logging.INFO:  # INFO records must reach the file
        root.setLevel(logging.INFO)
    return fh


class _RunLogFile(logging.FileHandler):
    """log.txt: a record that cannot be written (full disk) is reported once on stderr, not as one
    traceback per record; the error that ends the run names the file that failed."""

    _reported = False

    def _open(self):
        """Opened with ``O_NOFOLLOW``: a link planted at log.txt is one error line, not a write through it."""
        from clipbert_legacy.utils.safe_open import open_inside
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in self.mode else os.O_TRUNC)
        return os.fdopen(open_inside(self.baseFilename, flags), self.mode, encoding=self.encoding,
                         errors=self.errors)

    def handleError(self, _record):
        if not self._reported:
            self._reported = True
            err = sys.exc_info()[1]
            print(f"warning: cannot write {self.baseFilename} ({one_line(err) if err else 'unknown error'}); "
                  f"log records go to the console only", file=sys.stderr, flush=True)


def remove_log_file(handler):
    logging.getLogger().removeHandler(handler)
    handler.close()


class TensorboardLogger:
    """TensorBoard scalars (ClipBERT's TB_LOGGER, holding the global step); a no-op until create().

    Events are written by the calling thread (tensorboardX's ``EventsWriter``), flushed every
    ``FLUSH_SECS`` and at close. tensorboardX's ``SummaryWriter`` writes from a thread behind a
    10-event queue: when that thread died on a full disk, the next ``add_scalar`` blocked training
    forever with no message. Here a failed write raises :class:`OutputWriteError` naming the file."""

    FLUSH_SECS = 30

    def __init__(self):
        self._writer = None
        self._file = None
        self._next_flush = 0.0
        self.global_step = 0

    def create(self, path):
        from tensorboardX.event_file_writer import EventsWriter
        try:
            os.makedirs(path, exist_ok=True)
            self._writer = EventsWriter(os.path.join(path, "events"))
        except OSError as e:
            raise write_error(os.path.join(path, "events.out.tfevents.*"), e) from e
        self._file = getattr(self._writer, "_file_name", path)
        self._next_flush = time.monotonic() + self.FLUSH_SECS

    def add_scalar(self, tag, value, step=None):
        """Non-finite values are left out (TensorBoard would plot nothing useful); the log lines
        report them."""
        if self._writer is None or not math.isfinite(float(value)):
            return
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar
        event = Event(summary=scalar(tag, float(value)), wall_time=time.time(),
                      step=self.global_step if step is None else step)
        self._guarded(self._writer.write_event, event)
        if time.monotonic() >= self._next_flush:
            self.flush()

    def _guarded(self, fn, *args):
        try:
            return fn(*args)
        except OSError as e:
            self._writer = None  # nothing more is written to a file that failed (and close() skips it)
            raise write_error(self._file, e) from e

    def log_scalar_dict(self, log_dict, step=None):
        """Log flat {tag: number}; nested dicts are flattened as ``a/b`` (ClipBERT raised TypeError)."""
        for tag, v in _flatten(log_dict):
            self.add_scalar(tag, v, step)

    def step(self):
        self.global_step += 1

    def flush(self):
        if self._writer is not None:
            self._guarded(self._writer.flush)
            self._next_flush = time.monotonic() + self.FLUSH_SECS

    def close(self):
        if self._writer is not None:
            writer = self._writer
            self._guarded(writer.close)
            self._writer = None


def _flatten(d, prefix=""):
    for k, v in d.items():
        tag = f"{prefix}/{k}" if prefix else str(k)
        if isinstance(v, dict):
            yield from _flatten(v, tag)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            yield tag, v
        elif hasattr(v, "item"):
            yield tag, float(v.item())


TB_LOGGER = TensorboardLogger()


def make_tb_logger(path, is_rank0):
    """A TensorboardLogger writing to ``path`` on rank 0, a NoOp elsewhere."""
    if not is_rank0:
        return NoOp()
    tb = TensorboardLogger()
    tb.create(path)
    return tb


class RunningMeter:
    """Exponentially smoothed value: the first call sets it, then ``(1-smooth)*v + smooth*prev``."""

    def __init__(self, name, val=None, smooth=0.99):
        self._name = name
        self._sm = smooth
        self._val = val

    def __call__(self, value):
        value = float(value)
        self._val = value if self._val is None else value * (1 - self._sm) + self._val * self._sm

    def __str__(self):
        return f"{self._name}: {self._val:.4f}"

    @property
    def val(self):
        return self._val

    def reset(self, val=None):
        """Start again from ``val`` (None: the next value sets it), e.g. from a restored state."""
        self._val = None if val is None else float(val)

    @property
    def name(self):
        return self._name

    def state_dict(self):
        return {"name": self._name, "val": self._val, "smooth": self._sm}

    def load_state_dict(self, sd):
        self._val = sd["val"]
