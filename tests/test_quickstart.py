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
    for s in ("1/6 environment", "2/6 synthetic demo data", "3/6 train text-to-video retrieval",
              "4/6 retrieval inference", "5/6 train + evaluate frame QA", "6/6 results"):
        assert s in out
    table = out.split("6/6 results", 1)[1]
    assert "R@1" in table and "accuracy" in table and "tensorboard logs" in table
    assert list((tmp_path / "qs/demo_ret/ckpt").glob("model_step_*.pt"))
    assert list((tmp_path / "qs/demo_ret/log").glob("events.out.tfevents.*"))
