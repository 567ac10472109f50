"""torch backend: Horovod's timeline, a Chrome-trace JSON file written while the job runs.

Horovod's timeline (``horovod/common/timeline.cc``) is written by rank 0 only: an opening ``[``, a
``process_name`` record whose args carry ``start_time_since_epoch_in_micros``, then one event per line,
each tensor (operation name) drawn as a "process" of its own (``pid``), and after every event a closing
``]`` that the next event overwrites, so the file parses at any moment (``json.load``, chrome://tracing).
The same here, with Horovod's names where they mean something on this backend:

* ``NEGOTIATE_<KIND>`` (``B`` .. ``E``) from the first rank's submission reaching the coordinator thread to
  the coordinator's response, with one ``X`` event per rank as its submission arrives (named by the rank);
* ``<KIND>`` (``ALLREDUCE``, ``ALLGATHER``, ``BROADCAST``, ``ALLTOALL``, ``REDUCESCATTER``, ``BARRIER``)
  from the executor thread taking the response to the result, its ``E`` carrying ``dtype`` and ``shape``;
* inside it one activity, the collective itself: ``GLOO_<OP>`` / ``NCCL_<OP>`` (Horovod's names:
  ``GLOO_ALLREDUCE``, ``GLOO_BCAST``, ``NCCL_ALLGATHER`` ...); Horovod's buffer copies
  (``MEMCPY_IN_FUSION_BUFFER`` ...) are not separate activities here;
* ``CYCLE_START`` instant markers when ``mark_cycles`` (``HOROVOD_TIMELINE_MARK_CYCLES=1`` or
  ``start_timeline(path, mark_cycles=True)``): this backend has no timed cycle (its threads wake when
  there is work), so a cycle is one response the executor takes from the schedule.

Tensor names are Horovod's: ``<kind>.<name>`` (``allreduce.loss``), unnamed ones ``allreduce.noname.<n>``.
Not recorded: ``DistributedOptimizer``'s gradient buckets (reduced directly, without negotiation), join.

The producers (coordinator and executor threads) only put a tuple on a bounded queue; one writer thread
per file formats, appends and flushes each batch it drains, so the file is current within a few ms and
memory stays bounded (the queue holds at most ``_QUEUE_MAX`` events, the tensor table ``_NAMES_MAX`` names;
a name dropped from the table gets a new pid when it comes back). ``stop_timeline()``, ``shutdown()`` and
the backend's exit handling join the writer. ``HOROVOD_TIMELINE=<file>`` starts a timeline at ``init()``
(``DYNAMIC``: only the calls); a second ``start_timeline`` closes the first file and opens the next.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from clipbert_legacy.compat.hvd.torch_backend.state import STATE

logger = logging.getLogger(__name__)

_T: dict[str, Any] = STATE.timeline
_QUEUE_MAX = 65536   # events waiting for the writer (a producer waits when it is full, as Horovod's)
_NAMES_MAX = 65536   # tensors with a pid in the current file
_STOP = object()
_ACTIVITY_OPS = {"ALLREDUCE": "ALLREDUCE", "ALLGATHER": "ALLGATHER", "BROADCAST": "BCAST",
                 "ALLTOALL": "ALLTOALL", "REDUCESCATTER": "REDUCESCATTER", "BARRIER": "ALLREDUCE"}


class TimelineWriter:
    """One timeline file and the thread that appends to it (see the module docstring)."""

    def __init__(self, path: str, mark_cycles: bool) -> None:
        self.path, self.mark_cycles = path, mark_cycles
        self._file = open(path, "wb")  # closed by the writer thread
        self._start = time.monotonic()
        start_epoch_us = int(time.time() * 1e6)
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_MAX)
        self._pids: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._next_pid = 1
        self._negotiating: set[str] = set()
        self._lock = threading.Lock()
        head = ('[\n{"name": "process_name", "ph": "M", "pid": 0, "args": '
                f'{{"start_time_since_epoch_in_micros": {start_epoch_us}}}}},\n'
                '{"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}}').encode()
        self._file.write(head)
        self._end = self._file.tell()  # where the closing "]" is, overwritten by the next event
        self._file.write(b"]")
        self._file.flush()
        self._thread = threading.Thread(target=self._write_loop, daemon=True, name="hvd-timeline")
        self._thread.start()

    def now_us(self) -> int:
        return int((time.monotonic() - self._start) * 1e6)

    def event(self, tensor: str, phase: str, name: str = "", args: dict | None = None) -> None:
        self._queue.put((tensor, phase, name, self.now_us(), args))

    def marker(self, name: str) -> None:
        self._queue.put((None, "i", name, self.now_us(), None))

    def negotiate_start(self, tensor: str, kind: str) -> None:
        with self._lock:  # Horovod: the first submission opens the span, later ones only mark the rank
            if tensor in self._negotiating:
                return
            self._negotiating.add(tensor)
        self.event(tensor, "B", f"NEGOTIATE_{kind}")

    def negotiate_end(self, tensor: str) -> None:
        with self._lock:
            if tensor not in self._negotiating:
                return  # started before this file was opened
            self._negotiating.discard(tensor)
        self.event(tensor, "E")

    def close(self) -> None:
        """Write what is queued, close the file, join the thread."""
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()

    def _write_loop(self) -> None:
        try:
            while True:
                batch = [self._queue.get()]
                while len(batch) < 4096:
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                stop = any(item is _STOP for item in batch)
                self._append(b"".join(self._format(item) for item in batch if item is not _STOP))
                if stop:
                    return
        except Exception as e:  # a full disk, a removed file: the job goes on without its timeline
            logger.error("hvd: cannot write the timeline %s (%s); it stops here", self.path, e)
            self._drain()
        finally:
            self._file.close()

    def _drain(self) -> None:
        while self._queue.get() is not _STOP:
            pass

    def _append(self, data: bytes) -> None:
        if not data:
            return
        self._file.seek(self._end)
        self._file.write(data)
        self._end = self._file.tell()
        self._file.write(b"]")
        self._file.flush()

    def _format(self, item: tuple) -> bytes:
        tensor, phase, name, ts, args = item
        if tensor is None:  # a marker (CYCLE_START)
            return f',\n{{"ph": "i", "name": {json.dumps(name)}, "ts": {ts}, "s": "g"}}'.encode()
        head = b""
        pid = self._pids.get(tensor)
        if pid is None:
            pid, self._next_pid = self._next_pid, self._next_pid + 1
            self._pids[tensor] = pid
            if len(self._pids) > _NAMES_MAX:
                self._pids.popitem(last=False)
            meta = [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": tensor}},
                    {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]
            head = b"".join(b",\n" + json.dumps(m).encode() for m in meta)
        record: dict[str, Any] = {"ph": phase}
        if phase != "E":
            record["name"] = name
        record.update(ts=ts, pid=pid)
        if phase == "X":
            record["dur"] = 0
        if args:
            record["args"] = args
        return head + b",\n" + json.dumps(record).encode()


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Horovod's ``hvd.start_timeline``: rank 0 writes ``file_path`` from now on; other ranks record
    nothing (as Horovod's)."""
    old = _T["writer"]
    if old is not None and old.path == file_path:
        old.mark_cycles = mark_cycles  # Horovod: the same file again goes on with it
        return
    stop_timeline()
    if _T["rank"] != 0:
        return
    if not _T["atexit"]:  # the writer thread ends before the interpreter finalizes
        atexit.register(stop_timeline)
        _T["atexit"] = True
    _T["writer"] = TimelineWriter(file_path, mark_cycles)


