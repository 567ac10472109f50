"""`src.compat.hvd` backend that forwards to the real Horovod (`horovod.torch`)."""
import horovod.torch as _h

_OPS = {"average": _h.Average, "sum": _h.Sum, "adasum": _h.Adasum,
        "min": getattr(_h, "Min", None), "max": getattr(_h, "Max", None),
        "product": getattr(_h, "Product", None)}


def _op(op):
    if op not in _OPS or _OPS[op] is None:
        if op in _OPS.values():  # already a horovod constant
            return op
        raise ValueError(f"unsupported reduction op {op!r} for the horovod backend")
    return _OPS[op]


def init(*args, **kwargs):
    _h.init(*args, **kwargs)


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
                         **kwargs):
    kwargs.setdefault("compression", compression if compression is not None else _h.Compression.none)
    return _h.DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                   backward_passes_per_step=backward_passes_per_step, op=_op(op),
                                   gradient_predivide_factor=gradient_predivide_factor, **kwargs)
