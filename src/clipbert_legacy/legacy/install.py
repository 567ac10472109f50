"""``import clipbert_legacy.legacy.install``: install the legacy layer in this process, at import.

For a script started some other way than the launcher (a notebook, a job wrapper that runs
``python script.py``): put this import first in it. ``CLIPBERT_LEGACY_CPU=1`` turns on the CPU mode and
``CLIPBERT_LEGACY_UINT8_MASKS=1`` the uint8-mask opt-in (the launcher's ``--cpu`` / ``--uint8-masks``).
"""
import os

from clipbert_legacy.legacy import layer

LAYER = layer.install(cpu=os.environ.get("CLIPBERT_LEGACY_CPU") == "1",
                      uint8_masks=os.environ.get("CLIPBERT_LEGACY_UINT8_MASKS") == "1")
