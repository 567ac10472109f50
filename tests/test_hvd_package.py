"""The Horovod layer as a package: the front is ``horovod.torch``'s API, each backend provides the whole
``Backend`` protocol, and each backend's state is one object."""
import types
import typing

import pytest

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.compat.hvd import horovod_backend, torch_backend
from clipbert_legacy.compat.hvd.backend import Backend
from clipbert_legacy.compat.hvd.torch_backend import ops, optimizer, peer_watchdog, sets, timeline
from clipbert_legacy.compat.hvd.torch_backend.state import STATE, TorchBackendState
from tests.conftest import requires_horovod

# what the front adds to horovod.torch's names (docs/horovod.md): the backend choice, the busy() context and
# the type of broadcast_parameters' argument (Params); and three Horovod names its submodules hold
# (compression.Compressor, mpi_ops.is_homogeneous, horovod.common.exceptions.HostsUpdatedInterrupt)
FRONT_EXTRAS = {"BACKENDS", "NotInitializedError", "backend_name", "set_backend", "busy", "Params",
                "Compressor", "is_homogeneous", "HostsUpdatedInterrupt"}


def _protocol_members():
    return {n for n in vars(Backend) if not n.startswith("_")}


@pytest.mark.parametrize("backend", [horovod_backend, torch_backend], ids=["horovod", "torch"])
def test_each_backend_provides_the_whole_protocol(backend):
    members = _protocol_members()
    assert len(members) >= 55 and {"allreduce_async", "join", "DistributedOptimizer", "nccl_built"} <= members
    missing = sorted(n for n in members if not callable(getattr(backend, n, None)))
    assert not missing, f"{backend.__name__} lacks {missing}"
    assert isinstance(backend, Backend)  # runtime_checkable: every member present


def test_the_front_asks_the_backend_only_for_protocol_names():
    """Every ``impl().X`` / ``_built().X`` of the front modules is a member of the protocol (or the torch
    backend's optional ``busy``), so the protocol is the whole contract."""
    import inspect
    import re

    from clipbert_legacy.compat.hvd import api, functions, process_sets, sync_bn
    text = "".join(inspect.getsource(m) for m in (hvd, api, functions, process_sets, sync_bn))
    asked = set(re.findall(r"(?:impl|_built)\(\)\.(\w+)", text))
    assert len(asked) >= 50 and asked - _protocol_members() == set()


@requires_horovod
def test_the_front_has_every_public_name_of_horovod_torch_0_28_1():
    import horovod
    import horovod.torch as real
    assert horovod.__version__ == "0.28.1"
    names = {n for n in dir(real) if not n.startswith("_")}
    modules = {n for n in names if isinstance(getattr(real, n), types.ModuleType)}
    functions = names - modules
    missing = sorted(n for n in functions if not hasattr(hvd, n))
    assert not missing, f"horovod.torch names the layer lacks: {missing}"
    assert set(hvd.__all__) - functions == FRONT_EXTRAS  # nothing else added silently


def test_the_torch_backends_state_is_one_object():
    """The module-level names the backend's modules use are parts of ``STATE`` (not separate globals)."""
    assert isinstance(STATE, TorchBackendState)
    assert torch_backend._S is STATE.process and sets._S is STATE.sets
    assert ops._HANDLES is STATE.handles and ops._NEXT is STATE.next_handle
    assert ops._LOCK is STATE.handles_lock
    assert optimizer._OPTIMIZERS is STATE.optimizers and timeline._T is STATE.timeline
    assert peer_watchdog._W is STATE.watchdog and peer_watchdog._LOCK is STATE.watchdog_lock
    hints = typing.get_type_hints(TorchBackendState)
    assert set(hints) == {"process", "sets", "handles", "next_handle", "handles_lock", "optimizers",
                          "timeline", "watchdog", "watchdog_lock"}


def test_the_front_state_is_one_object_and_resets_at_shutdown(monkeypatch):
    from clipbert_legacy.compat.hvd.state import STATE as FRONT
    for k in ("HOROVOD_RANK", "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    hvd.shutdown()
    monkeypatch.setattr(FRONT, "requested", None)  # an earlier test's choice comes back after
    monkeypatch.setenv("DIST_BACKEND", "torch")
    hvd.init()
    assert FRONT.name == "torch" and FRONT.impl is torch_backend and hvd.size() == 1
    hvd.shutdown()
    assert FRONT.impl is None and FRONT.name is None and not hvd.is_initialized()
