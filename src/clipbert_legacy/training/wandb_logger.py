"""Weights & Biases beside TensorBoard (``--wandb_project NAME``), as MMF's and Lightning's loggers do.

Rank 0 logs the same scalars as TensorBoard (every step's ``train/*`` and ``perf/*``, every
validation's ``valid/*``), the config, and the final metrics as the run's summary. The W&B run id is
kept in ``log/wandb_run_id.txt``, so a resumed or requeued training continues the same W&B run. Mode
``auto`` is online when an API key is configured (``WANDB_API_KEY`` or ``wandb login``) and offline
otherwise (``wandb sync output_dir/log/wandb/offline-run-*`` uploads it later). An online start first
checks in a few seconds that W&B's server answers (else it starts offline at once, instead of waiting
out W&B's own 60 s timeout); an online start that fails falls back to offline, with the same run id
(W&B's service is shut down first: it still holds the id of the failed start). W&B can never fail or
stop a training run: a missing package or any error of it is one warning, and the run goes on without
it. W&B writes its files from a service process and reports no write error, so a full disk under its
directory is noticed from the free space there: one warning, and the training goes on.
"""
from __future__ import annotations

import logging
import math
import netrc
import os
import socket
import time
import uuid
from urllib.parse import urlsplit

from clipbert_legacy.training.events import Writer
from clipbert_legacy.utils.errors import free_bytes

logger = logging.getLogger(__name__)
RUN_ID_FILE = "wandb_run_id.txt"
INIT_TIMEOUT_S = 60  # W&B's own limit for an online start
PROBE_TIMEOUT_S = 5  # how long the server may take to accept a connection before the run goes offline
LOW_SPACE_BYTES = 4 * 2 ** 20  # less free space under W&B's directory: it cannot record the run
SPACE_CHECK_S = 5.0


def wandb_mode(setting: str) -> str:
    """``online``/``offline`` as given; ``auto``: ``$WANDB_MODE``, else online only with an API key."""
    if setting != "auto":
        return setting
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    if os.environ.get("WANDB_API_KEY"):
        return "online"
    try:
        return "online" if netrc.netrc().authenticators("api.wandb.ai") else "offline"
    except (OSError, netrc.NetrcParseError):
        return "offline"


