"""Failures a user can fix: the entry points print them as one line (``error: ...``), exit status 1.

Each message names the thing (file, key, step, value) and the fix. ``CLIPBERT_TRACEBACK=1`` shows the
traceback instead.
"""
import errno
import os
import shutil


class UserError(Exception):
    """Base class: bad input or state the user can correct (not a bug in this project)."""


class RunDirError(UserError, RuntimeError):
    """The output directory cannot be used for this run (in use, other settings, not writable)."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or restore file cannot be read."""


class UnsafeFileError(CheckpointError):
    """A file was refused before anything in it ran: it names code to call (a pickled global this project
    never loads), or it could take unbounded memory (clipbert_legacy.utils.safe_load)."""


class DataStoreError(UserError, RuntimeError):
    """An LMDB store cannot be opened or read."""


SHOWN_CHARS = 100  # how much of a user's value an error repeats
LINE_CHARS = 4000  # how long an error line may get, whatever it quotes


def clip(text: str, limit: int = SHOWN_CHARS) -> str:
    """``text`` on one line, cut to its first ``limit`` characters + ``... (N chars)``: an error names
    the value without repeating a 50 MB one."""
    text = str(text).replace("\r", "\\r").replace("\n", "\\n")
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} chars)"


def shown(value) -> str:
    """A user's value as errors quote it: ``repr`` of a string, JSON of anything else, clipped."""
    import json
    if isinstance(value, str):
        long = len(value) > SHOWN_CHARS
        return f"{value[:SHOWN_CHARS]!r}... ({len(value)} chars)" if long else repr(value)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return clip(text)


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (DataLoader workers and some libraries add lines), at most
    LINE_CHARS characters (the head and the end, where the fix is)."""
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    return f"{type(exc).__name__}: {line_of(msg)}"


def line_of(message) -> str:
    """A message on one line, at most LINE_CHARS characters: its head and its end (the fix) kept."""
    line = " ".join(part.strip() for part in str(message).splitlines() if part.strip())
    if len(line) <= LINE_CHARS:
        return line
    return f"{line[:LINE_CHARS - 600]} ... ({len(line)} chars) ... {line[-500:]}"


class OutputWriteError(UserError, RuntimeError):
    """A file of the run could not be written (full disk, quota, read-only or vanished mount)."""


def _mb(n: int) -> str:
    return f"{n / 2 ** 20:.1f} MB"


def free_bytes(path: str) -> int | None:
    """Free bytes on the file system of ``path`` (or of its nearest existing parent)."""
    folder = os.path.abspath(path)
    while folder and not os.path.exists(folder):
        folder = os.path.dirname(folder)
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def write_error(path: str, exc: BaseException, need_bytes: int | None = None) -> OutputWriteError:
    """One line for a failed write of ``path``: the reason, the free space and, when known, the space
    the file needed. torch.save reports a full disk as ``RuntimeError: ... unexpected pos``; with less
    free space than needed that is called what it is."""
    free = free_bytes(path)
    full = getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or (
        need_bytes is not None and free is not None and free < need_bytes)
    reason = "no space left on device" if full else (getattr(exc, "strerror", None) or one_line(exc))
    space = "" if free is None else f" ({_mb(free)} free"
    space += "" if not space else (f", about {_mb(need_bytes)} needed)" if need_bytes else ")")
    fix = ("free space there (or give --output_dir on a larger disk) and rerun the same command: it "
           "resumes from the last restore file" if full else
           "check that the folder exists and is writable, then rerun the same command")
    return OutputWriteError(f"cannot write {path}: {reason}{space}; {fix}")
