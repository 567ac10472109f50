"""torch backend: end the job within about a minute when a rank stops responding.

A rank that is stopped (SIGSTOP, a hung node, a frozen container) leaves its peers waiting in the next
collective until gloo/NCCL's process-group timeout (``DIST_TIMEOUT_S``, 30 minutes by default). A
short collective timeout would also kill healthy runs in which one rank legitimately works alone for
long (rank 0 writing a large checkpoint to slow storage). So every rank runs a daemon thread that

* beats: increments its own counter in the launcher's TCP store every ``interval`` seconds. The
  thread keeps beating while the main thread computes, evaluates or waits in a collective; only a
  process that is stopped as a whole (or holds the GIL in one C call, see :func:`busy`) stops beating;
* watches: reads every peer's counter; a peer whose counter has not moved for ``DIST_PEER_TIMEOUT_S``
  seconds (default 60; 0 turns the watchdog off) has stopped responding. Counters, not timestamps:
  the hosts' clocks need not agree.

The lowest healthy rank logs one line naming the silent rank (host, pid, how long), a silent rank on
the same host is killed (a stopped process cannot act on the launcher's SIGTERM), and the process
exits with status 1; ``torchrun`` then ends the other workers. :func:`busy` marks a long operation
that may hold the GIL (a checkpoint save): peers then allow ``DIST_BUSY_GRACE_S`` (default 900 s).

The store is writable by every local user (``clipbert_legacy.compat._store_auth``): each rank writes only its
own keys, with ``set`` (a counter it keeps itself: ``add`` on a value someone replaced by text makes the store
server drop the connection), reads the others' with ``get`` and parses them (a malformed value is one
warning line naming the key), and a pid is signalled only when it is proven a process of this job
(:func:`clipbert_legacy.compat._store_auth.is_job_process`: start time and the job's token in its
environment).
"""
from __future__ import annotations

import contextlib
import datetime
import os
import signal
import socket
import sys
import threading
import time

import torch.distributed as dist

from clipbert_legacy.compat import launcher_env
from clipbert_legacy.compat._store_auth import identity, is_job_process, parse_int, warn_once
from clipbert_legacy.compat.hvd.torch_backend.state import STATE

_W = STATE.watchdog
_LOCK = STATE.watchdog_lock  # one store client, used by the watchdog thread and by busy() in the main thread


def _set(store, key, value) -> None:
    with _LOCK:
        store.set(key, str(value))


def _read_int(store, key) -> int | None:
    """The counter under ``key`` (None when it is not there yet, or not a counter: one warning line)."""
    with _LOCK:
        if not store.check([key]):
            return None
        raw = store.get(key)
    return parse_int(key, raw)


def peer_timeout() -> float:
    return float(os.environ.get("DIST_PEER_TIMEOUT_S", "60"))


def start(rank: int, world: int) -> bool:
    """Start the watchdog thread for this rank (torch backend, several processes). Returns whether it
    runs: off with ``DIST_PEER_TIMEOUT_S=0`` or without a launcher store address."""
    timeout = peer_timeout()
    address = launcher_env.store_address()
    if timeout <= 0 or world < 2 or address is None or _W["thread"] is not None:
        return False
    interval = min(5.0, max(0.2, timeout / 12))
    store = dist.TCPStore(*address, is_master=False, timeout=datetime.timedelta(seconds=max(10.0, timeout)))
    prefix = f"clipbert/watchdog/{launcher_env.torchrun_run_id()}/{launcher_env.torchrun_restart_count()}/"
    store.set(f"{prefix}who{rank}", identity())  # host, pid, start time: what a kill is checked against
    _W.update(store=store, rank=rank, prefix=prefix, busy=0)
    _W["stop"].clear()
    t = threading.Thread(target=_loop, args=(store, prefix, rank, world, timeout, interval),
                         name="clipbert-peer-watchdog", daemon=True)
    t.start()
    _W["thread"] = t
    return True


