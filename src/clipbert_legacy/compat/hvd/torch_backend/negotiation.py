"""torch backend: which submitted operations are ready, and whether the ranks agree on them.

Horovod's coordinator (``horovod/common/controller.cc``) matches operations across ranks by name, not
by the order they were issued: an operation runs once every rank of its process set has submitted the
same name, or has joined (``hvd.join``); then the submissions are checked against each other and any
disagreement (data type, operation, shape, root rank, scale factors, reduction op, CPU/GPU) becomes an
error delivered to every rank, instead of a collective that aborts or waits forever. This module is
that logic, pure and deterministic: the coordinator thread (``hvd.torch_backend.controller``) feeds it the
events in the order the store's log gives them, and every rank executes the responses in that order.

An event is a dict: ``r`` (global rank), ``n`` (name), ``k`` (kind), ``m`` (metadata: ``dt`` data types
and ``sh`` shapes of the tensors, ``dev``, and per kind ``op``, ``pre``, ``post``, ``root``, ``splits``,
``obj`` (object broadcast: only the root knows the size), ``jo`` (joined ranks may take part with no
rows; internal)).

A ``WAIT`` event says that the rank's user thread has been waiting (``synchronize``) on the named
operation for a while (an empty name: it no longer waits). When every member waits on an operation that
still misses a rank, none of them can ever go on: the ranks took different paths (a rank that failed a
check, caught the exception and went on to other operations while its peer still waits). Horovod's
coordinator would stall there with a warning a minute until an outer timeout; here every waiting
operation gets an error naming where each rank waits, and the set is shut down (``STOP``), as Horovod
shuts down when a rank ends: a failing rank ends the job instead of hanging it.
"""
from __future__ import annotations

from typing import Any

JOIN, LEAVE, STOP, WAIT = "JOIN", "LEAVE", "STOP", "WAIT"
JOIN_NAME = "join"
REDUCING = ("ALLREDUCE", "REDUCESCATTER")
SAME_SHAPE = ("ALLREDUCE", "BROADCAST", "REDUCESCATTER")


class Negotiation:
    """The coordinator's table of submitted operations for one process set."""

    def __init__(self, ranks: list[int]) -> None:
        self.ranks = list(ranks)
        self.table: dict[str, dict[int, dict]] = {}  # name -> rank -> event, in first-submission order
        self.joined: dict[int, int] = {}              # rank -> arrival order (the last to join is reported)
        self.left: set[int] = set()
        self.waiting: dict[int, str] = {}            # rank -> the name its user thread waits on
        self._arrivals = 0

    def pending(self) -> dict[str, list[int]]:
        """Names submitted by some ranks only, with the ranks still missing (for stall reports)."""
        return {n: [r for r in self.ranks if r not in e and r not in self.joined]
                for n, e in self.table.items()}

    def add(self, event: dict) -> list[dict]:
        """Take one event from the log; return the responses it makes ready, in execution order."""
        kind = event["k"]
        if kind == WAIT:
            if event["n"]:
                self.waiting[event["r"]] = event["n"]
            else:
                self.waiting.pop(event["r"], None)
            return self._deadlock()
        if kind == LEAVE:  # an operation still waiting can never complete without the rank that left
            self.left.add(event["r"])
            if self.left >= set(self.ranks):
                return [{"k": STOP, "n": STOP}]
            return [self._gone(n) for n in list(self.table)]
        if kind == JOIN:
            self.joined[event["r"]] = self._arrivals
            self._arrivals += 1
            out = [self._respond(n) for n in list(self.table) if self._ready(n)]
            if len(self.joined) == len(self.ranks):
                last = max(self.joined, key=self.joined.get)
                self.joined = {}
                out.append({"k": JOIN, "n": JOIN_NAME, "err": None, "last": last})
            return out
        self.table.setdefault(event["n"], {})[event["r"]] = event
        if self.left:
            return [self._gone(event["n"])]
        return [self._respond(event["n"])] if self._ready(event["n"]) else []

    def _ready(self, name: str) -> bool:
        return set(self.table[name]) | set(self.joined) >= set(self.ranks)

    def _deadlock(self) -> list[dict]:
        """Every member waits on an operation no rank can complete: an error for every operation still
        pending, then ``STOP`` (the set is shut down on every rank). Else nothing."""
        live = [r for r in self.ranks if r not in self.left]

        def stuck(r: int) -> bool:
            name = self.waiting.get(r)
            return name in self.table or (name == JOIN_NAME and r in self.joined)

        if not live or not all(stuck(r) for r in live):
            return []
        where = "; ".join(self._where(r) for r in live)
        out = []
        for name, entries in self.table.items():
            first = next(iter(entries.values()))
            out.append({"k": first["k"], "n": name, "m": first["m"], "joined": [],
                        "err": f"{first['k']} '{name}': every rank waits on an operation that another rank "
                               f"has not submitted, so none can go on ({where}): the ranks took different "
                               "paths (a rank that failed and went on to other operations?). Horovod has "
                               "been shut down; hvd.shutdown() and hvd.init() start it again"})
        self.table, self.waiting = {}, {}
        return out + [{"k": STOP, "n": STOP}]

    def _where(self, r: int) -> str:
        name = self.waiting[r]
        if name not in self.table:
            return f"rank {r} waits in join"
        entries = self.table[name]
        missing = [m for m in self.ranks if m not in entries and m not in self.joined]
        return (f"rank {r} waits in {entries[r]['k'] if r in entries else '?'} '{name}', not submitted by "
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}")

    def _gone(self, name: str) -> dict:
        """Horovod's answer to an operation that needs a rank which has shut down (or exited)."""
        entries = self.table.pop(name)
        first = next(iter(entries.values()))
        return {"k": first["k"], "n": name, "m": first["m"], "joined": [],
                "err": f"{first['k']} '{name}': Horovod has been shut down: rank(s) "
                       f"{', '.join(map(str, sorted(self.left)))} finished execution (shutdown or exit) "
                       "without submitting it"}

    def _respond(self, name: str) -> dict:
        entries = self.table.pop(name)
        joined = [r for r in self.ranks if r not in entries]
        return construct_response(name, [entries[r] for r in self.ranks if r in entries], joined, self.ranks)


