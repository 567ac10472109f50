"""The quickstart end to end in its reduced mode (QUICKSTART_FAST=1), as CI runs it; its results
table (run_scripts/quickstart_report.py) on hand-made result files."""
import importlib.util
import json
import os
from pathlib import Path

import pytest

from tests import mp_utils
from tests.conftest import requires_horovod

REPO = Path(__file__).resolve().parents[1]


def _load_report():
    """run_scripts/quickstart_report.py is a script, not part of the package: load it by path."""
    path = REPO / "run_scripts" / "quickstart_report.py"
    spec = importlib.util.spec_from_file_location("quickstart_report", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write_json(path, obj):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj))


def test_report_table(tmp_path, capsys):
    out, data = tmp_path / "qs", tmp_path / "demo"
    _write_json(data / "stats.json", {"test": {
        "retrieval_r1_chance": 1.11, "retrieval_r5_chance": 5.56, "mc_chance_acc": 20.0,
        "frameqa_best_constant_acc": 19.44, "action_majority_index_acc": 24.44}})
    _write_json(out / "demo_ret/results_retrieval_test/step_10/scores.json",
                {"text2video": {"r1": 50.0, "r5": 90.0}})
    _write_json(out / "demo_ret/mc_results_mc_test/step_10/mc_test_scores.json", {"mc_accuracy": 80.0})
    _write_json(out / "demo_qa_frameqa/results_frameqa_test/step_5/scores.json", {"overall_acc": 70.0})
    _write_json(out / "demo_qa_action/results_action_test/step_5/scores.json", {"overall_acc": 100.0})
    (out / "ret_train.wall").write_text("12\n")
    (out / "ret_infer.wall").write_text("3\n")
    report = _load_report()
    assert report.main(["--output_dir", str(out), "--data_dir", str(data), "--total_s", "99"]) == 0
    text = capsys.readouterr().out
    assert "R@1" in text and "50.00%" in text and "15s" in text and "total wall time: 99 s" in text
    for row in ("retrieval (text->video)", "multiple choice (ret.)", "frame QA", "action (5-way QA)"):
        assert row in text
    assert "first" not in text
    subset = out / "demo_qa_action/results_action_test/step_5_1_mean_first30/scores.json"
    _write_json(subset, {"overall_acc": 1.0})
    assert report.main(["--output_dir", str(out), "--data_dir", str(data)]) == 0
    assert "scores over the first 30 test examples only" in capsys.readouterr().out
    subset.unlink()
    (out / "demo_qa_action/results_action_test/step_5/scores.json").unlink()
    assert report.main(["--output_dir", str(out), "--data_dir", str(data)]) == 1
    assert "no inference scores" in capsys.readouterr().err


# Idle: 165 s alone, 492 s beside the serial group's jobs (the demo data and its CNN built first); two
# CPU-bound processes beside that halve its share of the cores. Its own limit first, then pytest's.
QUICKSTART_TIMEOUT_S = 2400


@requires_horovod
@pytest.mark.timeout(QUICKSTART_TIMEOUT_S + 120)
def test_quickstart_fast(tmp_path):
    env = dict(os.environ, QUICKSTART_FAST="1", QUICKSTART_OUT=str(tmp_path / "qs"))
    p = mp_utils.run_tree([REPO / "run_scripts/quickstart.sh"], QUICKSTART_TIMEOUT_S, env, REPO)
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
