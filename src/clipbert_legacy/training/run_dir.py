"""The run directory (``output_dir``): one training run at a time, and a rerun that never changes what an
earlier run left there unless the user asks for it.

* **Lock.** Rank 0 holds an exclusive ``flock`` on ``output_dir/.run.lock`` for the whole run (the
  kernel releases it when the process dies, so a crash leaves no stale lock); a second training into
  the same directory stops at once, naming the holder.
* **Interrupted saves.** ``ckpt/*.tmp<pid>`` files left by a killed save are deleted at start (the lock
  guarantees no other run is writing them).
* **Inside the folder.** ``log/`` and ``ckpt/`` must be real directories, and no entry in them a symbolic
  link (the run writes and deletes files there, and never makes a link); the lock file is opened with
  ``O_NOFOLLOW``; deletions take regular files of the names this project writes only
  (:mod:`clipbert_legacy.utils.safe_open`). Anything else is one :class:`UnsafeFileError` line naming it.
* **Rerun policy** (``--existing_run``), decided before anything in the directory is written:

  ``resume`` (default)  the stored ``log/args.json`` must match this run's settings (keys that do not
                        change what is trained, such as ``n_workers`` or ``log_interval``, aside); the
                        run continues from ``ckpt/restore.pt``, or reports that it already finished.
                        Other settings: a one-line error naming the differing keys and the choices.
  ``extend``            keep the stored weights, optimizer state and step, and continue under the new
                        settings (e.g. more epochs); the old ``args.json`` is kept as
                        ``log/args.<time>.json``.
  ``restart``           move everything the earlier run left (``log/``, ``ckpt/``, result folders) to
                        ``previous_runs/<time>/`` and start from scratch.
"""
from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import socket
import sys
import time

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config.tasks import runtime_keys
from clipbert_legacy.training.batch_size_finder import FOUND_KEYS
from clipbert_legacy.training.checkpoint_files import model_step_path
from clipbert_legacy.training.metrics_log import read_metrics
from clipbert_legacy.training.plan import CLIPBERT_DERIVED_KEYS
from clipbert_legacy.utils.errors import RunDirError, UnsafeFileError
from clipbert_legacy.utils.safe_open import check_real_dir, open_inside, remove_inside

logger = logging.getLogger(__name__)

POLICIES = ("resume", "extend", "restart")
LOCK_NAME = ".run.lock"
INTERRUPTED_SAVE = re.compile(r".+\.tmp\d+")  # checkpoint._atomic_write's temp names: <file>.tmp<pid>


def setting_differences(stored: dict, current: dict) -> dict[str, tuple]:
    """``{key: (stored, current)}`` for the settings that differ (keys on one side only are skipped:
    options added or removed between versions of this project; so are the options flagged ``runtime``,
    which say how a run runs, not what it trains). Under ``find_batch_size`` the batch
    size and accumulation are what the finder chose, kept from the stored run."""
    out = {}
    finder = current.get("find_batch_size", "none") != "none"
    found = set(FOUND_KEYS) if finder else set()
    for k in sorted(set(stored) & set(current) - runtime_keys() - set(CLIPBERT_DERIVED_KEYS) - found):
        if stored[k] != current[k]:
            out[k] = (stored[k], current[k])
    return out


def _fmt(diffs: dict[str, tuple], limit: int = 6) -> str:
    shown = [f"{k} {json.dumps(a, default=str)} -> {json.dumps(b, default=str)}"
             for k, (a, b) in list(diffs.items())[:limit]]
    more = f" (+{len(diffs) - limit} more)" if len(diffs) > limit else ""
    return ", ".join(shown) + more