def stop(timeout: float = 15.0) -> None:
    """This rank leaves normally: peers stop watching it, the thread ends and is joined (a thread still
    in a store call when the interpreter finalizes aborts the process: issue 46)."""
    store, thread = _W["store"], _W["thread"]
    if store is not None:
        with contextlib.suppress(Exception):
            _set(store, f"{_W['prefix']}done{_W['rank']}", 1)
    _W["stop"].set()
    _W.update(store=None, thread=None)
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)


@contextlib.contextmanager
def busy():
    """A long operation of this rank alone that may hold the GIL (a checkpoint save): peers allow
    ``DIST_BUSY_GRACE_S`` seconds of silence instead of ``DIST_PEER_TIMEOUT_S``."""
    store, key = _W["store"], f"{_W['prefix']}busy{_W['rank']}"
    marked = False
    if store is not None:
        with contextlib.suppress(Exception):  # advisory: a store error must not fail the save itself
            _W["busy"] += 1
            marked = True
            _set(store, key, _W["busy"])
    try:
        yield
    finally:
        if marked:
            _W["busy"] -= 1
            with contextlib.suppress(Exception):
                _set(store, key, _W["busy"])


def _loop(store, prefix, rank, world, timeout, interval):
    grace = float(os.environ.get("DIST_BUSY_GRACE_S", "900"))
    peers = [r for r in range(world) if r != rank]
    seen = {r: (None, time.monotonic()) for r in peers}  # last counter value, when it last changed
    beats = 0
    while not _W["stop"].wait(interval):
        try:
            beats += 1
            _set(store, f"{prefix}hb{rank}", beats)
            silent = []
            for r in peers:
                if _read_int(store, f"{prefix}done{r}") == 1:
                    continue
                value, since = seen[r]
                now_value = _read_int(store, f"{prefix}hb{r}")
                if now_value is not None and now_value != value:
                    seen[r] = (now_value, time.monotonic())
                    continue
                limit = grace if (_read_int(store, f"{prefix}busy{r}") or 0) > 0 else timeout
                if time.monotonic() - since > limit:
                    silent.append((r, time.monotonic() - since))
        except Exception as e:  # the store itself is gone: the launcher is ending the job
            if not _W["stop"].is_set():
                _end(f"rank {rank}: the launcher's store stopped answering ({e}); ending this process")
            return
        if silent:
            _end_for(store, prefix, rank, world, silent, timeout)
            return


def _end_for(store, prefix, rank, world, silent, timeout):
    silent_ranks = {r for r, _ in silent}
    reporter = min(r for r in range(world) if r not in silent_ranks)
    names = []
    for r, secs in silent:
        host, pid, start = _who(store, f"{prefix}who{r}")
        note = ""
        if host == socket.gethostname() and pid is not None:  # stopped: only SIGKILL ends it
            proven, why = is_job_process(pid, start)
            if proven:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            else:
                note = f"; pid {pid} not signalled: {why}"
        names.append(f"rank {r} (host {host}, pid {pid if pid is not None else '?'}) has not responded for "
                     f"{secs:.0f} s{note}")
    msg = (f"error: {'; '.join(names)} (DIST_PEER_TIMEOUT_S={timeout:g}); ending the job. Rerun the "
           f"same command to resume from the last restore file")
    _end(msg if rank == reporter else None)


def _who(store, key) -> tuple[str, int | None, int | None]:
    """(host, pid, start time) a rank registered under ``key``; ("?", None, None) when unreadable."""
    try:
        with _LOCK:
            host, pid, start = store.get(key).decode("ascii").split()
        return host, int(pid), int(start)
    except (ValueError, UnicodeError):
        warn_once(key, "not 'host pid start-time'")
    except Exception:  # the store is going too: name the rank alone
        pass
    return "?", None, None


def _end(msg):
    if msg:
        print(msg, file=sys.stderr, flush=True)
    os._exit(1)
