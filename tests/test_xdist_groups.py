"""Under ``pytest -n 2 --dist loadgroup`` (run_scripts/test.sh's default), tests/conftest.py's groups
reach pytest-xdist: every multi-process test gets "serial", every file in GROUPED_FILES its group ("demo"),
in the node id the workers report (xdist schedules by it), the other tests none. Checked on the
workers themselves: a probe plugin records each worker's final items and runs none of them."""
import json

from tests import mp_utils

PROBE = '''
import json, os
import pytest

@pytest.hookimpl(trylast=True)  # after every other plugin (xdist's group suffix included)
def pytest_collection_modifyitems(config, items):
    worker = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    with open(os.path.join(os.environ["PROBE_OUT"], worker + ".json"), "w") as f:
        json.dump([item.nodeid for item in items], f)
    config.hook.pytest_deselected(items=list(items))
    items[:] = []
'''
FILES = ["tests/test_readme.py", "tests/test_env.py", "tests/test_hvd_api.py", "tests/test_config.py"]


def test_the_serial_group_reaches_the_xdist_workers(tmp_path):
    (tmp_path / "xdist_probe.py").write_text(PROBE)
    env = {"PYTHONPATH": str(tmp_path), "PROBE_OUT": str(tmp_path)}
    cmd = ["-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "xdist_probe", "-p", "no:cacheprovider",
           "-q", *FILES]
    # two workers importing four test files: well under a minute idle
    p = mp_utils.run_python(cmd, timeout=600, env=env)
    missing = [w for w in ("gw0", "gw1") if not (tmp_path / f"{w}.json").exists()]
    assert not missing, (f"{missing}: no items recorded (exit {p.returncode}):\n"
                         f"{p.stdout[-3000:]}{p.stderr[-2000:]}")
    seen = {w: json.loads((tmp_path / f"{w}.json").read_text()) for w in ("gw0", "gw1")}
    for worker, ids in seen.items():
        assert ids, worker
        for nodeid in ids:
            group = {"tests/test_readme.py": "@demo", "tests/test_env.py": "@demo",
                     "tests/test_hvd_api.py": "@serial"}.get(nodeid.split("::")[0], "")
            assert nodeid.endswith(group) and ("@" in nodeid) == bool(group), (worker, nodeid)
