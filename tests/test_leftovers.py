"""The end-of-run check (tests/leftovers.py): a test run that leaves a process behind fails and names it,
also under pytest-xdist; a run that cleans up passes."""
import subprocess
import sys
from pathlib import Path

import pytest

from tests import mp_utils

LEAKY = '''
import subprocess, sys

def test_leaves_a_process_behind():
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)  # the leaked one"],
                     start_new_session=True)

def test_cleans_up():
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(90)"])
    p.kill()
    p.wait()

def test_leaves_a_folder_in_the_temporary_directory():
    from tests import mp_utils
    made = "import tempfile; print(tempfile.mkdtemp(prefix='torchelastic_'))"  # as torchrun's agent does
    p = subprocess.run([sys.executable, "-c", made], env=mp_utils._env(), capture_output=True, text=True)
    with open("made.txt", "w") as f:
        f.write(p.stdout.strip())
'''


def _pytest(tmp_path, workers, leak):
    test = tmp_path / "test_sample.py"
    test.write_text(LEAKY if leak else LEAKY.replace("def test_leaves_a_process_behind", "def _not_a_test"))
    cmd = [sys.executable, "-m", "pytest", "-p", "tests.leftovers", "-p", "no:cacheprovider", "-q",
           "-n", str(workers), "--rootdir", str(tmp_path), str(test)]
    # start-up of pytest (and of 2 xdist workers), the check's grace period: well under a minute idle
    env = mp_utils._env({"CLIPBERT_TEST_RUN": "", "CLIPBERT_TEST_GRACE_S": "5"})  # the leak sleeps 90 s
    return subprocess.run(cmd, cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_process_left_behind_fails_the_run_and_is_named(tmp_path, workers):
    p = _pytest(tmp_path, workers, leak=True)
    text = p.stdout + p.stderr
    assert p.returncode == 1, text[-3000:]
    assert "3 passed" in text, text[-3000:]
    assert "1 process(es) started during this test run outlived it" in text, text[-3000:]
    assert "time.sleep(90)  # the leaked one" in text, text[-3000:]


def test_a_run_that_cleans_up_passes(tmp_path):
    p = _pytest(tmp_path, 0, leak=False)
    assert p.returncode == 0 and "outlived" not in p.stdout, (p.stdout + p.stderr)[-3000:]
    # a folder a started process made in its temporary directory was in the run's own, gone with it
    made = Path((tmp_path / "made.txt").read_text())
    assert made.name.startswith("torchelastic_") and made.parent.name.startswith("clipbert-test-run-"), made
    assert made.parent.parent.is_dir() and not made.parent.exists(), made
