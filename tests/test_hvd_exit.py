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
