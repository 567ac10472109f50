"""Object-level collectives used by evaluation and logging (ClipBERT's helper names).

ClipBERT's ``all_gather_list`` pickled into a fixed 4 KB CUDA buffer and asserted on anything
larger; these go through ``hvd.allgather_object``/``broadcast_object``, so size is unbounded and
they work on CPU and in a single process without a launcher.
"""
import src.compat.hvd as hvd


def _ensure_init():
    if not hvd.is_initialized():
        hvd.init()


def all_gather_list(data):
    """Gather one picklable object from every rank; returns a list in rank order."""
    _ensure_init()
    return hvd.allgather_object(data)


def any_broadcast(data, root_rank=0):
    """Return the root rank's picklable object on every rank."""
    _ensure_init()
    return hvd.broadcast_object(data, root_rank)
