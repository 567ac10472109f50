"""horovod backend: a fresh Gloo rendezvous for every ``hvd.init()`` after ``hvd.shutdown()`` in one job.

Why: horovodrun's rendezvous server (``horovod.runner.http.http_server``, 0.28.1) empties a scope once
every rank of it has finished, but it keeps one list of finished ranks for all scopes and clears the
whole list whenever any scope completes. In a 2-rank job on one host the ``cross_<local_rank>`` scopes
(one rank each) complete between the two ranks' ``local_<host>`` finishes, so the local scope is often
never emptied. A second ``init()`` then reads the peer's address from the first rendezvous, whose
sockets are closed: Gloo's ``Connect timeout`` or ``Connection refused`` (issue 46: a third of the jobs
with three jobs at once on a busy machine).

So every init after the first gets a rendezvous server of its own: every rank says it has arrived (in
the launcher's server, under keys of that generation), rank 0 waits for all of them (no rank still
talks to the previous server), starts a new ``RendezvousHTTPServer`` (Horovod's class, no scope
registered: each rank removes its own key after Horovod's post-connect barrier) and publishes its
address; every rank points ``HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT`` at it before Horovod's ``init``.
Values are plain ``host:port`` text, never unpickled. Horovod elastic jobs are left alone (the elastic
driver resets its server itself).
"""
from __future__ import annotations

import ipaddress
import os
import socket
import threading
import time
import urllib.error
import urllib.request

from clipbert_legacy.compat import launcher_env

ADDR, PORT = "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT"
SCOPE = "clipbert_reinit"
_R = {"launcher": None, "inits": 0, "server": None}


def prepare() -> None:
    """Before Horovod's ``init``: for a re-initialisation under horovodrun, a fresh rendezvous server."""
    if _R["launcher"] is None:
        _R["launcher"] = launcher_env.horovod_rendezvous()  # horovodrun's own, before any of ours
    _R["inits"] += 1
    if _R["inits"] == 1 or _R["launcher"] is None or launcher_env.horovod_elastic():
        return
    job = _R["launcher"]
    gen, rank, size, timeout, launcher = _R["inits"], job.rank, job.size, job.timeout_s, (job.addr, job.port)
    _put(launcher, f"{gen}.arrived.{rank}", b"1")
    if rank == 0:
        for r in range(size):
            _wait(launcher, f"{gen}.arrived.{r}", timeout, f"rank {r} to reach hvd.init() number {gen}")
        address = _start_server(launcher[0])
        _put(launcher, f"{gen}.server", address.encode())
    else:
        address = _wait(launcher, f"{gen}.server", timeout,
                        f"rank 0 to start the rendezvous of hvd.init() number {gen}").decode()
    host, port = address.rsplit(":", 1)
    os.environ[ADDR], os.environ[PORT] = host, port


def _start_server(launcher_host: str) -> str:
    """Rank 0: a new rendezvous server on the address this host reaches the launcher's server from (the
    loopback for a job on one machine); the previous generation's server stops (every rank has arrived)."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer
    old = _R["server"]
    if old is not None:
        old.shutdown()
        old.server_close()
    host = _own_address(launcher_host)
    server = RendezvousHTTPServer((host, 0), RendezvousHandler, 0)
    threading.Thread(target=server.serve_forever, name="hvd-reinit-rendezvous", daemon=True).start()
    _R["server"] = server
    return f"{host}:{server.server_address[1]}"


def _own_address(launcher_host: str) -> str:
    try:
        if ipaddress.ip_address(launcher_host).is_loopback:
            return launcher_host
    except ValueError:
        pass
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:  # no packet is sent: only the route
        s.connect((launcher_host, 9))
        return s.getsockname()[0]


def _url(launcher: tuple, key: str) -> str:
    return f"http://{launcher[0]}:{launcher[1]}/{SCOPE}/{key}"


def _put(launcher: tuple, key: str, value: bytes) -> None:
    req = urllib.request.Request(_url(launcher, key), data=value, method="PUT")
    with urllib.request.urlopen(req, timeout=30):
        pass


def _wait(launcher: tuple, key: str, timeout: float, what: str) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(_url(launcher, key), timeout=30) as resp:
                return resp.read()
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
        if time.monotonic() > deadline:
            raise RuntimeError(f"hvd.init(): waited {timeout:g} s (HOROVOD_GLOO_TIMEOUT_SECONDS, horovodrun "
                               f"--gloo-timeout-seconds) for {what}; is every rank calling hvd.init()?")
        time.sleep(0.02)

