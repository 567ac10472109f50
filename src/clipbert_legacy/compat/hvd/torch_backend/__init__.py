"""`clipbert_legacy.compat.hvd` backend over `torch.distributed` (gloo on CPU, nccl on GPU), for `torchrun`.

The ``horovod.torch`` API with Horovod's semantics, built from the modules of this package:

* ``negotiation`` / ``controller``: operations matched across ranks by name and checked (shape, dtype,
  root, op, scale factors, device) as Horovod's coordinator does, through the launcher's TCP store; the
  executor thread of each process set runs them in one agreed order;
* ``execute``: the collectives themselves, with Horovod's numerics (Average, scale factors, integer and
  int16 tensors, uneven reducescatter, alltoall splits);
* ``ops``: async operations, handles, ``poll``/``synchronize``; ``autograd``: the differentiable forms
  with Horovod's gradients; ``objects``: object collectives;
* ``sets``: process sets as process groups; ``optimizer`` + ``buckets``: ``DistributedOptimizer`` (fused
  buckets, sparse gradients, join); ``timeline``; ``peer_watchdog``: a frozen rank ends the job.

This module: start-up and shutdown, the basic queries, ``join``, and the watchdog / exit handling.
Without a launcher (no WORLD_SIZE in the environment) it runs as a single process: size 1, every
collective is the identity and no process group is created.
"""
import atexit
import datetime
import gc
import os
import sys

import torch
import torch.distributed as dist

from clipbert_legacy.compat import launcher_env
from clipbert_legacy.compat.hvd.process_sets import global_process_set
from clipbert_legacy.compat.hvd.torch_backend import peer_watchdog as _peer_watchdog
from clipbert_legacy.compat.hvd.torch_backend import sets as sets
from clipbert_legacy.compat.hvd.torch_backend.autograd import (  # noqa: F401 (the backend's API)
    allgather,
    allreduce,
    alltoall,
    broadcast,
    grouped_allgather,
    grouped_allreduce,
    grouped_reducescatter,
    reducescatter,
)
from clipbert_legacy.compat.hvd.torch_backend.buckets import serve_joined
from clipbert_legacy.compat.hvd.torch_backend.controller import join_started
from clipbert_legacy.compat.hvd.torch_backend.objects import (  # noqa: F401
    allgather_object,
    broadcast_object,
    broadcast_parameters,
)
from clipbert_legacy.compat.hvd.torch_backend.ops import (  # noqa: F401 (the backend's API)
    allgather_async,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall_async,
    barrier,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather_async,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter_async,
    join_async,
    poll,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from clipbert_legacy.compat.hvd.torch_backend.optimizer import DistributedOptimizer, registered  # noqa: F401 (the backend API)
from clipbert_legacy.compat.hvd.torch_backend.optimizer_state import broadcast_optimizer_state  # noqa: F401 (the backend API)
from clipbert_legacy.compat.hvd.torch_backend.state import STATE
from clipbert_legacy.compat.hvd.torch_backend.timeline import start_from_env, start_timeline, stop_timeline  # noqa: F401

_S = STATE.process  # this process: rank, world, groups, device, failure, init generation


def init(comm=None, process_sets=None):
    if comm is not None:
        raise ValueError("hvd.init(comm=...) takes an MPI communicator; the torch backend has no MPI")
    proc = launcher_env.torchrun_process()
    world = proc.world
    _S["rank"] = proc.rank
    _S["size"] = world
    _S["local_rank"] = proc.local_rank
    _S["local_size"] = proc.local_size
    if world > 1 and not dist.is_initialized():
        use_nccl = torch.cuda.is_available() and os.environ.get("DIST_TORCH_BACKEND", "") != "gloo"
        if use_nccl:
            torch.cuda.set_device(_S["local_rank"])
        timeout = datetime.timedelta(seconds=float(os.environ.get("DIST_TIMEOUT_S", "1800")))
        dist.init_process_group("nccl" if use_nccl else "gloo", timeout=timeout,
                                **_restart_safe_store(world, timeout))
        _S["device"] = f"cuda:{_S['local_rank']}" if use_nccl else "cpu"
        _peer_watchdog.start(_S["rank"], world)
        atexit.register(_leave_together)
        sys.excepthook = _note_failure
    _S["group"] = world > 1
    _S["generation"] += 1
    start_from_env(_S["rank"])  # before the sets' threads: the first negotiation is in the timeline
    sets.start(_S["rank"], world, _S["generation"], _S["device"])
    for process_set in process_sets if isinstance(process_sets, (list, tuple)) else ():
        sets.add(process_set)


def _restarted():
    """This worker was started by ``torchrun --max-restarts`` after a failure (round > 0)."""
    return launcher_env.torchrun_restart_count() > 0


def _restart_safe_store(world, timeout):
    """After ``torchrun --max-restarts`` restarted the workers, the agent's store can still hold the
    previous round's process-group keys, and a new worker then reads a dead peer's address (gloo:
    "connectFullMesh failed ... Connection refused", seen in about half of the restarts here); so can
    a second ``hvd.init()`` after ``hvd.shutdown()`` in one process (it waited forever). Keys of restart
    round ``n`` > 0, or of a re-initialisation, go under their own prefix; a first init: the default."""
    restart = launcher_env.torchrun_restart_count()
    reinit = _S["generation"] > 0
    if not reinit and (not launcher_env.torchrun_agent_store() or not _restarted()):
        return {}
    addr, port = launcher_env.store_address()
    store = dist.TCPStore(addr, port, world, is_master=False, timeout=timeout)
    prefix = f"clipbert/restart_{restart}" + (f"/init_{_S['generation']}" if reinit else "")
    return {"store": dist.PrefixStore(prefix, store), "rank": _S["rank"], "world_size": world}


def _leave_together():
    """At interpreter exit (an atexit function): wait (10 s at most) until every rank is leaving, then
    tear the group down. A rank that exited while its peers' gloo threads still held connections to it
    made one of them abort at exit ("terminate called without an active exception", SIGABRT). After an
    uncaught exception, or if a peer does not arrive, nothing is waited for: the launcher ends the job.
    Whatever happened, this rank's own threads (peer watchdog, every set's executor and coordinator)
    end before the interpreter finalizes: a daemon thread whose store call returns after that aborts the
    process the same way, also after a finished run (issue 46)."""
    try:
        _peer_watchdog.stop()  # a clean exit: peers stop watching this rank
        if _S["failed"] or not (_S["group"] and dist.is_initialized()):
            return
        sets.announce_leave()  # a peer waiting on this rank gets Horovod's "shut down" error, not a hang
        if dist.get_backend() != "gloo":
            return
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=10))
        except Exception:  # a peer is gone or stuck: leave without tearing down
            return
        shutdown()
    finally:
        sets.stop_threads()
        join_started()  # a thread of a set closed earlier may still be ending


