"""Which keys of a training run's stored ``log/args.json`` inference applies, and which settings may differ
between the runs of one directory: both generated from the options' ``model`` / ``runtime`` flags.

The two key sets are computed on each call of :func:`model_keys` / :func:`runtime_keys`
(``clipbert_legacy.config.tasks``), so a task registered after import is included.
"""
import logging
from collections.abc import Iterable, Mapping
from typing import Optional

from clipbert_legacy.config.schema import Config
from clipbert_legacy.config.tasks import model_keys

logger = logging.getLogger(__name__)


def apply_stored_model_config(cfg: Config, stored_args: Mapping,
                              keys: Optional[Iterable[str]] = None) -> Config:
    """Copy the model-defining keys (default: :func:`model_keys`) of a training run's ``log/args.json``
    into ``cfg``.

    Unlike ClipBERT (which overwrote every stored key but ``*inference*``), inference settings the
    user gives now (score_agg_func, fps, num_frm, output_dir, ...) stay as given.
    """
    for k in model_keys() if keys is None else keys:
        if k in stored_args and k in cfg and cfg[k] != stored_args[k]:
            logger.info("inference: %s=%r from the trained run's args.json (was %r)", k, stored_args[k],
                        cfg[k])
        if k in stored_args:
            cfg[k] = stored_args[k]
    return cfg
