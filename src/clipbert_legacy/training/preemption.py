"""A graceful stop when the cluster asks for the machine back.

SLURM, Kubernetes and spot instances send SIGTERM some time before the kill; SLURM's ``--signal=USR1@T``
sends SIGUSR1 ``T`` seconds before the time limit; a user presses Ctrl-C. :class:`StopSignals` turns the
first of these into a request, never into an exception: the handler only records the signal. The
trainer packs the request into the loss statistics it allreduces at every step anyway (no extra
collective), so all ranks see it at the same step even when only one rank got the signal; they then
write the restore file together and the process exits with :data:`EXIT_PREEMPTED`. A second Ctrl-C
stops at once (``KeyboardInterrupt``). A repeated SIGTERM or SIGUSR1 is the same request: launchers
forward the SIGTERM that the scheduler has already sent to every process (torchrun, horovodrun), and
that copy must not cut the save short; SIGKILL stops at once.
"""
from __future__ import annotations

import logging
import os
import signal
import threading

logger = logging.getLogger(__name__)

#: exit status of a run stopped by a signal after saving its restore file (EX_TEMPFAIL, "try again
#: later": a SLURM or Kubernetes wrapper requeues on it; see run_scripts/slurm_*.sbatch)
EXIT_PREEMPTED = 75
SIGNALS = tuple(s for s in (signal.SIGTERM, getattr(signal, "SIGUSR1", None), signal.SIGINT) if s is not None)


class Preempted(Exception):
    """Training stopped on a signal after writing its restore file; rerunning the command resumes."""

    exit_status = EXIT_PREEMPTED


class StopSignals:
    """Record SIGTERM / SIGUSR1 / SIGINT between :meth:`install` and :meth:`uninstall`."""

    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._pid = os.getpid()

    def install(self) -> bool:
        """Install the handlers (main thread only: Python delivers signals there). Returns whether
        they were installed."""
        if threading.current_thread() is not threading.main_thread():
            return False
        self._pid = os.getpid()
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def _handle(self, signum, _frame):
        if os.getpid() != self._pid:  # a forked DataLoader worker: the training process decides
            return
        if self.received is None:
            self.received = signum
        elif signum == signal.SIGINT:  # Ctrl-C twice: now
            self.uninstall()
            raise KeyboardInterrupt


def preempted(signals: StopSignals, state, stop_step: int, restore_path: str, is_main: bool) -> Preempted:
    """The stop every rank makes at the same step (the request was allreduced with the step's loss
    statistics), after the engine wrote the restore file: one line from rank 0, as :class:`Preempted`."""
    got = f"{signals.name} received" if signals.received else "a stop signal reached another rank"
    saved_at = state.restore_saved_at
    held = ("this step" if saved_at == state.global_step else
            f"step {saved_at} (the weights are not finite now)" if saved_at
            else "nothing: the weights are not finite")
    msg = (f"stopped at step {state.global_step} of {stop_step} (epoch {state.epoch}): {got}; {restore_path} "
           f"holds {held}, rerun the same command to resume (exit status {EXIT_PREEMPTED})")
    if is_main:
        logger.warning(msg)
    return Preempted(msg)