def construct_response(name: str, events: list[dict], joined: list[int], ranks: list[int]) -> dict:
    """Horovod's ConstructResponse: the checked response for one name (``err`` set on a mismatch)."""
    first = events[0]
    kind, meta = first["k"], first["m"]
    err = (_check_kind(events) or _check_types(events) or _check_count(events)
           or _check_join(kind, meta, joined) or _check_shapes(kind, events) or _check_factors(kind, events)
           or _check_root(kind, events) or _check_device(kind, events))
    resp: dict[str, Any] = {"k": kind, "n": name, "err": None if err is None else f"{kind} '{name}': {err}",
                            "m": meta, "joined": joined}
    if err is None and kind in ("ALLGATHER", "BROADCAST", "ALLTOALL"):
        by_rank = {e["r"]: e["m"] for e in events}
        no_rows = [[0] + s[1:] for s in meta["sh"]]  # a joined rank's part (internal allgathers)
        resp["shapes"] = [by_rank[r]["sh"] if r in by_rank else no_rows for r in ranks]
        if kind == "ALLTOALL":
            resp["splits"] = [by_rank[r]["splits"] for r in ranks]
    return resp


def _describe(events: list[dict], key: Any) -> str:
    return ", ".join(f"rank {e['r']}: {key(e)}" for e in events)


def _check_kind(events: list[dict]) -> str | None:
    kinds = {e["k"] for e in events}
    if len(kinds) > 1:
        return (f"mismatched operations ({_describe(events, lambda e: e['k'])}); every rank must call the "
                "same collective under one name")
    return None


def _check_types(events: list[dict]) -> str | None:
    if len({tuple(e["m"]["dt"]) for e in events}) > 1:
        return f"mismatched data types ({_describe(events, lambda e: '/'.join(e['m']['dt']))})"
    return None


def _check_count(events: list[dict]) -> str | None:
    if len({len(e["m"]["sh"]) for e in events}) > 1:
        return f"mismatched number of tensors in the group ({_describe(events, lambda e: len(e['m']['sh']))})"
    return None


def _check_join(kind: str, meta: dict, joined: list[int]) -> str | None:
    if not joined or kind in ("ALLREDUCE", "BARRIER") or meta.get("jo"):
        return None
    hint = ". Specify sparse_as_dense=True if using DistributedOptimizer" if kind == "ALLGATHER" else ""
    return f"{kind.capitalize()} is not supported with Join at this time (joined ranks: {joined}){hint}"


def _check_shapes(kind: str, events: list[dict]) -> str | None:
    shapes = [e["m"]["sh"] for e in events]
    if kind in SAME_SHAPE and not events[0]["m"].get("obj"):
        if len({str(s) for s in shapes}) > 1:
            return f"mismatched tensor shapes ({_describe(events, lambda e: _shapes(e['m']['sh']))})"
    if kind in ("ALLGATHER", "ALLTOALL", "REDUCESCATTER"):
        if any(len(s) == 0 for group in shapes for s in group):
            return f"a rank-zero (scalar) tensor cannot be {kind.lower()}ed; give it at least one dimension"
    if kind in ("ALLGATHER", "ALLTOALL"):
        ndims = {str([len(s) for s in group]) for group in shapes}
        if len(ndims) > 1:
            return f"mismatched tensor ranks ({_describe(events, lambda e: [len(s) for s in e['m']['sh']])})"
        if len({str([s[1:] for s in group]) for group in shapes}) > 1:
            return ("mismatched tensor shapes beyond the first dimension "
                    f"({_describe(events, lambda e: _shapes(e['m']['sh']))})")
    return None


def _check_factors(kind: str, events: list[dict]) -> str | None:
    if kind not in REDUCING:
        return None
    if len({(e["m"]["pre"], e["m"]["post"]) for e in events}) > 1:
        return ("mismatched prescale/postscale factors "
                f"({_describe(events, lambda e: (e['m']['pre'], e['m']['post']))})")
    if len({e["m"]["op"] for e in events}) > 1:
        return f"mismatched reduction ops ({_describe(events, lambda e: e['m']['op'])})"
    return None


def _check_root(kind: str, events: list[dict]) -> str | None:
    if kind == "BROADCAST" and len({e["m"]["root"] for e in events}) > 1:
        return f"mismatched root ranks ({_describe(events, lambda e: e['m']['root'])})"
    return None


def _check_device(kind: str, events: list[dict]) -> str | None:
    if kind != "BARRIER" and len({e["m"]["dev"] for e in events}) > 1:
        return f"mismatched CPU/GPU device selection ({_describe(events, lambda e: e['m']['dev'])})"
    return None


def _shapes(sh: list[list[int]]) -> str:
    return "/".join(str(list(s)) for s in sh)
