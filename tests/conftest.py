"""Shared pytest setup: offline Hugging Face, and the marker for tests that need Horovod.

`clipbert_legacy` is importable because run_scripts/setup_env.sh installs the project (`pip install -e .`);
`tests` because pytest puts the repository root on sys.path for this package's conftest.
"""
import os
import re

import pytest

from tests import mp_utils

try:
    from _pytest.nodeid import NodeId  # pytest >= 9.2
except ImportError:
    NodeId = None
from tests.leftovers import pytest_configure, pytest_sessionfinish  # noqa: F401 (the run's hooks: no survivors)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

requires_horovod = pytest.mark.skipif(
    not mp_utils.horovodrun_available() and os.environ.get("CI") != "true",
    reason="Horovod not installed (run ./run_scripts/setup_env.sh)")


# Under pytest-xdist (test.sh: -n 2 --dist loadgroup) two groups each run one after another on one worker:
# "serial", the multi-process jobs (marker ``multiprocess``: 2 processes already fill the 2 cores CI has), and
# "demo", the files that share the checkout's data/demo and output/ (the quickstart, the README's commands)
# or check the env itself. xdist hands out the largest groups first, so "serial" and "demo" start on
# different workers, and each worker then takes the single tests. "demo" was in "serial" until its two
# training tests were cut (--max_eval_examples 30: 165 s and 130 s idle instead of 279 s and 264 s): one
# chain of every job was then the suite's wall time (about 1,700 s idle, the other worker idle for the last
# third). Beside the serial chain's jobs they take two to three times as long (the quickstart 492 s idle,
# building the demo data first), more with other jobs on the machine: their own limits (2,400 s, 1,800 s) say
# so, above pytest's 600 s; the suite is CPU-bound on 2 cores (docs/benchmarks.md).
GROUPED_FILES = {"test_quickstart.py": "demo", "test_readme.py": "demo", "test_env.py": "demo"}


def xdist_group_of(item):
    """"serial", "demo" or None (the test goes to whichever worker is free)."""
    if item.get_closest_marker("multiprocess"):
        return "serial"
    return GROUPED_FILES.get(item.path.name)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config, items):
    """Tests marked ``docker`` (the CPU image: minutes) or ``docker_cuda`` (the CUDA image: longer) run only
    when asked for by name: ``pytest -m docker``, ``pytest -m docker_cuda``."""
    named = set(re.findall(r"\w+", config.option.markexpr or ""))
    off = [m for m in ("docker", "docker_cuda") if m not in named]
    keep = [i for i in items if not any(i.get_closest_marker(m) for m in off)]
    if len(keep) < len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep
    for item in items:  # with pytest-xdist (test.sh: -n 2 --dist loadgroup), see GROUPED_FILES
        group = xdist_group_of(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
            _group_in_node_id(config, item, group)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Module fixtures run in the first test's setup: the flag covers them too (mp_utils._require_serial)."""
    mp_utils.RUNNING_TEST.update(name=item.nodeid, serial=xdist_group_of(item) is not None)


def _group_in_node_id(config, item, group):
    """On an xdist worker (``--dist loadgroup``): the group as the node id's suffix, which is what the
    controller schedules by. pytest-xdist 3.8 writes it to ``item._nodeid``, which pytest >= 9.2 no longer
    reads (the node id is the structured ``item._id``): without this every "serial" test was scheduled
    alone, beside the other worker (tests/test_xdist_groups.py)."""
    if getattr(config.option, "loadgroup", False) and NodeId is not None and isinstance(
            getattr(item, "_id", None), NodeId) and "@" not in item.nodeid:
        item._id = NodeId.parse(f"{item.nodeid}@{group}")


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
