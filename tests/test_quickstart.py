"""The quickstart end to end in its reduced mode (QUICKSTART_FAST=1), as CI runs it."""
import os
import subprocess
from pathlib import Path

from tests.conftest import requires_horovod

REPO = Path(__file__).resolve().parents[1]


@requires_horovod
def test_quickstart_fast(tmp_path):
    env = dict(os.environ, QUICKSTART_FAST="1", QUICKSTART_OUT=str(tmp_path / "qs"))
    p = subprocess.run([str(REPO / "run_scripts/quickstart.sh")], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, f"{p.stdout[-5000:]}\n{p.stderr[-5000:]}"
    out = p.stdout
    for s in ("1/7 environment", "2/7 synthetic demo data", "3/7 train text-to-video retrieval",
              "4/7 retrieval and multiple-choice inference", "5/7 train + evaluate frame QA",
              "6/7 train + evaluate action", "7/7 results"):
        assert s in out
    table = out.split("7/7 results", 1)[1]
    assert "R@1" in table and "accuracy" in table and "tensorboard logs" in table
    for row in ("retrieval (text->video)", "multiple choice (ret.)", "frame QA", "action (5-way QA)"):
        assert row in table
    assert list((tmp_path / "qs/demo_qa_action/results_action_test").glob("step_*/scores.json"))
    assert list((tmp_path / "qs/demo_ret/ckpt").glob("model_step_*.pt"))
    assert list((tmp_path / "qs/demo_ret/log").glob("events.out.tfevents.*"))
