"""torch backend: how the ranks of a process set agree on what to run, through the launcher's store.

Horovod runs a background thread that negotiates every operation with a coordinator before executing
it. Here the same happens over the TCP store ``torchrun`` already runs (the one ``peer_watchdog`` uses):

* a rank **submits** an operation by pushing an event onto the set's log, a queue in the store (the
  log's order is the one order every rank agrees on). As Horovod's ``Enqueue*`` hands a request to its
  background thread, the user's thread only queues the event for this rank's **sender** thread, which
  pushes it: the user's thread keeps the GIL, so a second submission of the same name right after the
  first is a duplicate whatever the machine's load (with a blocking push, the first operation could be
  negotiated and run by the other threads before the user's thread was scheduled again: Horovod's
  ``*_duplicate_name_error`` tests failed that way in about one job of five);
* the **coordinator** thread of the set's lowest rank reads the log in order, feeds it to
  ``Negotiation`` (name matching, join, checks) and appends each ready response to the schedule ``s<j>``;
* an **executor** thread on every member reads the schedule in order and runs each collective on the
  set's own process group, completing the rank's handle (or an error: the same on every rank).

Every value in the store is sealed and parsed (``clipbert_legacy.compat._store_auth``: another local user
can write the store): the coordinator skips an event that is malformed, forged, replayed or from a rank
outside the set, with one warning line naming the key; an executor that reads a response that is not the
coordinator's waits for the coordinator's to replace it.

Store waits block without timeouts (no polling); ``shutdown`` ends the threads through the log (every
member's ``LEAVE``, then the coordinator's ``STOP``). At process exit, when the peers do not all leave,
``stop_threads`` wakes this rank's own threads (a ``WAKE`` event in the log for its coordinator, a
``STOP`` written where its executor waits, if the coordinator wrote nothing there) and joins them: a
thread still blocked in a store call when the interpreter finalizes aborts the process once the call
returns ("terminate called without an active exception", SIGABRT, issue 46). A rank whose user thread
has waited ``WAIT_REPORT_S`` on an operation says so in the log (``WAIT``, and again when it no longer
waits): when every member waits on an operation another has not submitted, the coordinator fails them
all and shuts the set down (``negotiation``) instead of leaving the job hung. A stall monitor logs, every
``HOROVOD_STALL_CHECK_TIME_SECONDS`` (60 s, Horovod's variable), the operations some ranks submitted and
others did not, naming the missing ranks. A set of one rank (or a job of one process) negotiates locally:
no store, no threads.
"""
from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from clipbert_legacy.compat._store_auth import seal, unseal, warn_once
from clipbert_legacy.compat.hvd.torch_backend.negotiation import JOIN, LEAVE, STOP, WAIT, Negotiation
from clipbert_legacy.compat.hvd.torch_backend.timeline import negotiation_done, negotiation_event

logger = logging.getLogger(__name__)

_DELETE_BATCH = 16  # schedule entries the coordinator's executor removes from the store at a time
WAIT_REPORT_S = 1.0  # a user thread waiting this long on an operation tells the coordinator (deadlocks)
WAKE = "WAKE"  # a rank's own event in the log: its coordinator thread ends if the rank is stopping
_STARTED: weakref.WeakSet[threading.Thread] = weakref.WeakSet()  # every thread a controller started


def join_started(timeout: float = 10.0) -> bool:
    """At exit, after every set was stopped: wait (``timeout`` seconds in all) for any controller thread
    still ending, of any set (a removed one, one of an earlier ``init``); returns whether none is left."""
    deadline = time.monotonic() + timeout
    for t in list(_STARTED):
        if t is not threading.current_thread():
            t.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in _STARTED)


