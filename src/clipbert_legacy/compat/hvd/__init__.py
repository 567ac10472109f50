"""The `horovod.torch` API, over real Horovod or over `torch.distributed`.

ClipBERT-style scripts say `import horovod.torch as hvd`; ours say `import clipbert_legacy.compat.hvd as hvd`
and keep every call: the whole ``horovod.torch`` 0.28.1 API (collectives with their async, in-place and
grouped forms, handles, process sets, join, SyncBatchNorm, timelines, DistributedOptimizer ...). Two
backends sit under the same names:

* ``horovod`` — the real Horovod (built by run_scripts/install_horovod.sh), launched with
  ``horovodrun -np N ...``. Calls are forwarded to ``horovod.torch``.
* ``torch``  — the same semantics over ``torch.distributed`` (gloo on CPU, nccl on GPU), launched with
  ``torchrun --nproc_per_node N ...``, for machines where Horovod cannot be built: ops are matched across
  ranks by name and checked (shape, dtype, root, op) as Horovod's coordinator does, see ``hvd.torch_backend``.

A single process started without any launcher works with either backend: size 1, no communication.

Selection (logged at ``init()``): ``set_backend(name)`` (the engine passes the ``dist_backend`` config
key) or the env var ``DIST_BACKEND`` = ``auto|horovod|torch``. ``auto`` picks ``horovod`` under
``horovodrun``, ``torch`` under ``torchrun``, and otherwise ``horovod`` when it is importable.

Deliberate differences from Horovod 0.28.1 (both backends; details and the torch backend's own in
docs/horovod.md):

* ``broadcast_optimizer_state`` is Horovod's, zero-gradient step included, and takes one keyword of
  ours: ``zero_grad_step=False`` loads the root's ``state_dict()`` without a step (``hvd.functions``).
* ``SyncBatchNorm`` also runs on CPU tensors (Horovod's needs CUDA; under horovodrun CUDA input still
  runs Horovod's kernels).
* ``DistributedOptimizer(row_sparse=[...])``: those tables' gradients are averaged over the rows some
  rank touched, in ``synchronize()`` (exact; ``clipbert_legacy.compat.hvd.row_sparse``); ``reduce_to`` (torch
  backend).
* ``DistributedOptimizer`` on CPU parameters (horovod backend) waits for its reductions with ``hvd.poll``
  and sleeps, then runs Horovod's ``synchronize()``, instead of Horovod's spinning wait, which keeps a
  core busy that the reduction itself needs on a CPU job (``hvd.horovod_wait``; ``CLIPBERT_HVD_WAIT``).
* ``allgather_object`` / ``broadcast_object`` default to one fixed name per call kind instead of the
  object's type name (ranks passing objects of different types would otherwise wait for each other).
* No ``HOROVOD_*`` setting is changed: ``init()`` leaves Horovod's cycle time and the rest to the user
  (the project's task entry chooses a CPU cycle time for its own jobs: ``clipbert_legacy.tasks.cpu``).
* ``hvd.elastic`` is Horovod's own module on the horovod backend; on the torch backend it is refused
  (``AttributeError``, ``ELASTIC_ON_TORCH``): torchrun restarts every worker instead of re-forming the
  survivors, so resume with ``--max-restarts`` and the engine's restore file.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

from clipbert_legacy.compat import launcher_env
from clipbert_legacy.compat.hvd.api import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    sparse_allreduce_async,
    synchronize,
)
from clipbert_legacy.compat.hvd.compression import Compression, Compressor
from clipbert_legacy.compat.hvd.errors import HorovodInternalError, HostsUpdatedInterrupt
from clipbert_legacy.compat.hvd.functions import (
    DistributedOptimizer,
    Params,
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from clipbert_legacy.compat.hvd.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    remove_process_set,
)
from clipbert_legacy.compat.hvd.state import BACKENDS, STATE, NotInitializedError, backend_name, impl
from clipbert_legacy.compat.hvd.sync_bn import SyncBatchNorm

__all__ = [
    "Adasum", "Average", "BACKENDS", "Compression", "Compressor", "DistributedOptimizer",
    "HorovodInternalError", "HostsUpdatedInterrupt", "Max", "Min", "NotInitializedError", "Params",
    "ProcessSet", "Product", "Sum", "SyncBatchNorm", "add_process_set", "allgather", "allgather_async",
    "allgather_object", "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "alltoall",
    "alltoall_async", "backend_name", "barrier", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "busy",
    "ccl_built", "check_extension", "cross_rank", "cross_size", "cuda_built", "ddl_built",
    "global_process_set", "gloo_built", "gloo_enabled", "grouped_allgather", "grouped_allgather_async",
    "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_",
    "grouped_reducescatter", "grouped_reducescatter_async", "init", "is_homogeneous", "is_initialized",
    "join", "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported", "nccl_built",
    "poll", "rank", "reducescatter", "reducescatter_async", "remove_process_set", "rocm_built",
    "set_backend", "shutdown", "size", "sparse_allreduce_async", "start_timeline", "stop_timeline",
    "synchronize",
]

logger = logging.getLogger(__name__)


def set_backend(name: str) -> None:
    """Choose the backend before ``init()``: 'auto', 'horovod' or 'torch'."""
    if name not in BACKENDS:
        raise ValueError(f"dist_backend={name!r} is not one of {'|'.join(BACKENDS)}")
    if STATE.impl is not None and name not in ("auto", STATE.name):
        raise RuntimeError(f"hvd already initialized with backend {STATE['name']!r}; "
                           f"set dist_backend={name!r} before hvd.init()")
    STATE.requested = name


def _horovod_importable() -> bool:
    try:
        import horovod.torch  # noqa: F401
        return True
    except Exception:  # ImportError, or a broken build raising at import
        return False


def _resolve_backend() -> str:
    name = STATE.requested or os.environ.get("DIST_BACKEND", "auto") or "auto"
    if name not in BACKENDS:
        raise ValueError(f"DIST_BACKEND={name!r} is not one of {'|'.join(BACKENDS)}")
    under_horovodrun, under_torchrun = launcher_env.under_horovodrun(), launcher_env.under_torchrun()
    if name == "auto":
        if under_horovodrun:
            name = "horovod"
        elif under_torchrun:
            name = "torch"
        else:
            name = "horovod" if _horovod_importable() else "torch"
    if name == "horovod":
        if not _horovod_importable():
            raise RuntimeError("dist_backend=horovod but horovod.torch is not importable; run "
                               "./run_scripts/install_horovod.sh, or use dist_backend=torch with torchrun")
        if under_torchrun and not under_horovodrun:
            raise RuntimeError("dist_backend=horovod but this process was started by torchrun; "
                               "launch with horovodrun, or use dist_backend=torch")
    elif under_horovodrun:
        raise RuntimeError("dist_backend=torch but this process was started by horovodrun; "
                           "launch with torchrun --nproc_per_node N, or use dist_backend=horovod")
    return name


def _backend_module(name: str) -> Any:
    if name == "horovod":
        from clipbert_legacy.compat.hvd import horovod_backend as backend
    else:
        from clipbert_legacy.compat.hvd import torch_backend as backend
    return backend


def _built() -> Any:
    """The backend that answers the build queries (``ccl_built()`` ...): Horovod answers them before
    ``init()``, so they do not need it here either."""
    return STATE.impl if STATE.impl is not None else _backend_module(_resolve_backend())


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Initialise the chosen backend (idempotent). ``process_sets``: ProcessSets to register at once."""
    if STATE.impl is not None:
        return
    name = _resolve_backend()
    backend = _backend_module(name)
    backend.init(comm=comm, process_sets=process_sets)
    STATE.name, STATE.impl = name, backend
    logger.info("distributed backend: %s (rank %d/%d, local rank %d/%d)", name, backend.rank(),
                backend.size(), backend.local_rank(), backend.local_size())


