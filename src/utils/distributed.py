"""Object-level collectives used by evaluation and logging (ClipBERT's helper names).

ClipBERT's ``all_gather_list`` pickled into a fixed 4 KB CUDA buffer and asserted on anything
larger; these go through ``hvd.allgather_object``/``broadcast_object``, so size is unbounded and
they work on CPU and in a single process without a launcher. As in ClipBERT, every rank gets fresh
objects (unpickled copies), its own entry included, also in a single process: editing a result
never edits the caller's input.
"""
import pickle

import src.compat.hvd as hvd


def _ensure_init():
    if not hvd.is_initialized():
        hvd.init()


def _copy(obj):
    return pickle.loads(pickle.dumps(obj))


def all_gather_list(data):
    """Gather one picklable object from every rank; returns a list of copies in rank order."""
    _ensure_init()
    return [_copy(x) if x is data else x for x in hvd.allgather_object(data)]


def any_broadcast(data, root_rank=0):
    """Return (a copy of) the root rank's picklable object on every rank."""
    _ensure_init()
    out = hvd.broadcast_object(data, root_rank)
    return _copy(out) if out is data else out
