"""`clipbert_legacy.compat.hvd` backend that forwards to the real Horovod (`horovod.torch`).

Every call goes to Horovod's own function; only our reduction-op names (``hvd.Average`` ...) and our
``ProcessSet`` objects are translated to Horovod's. What this module adds is listed in ``hvd``'s
docstring (row-sparse routing, fixed object-collective names, the re-initialisation rendezvous). It
sets no ``HOROVOD_*`` setting of its own: the one variable it writes is the rendezvous address of an
``init()`` after ``shutdown()`` (``hvd.horovod_rendezvous``).
"""
import horovod.torch as _h
import torch
from horovod.torch import mpi_ops as _mpi_ops

from clipbert_legacy.compat.hvd import horovod_rendezvous, horovod_wait
from clipbert_legacy.compat.hvd.process_sets import ProcessSet, global_process_set
from clipbert_legacy.compat.hvd.row_sparse import average_rows

_OPS = {"average": _h.Average, "sum": _h.Sum, "adasum": _h.Adasum, "min": _h.Min, "max": _h.Max,
        "product": _h.Product}


def _op(op):
    if op in _OPS:
        return _OPS[op]
    if op in _OPS.values():  # already a horovod constant
        return op
    raise ValueError(f"unsupported reduction op {op!r} for the horovod backend")


def _ps(process_set):
    """Horovod's process set behind ours (Horovod's own objects pass through)."""
    if isinstance(process_set, ProcessSet):
        if process_set.process_set_id == 0:
            return _h.global_process_set
        if process_set._backend is None:
            raise ValueError(f"{process_set} is not registered: call hvd.add_process_set first")
        return process_set._backend
    return process_set


def init(comm=None, process_sets=None):
    horovod_rendezvous.prepare()  # after an hvd.shutdown(): a rendezvous of its own (issue 46)
    if isinstance(process_sets, (list, tuple)):  # static process sets: ours become Horovod's
        theirs = [_h.ProcessSet(p.ranks) if isinstance(p, ProcessSet) else p for p in process_sets]
        _h.init(comm=comm, process_sets=theirs)
        for p, h in zip(process_sets, theirs):
            if isinstance(p, ProcessSet):
                p.process_set_id, p._backend = h.process_set_id, h
    else:
        _h.init(comm=comm, process_sets=process_sets)
    global_process_set.ranks = list(range(_h.size()))


rank, size, local_rank, local_size, shutdown = _h.rank, _h.size, _h.local_rank, _h.local_size, _h.shutdown
cross_rank, cross_size, is_homogeneous = _h.cross_rank, _h.cross_size, _mpi_ops.is_homogeneous
mpi_threads_supported, mpi_enabled, mpi_built = _h.mpi_threads_supported, _h.mpi_enabled, _h.mpi_built
gloo_enabled, gloo_built, nccl_built, ddl_built = _h.gloo_enabled, _h.gloo_built, _h.nccl_built, _h.ddl_built
ccl_built, cuda_built, rocm_built = _h.ccl_built, _h.cuda_built, _h.rocm_built
start_timeline, stop_timeline, poll, synchronize, join = (_h.start_timeline, _h.stop_timeline, _h.poll,
                                                          _h.synchronize, _h.join)


def add_process_set(process_set):
    h = _h.add_process_set(process_set.ranks)
    process_set.process_set_id, process_set._backend = h.process_set_id, h
    return process_set


def remove_process_set(process_set):
    return _h.remove_process_set(process_set._backend)


def process_set_size(process_set):
    return _ps(process_set).size()


def process_set_rank(process_set):
    return _ps(process_set).rank()


def barrier(process_set=global_process_set):
    _h.barrier(process_set=_ps(process_set))


def _reduction(fn):
    """A Horovod reduction with our op name and process set translated."""
    def call(*args, op, process_set, **kwargs):
        return fn(*args, op=_op(op), process_set=_ps(process_set), **kwargs)
    call.__name__ = fn.__name__
    return call


def _placed(fn):
    """A Horovod collective with our process set translated."""
    def call(*args, process_set, **kwargs):
        return fn(*args, process_set=_ps(process_set), **kwargs)
    call.__name__ = fn.__name__
    return call


