"""What the torch backend cannot do is refused at the call, in one line naming the alternative
(docs/horovod.md, "Every difference from horovod.torch"): Adasum, MPI communicators. One process with
``DIST_BACKEND=torch`` (no launcher), in a fresh interpreter: a test process may already hold Horovod's
backend from an earlier test."""
import json

from tests import mp_utils

SCRIPT = r"""
import json, torch
import clipbert_legacy.compat.hvd as hvd

out = {}
def refused(call):
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "not refused"

out["comm"] = refused(lambda: hvd.init(comm=[0]))
out["initialized_after_comm"] = hvd.is_initialized()
hvd.init()
model = torch.nn.Linear(2, 2)
out["allreduce"] = refused(lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum))
out["optimizer"] = refused(lambda: hvd.DistributedOptimizer(
    torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=model.named_parameters(), op=hvd.Adasum))
out["mpi"] = [hvd.mpi_enabled(), hvd.mpi_built(), hvd.mpi_threads_supported()]
hvd.shutdown()
print("RESULT " + json.dumps(out))
"""


def test_adasum_and_mpi_communicators_are_refused_in_one_line():
    p = mp_utils.check(mp_utils.run_python(["-c", SCRIPT], timeout=300, env={"DIST_BACKEND": "torch"}))
    out = json.loads(next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    assert out["comm"] == ("ValueError: hvd.init(comm=...) takes an MPI communicator; the torch backend has "
                           "no MPI"), out
    assert out["initialized_after_comm"] is False
    assert out["allreduce"].startswith("HorovodInternalError: Adasum needs real Horovod built with MPI; the "
                                       "torch backend reduces with Average, Sum"), out
    assert out["optimizer"].startswith("ValueError: DistributedOptimizer op 'adasum': the torch backend "
                                       "reduces gradients with Average or Sum; Adasum needs real"), out
    assert out["mpi"] == [False, False, False]
