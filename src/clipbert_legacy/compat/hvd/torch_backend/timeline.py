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

The producers (coordinator and executor threads) only append a tuple to a deque; one writer thread per
file wakes on the first, lets a batch gather for ``_BATCH_S`` (5 ms), formats, appends and flushes it, so
the file is current within milliseconds, the writer wakes at most 200 times a second, and memory stays
bounded (at most ``_QUEUE_MAX`` events wait: a producer then waits for the writer; the tensor table
holds ``_NAMES_MAX`` names: a name dropped from it gets a new pid when it comes back). ``stop_timeline()``,
``shutdown()`` and an ``atexit`` function join the writer. ``HOROVOD_TIMELINE=<file>`` starts a timeline
at ``init()`` (``DYNAMIC``: only the calls); a second ``start_timeline`` closes the first file and opens
the next.
"""
from __future__ import annotations

import atexit
import collections
import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

from clipbert_legacy.compat.hvd.torch_backend.state import STATE

logger = logging.getLogger(__name__)

_T: dict[str, Any] = STATE.timeline
_QUEUE_MAX = 65536   # events waiting for the writer (a producer waits when it is full, as Horovod's)
_NAMES_MAX = 65536   # tensors with a pid in the current file
_BATCH_S = 0.005     # how long the writer lets events gather after the first before it writes them
_ACTIVITY_OPS = {"ALLREDUCE": "ALLREDUCE", "ALLGATHER": "ALLGATHER", "BROADCAST": "BCAST",
                 "ALLTOALL": "ALLTOALL", "REDUCESCATTER": "REDUCESCATTER", "BARRIER": "ALLREDUCE"}


class TimelineWriter:
    """One timeline file and the thread that appends to it (see the module docstring)."""

    def __init__(self, path: str, mark_cycles: bool) -> None:
        self.path, self.mark_cycles = path, mark_cycles
        self._file = open(path, "wb")  # closed by the writer thread
        self._start = time.monotonic()
        start_epoch_us = int(time.time() * 1e6)
        self._events: collections.deque = collections.deque()  # appends and pops are thread-safe
        self._wake = threading.Event()  # set by a producer when the writer may be asleep
        self._closing = self._failed = False
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
        self._put((tensor, phase, name, self.now_us(), args))

    def marker(self, name: str) -> None:
        self._put((None, "i", name, self.now_us(), None))

    def _put(self, item: tuple) -> None:
        while len(self._events) >= _QUEUE_MAX and not (self._closing or self._failed):
            time.sleep(0.001)  # the writer is behind: wait for it (Horovod's producers wait too)
        if self._closing or self._failed:
            return  # an operation that outlived stop_timeline(): the file is closed
        self._events.append(item)
        if not self._wake.is_set():
            self._wake.set()

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
        self._closing = True
        self._wake.set()
        self._thread.join()

    def _write_loop(self) -> None:
        """Wake on the first event, let a batch gather for ``_BATCH_S``, append it, flush; until closed."""
        try:
            while True:
                self._wake.wait()
                if not self._closing:
                    time.sleep(_BATCH_S)
                self._wake.clear()
                closing = self._closing  # read after clear(): a later close() wakes the next wait()
                batch = []
                while self._events:
                    batch.append(self._format(self._events.popleft()))
                self._append(b"".join(batch))
                if closing:
                    return
        except Exception as e:  # a full disk, a removed file: the job goes on without its timeline
            self._failed = True
            self._events.clear()
            logger.error("hvd: cannot write the timeline %s (%s); it stops here", self.path, e)
        finally:
            self._file.close()

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
        # phase, name and args are this module's own strings (no quoting needed): formatted directly,
        # the writer's main cost per event
        text = f',\n{{"ph": "{phase}"'
        if phase != "E":
            text += f', "name": "{name}"'
        text += f', "ts": {ts}, "pid": {pid}'
        if phase == "X":
            text += ', "dur": 0'
        if args:
            text += ', "args": {' + ", ".join(f'"{k}": "{v}"' for k, v in args.items()) + "}"
        return head + (text + "}").encode()


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


def negotiation_event(event: dict) -> None:
    """The coordinator took ``event`` (a rank's submission): ``NEGOTIATE_<KIND>`` opens on the first one
    this file sees (a negotiation under way when the timeline started opens at its next submission),
    each rank's arrival is an ``X`` named by the rank."""
    writer = _T["writer"]
    if writer is None or event.get("k") not in _ACTIVITY_OPS:
        return
    tensor = tensor_name(event["k"], event["n"])
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