class WandbLogger(Writer):
    """Rank 0's W&B run (a writer of the event record); a no-op after any W&B failure."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.run = None
        self._space_dir, self._space_checked, self._space_warned = None, 0.0, False

    def start(self, trainer):
        try:
            import wandb
        except ImportError as e:
            logger.warning("wandb_project=%s: wandb is not importable (%s); training goes on without W&B "
                           "(pip install wandb)", self.cfg.wandb_project, e)
            return
        try:
            run_id = self._run_id(trainer.log_dir)
        except OSError as e:
            logger.warning("W&B: cannot keep the run id in %s (%s); training goes on without W&B",
                           trainer.log_dir, e)
            return
        mode = wandb_mode(self.cfg.wandb_mode)
        if mode == "online":
            unreachable = server_unreachable()
            if unreachable:
                logger.warning("W&B: %s; starting offline", unreachable)
                mode = "offline"
        self.run = self._init(wandb, trainer, run_id, mode)
        if self.run is None and mode == "online":
            _teardown(wandb)  # W&B's service still holds the run id of the failed start
            self.run = self._init(wandb, trainer, run_id, "offline")
        if self.run is not None:
            self._step_axis()
            later = f"; upload it later with `wandb sync {trainer.log_dir}/wandb/offline-run-*`"
            logger.info("W&B: project %s, run %s (%s)%s", self.cfg.wandb_project, run_id, self.run_mode,
                        later if self.run_mode == "offline" else "")

    def _run_id(self, log_dir) -> str:
        """This training run's W&B id: the stored one, or a new one (8 characters of [0-9a-f])."""
        path = os.path.join(log_dir, RUN_ID_FILE)
        if os.path.isfile(path):
            with open(path) as f:
                return f.read().strip()
        run_id = uuid.uuid4().hex[:8]
        with open(path, "w") as f:
            f.write(run_id + "\n")
        return run_id

    def _init(self, wandb, trainer, run_id, mode):
        cfg = self.cfg
        try:
            run = wandb.init(project=cfg.wandb_project, entity=cfg.wandb_entity, id=run_id, resume="allow",
                             name=cfg.wandb_run_name or os.path.basename(os.path.abspath(cfg.output_dir)),
                             tags=cfg.wandb_tags, config=cfg.to_dict(), dir=trainer.log_dir, mode=mode,
                             settings=wandb.Settings(init_timeout=INIT_TIMEOUT_S, console="off"))
        except Exception as e:  # W&B must never stop training
            logger.warning("W&B could not start in %s mode (%s: %s); training goes on%s", mode,
                           type(e).__name__, e, ", trying offline" if mode == "online" else " without W&B")
            return None
        self.run_mode = mode
        self._space_dir, self._space_checked, self._space_warned = _run_dir(run, trainer.log_dir), 0.0, False
        return run

    def _step_axis(self) -> None:
        """Charts over ``trainer/global_step``, logged as a value: W&B's own step must only grow, so a
        run resumed from a restore file older than the last logged step would lose the replayed steps."""
        try:
            self.run.define_metric("trainer/global_step")
            self.run.define_metric("*", step_metric="trainer/global_step")
        except Exception as e:
            self._drop(e)

    def _log(self, scalars: dict, step: int) -> None:
        if self.run is None:
            return
        try:
            finite = {k: v for k, v in scalars.items() if math.isfinite(v)}
            self.run.log({**finite, "trainer/global_step": step})
        except Exception as e:
            self._drop(e)
            return
        self._check_space()

    def _check_space(self) -> None:
        """One warning when W&B's directory runs out of space (every SPACE_CHECK_S at most): W&B's
        service loses what it cannot write without telling anyone."""
        now = time.monotonic()
        if self._space_warned or now - self._space_checked < SPACE_CHECK_S:
            return
        self._space_checked = now
        free = free_bytes(self._space_dir)
        if free is not None and free < LOW_SPACE_BYTES:
            self._space_warned = True
            logger.warning("W&B: its directory %s has %.1f MB free: W&B cannot record the rest of this "
                           "run (training goes on; TensorBoard and log/metrics.jsonl have every step); free "
                           "space there", self._space_dir, free / 2 ** 20)

    def _drop(self, e: Exception) -> None:
        logger.warning("W&B failed (%s: %s); training goes on without it", type(e).__name__, e)
        run, self.run = self.run, None
        try:
            run.finish(exit_code=1)
        except Exception:  # already broken: nothing more to do
            pass

    def write(self, events, _trainer):
        if self.run is not None:
            self._log(events.train, events.step)
            if events.valid is not None:
                self._log({f"valid/{k}": v for k, v in events.valid.items()}, events.step)

    def finish(self, _trainer, summary):
        if self.run is None:
            return
        best = summary["best"]
        final = {f"final/{k}": v for k, v in (summary.get("last_metrics") or {}).items()}
        final.update({"best/metric": best["metric"], "best/value": best["value"], "best/step": best["step"],
                      "global_step": summary["global_step"], "stopped_early": summary["stopped_early"]})
        try:
            self.run.summary.update(final)
        except Exception as e:
            self._drop(e)

    def close(self):
        """Finish the run and, unless another W&B run is active in this process, stop W&B's service:
        ``run.finish()`` returns before the service has written the run's file to the end (a training
        run inside a longer-lived process, a test, read it incomplete: issue 46); stopping the service
        waits until it has, as W&B's own exit hook does when the process ends."""
        if self.run is not None:
            run, self.run = self.run, None
            try:
                run.finish()
                import wandb
                if wandb.run is None:
                    wandb.teardown()
            except (Exception, SystemExit) as e:  # teardown exits on a failed service: never the training
                logger.warning("W&B could not finish its run (%s: %s)", type(e).__name__, e)


def server_unreachable() -> str | None:
    """Why W&B's server cannot be reached (no DNS, no route, nothing accepting within PROBE_TIMEOUT_S),
    or None. An online ``wandb.init`` without a network waits out its 60 s timeout first."""
    try:
        from wandb.sdk import wandb_setup
        url = wandb_setup.singleton().settings.base_url
    except Exception:  # an internal API: fall back to the documented variable
        url = os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return f"its server {host}:{port} does not answer ({type(e).__name__}: {e})"


def _teardown(wandb) -> None:
    try:
        wandb.teardown()
    except Exception as e:  # nothing more to clean: the offline start reports what still fails
        logger.info("W&B teardown after the failed online start: %s: %s", type(e).__name__, e)


def _run_dir(run, log_dir: str) -> str:
    """The folder W&B writes this run's files to (its free space is what counts)."""
    try:
        return run.dir or os.path.join(log_dir, "wandb")
    except Exception:
        return os.path.join(log_dir, "wandb")
