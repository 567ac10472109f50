"""What the torch backend cannot do is refused at the call, in one line naming the alternative
(docs/horovod.md, "Every difference from horovod.torch"): Adasum, MPI communicators. One process,
``DIST_BACKEND=torch`` (no launcher), so each call reaches the backend's own check."""
import pytest
import torch

import clipbert_legacy.compat.hvd as hvd


@pytest.fixture
def torch_hvd(monkeypatch):
    monkeypatch.setenv("DIST_BACKEND", "torch")
    hvd.init()
    yield hvd
    hvd.shutdown()


def test_adasum_is_refused_with_the_alternatives(torch_hvd):
    with pytest.raises(hvd.HorovodInternalError,
                       match="Adasum needs real Horovod built with MPI.*Average, Sum"):
        torch_hvd.allreduce(torch.ones(3), op=torch_hvd.Adasum)
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="Average or Sum; Adasum needs real Horovod built with MPI"):
        torch_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                       named_parameters=model.named_parameters(), op=torch_hvd.Adasum)


def test_mpi_communicators_are_refused(monkeypatch):
    monkeypatch.setenv("DIST_BACKEND", "torch")
    with pytest.raises(ValueError, match=r"hvd.init\(comm=...\) takes an MPI communicator; the torch backend "
                                         r"has no MPI"):
        hvd.init(comm=[0])
    assert not hvd.is_initialized()
    hvd.init()
    try:
        assert (hvd.mpi_enabled(), hvd.mpi_built(), hvd.mpi_threads_supported()) == (False, False, False)
    finally:
        hvd.shutdown()
