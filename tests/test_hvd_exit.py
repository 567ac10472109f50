"""The torch backend's threads end before the interpreter finalizes (issue 46).

A daemon thread blocked in a TCPStore call (GIL released) whose call returns after the interpreter
started finalizing aborts the process: ``terminate called without an active exception``, SIGABRT,
after a finished run. Here a process runs the negotiation threads of a 2-rank process set (rank 0:
coordinator and executor, on a store this test serves), exits through the backend's atexit function,
and as its very last act tells the test, which at once wakes both blocked store calls (an event in the
log, the next schedule entry): if the threads were still blocked, the process would abort in most
runs (it did in 7 of 10 before the fix).
"""
import datetime
import subprocess
import sys

import torch.distributed as dist

from tests import mp_utils

CHILD = r"""
import atexit, datetime, sys, types
import torch.distributed as dist
from clipbert_legacy.compat.hvd import torch_backend as backend
from clipbert_legacy.compat.hvd.torch_backend import sets
from clipbert_legacy.compat.hvd.torch_backend.controller import Controller

port, i = int(sys.argv[1]), sys.argv[2]
def store():
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(days=1))
signal_store = store()
controller = Controller(0, [0, 1], f"t{i}/", store, lambda resp, req: None)
sets._S["sets"][0] = types.SimpleNamespace(controller=controller)
atexit.register(signal_store.set, f"go{i}", "1")  # registered first: runs last, just before finalization
atexit.register(backend._leave_together)         # as hvd.init() registers it
sys.exit(0)
"""


def test_blocked_store_threads_end_before_the_interpreter_finalizes():
    master = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=120))
    for i in range(6):
        child = subprocess.Popen([sys.executable, "-c", CHILD, str(master.port), str(i)], cwd=mp_utils.REPO,
                                 env=mp_utils._env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        try:  # the child is past every atexit function of its own
            master.wait([f"go{i}"])
        except dist.DistStoreError:
            child.kill()
            err = child.communicate()[1][-2000:]
            raise AssertionError(f"run {i}: the child did not reach its last atexit function within 120 s "
                                 f"(start-up and exit of one process): {err}") from None
        master.queue_push(f"t{i}/log", '{"r": 1, "n": "x", "k": "ALLREDUCE", "m": {}}')
        master.set(f"t{i}/s1", '{"k": "STOP", "n": "STOP"}')
        try:
            out, err = child.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            child.kill()
            raise AssertionError(f"run {i}: the child did not exit within 120 s of its last atexit "
                                 "function") from None
        assert child.returncode == 0 and "terminate called" not in err, (i, child.returncode, err[-2000:])


def test_close_joins_an_executor_that_ended_the_set_itself():
    """The executor reads the coordinator's STOP and closes the set itself (``_lost``) a moment before
    ``shutdown`` calls ``close``: ``close`` must still wait for the thread. It returned at once, and the
    thread, still ending (freeing its last request's tensors), met the interpreter's finalization:
    SIGABRT after a finished torchrun job (a core dump of the CI failure showed the executor there)."""
    import time

    from clipbert_legacy.compat.hvd.torch_backend.controller import Controller

    master = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, timeout=datetime.timedelta(seconds=60))

    def store():
        return dist.TCPStore("127.0.0.1", master.port, is_master=False,
                             timeout=datetime.timedelta(seconds=60))

    class SlowToEnd(Controller):
        def _lost(self, error):
            super()._lost(error)  # the set is closed from here on
            time.sleep(1.0)  # ... and the thread is still ending

    # rank 1 of a 2-rank set: an executor only (rank 0 is the coordinator: this test writes its schedule)
    controller = SlowToEnd(1, [0, 1], "slow/", store, lambda resp, req: None)
    executor = controller._threads[0]
    master.set("slow/s1", '{"k": "STOP", "n": "STOP"}')
    deadline = time.monotonic() + 60
    while not controller._closed:
        assert time.monotonic() < deadline, "the executor did not read the STOP entry within 60 s"
        time.sleep(0.01)
    controller.close(timeout=30)
    assert not executor.is_alive(), "close() returned while the executor thread was still running"
