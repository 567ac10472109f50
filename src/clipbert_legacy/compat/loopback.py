"""Single-machine launches that listen on the loopback only.

    python -m clipbert_legacy.compat.loopback horovodrun -np 2 -H localhost:2 --gloo \
        python src/tasks/run_x.py ...
    python -m clipbert_legacy.compat.loopback torchrun --nproc_per_node 2 src/tasks/run_x.py ...

Why: the launchers' servers take commands without authentication (PyTorch's security policy: its
distributed primitives are for trusted networks only), and both listen on every interface whatever
address the job uses: torch's ``TCPStore`` server (torchrun's rendezvous and the store the workers
share) binds ``::``/``0.0.0.0`` even with ``--master_addr 127.0.0.1`` and has no option for the
address, and horovodrun's rendezvous HTTP server binds ``0.0.0.0``. A job on one machine needs none of
them reachable from outside, so this runs the same launcher (``torch.distributed.run.main`` /
Horovod's ``horovodrun`` code, in this process) with those servers bound to 127.0.0.1: the store
server gets a socket bound to the loopback (``TCPStore(master_listen_fd=...)``), Horovod's port finder
binds 127.0.0.1, and the workers' Gloo sockets use interface ``lo`` (``GLOO_SOCKET_IFNAME``,
``--network-interface lo``). A job that names another host is refused (exit 2): across machines the
ports must be on a private network or behind a firewall (docs/scaling_out.md).

The workers also get a fresh random ``CLIPBERT_JOB_TOKEN`` (kept when already set): the torch backend
seals its store values with it and the watchdog signals only processes whose environment holds it
(``clipbert_legacy.compat._store_auth``), so another local user who writes the store cannot steer the job
or make it kill an unrelated process.
"""
import ipaddress
import os
import secrets
import socket
import sys
import traceback

LOOPBACK = "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address) is this machine's loopback only."""
    host = (host or "").strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback for i in infos)


def _refuse(what: str) -> None:
    print(f"error: clipbert_legacy.compat.loopback launches jobs on this machine only, bound to {LOOPBACK}; "
          f"{what}. "
          "For several machines run the launcher itself (run_scripts/multinode_*.sh) on a private network "
          "or behind a firewall: docs/scaling_out.md", file=sys.stderr)
    sys.exit(2)


# -- torchrun --------------------------------------------------------------------------------------
def _loopback_tcpstore(original):
    """A TCPStore whose server, for a loopback host, listens on a socket bound to 127.0.0.1."""
    from torch.distributed import DistNetworkError

    class LoopbackTCPStore(original):
        def __init__(self, host_name, port, world_size=None, is_master=False, *args, **kwargs):
            own_socket = kwargs.get("master_listen_fd") is None and len(args) < 4
            if is_master and own_socket and is_loopback(host_name):
                try:
                    sock = socket.create_server((LOOPBACK, int(port)), backlog=4096)
                except OSError as e:  # as the store's own bind failure (torchrun's c10d handler retries)
                    raise DistNetworkError(f"cannot listen on {LOOPBACK}:{port}: {e}") from e
                port = sock.getsockname()[1]
                kwargs["master_listen_fd"] = sock.detach()  # the store's server owns the descriptor
            super().__init__(host_name, port, world_size, is_master, *args, **kwargs)

    LoopbackTCPStore.__name__ = LoopbackTCPStore.__qualname__ = "TCPStore"
    return LoopbackTCPStore


def _patch_tcpstore() -> None:
    import torch.distributed as dist
    import torch.distributed.run  # noqa: F401  (the launcher's modules, so that their names get patched too)
    original = dist.TCPStore
    patched = _loopback_tcpstore(original)
    for name, module in list(sys.modules.items()):
        if name.startswith("torch.distributed") and getattr(module, "TCPStore", None) is original:
            module.TCPStore = patched


def torchrun(argv: list) -> None:
    """``torchrun ARGV`` with its store servers and the workers' Gloo sockets on the loopback."""
    from torch.distributed import run
    args = run.parse_args(argv)
    _, max_nodes = run.parse_min_max_nnodes(args.nnodes)
    host = "localhost" if args.standalone else (
        args.rdzv_endpoint.rsplit(":", 1)[0] if args.rdzv_endpoint else args.master_addr)
    if max_nodes != 1:
        _refuse(f"torchrun --nnodes {args.nnodes} means several machines")
    if not is_loopback(host):
        _refuse(f"the rendezvous host {host!r} is not a loopback address")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if args.local_addr is None:
        argv = ["--local-addr", LOOPBACK] + list(argv)
    _patch_tcpstore()
    run.main(argv)


# -- horovodrun ------------------------------------------------------------------------------------
def _loopback_find_port(server_factory):
    """Horovod's ``find_port`` on 127.0.0.1 (an ephemeral port) instead of every interface."""
    server = server_factory((LOOPBACK, 0))
    return server, server.server_address[1]


def horovodrun(argv: list) -> None:
    """``horovodrun ARGV`` with its rendezvous server on 127.0.0.1 and Gloo on interface ``lo``."""
    from horovod.runner import launch
    from horovod.runner.common.util import network as common_network
    from horovod.runner.http import http_server
    from horovod.runner.util import network
    sys.argv = ["horovodrun"] + list(argv)
    args = launch.parse_args()
    if args.hostfile or args.host_discovery_script:
        _refuse("--hostfile and --host-discovery-script name other machines")
    for entry in (args.hosts or "localhost").split(","):
        if not is_loopback(entry.rsplit(":", 1)[0]):
            _refuse(f"-H names host {entry.rsplit(':', 1)[0]!r}")
    args.nics = args.nics or {"lo"}
    for module in (network, common_network, http_server):
        module.find_port = _loopback_find_port
    if args.log_level:  # as horovod.runner.launch.run_commandline
        import logging
        logging.addLevelName(logging.NOTSET, "TRACE")
        logging.basicConfig(level=logging.getLevelName(args.log_level))
    launch._run(args)


def main(argv: list) -> None:
    if not argv or argv[0] not in ("torchrun", "horovodrun"):
        print("usage: python -m clipbert_legacy.compat.loopback {torchrun|horovodrun} LAUNCHER_ARGS...",
              file=sys.stderr)
        sys.exit(2)
    from clipbert_legacy.compat._store_auth import TOKEN_ENV
    os.environ.setdefault(TOKEN_ENV, secrets.token_hex(16))  # inherited by every worker, never in the store
    try:
        (torchrun if argv[0] == "torchrun" else horovodrun)(argv[1:])
    except Exception as e:  # reported as the launcher reports it (its traceback, exit 1), without this module
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        traceback.print_exception(type(e), e, tb)
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
