"""CPU scheduling of a task's process: its share of the cores under a launcher, and SCHED_BATCH."""
import logging
import os

import torch

from clipbert_legacy.compat.launcher_env import local_size

logger = logging.getLogger(__name__)


def limit_cpu_threads():
    """Under a launcher with several processes per machine and no OMP_NUM_THREADS, give each process
    its share of the cores (torch would start one thread per core in every process)."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    local = local_size()
    if local > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def batch_scheduling(enabled):
    """Put this process (and the threads and workers it starts later: Horovod's background thread,
    Gloo's loops, DataLoader workers) under SCHED_BATCH on a CPU-only Linux machine.

    Under the default policy every wake-up of a communication thread preempts a compute thread at
    once; with ranks filling the cores those preemptions (hundreds a second per rank under Horovod)
    cost a few percent of the step. SCHED_BATCH threads do not preempt on wake-up; the scheduler lets
    the running thread finish its slice. Call before ``hvd.init()``. Returns whether it was applied."""
    if not enabled or torch.cuda.is_available() or not hasattr(os, "SCHED_BATCH"):
        return False
    try:
        # every thread so far (this one, and those torch and others started at import); threads
        # started later inherit the policy of the thread that starts them
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setscheduler(int(tid), os.SCHED_BATCH, os.sched_param(0))
            except ProcessLookupError:  # ended meanwhile
                pass
    except OSError as e:  # a container or seccomp policy may forbid it; nothing else depends on it
        logger.info("cpu_sched_batch: SCHED_BATCH not available here (%s); default scheduling", e)
        return False
    return True
