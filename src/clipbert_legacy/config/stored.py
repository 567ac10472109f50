"""Which keys of a training run's stored ``log/args.json`` inference applies, and which settings may differ
between the runs of one directory: both generated from the options' ``model`` / ``runtime`` flags.

``MODEL_KEYS`` and ``RUNTIME_KEYS`` are computed on each access (a module ``__getattr__``), so a task
registered after import is included; code that needs them calls :func:`model_keys` / :func:`runtime_keys`.
"""
import logging
from collections.abc import Iterable, Mapping
from typing import Optional

from clipbert_legacy.config.schema import Config
from clipbert_legacy.config.tasks import model_keys, runtime_keys

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    if name == "MODEL_KEYS":
        return model_keys()
    if name == "RUNTIME_KEYS":
        return runtime_keys()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
