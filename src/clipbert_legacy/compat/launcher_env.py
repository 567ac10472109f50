"""What the launcher told this process: the one reader of the launchers' environment variables.

``horovodrun`` (and mpirun under it), ``torchrun`` and SLURM start the workers with their rank, world,
local share and rendezvous address in environment variables. Every module that needs one of them asks
here, so the names and their precedence are written once (docs/environment.md lists every variable the
project reads, these and its own settings).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

# a worker of any launcher (horovodrun/mpirun, torchrun, SLURM) has one of these
_RANK_VARS = ("HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "LOCAL_RANK", "SLURM_PROCID")
# how many processes of the job share this machine, in the order each launcher's own name is trusted
_LOCAL_SIZE_VARS = ("HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE",
                    "SLURM_NTASKS_PER_NODE")


@dataclass(frozen=True)
class TorchrunProcess:
    """``torchrun``'s description of this worker (a single process without torchrun: 0 of 1)."""

    rank: int
    world: int
    local_rank: int
    local_size: int


def under_horovodrun() -> bool:
    """Started by ``horovodrun`` (Horovod's runner sets ``HOROVOD_RANK`` in every worker)."""
    return "HOROVOD_RANK" in os.environ


def under_torchrun() -> bool:
    """Started by ``torchrun`` (or another launcher that sets ``RANK`` and ``WORLD_SIZE``), not horovodrun."""
    return "TORCHELASTIC_RUN_ID" in os.environ or (
        "WORLD_SIZE" in os.environ and "RANK" in os.environ and not under_horovodrun())


def launched() -> bool:
    """Started by any launcher (its output is then a log, not a terminal: no progress bar)."""
    return any(k in os.environ for k in _RANK_VARS)


def torchrun_process() -> TorchrunProcess:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return TorchrunProcess(rank=int(os.environ.get("RANK", "0")), world=world,
                           local_rank=int(os.environ.get("LOCAL_RANK", "0")),
                           local_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))))


def launcher_rank() -> int:
    """This process's global rank as the launcher gave it (before any process group exists)."""
    return int(os.environ.get("HOROVOD_RANK", os.environ.get("RANK", "0")))


def local_size() -> int:
    """Processes of this job on this machine (1 without a launcher)."""
    return next((int(os.environ[k]) for k in _LOCAL_SIZE_VARS if os.environ.get(k, "").isdigit()), 1)


def store_address() -> tuple[str, int] | None:
    """The launcher's TCP store (``MASTER_ADDR``:``MASTER_PORT``), None without one."""
    if "MASTER_ADDR" not in os.environ:
        return None
    return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])


def torchrun_run_id() -> str:
    """``torchrun --rdzv-id`` (what names this job's keys in the shared store); 'none' without torchrun."""
    return os.environ.get("TORCHELASTIC_RUN_ID", "none")


def torchrun_restart_count() -> int:
    """Which restart round of ``torchrun --max-restarts`` this worker belongs to (0: the first)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)


def torchrun_max_restarts() -> int:
    """``torchrun --max-restarts`` of this worker's launcher (0 outside torchrun)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)


def torchrun_agent_store() -> bool:
    """The workers share the torchrun agent's store (its keys outlive a restart round)."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


JOB_IDENTITY_VARS = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")
"""What every worker of one ``torchrun`` job has alike in its environment (and no other process of the
user has all of, while the job holds the port): the proof of a job's process without ``CLIPBERT_JOB_TOKEN``
(``compat._store_auth.is_job_process``)."""


def job_identity() -> dict[str, str]:
    """This process's values of :data:`JOB_IDENTITY_VARS` ({} when any is missing: not a torchrun worker)."""
    values = {k: os.environ.get(k, "") for k in JOB_IDENTITY_VARS}
    return values if all(values.values()) else {}


@dataclass(frozen=True)
class HorovodRendezvous:
    """horovodrun's Gloo rendezvous server for this worker, and this worker's place in the job."""

    addr: str
    port: int
    rank: int
    size: int
    timeout_s: float  # horovodrun --gloo-timeout-seconds


def horovod_rendezvous() -> HorovodRendezvous | None:
    """Where Horovod's Gloo rendezvous goes (``HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT``), None without one."""
    if "HOROVOD_GLOO_RENDEZVOUS_ADDR" not in os.environ:
        return None
    return HorovodRendezvous(addr=os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"],
                             port=int(os.environ["HOROVOD_GLOO_RENDEZVOUS_PORT"]),
                             rank=int(os.environ.get("HOROVOD_RANK", "0")),
                             size=int(os.environ.get("HOROVOD_SIZE", "1")),
                             timeout_s=float(os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", "30")))


def horovod_elastic() -> bool:
    """Started by ``horovodrun`` in elastic mode (``--min-np/--max-np``)."""
    return os.environ.get("HOROVOD_ELASTIC") == "1"