class Request:
    """One operation of this rank: what it submitted, and its outcome once executed."""

    __slots__ = ("name", "kind", "meta", "tensors", "outputs", "done", "error", "result", "extra",
                 "submitted", "owner")

    def __init__(self, name: str, kind: str, meta: dict, tensors: list | None = None,
                 outputs: list | None = None) -> None:
        self.name, self.kind, self.meta = name, kind, meta
        self.tensors, self.outputs = tensors or [], outputs
        self.done = threading.Event()
        self.error: str | None = None
        self.result: Any = None
        self.extra: dict = {}
        self.submitted = time.monotonic()
        self.owner: LocalController | None = None  # the controller it was submitted to

    def wait(self) -> None:
        """Wait until it has run; a wait longer than ``WAIT_REPORT_S`` is reported to the coordinator
        (``WAIT``, then an empty ``WAIT`` once over), so that ranks waiting on each other end."""
        if self.done.wait(WAIT_REPORT_S) or self.owner is None:
            self.done.wait()
            return
        reported = self.owner.report_wait(self.name)
        self.done.wait()
        if reported:
            self.owner.report_wait("")

    def finish(self, result: Any = None, error: str | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


class LocalController:
    """A set of one rank: negotiation and execution at submission, in the caller's thread."""

    def __init__(self, rank: int, execute: Callable[[dict, Request | None], Any]) -> None:
        self.rank, self._execute = rank, execute
        self._negotiation = Negotiation([rank])
        self._lock = threading.RLock()
        self._counters: collections.Counter = collections.Counter()
        self._pending: dict[str, Request] = {}

    def auto_name(self, kind: str) -> str:
        with self._lock:
            n = self._counters[kind]
            self._counters[kind] += 1
        return f"{kind.lower()}.noname.{n}"

    def report_wait(self, _name: str) -> bool:
        """Nothing to tell: a set of one never waits on another rank."""
        return False

    def submit(self, req: Request) -> None:
        with self._lock:
            _claim(self._pending, req)
            for resp in self._negotiate(_event(self.rank, req)):
                run_response(resp, self._pending.pop(resp["n"], None), self._execute)

    def _negotiate(self, event: dict) -> list[dict]:
        """One event through the negotiation, recorded in the timeline (rank 0, when one runs)."""
        negotiation_event(event)
        responses = self._negotiation.add(event)
        negotiation_done(responses)
        return responses

    def announce_leave(self) -> None:
        """Nothing to tell: no other rank waits on a set of one."""

    def close(self, _timeout: float = 0.0) -> None:
        _fail_all(self._pending, "Horovod has been shut down")


class Controller(LocalController):
    """One process set of several ranks, on one member rank (see the module docstring)."""

    def __init__(self, rank: int, ranks: list[int], prefix: str, store_factory: Callable[[], Any],
                 execute: Callable[[dict, Request | None], Any]) -> None:
        super().__init__(rank, execute)
        self.ranks, self.prefix, self.coordinator = list(ranks), prefix, min(ranks)
        self._store = store_factory()
        self._closed = self._left = False
        self._seq = 0  # this rank's events, numbered: the coordinator refuses a replayed one
        self._stopping = threading.Event()
        self._quiet = threading.Event()  # the stall monitor's end: the set is closed or stopping
        self._next = 1  # the schedule entry the executor reads next
        self._negotiation = Negotiation(self.ranks)
        self._outbox: collections.deque = collections.deque()  # (sealed event, its request or None)
        self._outbox_cv = threading.Condition(threading.Lock())
        self._send_stop = False
        self._sender = threading.Thread(target=self._send_loop, args=(store_factory(),), daemon=True,
                                        name=f"hvd-sender-{prefix}")
        self._sender.start()
        _STARTED.add(self._sender)
        self._threads = [threading.Thread(target=self._execute_loop, args=(store_factory(),), daemon=True,
                                          name=f"hvd-executor-{prefix}")]
        if rank == self.coordinator:
            self._threads.append(threading.Thread(target=self._coordinate_loop, args=(store_factory(),),
                                                  daemon=True, name=f"hvd-coordinator-{prefix}"))
        for t in self._threads:
            t.start()
            _STARTED.add(t)

    def submit(self, req: Request) -> None:
        with self._lock:  # one rank's events enter the log in the order it submitted them
            if self._closed:
                raise ValueError("Horovod has been shut down: call hvd.init() first")
            _claim(self._pending, req)
            req.owner = self
            self._log(_event(self.rank, req), req)

    def report_wait(self, name: str) -> bool:
        """Tell the coordinator that this rank's user thread waits on ``name`` ("": no longer waits);
        returns whether it was told (not once the set is closed or the store is gone)."""
        with self._lock:
            if self._closed:
                return False
            try:
                self._log({"r": self.rank, "n": name, "k": WAIT, "m": {}})
            except Exception:  # the launcher's store is gone: the executor fails the operation itself
                return False
            return True

    def _log(self, event: dict, req: Request | None = None) -> None:
        """Queue one event of this rank for the sender thread (called under ``self._lock``: the
        events keep the order the rank made them in)."""
        self._seq += 1
        key = self.prefix + "log"
        value = seal(key, {**event, "q": self._seq})
        with self._outbox_cv:
            self._outbox.append((value, req))
            self._outbox_cv.notify()

    def _send_loop(self, store: Any) -> None:
        """Push the queued events onto the log, in order; ends once stopped and the queue is empty. A push
        that fails (the launcher's store is gone) fails its operation."""
        key = self.prefix + "log"
        while True:
            with self._outbox_cv:
                while not self._outbox and not self._send_stop:
                    self._outbox_cv.wait()
                if not self._outbox:
                    return
                value, req = self._outbox.popleft()
            try:
                store.queue_push(key, value)
            except Exception as e:
                if req is not None:
                    with self._lock:
                        if self._pending.get(req.name) is req:
                            del self._pending[req.name]
                    req.finish(error=f"lost the launcher's store: {e}")
            value = req = None

    def _stop_sender(self, timeout: float) -> None:
        """The sender pushes what is queued, then ends."""
        with self._outbox_cv:
            self._send_stop = True
            self._outbox_cv.notify()
        self._sender.join(timeout)

    def announce_leave(self) -> None:
        """Log this rank's LEAVE once; operations of other ranks that need it then fail."""
        with self._lock:
            if not self._left:
                self._left = True
                self._log({"r": self.rank, "n": LEAVE, "k": LEAVE, "m": {}})

    def close(self, timeout: float = 10.0) -> None:
        """Leave the set: the threads end once every member has left (or after ``timeout`` seconds).
        The threads are joined also when the executor closed the set itself (it read the coordinator's
        ``STOP``, or lost the store): a thread still ending (clearing its frame, freeing tensors) when
        the interpreter finalizes aborts the process ("terminate called without an active exception",
        issue 46: a core dump showed the executor thread there)."""
        with self._lock:
            was_open, self._closed = not self._closed, True
            self._quiet.set()
            if was_open:
                self.announce_leave()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self.stop_threads()  # a member that never left: this rank's threads end anyway
        with self._lock:
            _fail_all(self._pending, "Horovod has been shut down")

    def stop_threads(self, timeout: float = 10.0) -> bool:
        """End this rank's threads now, whatever the others do; returns whether they all ended."""
        self._stopping.set()
        self._quiet.set()
        deadline = time.monotonic() + timeout
        self._stop_sender(timeout)  # what this rank queued (its LEAVE) is in the log first
        while any(t.is_alive() for t in self._threads) and time.monotonic() < deadline:
            try:
                if self._threads[-1].is_alive() and self.rank == self.coordinator:
                    with self._lock:
                        self._seq += 1
                        key = self.prefix + "log"
                        self._store.queue_push(key, seal(key, {"r": self.rank, "n": WAKE, "k": WAKE, "m": {},
                                                               "q": self._seq}))
                if self._threads[0].is_alive():  # only where the coordinator has not written the entry
                    entry = f"{self.prefix}s{self._next}"
                    self._store.compare_set(entry, "", seal(entry, {"k": STOP, "n": STOP}))
            except Exception:  # the launcher's store is gone: the blocked calls fail on their own
                pass
            for t in self._threads:
                t.join(min(0.5, max(0.0, deadline - time.monotonic())))
        return not any(t.is_alive() for t in (*self._threads, self._sender))

    def _coordinate_loop(self, store: Any) -> None:
        monitor = threading.Thread(target=self._stall_monitor, daemon=True, name=f"hvd-stall-{self.prefix}")
        monitor.start()
        _STARTED.add(monitor)
        j, key, last_seq = 1, self.prefix + "log", dict.fromkeys(self.ranks, 0)
        try:
            while True:
                event = unseal(key, store.queue_pop(key))  # blocks until a rank submits
                if not self._acceptable(key, event, last_seq):
                    continue
                if event["k"] == WAKE:  # stop_threads: this rank's coordinator is to end
                    if self._stopping.is_set():
                        return
                    continue
                for resp in self._negotiation_step(key, event):
                    store.set(f"{self.prefix}s{j}", seal(f"{self.prefix}s{j}", resp))
                    j += 1
                    if resp["k"] == STOP:
                        return
        except Exception as e:  # the launcher's store is gone: the job is ending
            self._lost(e)

    def _acceptable(self, key: str, event: dict | None, last_seq: dict[int, int]) -> bool:
        """An event of a member rank, of the shape ``_event`` writes, newer than that rank's last."""
        if event is None:
            return False  # unseal named the key
        r, q = event.get("r"), event.get("q")
        if not (type(r) is int and r in last_seq and isinstance(event.get("n"), str)
                and isinstance(event.get("k"), str) and isinstance(event.get("m"), dict) and type(q) is int):
            warn_once(key, f"an event not of this job's shape ({str(event)[:80]})")
            return False
        if q <= last_seq[r]:
            warn_once(key, f"a replayed event of rank {r} (number {q}, after {last_seq[r]})")
            return False
        last_seq[r] = q
        return True

    def _negotiation_step(self, key: str, event: dict) -> list[dict]:
        with self._lock:
            try:
                return self._negotiate(event)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                warn_once(key, f"an event the negotiation cannot read ({type(e).__name__}: {str(e)[:80]})")
                return []

    def _execute_loop(self, store: Any) -> None:
        j = undeleted = 1
        try:
            while True:
                self._next = j
                resp = self._response(store, f"{self.prefix}s{j}")
                if resp["k"] == STOP:
                    self._lost(None)
                    return
                with self._lock:
                    req = self._pending.pop(resp["n"], None)
                ran = run_response(resp, req, self._execute)
                req = None  # the finished request's tensors are freed here, not when the thread ends
                if ran and self.rank == self.coordinator and j - undeleted >= _DELETE_BATCH:
                    # every member read the entries up to j: it took part in entry j's collective
                    for i in range(undeleted, j + 1):
                        store.delete_key(f"{self.prefix}s{i}")
                    undeleted = j + 1
                j += 1
        except Exception as e:  # the launcher's store is gone: the job is ending
            self._lost(e)

    @staticmethod
    def _response(store: Any, key: str) -> dict:
        """The coordinator's response under ``key`` (blocks until it is written). A value that is not the
        coordinator's (forged, malformed) is named once and waited out: the coordinator's own write
        replaces it."""
        while True:
            resp = unseal(key, store.get(key))
            if resp is not None and isinstance(resp.get("k"), str) and isinstance(resp.get("n"), str):
                return resp
            if resp is not None:
                warn_once(key, "a response not of this job's shape")
            time.sleep(0.05)

    def _lost(self, error: Exception | None) -> None:
        """Fail every operation still waiting (shut down, or the store is unreachable)."""
        why = "Horovod has been shut down" if error is None else f"lost the launcher's store: {error}"
        with self._lock:
            self._closed = True
            self._quiet.set()
            _fail_all(self._pending, why)

    def _stall_monitor(self) -> None:
        every = float(os.environ.get("HOROVOD_STALL_CHECK_TIME_SECONDS", "60"))
        if every <= 0:
            return
        seen: dict[str, float] = {}
        while not self._quiet.wait(min(every, 5.0)):
            now = time.monotonic()
            with self._lock:
                pending = self._negotiation.pending()
            seen = {n: seen.get(n, now) for n in pending}
            stalled = {n: pending[n] for n, t in seen.items() if now - t >= every and pending[n]}
            for n, missing in list(stalled.items())[:10]:
                logger.warning("hvd: '%s' was submitted by some ranks %d s ago but not yet by ranks %s: they "
                               "are elsewhere (a different op, another name, or stopped)", n, every, missing)
                seen[n] = now  # report again after another period


def run_response(resp: dict, req: Request | None, execute: Callable[[dict, Request | None], Any]) -> bool:
    """Execute one response for this rank; returns whether a collective ran."""
    if resp.get("err"):
        if req is not None:
            req.finish(error=resp["err"])
        return False
    if resp["k"] == JOIN:
        if req is not None:
            req.finish(resp["last"])
        return False
    try:
        result = execute(resp, req)
    except Exception as e:  # a failed collective: a lost peer, a backend error
        if req is None:
            logger.error("hvd: %s '%s' failed on this rank: %s", resp["k"], resp["n"], e)
        else:
            req.finish(error=f"{resp['k']} '{resp['n']}' failed: {e}")
        return True
    if req is not None:
        req.finish(result)
    return True


def _event(rank: int, req: Request) -> dict:
    return {"r": rank, "n": req.name, "k": req.kind, "m": req.meta}


def _claim(pending: dict[str, Request], req: Request) -> None:
    if req.name in pending:
        raise ValueError(f"Requested to {req.kind.lower()} a tensor with the same name as another tensor "
                         f"that is currently being processed: '{req.name}'. Use a different name, or "
                         "synchronize the first operation before submitting the second")
    pending[req.name] = req


def _fail_all(pending: dict[str, Request], why: str) -> None:
    for req in list(pending.values()):
        req.finish(error=why)
    pending.clear()
