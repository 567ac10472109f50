"""benchmarks/run_horovod_suite.py, on a small suite in Horovod's layout (test/parallel/test_torch.py +
test/utils/common.py): only the import line is rewritten, each test runs in its own 2-process torchrun
job, and passed / failed / skipped / hung are told apart."""
import json
import subprocess
import sys

import pytest

from benchmarks import run_horovod_suite as suite
from tests import mp_utils

SUITE = '''import os
import sys
import time
import unittest

import torch

import horovod.torch as hvd

sys.path.append(os.path.join(os.path.dirname(__file__), os.pardir, "utils"))
from common import helper  # noqa: E402


class TorchTests(unittest.TestCase):
    def test_sums(self):
        hvd.init()
        assert helper() == 1
        assert hvd.allreduce(torch.ones(2), op=hvd.Sum).tolist() == [2.0, 2.0]

    def test_wrong(self):
        hvd.init()
        assert hvd.rank() == 0, "fails on rank 1"

    def test_skips(self):
        self.skipTest("not here")

    def test_hangs(self):
        hvd.init()
        if hvd.rank() == 0:
            hvd.allreduce(torch.ones(1), name="only_rank_0")
        time.sleep(600)
'''


def _write_suite(root):
    (root / "test" / "parallel").mkdir(parents=True)
    (root / "test" / "utils").mkdir()
    (root / "test" / "parallel" / "test_torch.py").write_text(SUITE)
    (root / "test" / "utils" / "common.py").write_text("def helper():\n    return 1\n")
    return root / "test" / "parallel" / "test_torch.py"


def test_a_missing_helper_import_is_one_line_before_any_job(tmp_path, capsys):
    """Horovod's utils/common.py imports mock: without it every test would "fail" with no report."""
    tests = _write_suite(tmp_path / "h")
    common = tmp_path / "h" / "test" / "utils" / "common.py"
    common.write_text("import json\nimport not_installed_here.sub\n" + common.read_text())
    (tmp_path / "h" / "test" / "utils" / "spark_only.py").write_text("import also_missing\n")  # not imported
    assert suite.suite_imports(tests) == {"torch", "not_installed_here"}
    with pytest.raises(SystemExit) as e:
        suite.main(["--tests", str(tests), "--launcher", "torchrun", "--one_job", "1"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "imports not_installed_here, not installed in" in err and "pip install not_installed_here" in err


def test_rewrites_only_the_import_line(tmp_path):
    target = suite.prepare(_write_suite(tmp_path / "h"), "clipbert_legacy.compat.hvd", tmp_path / "w")
    before = SUITE.splitlines()
    after = target.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert changed == [("import horovod.torch as hvd", "import clipbert_legacy.compat.hvd as hvd")]
    assert (tmp_path / "w" / "utils" / "common.py").is_file()
    assert suite.test_names(target) == ["test_sums", "test_wrong", "test_skips", "test_hangs"]


def test_outcome_of_a_job():
    assert suite.combine([("passed", ""), ("passed", "")], 0) == ("passed", "")
    assert suite.combine([("skipped", "r0: x"), ("skipped", "r1: x")], 0)[0] == "skipped"
    assert suite.combine([("passed", ""), ("failed", "r1: boom")], 1) == ("failed", "r1: boom")
    assert suite.combine([("passed", ""), ("passed", "")], 1)[0] == "failed"  # a rank crashed after
    assert suite.combine([("passed", ""), ("missing", "no report from rank1")], 1)[0] == "failed"


def _run_suite(tests, out, timeout, *only):
    cmd = [sys.executable, "benchmarks/run_horovod_suite.py", "--tests", str(tests), "--launcher", "torchrun",
           "--timeout", str(timeout), "--json", str(out), *[x for k in only for x in ("-k", k)]]
    p = subprocess.run(cmd, cwd=mp_utils.REPO, env=mp_utils._env(), capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p, json.loads(out.read_text())


@pytest.mark.multiprocess
def test_runs_a_suite_under_torchrun(tmp_path):
    tests = _write_suite(tmp_path / "h")
    # --timeout is each test's whole job (start-up included): the others' torchrun + torch start-up took
    # over 25 s on a loaded machine (load average 10), reported as "hung", so they get 90 s. test_hangs
    # takes all of its timeout, which can be short: killed before or after its start-up, it is "hung".
    _, hangs = _run_suite(tests, tmp_path / "hangs.json", 15, "test_hangs")
    assert {n: r["outcome"] for n, r in hangs["results"].items()} == {"test_hangs": "hung"}
    assert hangs["counts"] == {"passed": 0, "failed": 0, "skipped": 0, "hung": 1}
    p, res = _run_suite(tests, tmp_path / "out.json", 90, "test_sums", "test_wrong", "test_skips")
    outcomes = {name: r["outcome"] for name, r in res["results"].items()}
    assert outcomes == {"test_sums": "passed", "test_wrong": "failed", "test_skips": "skipped"}, p.stdout
    assert "fails on rank 1" in res["results"]["test_wrong"]["detail"]
    assert res["counts"] == {"passed": 1, "failed": 1, "skipped": 1, "hung": 0}
    assert "| `clipbert_legacy.compat.hvd` under `torchrun -np 2` | 1 | 1 | 1 | 0 |" in p.stdout


@pytest.mark.multiprocess
def test_runs_the_whole_file_in_one_job(tmp_path):
    """``--one_job``: the file in one job, per-test outcomes from each rank's report; the job is clean only
    when every outcome is the expected one (a baseline that expects test_wrong to fail makes it clean)."""
    tests = _write_suite(tmp_path / "h")
    tests.write_text(SUITE.split("    def test_hangs")[0])
    baseline = tmp_path / "baseline.json"
    baseline.write_text(json.dumps({"results": {"test_wrong": {"outcome": "failed"}}}))
    runs = {}
    for name, extra in (("plain", []), ("baseline", ["--compare", str(baseline)])):
        out = tmp_path / f"{name}.json"
        cmd = [sys.executable, "benchmarks/run_horovod_suite.py", "--tests", str(tests), "--launcher",
               "torchrun", "--one_job", "1", "--timeout", "300", "--json", str(out), *extra]
        p = subprocess.run(cmd, cwd=mp_utils.REPO, env=mp_utils._env(), capture_output=True, text=True,
                           timeout=600)
        runs[name] = (p, json.loads(out.read_text()))
    p, res = runs["plain"]
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    assert res["tally"] == {"clean": 0, "failed": 1, "aborted": 0, "hung": 0}, p.stdout
    assert {n: r["outcome"] for n, r in res["results"].items()} == {
        "test_sums": "passed", "test_wrong": "failed", "test_skips": "skipped"}
    assert res["jobs"][0]["differ"] == ["test_wrong"]
    assert "fails on rank 1" in res["results"]["test_wrong"]["detail"]
    p, res = runs["baseline"]
    assert p.returncode == 0 and res["tally"]["clean"] == 1, p.stdout[-3000:]
    assert "the whole file in one job: 1/1 clean" in p.stdout