def is_initialized() -> bool:
    """Whether ``init()`` has run (and ``shutdown()`` has not)."""
    return STATE.impl is not None


def shutdown() -> None:
    """Shut the backend down; ``init()`` may be called again afterwards."""
    if STATE.impl is not None:
        STATE.impl.shutdown()
    STATE.impl = STATE.name = None


def rank() -> int:
    return impl().rank()


def size() -> int:
    return impl().size()


def local_rank() -> int:
    return impl().local_rank()


def local_size() -> int:
    return impl().local_size()


def cross_rank() -> int:
    return impl().cross_rank()


def cross_size() -> int:
    return impl().cross_size()


def is_homogeneous() -> bool:
    return impl().is_homogeneous()


def mpi_threads_supported() -> bool:
    return impl().mpi_threads_supported()


def mpi_enabled() -> bool:
    return impl().mpi_enabled()


def mpi_built() -> bool:
    return _built().mpi_built()


def gloo_enabled() -> bool:
    return impl().gloo_enabled()


def gloo_built() -> bool:
    return _built().gloo_built()


def nccl_built() -> int:
    """The NCCL version as an int (2.29.7 -> 22907), 0 without NCCL (Horovod's convention)."""
    return _built().nccl_built()


def ddl_built() -> bool:
    return _built().ddl_built()


