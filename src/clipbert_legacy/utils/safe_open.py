"""Opening files that someone else may have planted: regular files only, and (inside the output folder)
never through a symbolic link.

* :func:`open_regular`: a file to read (a checkpoint, weights). ``open()`` of a FIFO blocks until a
  writer comes (forever: SIGTERM's handler never runs), and a device (``/dev/zero``, ``/dev/urandom``)
  reads without end. The file is opened with ``O_NONBLOCK`` (a FIFO's open returns at once) and
  refused unless ``fstat`` says it is a regular file; ``follow_symlinks=False`` adds ``O_NOFOLLOW``
  (files of the run's own folder, which the run never writes as links).
* :func:`open_inside` / :func:`check_real_dir`: files the run writes in its output folder: created
  with ``O_NOFOLLOW`` in a folder that is itself a real directory (not a link), so a link planted there
  (``.run.lock`` -> a file elsewhere, ``ckpt`` -> another folder) is refused in one line instead of
  being written (or cleaned up) through.
* :func:`ends_on_sigterm`: while a file loads, SIGTERM and SIGUSR1 end the process as they do by default
  (training's preemption handler only records them, and a load has nothing to save).
"""
from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import threading

from clipbert_legacy.utils.errors import UnsafeFileError

__all__ = ["open_regular", "open_inside", "check_real_dir", "remove_inside", "ends_on_sigterm", "kind_of"]


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path: str, follow_symlinks: bool = True):
    """``path`` opened for binary reading (a file object), or one :class:`UnsafeFileError` line when it is
    not a regular file (a FIFO, a device, a socket, a directory; with ``follow_symlinks=False`` a symbolic
    link). A missing file raises ``FileNotFoundError`` as ``open()`` does."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks:
            raise UnsafeFileError(f"{path} was refused: it is a symbolic link, and this project never writes "
                                  f"one there (someone else may have planted it); delete it") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafeFileError(f"{path} was refused: it is {kind_of(st.st_mode)}, not a regular file (reading "
                              f"it could block or never end); give the path of the file itself")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def check_real_dir(path: str, what: str) -> None:
    """``path`` is a directory and not a symbolic link (``lstat``), else one :class:`UnsafeFileError` line.
    A symbolic link there would make every file the run writes or deletes in it land elsewhere."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeFileError(f"{path} was refused: {what} is a symbolic link (to {os.readlink(path)!r}); "
                              f"the run writes and deletes files in it and would reach outside its output "
                              f"folder. "
                              f"Replace it by a real directory, or give another --output_dir")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeFileError(f"{path} was refused: {what} is {kind_of(st.st_mode)}, not a directory; move "
                              f"it away, or give another --output_dir")


def open_inside(path: str, flags: int, mode: int = 0o644) -> int:
    """``os.open(path, flags | O_NOFOLLOW | O_CLOEXEC)`` (a descriptor): a symbolic link at ``path`` is one
    :class:`UnsafeFileError` line instead of a write through it."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise UnsafeFileError(f"{path} was refused: it is a symbolic link, which this project never writes "
                              f"(someone else may have planted it to make the run overwrite its target); "
                              f"delete it") from None


def remove_inside(path: str) -> bool:
    """Delete ``path`` if it is a regular file (``lstat``: a link or anything else is left alone).
    Returns whether it was deleted."""
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return False
        os.remove(path)
    except FileNotFoundError:
        return False
    return True


_TERMINATING = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGUSR1", None)) if s is not None)


@contextlib.contextmanager
def ends_on_sigterm():
    """SIGTERM / SIGUSR1 end the process while the block runs (main thread only; elsewhere nothing
    changes): a load that takes long (a large file, slow storage) is never left running after the
    scheduler or the user asked the process to stop, whatever handler the run installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {}
    try:
        for sig in _TERMINATING:
            previous[sig] = signal.signal(sig, signal.SIG_DFL)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
