"""Shared pytest setup: repo root importable, deterministic single-thread CPU math."""
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from tests import mp_utils  # noqa: E402

requires_horovod = pytest.mark.skipif(
    not mp_utils.horovodrun_available() and os.environ.get("CI") != "true",
    reason="Horovod not installed (run ./run_scripts/setup_env.sh)")
