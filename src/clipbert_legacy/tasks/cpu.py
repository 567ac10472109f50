"""CPU scheduling of a task's process: its share of the cores under a launcher, SCHED_BATCH, and
Horovod's cycle time for the project's own CPU jobs."""
import logging
import os

import torch

from clipbert_legacy.compat.launcher_env import local_size, under_horovodrun

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


# Horovod's background thread negotiates with the other ranks every HOROVOD_CYCLE_TIME ms (default 1).
# In a CPU-only job whose ranks already fill the cores, those 1,000 wake-ups a second per rank take the
# cores from compute: on the 2-core demo, 2 ranks reached 1.26x one rank's examples/s at 1 ms and
# 1.58x at 20 ms (5 ms: 1.50x, 50 ms: 1.58x; benchmarks/bench_scaling.py). At most one cycle is added
# to the end of a step's allreduce, small next to a CPU step (about 1.5 s on the demo); the numbers
# computed are the same. Only the task entry (this project's jobs) sets it: clipbert_legacy.compat.hvd,
# which user scripts import, leaves every Horovod setting to the user.
CPU_CYCLE_TIME_MS = "20"


def horovod_cycle_time():
    """Under horovodrun on a machine without a GPU, with no ``HOROVOD_CYCLE_TIME`` given (by the user or
    ``horovodrun --cycle-time-ms``): set CPU_CYCLE_TIME_MS for this job. Call before ``hvd.init()``.
    Returns whether it was set (the caller logs it)."""
    if not under_horovodrun() or "HOROVOD_CYCLE_TIME" in os.environ or torch.cuda.is_available():
        return False
    os.environ["HOROVOD_CYCLE_TIME"] = CPU_CYCLE_TIME_MS
    return True
