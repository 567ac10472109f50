"""torch backend: what the job may believe of the launcher's TCP store, which every local user can reach.

torch's ``TCPStore`` has no authentication, and ``list_keys()`` shows any client every key, so a secret key
prefix hides nothing: another local user (or anyone who reaches the port) can read, write and delete the
job's keys. The job therefore

* **seals** what a rank's actions depend on: events of the Horovod negotiation log and the coordinator's
  responses carry an HMAC-SHA256 with the job's token (:func:`job_token`, an environment variable the
  launcher gives every worker and that other users cannot read: ``/proc/PID/environ`` is the owner's), a
  per-rank sequence number (a replayed event is refused) and the key they were written under (a response
  moved to another slot is refused);
* **parses** every value it reads (heartbeats, pids, events): a malformed or forged value is one warning
  line naming the key, never a crash;
* **proves** a pid before signalling it (:func:`is_job_process`): the pid's ``/proc`` start time must be the
  one its rank registered and its environment must hold the job's token (or, without one, the launcher's
  ``TORCHELASTIC_RUN_ID``/``MASTER_ADDR``/``MASTER_PORT``): a forged ``who`` entry cannot make the watchdog
  kill an unrelated process of the job's user.

``python -m clipbert_legacy.compat.loopback`` sets ``CLIPBERT_JOB_TOKEN`` to a fresh random token; a
multi-machine job sets the same value on every machine itself (docs/failure_behaviour.md, Security).
Without a token events are parsed but not sealed.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import socket

from clipbert_legacy.compat import launcher_env

logger = logging.getLogger(__name__)

TOKEN_ENV = "CLIPBERT_JOB_TOKEN"
_warned: set[str] = set()


def job_token() -> str:
    return os.environ.get(TOKEN_ENV, "")


def warn_once(key: str, what: str) -> None:
    """One line per key and kind of problem for the life of the process."""
    tag = f"{key}\0{what}"
    if tag not in _warned:
        _warned.add(tag)
        logger.warning("store key %s: %s; ignored (another local user can write the launcher's store: "
                       "docs/failure_behaviour.md, Security)", key, what)


def _mac(token: str, key: str, body: str) -> str:
    return hmac.new(token.encode(), f"{key}\0{body}".encode(), hashlib.sha256).hexdigest()


def seal(key: str, obj: dict) -> str:
    """``obj`` as JSON for ``key``, with its HMAC when the job has a token."""
    body = json.dumps(obj, separators=(",", ":"))
    token = job_token()
    return json.dumps({"b": body, "h": _mac(token, key, body)}) if token else body


def unseal(key: str, raw) -> dict | None:
    """The dict :func:`seal` wrote under ``key``, or None (one warning line naming ``key``) when ``raw`` is
    not JSON of an object, or lacks a valid HMAC while the job has a token."""
    try:
        outer = json.loads(raw)
        token = job_token()
        if token:
            if not (isinstance(outer, dict) and isinstance(outer.get("b"), str)
                    and isinstance(outer.get("h"), str)):
                raise ValueError("not sealed with the job's token")
            if not hmac.compare_digest(outer["h"], _mac(token, key, outer["b"])):
                raise ValueError("its seal does not match the job's token (forged or replayed)")
            outer = json.loads(outer["b"])
        if not isinstance(outer, dict):
            raise ValueError(f"a JSON {type(outer).__name__}, not an object")
        return outer
    except (ValueError, TypeError, UnicodeError, RecursionError) as e:
        warn_once(key, f"unreadable value ({str(e)[:120]})")
        return None


def parse_int(key: str, raw) -> int | None:
    """A counter the watchdog wrote with ``set`` (decimal text), or None with one warning line."""
    try:
        text = raw.decode("ascii") if isinstance(raw, (bytes, bytearray)) else str(raw)
        if len(text) > 20:
            raise ValueError(f"{len(text)} characters")
        return int(text)
    except (ValueError, UnicodeError) as e:
        warn_once(key, f"not a counter ({str(e)[:80]})")
        return None


def identity() -> str:
    """What a rank registers as ``who``: host, pid and the pid's start time (clock ticks since boot)."""
    return f"{socket.gethostname()} {os.getpid()} {start_time(os.getpid())}"


def start_time(pid: int) -> int | None:
    """Field 22 of ``/proc/PID/stat`` (the process's start, in clock ticks): a reused pid has another."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(4096)
        return int(stat[stat.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def _environ(pid: int) -> dict[str, str] | None:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError:  # another user's process, or gone
        return None
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            out[k.decode(errors="replace")] = v.decode(errors="replace")
    return out


def is_job_process(pid: int, registered_start: int | None) -> tuple[bool, str]:
    """Whether ``pid`` is provably a process of this job: not this process, started when its rank
    registered it, and holding this job's token (or launcher variables) in its environment. Returns
    (proven, why not)."""
    if pid <= 1 or pid == os.getpid():
        return False, "not another process"
    now = start_time(pid)
    if now is None or registered_start is None or now != registered_start:
        return False, "its start time is not the one its rank registered (gone, reused or forged)"
    env = _environ(pid)
    if env is None:
        return False, "its environment cannot be read (another user's process)"
    token = job_token()
    if token:
        ok = hmac.compare_digest(env.get(TOKEN_ENV, ""), token)
    else:
        ours = launcher_env.job_identity()
        ok = bool(ours) and all(env.get(k) == v for k, v in ours.items())
    return (True, "") if ok else (False, "its environment does not hold this job's token")
