"""The entry point of every task: parse, train or infer, and the process's exit status.

``python -m clipbert_legacy.tasks.run_x ...`` calls :func:`main` with its task class;
``python -m clipbert_legacy.tasks NAME ...`` (``src/clipbert_legacy/tasks/__main__.py``, also ClipBERT's
script paths ``python src/tasks/run_x.py``) with the name, looked up in the registry
(``clipbert_legacy.tasks.registry``), and the command line it parsed first. Either way the task class is
registered, so its spec is the one the config is parsed with."""
import json
import logging
import os
import sys

import torch

from clipbert_legacy.config import parse_args_or_exit
from clipbert_legacy.tasks import registry
from clipbert_legacy.tasks.cpu import (
    CPU_CYCLE_TIME_MS,
    batch_scheduling,
    horovod_cycle_time,
    limit_cpu_threads,
)
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.preemption import Preempted
from clipbert_legacy.utils.errors import UserError, one_line
from clipbert_legacy.utils.logger import setup_logging

logger = logging.getLogger(__name__)


# What a user can fix, printed as one line: bad files/values/keys, unusable output dirs and disks,
# unreadable checkpoints and LMDB stores, bad videos at evaluation, a diverged run (UserError family).
_USER_ERRORS = (UserError, FileNotFoundError, ValueError, KeyError, OSError)


def main(task, task_cls=None, argv=None, cfg=None):
    """Entry point: ``python src/tasks/run_x.py --config c.json [--key value ...]``.

    ``main(RetrievalTask)`` runs a task class (it is registered: its spec parses the config);
    ``main("retrieval")`` the class the registry holds under that name; ``main("shared", ToyTask)``
    a class under another task's options (tests). ``cfg``: the command line already parsed for this task
    (``python -m clipbert_legacy.tasks``), instead of ``argv``.

    Trains (engine) unless ``--do_inference 1``; returns the process exit status: 0 ok, 1 a
    user-fixable error (one line ``error: Type: message`` on stderr; CLIPBERT_TRACEBACK=1 shows the
    traceback), 2 a bad config value, 75 stopped by SIGTERM/SIGUSR1/SIGINT after saving the restore
    file (clipbert_legacy.training.preemption).
    """
    if isinstance(task, str):
        task_name, task_cls = task, task_cls or registry.get_task(task)
    else:
        task_name, task_cls = task.name, registry.register(task)
    limit_cpu_threads()
    if cfg is None:
        cfg = parse_args_or_exit(task_name, argv)
    setup_logging()
    if batch_scheduling(cfg.cpu_sched_batch):
        logger.info("cpu_sched_batch: SCHED_BATCH for this CPU job (--cpu_sched_batch 0 to keep the default)")
    if horovod_cycle_time():
        logger.info("horovod: HOROVOD_CYCLE_TIME=%s ms for this CPU job (Horovod's default is 1 ms; set "
                    "HOROVOD_CYCLE_TIME or horovodrun --cycle-time-ms to choose)", CPU_CYCLE_TIME_MS)
    task = task_cls()
    try:
        if cfg.do_inference:
            with torch.no_grad():
                task.run_inference(cfg)
        else:
            summary = Trainer(cfg, task).train()
            logger.info("done: %s", json.dumps(summary, default=str))
    except Preempted as e:  # the restore file is written and the line logged (rank 0)
        return e.exit_status
    except _USER_ERRORS as e:
        if os.environ.get("CLIPBERT_TRACEBACK"):
            raise
        print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        return 1
    return 0
