"""``apex.amp``: the project's ``clipbert_legacy.compat.amp`` (every option of apex's: opt levels O0-O3,
``num_losses`` / ``loss_id``, ``delay_unscale``, ``master_params``, ``state_dict``).

Also served where an installed apex has no ``amp`` any more (apex removed it in 2025), with one log line.
"""
import logging
import sys

from clipbert_legacy.compat import amp as _amp
from clipbert_legacy.legacy.finder import is_shim

_apex = sys.modules.get(__name__.rpartition(".")[0])
if _apex is not None and not is_shim(_apex):
    logging.getLogger("clipbert_legacy.legacy").warning(
        "legacy layer: the installed apex (%s) has no amp (removed upstream); "
        "using clipbert_legacy.compat.amp",
        getattr(_apex, "__file__", None) or list(getattr(_apex, "__path__", [])))

sys.modules[__name__] = _amp
