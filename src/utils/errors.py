"""Failures a user can fix: the entry points print them as one line (``error: ...``), exit status 1.

Each message names the thing (file, key, step, value) and the fix. ``CLIPBERT_TRACEBACK=1`` shows the
traceback instead.
"""


class UserError(Exception):
    """Base class: bad input or state the user can correct (not a bug in this project)."""


class RunDirError(UserError, RuntimeError):
    """The output directory cannot be used for this run (in use, other settings, not writable)."""


class CheckpointError(UserError, RuntimeError):
    """A checkpoint or restore file cannot be read."""


class DataStoreError(UserError, RuntimeError):
    """An LMDB store cannot be opened or read."""


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (DataLoader workers and some libraries add lines)."""
    msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    first = " ".join(part.strip() for part in str(msg).splitlines() if part.strip())
    return f"{type(exc).__name__}: {first}"
