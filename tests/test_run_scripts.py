"""Example launch scripts: the command lines they build and the configs they point at."""
import os
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _run(script, *args, **env):
    e = dict(os.environ, PYTHON="/bin/echo", **env)
    return subprocess.run([str(REPO / "run_scripts" / script), *args], env=e, capture_output=True,
                          text=True, timeout=30)


def test_train_retrieval_single_process_command():
    p = _run("train_retrieval.sh", "configs/demo_ret.json", "out/x", "--fp16", "0")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["src/tasks/run_video_retrieval.py", "--config", "configs/demo_ret.json",
                                "--output_dir", "out/x", "--fp16", "0"]


def test_torchrun_launcher():
    p = _run("train_video_qa.sh", "frameqa", "out/q", NP="4", LAUNCHER="torchrun")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:7] == ["-m", "clipbert_legacy.compat.loopback", "torchrun", "--nproc_per_node",
                                    "4",
                                    "--master_addr", "127.0.0.1"]  # listening on the loopback only
    assert "configs/tgif_qa_frameqa_base_resnet50.json" in p.stdout


def test_horovodrun_launcher_on_this_machine_binds_the_loopback():
    p = _run("train_retrieval.sh", "configs/demo_ret.json", "out/x", NP="2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split()[:8] == ["-m", "clipbert_legacy.compat.loopback", "horovodrun", "-np", "2", "-H",
                                    "localhost:2", "/bin/echo"]


@pytest.mark.parametrize("script", ["inference_retrieval.sh", "inference_video_qa.sh",
                                    "inference_msrvtt_mc.sh"])
def test_inference_scripts_need_their_arguments(script):
    p = _run(script)
    assert p.returncode == 2 and "usage:" in p.stderr
    p = _run(script, "run", "-1", "t.jsonl", "db", "4")
    assert p.returncode == 0
    assert "--do_inference 1 --output_dir run --inference_model_step -1" in p.stdout
    assert "--inference_n_clips 4" in p.stdout


def test_unknown_qa_task_is_a_clear_error():
    p = _run("train_video_qa.sh", "vqa")
    assert p.returncode == 2 and "unknown task 'vqa'" in p.stderr


def test_configs_named_by_scripts_exist():
    text = "".join(f.read_text() for f in (REPO / "run_scripts").glob("*.sh"))
    names = set(re.findall(r"configs/[\w.]+\.json", text))
    names |= {f"configs/tgif_qa_{t}_base_resnet50.json" for t in ("action", "transition", "frameqa")}
    for n in names:
        assert (REPO / n).exists(), n
