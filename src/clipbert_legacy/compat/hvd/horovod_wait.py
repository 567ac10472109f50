"""Waiting for Horovod's gradient reductions without spinning a core (CPU jobs).

Horovod's ``synchronize(handle)`` waits in C++ by polling the handle in a loop that only yields
(``WaitAndClear``: ``std::this_thread::yield()``): the training thread keeps a core busy for as long as the
reduction takes. On a GPU node that is harmless (the reduction runs on the GPU, cores are plentiful). On a
CPU job it is not: the reduction itself is done by Horovod's background thread and the other rank's
compute on the same few cores, which the spinning thread competes with (docs/scaling_out.md). There, the
optimizer's ``synchronize()`` first waits on each started reduction with ``hvd.poll`` and a short sleep
(20 us, doubling, at most 1 ms), then lets Horovod's own ``synchronize()`` install the results, which no
longer waits: same reductions, same order, same results.

``CLIPBERT_HVD_WAIT``: ``auto`` (default: poll-and-sleep when the optimizer's parameters are on the CPU,
Horovod's own wait on a GPU), ``poll`` or ``spin`` (Horovod's own wait everywhere).
"""
import os
import time

WAIT_ENV = "CLIPBERT_HVD_WAIT"
MODES = ("auto", "poll", "spin")
FIRST_SLEEP_S, MAX_SLEEP_S = 2e-5, 1e-3


def wait_mode(optimizer) -> str:
    """``poll`` or ``spin`` for this optimizer (``CLIPBERT_HVD_WAIT``, else by where its parameters are)."""
    mode = os.environ.get(WAIT_ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{WAIT_ENV}={os.environ[WAIT_ENV]!r} must be one of {'|'.join(MODES)}")
    if mode != "auto":
        return mode
    on_gpu = any(p.device.type != "cpu" for g in optimizer.param_groups for p in g["params"])
    return "spin" if on_gpu else "poll"


def wait_until_done(handle, poll) -> None:
    """Return once ``poll(handle)`` is true, sleeping between polls instead of spinning."""
    delay = FIRST_SLEEP_S
    while not poll(handle):
        time.sleep(delay)
        delay = min(2 * delay, MAX_SLEEP_S)


def _start_missing(opt) -> None:
    """What Horovod 0.28's ``_DistributedOptimizer.synchronize()`` does first: start the reduction of every
    parameter that has none yet (no hook fired: unused, or fewer backward passes than configured)."""
    started = set()
    for key in opt._handles:
        started.update(key) if isinstance(key, tuple) else started.add(key)
    for p in opt._requires_update - started:
        opt._handles[p] = opt._allreduce_grad_async(p)
    for p, (handle, _ctx) in list(opt._handles.items()):
        if handle is None:
            opt._handles[p] = opt._allreduce_grad_async(p)


def poll_before_synchronize(opt, poll) -> None:
    """Make ``opt.synchronize()`` (Horovod's ``DistributedOptimizer``; ``step()`` calls it) wait with
    ``poll`` and sleeps before Horovod's own synchronize runs."""
    horovods = opt.synchronize

    def synchronize():
        if opt.process_set.included():
            _start_missing(opt)
            for handle, _ctx in list(opt._handles.values()):
                if handle is not None and not callable(handle):  # a callable: the row-sparse path
                    wait_until_done(handle, poll)
        return horovods()

    synchronize.__doc__ = horovods.__doc__
    opt.synchronize = synchronize
