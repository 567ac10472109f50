"""`src.compat.hvd` backend that forwards to the real Horovod (`horovod.torch`)."""
import logging
import os

import horovod.torch as _h
import torch

from src.compat._row_sparse import average_rows

logger = logging.getLogger(__name__)

_OPS = {"average": _h.Average, "sum": _h.Sum, "adasum": _h.Adasum,
        "min": getattr(_h, "Min", None), "max": getattr(_h, "Max", None),
        "product": getattr(_h, "Product", None)}


def _op(op):
    if op not in _OPS or _OPS[op] is None:
        if op in _OPS.values():  # already a horovod constant
            return op
        raise ValueError(f"unsupported reduction op {op!r} for the horovod backend")
    return _OPS[op]


# Horovod's background thread negotiates with the other ranks every HOROVOD_CYCLE_TIME ms (default 1).
# In a CPU-only job whose ranks already fill the cores, those 1,000 wake-ups a second per rank take the
# cores from compute: on the 2-core demo, 2 ranks reached 1.26x one rank's examples/s at 1 ms and
# 1.58x at 20 ms (5 ms: 1.50x, 50 ms: 1.58x; benchmarks/bench_scaling.py). At most one cycle is added
# to the end of a step's allreduce, small next to a CPU step (about 1.5 s on the demo).
CPU_CYCLE_TIME_MS = "20"


def init(*args, **kwargs):
    _cpu_cycle_time()
    _h.init(*args, **kwargs)


def _cpu_cycle_time():
    """Use CPU_CYCLE_TIME_MS when no GPU is visible and the user has not chosen a cycle time
    (``horovodrun --cycle-time-ms`` or ``HOROVOD_CYCLE_TIME``); GPU jobs keep Horovod's default."""
    if "HOROVOD_CYCLE_TIME" in os.environ or torch.cuda.is_available():
        return
    os.environ["HOROVOD_CYCLE_TIME"] = CPU_CYCLE_TIME_MS
    logger.info("horovod: HOROVOD_CYCLE_TIME=%s ms for this CPU job (Horovod's default 1 ms costs the "
                "compute of CPU ranks; set HOROVOD_CYCLE_TIME or --cycle-time-ms to choose)",
                CPU_CYCLE_TIME_MS)


rank, size, local_rank, local_size = _h.rank, _h.size, _h.local_rank, _h.local_size
gloo_built, nccl_built, shutdown = _h.gloo_built, _h.nccl_built, _h.shutdown


def barrier():
    _h.barrier()


def join(device=-1):
    return _h.join(device)


def allreduce(tensor, op, name=None, prescale_factor=1.0, postscale_factor=1.0):
    return _h.allreduce(tensor, name=name, op=_op(op), prescale_factor=prescale_factor,
                        postscale_factor=postscale_factor)


def allgather(tensor, name=None):
    return _h.allgather(tensor, name=name)


def broadcast(tensor, root_rank, name=None):
    return _h.broadcast(tensor, root_rank, name=name)


def broadcast_(tensor, root_rank, name=None):
    return _h.broadcast_(tensor, root_rank, name=name)


# Horovod names an object collective after ``type(obj).__name__`` unless told otherwise, and matches
# ops across ranks by name: ranks passing objects of different types (rank 0 a str, the others None)
# would wait for each other forever. One fixed name per kind of call (they run one at a time).
def allgather_object(obj, name=None):
    return _h.allgather_object(obj, name=name or "clipbert.allgather_object")


def broadcast_object(obj, root_rank=0, name=None):
    return _h.broadcast_object(obj, root_rank, name=name or "clipbert.broadcast_object")


def DistributedOptimizer(optimizer, named_parameters=None, compression=None,
                         backward_passes_per_step=1, op="average", gradient_predivide_factor=1.0,
                         row_sparse=(), **kwargs):
    kwargs.setdefault("compression", compression if compression is not None else _h.Compression.none)
    opt = _h.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                  backward_passes_per_step=backward_passes_per_step, op=_op(op),
                                  gradient_predivide_factor=gradient_predivide_factor, **kwargs)
    if row_sparse:  # also at size 1: an elastic job may grow
        if _op(op) != _h.Average:
            raise ValueError("DistributedOptimizer: row_sparse parameters need op=average")
        _route_row_sparse(opt, row_sparse, kwargs["compression"])
    return opt


def _route_row_sparse(opt, params, compression):
    """Reduce ``params`` over their touched rows (src.compat._row_sparse) instead of densely.

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
