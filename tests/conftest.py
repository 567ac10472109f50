"""Shared pytest setup: offline Hugging Face, and the marker for tests that need Horovod.

`src` is importable because run_scripts/setup_env.sh installs the project (`pip install -e .`);
`tests` because pytest puts the repository root on sys.path for this package's conftest.
"""
import os

import pytest

from tests import mp_utils

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

requires_horovod = pytest.mark.skipif(
    not mp_utils.horovodrun_available() and os.environ.get("CI") != "true",
    reason="Horovod not installed (run ./run_scripts/setup_env.sh)")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """A throwaway sshd on the loopback hosts 127.0.0.1/127.0.0.2 (tests/multinode_utils.py); skips,
    saying why, where it cannot run."""
    from tests import multinode_utils as mn
    reason = mn.sshd_unavailable_reason()
    if reason:
        pytest.skip(reason)
    with mn.loopback_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server
