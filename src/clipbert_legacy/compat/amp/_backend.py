"""``AMP_BACKEND=native|apex``: delegate every amp call to a real legacy ``apex.amp`` when asked."""
from __future__ import annotations

import os
import types

from clipbert_legacy.compat.amp._state import _amp_state

AMP_BACKENDS = ("native", "apex")


def _select_backend() -> types.ModuleType | None:
    """The ``apex.amp`` module to delegate to, or None for the native implementation."""
    name = os.environ.get("AMP_BACKEND", "native") or "native"
    if name not in AMP_BACKENDS:
        raise ValueError(f"AMP_BACKEND={name!r} is not one of {'|'.join(AMP_BACKENDS)}")
    if name == "native":
        return None
    try:
        import apex.amp as apex_amp
    except Exception as e:
        raise RuntimeError(f"AMP_BACKEND=apex but legacy apex.amp is not importable ({e}); unset "
                           "AMP_BACKEND to use the native implementation") from e
    if apex_amp.__name__ == __package__:  # the legacy layer serves this very package as apex.amp
        raise RuntimeError("AMP_BACKEND=apex but no real apex.amp is installed (apex.amp is the legacy "
                           "layer's stand-in, this implementation); unset AMP_BACKEND")
    if not all(hasattr(apex_amp, f) for f in ("initialize", "scale_loss", "master_params")):
        raise RuntimeError("AMP_BACKEND=apex but the installed apex has no legacy amp API (apex removed "
                           "amp in PR #1896); unset AMP_BACKEND to use the native implementation")
    return apex_amp


def backend() -> str:
    """'apex' when calls are delegated to real apex.amp, else 'native'."""
    return "apex" if _amp_state.backend is not None else "native"