def ccl_built() -> bool:
    return _built().ccl_built()


def cuda_built() -> bool:
    return _built().cuda_built()


def rocm_built() -> bool:
    return _built().rocm_built()


def check_extension(ext_name: str, ext_env_var: str, pkg_path: str, *args: Any) -> None:
    """Horovod's check that its C++ extension was built (``horovod.common.util.check_extension``): with
    Horovod installed, Horovod's own; without it only the torch backend can run, and it needs none."""
    try:
        from horovod.common.util import check_extension as horovod_check
    except ImportError:
        return
    horovod_check(ext_name, ext_env_var, pkg_path, *args)


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Record the collectives into a Chrome-trace file (torch backend: see docs/horovod.md)."""
    impl().start_timeline(file_path, mark_cycles=mark_cycles)


def stop_timeline() -> None:
    impl().stop_timeline()


def busy() -> contextlib.AbstractContextManager:
    """Not Horovod API: wrap a long operation of this rank alone (a checkpoint save) so the torch
    backend's peer watchdog allows it ``DIST_BUSY_GRACE_S`` of silence; a no-op elsewhere."""
    backend = STATE.impl
    return backend.busy() if backend is not None and hasattr(backend, "busy") else contextlib.nullcontext()


ELASTIC_ON_TORCH = (
    "hvd.elastic does not run on the torch backend (torchrun, or DIST_BACKEND=torch): Horovod's elastic mode "
    "keeps the survivors running and re-forms them in-process, but torchrun restarts every worker after a "
    "failure or membership change, so its in-memory commits would be lost; use torchrun --max-restarts K "
    "(--nnodes MIN:MAX) and resume from a restore file (the engine writes ckpt/restore.pt every "
    "elastic_commit_steps steps, docs/scaling_out.md), or launch with horovodrun --min-np/--max-np")


def __getattr__(name: str) -> Any:
    """``hvd.elastic``: Horovod's own elastic module (``hvd.elastic.run``, ``TorchState``), loaded when
    first used; it drives Horovod itself, so it belongs to ``horovod``-backend jobs. On the torch backend
    (the one ``init()`` chose, or would choose) it is an ``AttributeError`` saying why and what to use
    instead: Horovod's module there says "Horovod has not been initialized" after ``hvd.init()``."""
    if name == "elastic":
        if (STATE.name or _resolve_backend()) == "torch":
            raise AttributeError(ELASTIC_ON_TORCH)
        try:
            import horovod.torch.elastic as elastic
        except ImportError as e:
            raise AttributeError("hvd.elastic is Horovod's elastic training (horovodrun --min-np/--max-np) "
                                 "and needs Horovod installed; under torchrun use --max-restarts "
                                 "(docs/scaling_out.md)") from e
        return elastic
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