def stop_timeline() -> None:
    """Horovod's ``hvd.stop_timeline``: the events so far are written, the file is closed."""
    writer, _T["writer"] = _T["writer"], None
    if writer is not None:
        writer.close()


def start_from_env(rank: int) -> None:
    """``hvd.init()``: ``HOROVOD_TIMELINE=<file>`` starts a timeline at once (``DYNAMIC``: none until
    ``start_timeline``), with ``HOROVOD_TIMELINE_MARK_CYCLES``."""
    _T["rank"] = rank
    path = os.environ.get("HOROVOD_TIMELINE", "")
    if path and path not in ("DYNAMIC", "DISABLED"):
        mark = os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "0").strip().lower() in ("1", "true", "yes")
        start_timeline(path, mark_cycles=mark)


def tensor_name(kind: str, name: str) -> str:
    """Horovod's name of an operation's tensor: ``allreduce.<name>`` (unnamed: ``allreduce.noname.<n>``)."""
    prefix = kind.lower() + "."
    return name if name.startswith(prefix + "noname.") else prefix + name


def negotiation_event(event: dict, names_pending: Any) -> None:
    """The coordinator took ``event`` (a rank's submission): ``NEGOTIATE_<KIND>`` opens on the first,
    each rank's arrival is an ``X`` named by the rank. ``names_pending``: the names already negotiating."""
    writer = _T["writer"]
    if writer is None or event.get("k") not in _ACTIVITY_OPS:
        return
    tensor = tensor_name(event["k"], event["n"])
    if event["n"] not in names_pending:
        writer.negotiate_start(tensor, event["k"])
    writer.event(tensor, "X", str(event["r"]))


def negotiation_done(responses: list[dict]) -> None:
    """The coordinator's responses: each closes its ``NEGOTIATE_<KIND>``."""
    writer = _T["writer"]
    if writer is None:
        return
    for resp in responses:
        if resp.get("k") in _ACTIVITY_OPS:
            writer.negotiate_end(tensor_name(resp["k"], resp["n"]))


@contextlib.contextmanager
def operation(kind: str, name: str, tensors: list) -> Iterator[None]:
    """The executor runs one response: ``CYCLE_START`` (with mark_cycles), ``<KIND>`` ``B`` .. ``E``."""
    writer = _T["writer"]
    if writer is None or kind not in _ACTIVITY_OPS:
        yield
        return
    tensor = tensor_name(kind, name)
    if writer.mark_cycles:
        writer.marker("CYCLE_START")
    writer.event(tensor, "B", kind)
    try:
        yield
    finally:
        args = None
        if tensors:
            args = {"dtype": "HOROVOD_" + str(tensors[0].dtype).replace("torch.", "").upper(),
                    "shape": "[" + ", ".join(map(str, tensors[0].shape)) + "]"}
        writer.event(tensor, "E", args=args)


@contextlib.contextmanager
def activity(kind: str, name: str, what: str) -> Iterator[None]:
    """One activity of a running operation (``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE`` ...)."""
    writer = _T["writer"]
    if writer is None or kind not in _ACTIVITY_OPS:
        yield
        return
    tensor = tensor_name(kind, name)
    writer.event(tensor, "B", what)
    try:
        yield
    finally:
        writer.event(tensor, "E")


def transport(kind: str, device: Any) -> str:
    """Horovod's activity name of the collective itself: ``GLOO_<OP>`` on CPU, ``NCCL_<OP>`` on GPU."""
    dev = getattr(device, "type", str(device))
    return ("NCCL_" if dev == "cuda" else "GLOO_") + _ACTIVITY_OPS[kind]