def _note_failure(exc_type, exc, tb, _previous=sys.excepthook):
    _S["failed"] = True
    _previous(exc_type, exc, tb)


def shutdown():
    stop_timeline()
    sets.close_all()
    _peer_watchdog.stop()
    if _S["group"] and dist.is_initialized():
        dist.destroy_process_group()
    _S["group"] = False
    gc.collect()  # the groups' last references: their gloo threads end now, not during finalization


def rank():
    return _S["rank"]


def size():
    return _S["size"]


def local_rank():
    return _S["local_rank"]


def local_size():
    return _S["local_size"]


def cross_rank():
    return _S["rank"] // max(_S["local_size"], 1)


def cross_size():
    return _S["size"] // max(_S["local_size"], 1)


def is_homogeneous():
    return True  # torchrun starts --nproc_per_node workers on every node


def mpi_threads_supported():
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    return dist.is_gloo_available()


def gloo_built():
    return dist.is_gloo_available()


def nccl_built():
    """NCCL's version as Horovod reports it (2.29.7 -> 22907), 0 without NCCL."""
    if not (dist.is_nccl_available() and torch.cuda.is_available()):
        return 0
    major, minor, patch = torch.cuda.nccl.version()[:3]
    return major * (10000 if (major, minor) >= (2, 9) else 1000) + minor * 100 + patch


def ddl_built():
    return False


def ccl_built():
    return False


def cuda_built():
    return torch.version.cuda is not None


def rocm_built():
    return torch.version.hip is not None


def busy():
    """Context: a long operation of this rank alone (a checkpoint save); see ``peer_watchdog``."""
    return _peer_watchdog.busy()


def add_process_set(process_set):
    return sets.add(process_set)


def remove_process_set(process_set):
    return sets.remove(process_set)


def process_set_size(process_set):
    return sets.lookup(process_set).size


def process_set_rank(process_set):
    tset = sets.lookup(process_set)
    return tset.ranks.index(tset.rank) if tset.member else None


def join(device=-1):
    """Horovod's join: until every rank has joined, this rank adds zeros to the others' allreduces
    (negotiated ones through its executor thread, the optimizers' buckets through ``serve_joined``).
    Returns the rank that joined last, the same on every rank."""
    tset = sets.lookup(global_process_set)
    if device is not None and device >= 0 and torch.cuda.is_available():
        tset.place.join_device = torch.device("cuda", device)
    handle = join_async()
    if _S["group"]:
        serve_joined(None, _S["size"], _S["device"], registered)
    return synchronize(handle)