class RunDirectory:
    """``output_dir`` for one training run on rank 0: :meth:`acquire` (lock, clean-up, policy) and
    :meth:`release`. Other ranks only learn the outcome (the trainer broadcasts it)."""

    def __init__(self, output_dir: str, policy: str = "resume"):
        if policy not in POLICIES:
            raise RunDirError(f"existing_run={policy!r} is not one of {'|'.join(POLICIES)}")
        self.dir, self.policy = output_dir, policy
        self.log_dir, self.ckpt_dir = os.path.join(output_dir, "log"), os.path.join(output_dir, "ckpt")
        self.args_path = os.path.join(self.log_dir, "args.json")
        self._lock_file = None
        self._extend_diffs: dict[str, tuple] = {}
        self.stored_settings: dict | None = None  # the earlier run's log/args.json

    # ------------------------------------------------------------------------------------------
    def acquire(self, settings: dict) -> str:
        """Create the directories, take the lock, clean up, apply the policy. Returns what happens to
        an earlier run: 'new', 'resume', 'extend' or 'restart'."""
        self._make_dirs()
        self._lock()
        self._refuse_links()
        self._remove_interrupted_saves()
        if not os.path.exists(self.args_path):
            return "new"
        if self.policy == "restart":
            self._archive()
            return "restart"
        self.stored_settings = self._read_json(self.args_path)
        diffs = setting_differences(self.stored_settings, settings)
        if diffs and self.policy == "resume":
            raise RunDirError(
                f"{self.dir} holds a run with other settings ({_fmt(diffs)}); nothing was changed there. "
                f"Use a new --output_dir, or --existing_run extend (continue that run's weights and step "
                f"under the new settings) or --existing_run restart (move it to "
                f"{os.path.join(self.dir, 'previous_runs')}/ and start again)")
        if self._without_restore_file():
            return "finished"
        self._extend_diffs = diffs if self.policy == "extend" else {}
        return "extend" if self.policy == "extend" else "resume"

    def _read_json(self, path: str) -> dict:
        try:
            with open(path, encoding="utf-8-sig") as f:
                data = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunDirError(f"{path} is empty or not JSON ({e}); this run's settings cannot be read: "
                              f"restore the file, or rerun with --existing_run restart") from None
        if not isinstance(data, dict):
            raise RunDirError(f"{path} is not a JSON object of settings; restore the file, or rerun with "
                              f"--existing_run restart")
        return data

    def _without_restore_file(self) -> bool:
        """A stored run with neither ``ckpt/restore.pt`` nor its backup (deleted to save space): True if
        its final ``model_step_N.pt`` says it finished; an error if it saved checkpoints (files in
        ``ckpt/``, or validation lines in ``log/metrics.jsonl`` when ``ckpt/`` went as a whole) but cannot
        be resumed (rerunning would train from step 0 over them); False if it saved none (it stopped
        before its first restore file and validation: starting again loses nothing)."""
        ckpt = self.ckpt_dir
        if any(os.path.exists(os.path.join(ckpt, n)) for n in ("restore.pt", "restore_backup.pt")):
            return False
        final = self._final_step()
        final_path = model_step_path(ckpt, final)
        if final is not None and self.policy == "resume" and os.path.isfile(final_path):
            return True
        trained = sorted(f"ckpt/{n}" for n in os.listdir(ckpt) if n.endswith(".pt"))
        # ckpt/ may have gone as a whole: a validation line says model_step files were written
        if read_metrics(os.path.join(self.log_dir, "metrics.jsonl"), "valid"):
            trained.append("log/metrics.jsonl")
        if not trained:
            return False
        what = ", ".join(trained[:4]) + (" ..." if len(trained) > 4 else "")
        raise RunDirError(
            f"{self.dir} holds a trained run ({what}) but no ckpt/restore.pt or ckpt/restore_backup.pt to "
            f"{'continue' if self.policy == 'extend' else 'resume'} from"
            + (f", and not its final checkpoint ckpt/model_step_{final}.pt" if final is not None else "")
            + "; rerunning would train again from step 0 over it. Use --existing_run restart (moves it to "
              f"{os.path.join(self.dir, 'previous_runs')}/) or a new --output_dir")

    def _final_step(self) -> int | None:
        """The step the stored run stops at (``log/run_plan.json``; else args.json's num_train_steps)."""
        plan = os.path.join(self.log_dir, "run_plan.json")
        if os.path.isfile(plan):
            return self._read_json(plan).get("stop_step")
        return self._read_json(self.args_path).get("num_train_steps")

    def keep_previous_args(self) -> None:
        """``extend`` under new settings, once the run is accepted: the stored ``args.json`` is kept as
        ``log/args.<time>.json`` before the trainer writes the new one."""
        if self._extend_diffs:
            kept = os.path.join(self.log_dir, f"args.{time.strftime('%Y%m%d-%H%M%S')}.json")
            shutil.copy2(self.args_path, kept)
            logger.warning("existing_run=extend: continuing the run in %s under new settings (%s); its "
                           "previous args.json is kept as %s", self.dir, _fmt(self._extend_diffs), kept)
            self._extend_diffs = {}

    def release(self) -> None:
        if self._lock_file is not None:
            fcntl.flock(self._lock_file, fcntl.LOCK_UN)
            self._lock_file.close()
            self._lock_file = None

    # ------------------------------------------------------------------------------------------
    def _make_dirs(self) -> None:
        for d in (self.log_dir, self.ckpt_dir):
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as e:
                raise RunDirError(f"cannot create {d}: {e.strerror or e}; give a writable "
                                  f"--output_dir") from e
            check_real_dir(d, f"{os.path.basename(d)}/ of the output folder")
            if not os.access(d, os.W_OK):
                raise RunDirError(f"{d} is not writable; give a writable --output_dir")

    def _refuse_links(self) -> None:
        """No symbolic link in ``log/`` or ``ckpt/``: the run writes, renames and deletes files there and
        never makes a link, so one found there was planted (writing through it would reach outside)."""
        for d in (self.log_dir, self.ckpt_dir):
            for entry in os.scandir(d):
                if entry.is_symlink():
                    raise UnsafeFileError(
                        f"{entry.path} was refused: it is a symbolic link (to {os.readlink(entry.path)!r}) "
                        f"in the run's {os.path.basename(d)}/ folder, where this project writes only plain "
                        f"files; "
                        f"writing or cleaning up through it would reach outside {self.dir}. Delete it")

    def _lock(self) -> None:
        path = os.path.join(self.dir, LOCK_NAME)
        f = os.fdopen(open_inside(path, os.O_RDWR | os.O_CREAT), "r+")
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            f.close()
            raise RunDirError(f"{self.dir} is in use by another training run ({holder}); wait for it to "
                              f"finish or use another --output_dir") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                f"{' '.join(sys.argv)[:300]}\n")
        f.flush()
        self._lock_file = f

    def _remove_interrupted_saves(self) -> None:
        """Delete the temp files of interrupted saves: regular files named ``<file>.tmp<pid>`` only."""
        tmp = [e.path for e in os.scandir(self.ckpt_dir)
               if INTERRUPTED_SAVE.fullmatch(e.name) and e.is_file(follow_symlinks=False)]
        if tmp:
            size = sum(os.lstat(p).st_size for p in tmp)
            for p in tmp:
                remove_inside(p)
            logger.warning("removed %d file(s) of interrupted checkpoint saves (%.1f MB) from %s", len(tmp),
                           size / 2 ** 20, self.ckpt_dir)

    def _archive(self) -> None:
        dest = os.path.join(self.dir, "previous_runs", time.strftime("%Y%m%d-%H%M%S"))
        os.makedirs(dest, exist_ok=True)
        for name in sorted(os.listdir(self.dir)):
            if name not in ("previous_runs", LOCK_NAME):
                shutil.move(os.path.join(self.dir, name), os.path.join(dest, name))
        self._make_dirs()
        logger.warning("existing_run=restart: the earlier run in %s was moved to %s", self.dir, dest)


def check_same_restore_state(state: dict | None, output_dir: str) -> None:
    """Collective: every rank must resume from the same step. Ranks on machines that do not share
    ``output_dir`` would read different (or no) restore files and silently train apart."""
    steps = hvd.allgather_object(None if state is None else state.get("global_step"))
    if len(set(steps)) > 1:
        raise RunDirError(f"the ranks found different restore states in {output_dir}/ckpt (step per rank: "
                          f"{steps}); output_dir must be on storage every machine shares (NFS, Lustre, ...)")
