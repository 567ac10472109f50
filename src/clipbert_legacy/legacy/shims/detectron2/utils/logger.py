"""detectron2's ``setup_logger`` (a named logger printing on rank 0 and, given ``output``, writing a file
per rank) and ``log_first_n`` / ``log_every_n`` / ``log_every_n_seconds``."""
import functools
import logging
import os
import sys
import time
from collections import Counter

__all__ = ["setup_logger", "log_first_n", "log_every_n", "log_every_n_seconds"]

_FORMAT = "[%(asctime)s] %(name)s %(levelname)s: %(message)s"


@functools.lru_cache  # one set of handlers per (output, rank, name), however often a fork calls it
def setup_logger(output=None, distributed_rank=0, *, color=True, name="detectron2", abbrev_name=None):
    """The logger ``name`` at DEBUG, not propagating: stdout on rank 0; ``output`` a ``.txt``/``.log`` file or
    a directory (``log.txt`` in it); ranks above 0 write ``<file>.rank<N>``."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    formatter = logging.Formatter(_FORMAT, datefmt="%m/%d %H:%M:%S")
    if distributed_rank == 0:
        handler = logging.StreamHandler(stream=sys.stdout)
        handler.setLevel(logging.DEBUG)
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    if output is not None:
        filename = output if output.endswith((".txt", ".log")) else os.path.join(output, "log.txt")
        if distributed_rank > 0:
            filename = f"{filename}.rank{distributed_rank}"
        os.makedirs(os.path.dirname(os.path.abspath(filename)), exist_ok=True)
        handler = logging.FileHandler(filename, encoding="utf-8")
        handler.setLevel(logging.DEBUG)
        handler.setFormatter(formatter)
        logger.addHandler(handler)
    return logger


_COUNTS = Counter()
_LAST = {}


def _caller_key():
    frame = sys._getframe(2)
    return frame.f_code.co_filename, frame.f_lineno, frame.f_globals.get("__name__", "detectron2")


def log_first_n(lvl, msg, n=1, *, name=None, key="caller"):
    """Log ``msg`` only the first ``n`` times this call site (``key="caller"``) or message (``"message"``)
    logs."""
    filename, lineno, module = _caller_key()
    keys = (key,) if isinstance(key, str) else tuple(key)
    k = tuple([(filename, lineno)] * ("caller" in keys) + [msg] * ("message" in keys))
    _COUNTS[k] += 1
    if _COUNTS[k] <= n:
        logging.getLogger(name or module).log(lvl, msg)


def log_every_n(lvl, msg, n=1, *, name=None):
    """Log ``msg`` on the 1st, (n+1)th, ... call from this call site."""
    filename, lineno, module = _caller_key()
    _COUNTS[(filename, lineno)] += 1
    if n == 1 or _COUNTS[(filename, lineno)] % n == 1:
        logging.getLogger(name or module).log(lvl, msg)


def log_every_n_seconds(lvl, msg, n=1, *, name=None):
    """Log ``msg`` from this call site at most once every ``n`` seconds."""
    filename, lineno, module = _caller_key()
    now = time.time()
    if now - _LAST.get((filename, lineno), -float("inf")) >= n:
        logging.getLogger(name or module).log(lvl, msg)
        _LAST[(filename, lineno)] = now