allreduce, allreduce_async = _reduction(_h.allreduce), _reduction(_h.allreduce_async)
allreduce_, allreduce_async_ = _reduction(_h.allreduce_), _reduction(_h.allreduce_async_)
grouped_allreduce = _reduction(_h.grouped_allreduce)
grouped_allreduce_async = _reduction(_h.grouped_allreduce_async)
grouped_allreduce_ = _reduction(_h.grouped_allreduce_)
grouped_allreduce_async_ = _reduction(_h.grouped_allreduce_async_)
sparse_allreduce_async = _reduction(_h.sparse_allreduce_async)
reducescatter, reducescatter_async = _reduction(_h.reducescatter), _reduction(_h.reducescatter_async)
grouped_reducescatter = _reduction(_h.grouped_reducescatter)
grouped_reducescatter_async = _reduction(_h.grouped_reducescatter_async)
allgather, allgather_async = _placed(_h.allgather), _placed(_h.allgather_async)
grouped_allgather = _placed(_h.grouped_allgather)
grouped_allgather_async = _placed(_h.grouped_allgather_async)
broadcast, broadcast_async = _placed(_h.broadcast), _placed(_h.broadcast_async)
broadcast_, broadcast_async_ = _placed(_h.broadcast_), _placed(_h.broadcast_async_)
alltoall, alltoall_async = _placed(_h.alltoall), _placed(_h.alltoall_async)


def broadcast_parameters(named_tensors, root_rank):
    """Horovod's way: every broadcast started, then all awaited (names from the state-dict keys)."""
    handles = [_h.broadcast_async_(t, root_rank, name) for name, t in named_tensors]
    for handle in handles:
        _h.synchronize(handle)


broadcast_optimizer_state = _h.broadcast_optimizer_state  # Horovod's own, zero-gradient step and all


# Horovod names an object collective after ``type(obj).__name__`` unless told otherwise, and matches
# ops across ranks by name: ranks passing objects of different types (rank 0 a str, the others None)
# would wait for each other forever. One fixed name per kind of call (they run one at a time).
def allgather_object(obj, name=None):
    return _h.allgather_object(obj, name=name or "clipbert.allgather_object")


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    return _h.broadcast_object(obj, root_rank, name=name or "clipbert.broadcast_object",
                               process_set=_ps(process_set))


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op="average", gradient_predivide_factor=1.0, row_sparse=(), process_set=None,
                         **kwargs):
    compression = compression if compression is not None else _h.Compression.none
    opt = _h.DistributedOptimizer(optimizer, named_parameters=named_parameters, compression=compression,
                                  backward_passes_per_step=backward_passes_per_step, op=_op(op),
                                  gradient_predivide_factor=gradient_predivide_factor,
                                  process_set=_ps(process_set or global_process_set), **kwargs)
    if row_sparse:  # also at size 1: an elastic job may grow
        if _op(op) != _h.Average:
            raise ValueError("DistributedOptimizer: row_sparse parameters need op=average")
        _route_row_sparse(opt, row_sparse, compression)
    if _op(op) != _h.Adasum and horovod_wait.wait_mode(optimizer) == "poll":  # a CPU job: no spinning wait
        horovod_wait.poll_before_synchronize(opt, _h.poll)
    return opt


def _route_row_sparse(opt, params, compression):
    """Reduce ``params`` over their touched rows (clipbert_legacy.compat.hvd.row_sparse) instead of densely.

    Horovod's optimizer starts a parameter's reduction with ``_allreduce_grad_async(p)`` and, for a
    handle that is a callable (its own sparse path), calls it in ``synchronize()`` and installs the
    result with ``p.grad.set_(decompress(result, ctx))``; the row-sparse reduction rides on that:
    it runs in ``synchronize()``, after the dense reductions were started, and works in place."""
    dense = opt._allreduce_grad_async
    ids = {id(p) for p in params}

    def allreduce_grad_async(p):
        if id(p) not in ids:
            return dense(p)
        if p.grad is None:  # no gradient on this rank: zeros, so the collectives still match
            p.grad = torch.zeros_like(p)
        name = opt._parameter_names.get(p)

        def reduce():
            return average_rows(p.grad, lambda t: _h.allgather(t, name=f"{name}.rows"),
                                lambda t, ctx: compression.decompress(
                                    _h.allreduce(t, name=f"{name}.row_values", op=_h.Average), ctx),
                                compression)
        return reduce, p.grad.dtype  # decompress(x, dtype) is x for ours and for horovod's compressors

    opt._allreduce_grad_async = allreduce_grad_async
