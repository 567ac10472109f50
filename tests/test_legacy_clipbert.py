"""The original ClipBERT (commit a118b02, never edited) runs through the legacy layer.

Every task script trains a few steps on the demo data in ClipBERT's formats, with a config in ClipBERT's
format, and runs its own validation; the retrieval and MC scripts also run their inference mode on the
saved checkpoint. The launchers and fp16 are covered once each (horovodrun on VQA, torchrun on frameqa,
``--fp16 1`` on action); ``tools/legacy_clipbert_matrix.py`` runs every script under every launcher.

ClipBERT is found through ``CLIPBERT_FORK_DIR`` (default ``../shared/legacy_forks/ClipBERT-a118b02`` from
the repository root); without it these tests skip.
"""
import json

import pytest

from tests.mp_utils import horovodrun_available
from tools.legacy_clipbert_matrix import fork_dir, prepare, run_case

FORK = fork_dir()
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(not (FORK / "src" / "tasks" / "run_video_retrieval.py").is_file(),
                       reason=f"no ClipBERT checkout at {FORK} (set CLIPBERT_FORK_DIR to one)"),
]


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("legacy_clipbert")
    return work_dir, prepare(work_dir)


def run(work, name, launcher="python"):
    work_dir, configs = work
    rc, seconds, metric, output = run_case(name, launcher, configs, work_dir, FORK)
    assert rc == 0, f"{name} under {launcher} failed (rc {rc}, {seconds:.0f} s):\n{output[-4000:]}"
    assert "Traceback" not in output
    return metric, output


def test_retrieval_trains_validates_and_infers(work):
    metric, output = run(work, "ret")
    assert "itm_acc" in metric and "text2video" in metric
    assert "legacy layer: --cpu" in output
    ckpt = work[0] / "runs" / "ret" / "ckpt"
    assert [p.name for p in ckpt.glob("model_step_*.pt")] == ["model_step_4.pt"]  # 8 videos / batch 2
    run(work, "ret_infer")
    found = (work[0] / "runs" / "ret").glob("results_retrieval_test/*/scores.json")
    scores = json.loads(next(found).read_text())
    assert set(scores) == {"text2video", "video2text"}
    assert 0 <= scores["text2video"]["r1"] <= 100 and scores["text2video"]["r10"] == 100  # 4 test videos


def test_msrvtt_mc_inference_on_the_retrieval_checkpoint(work):
    if not (work[0] / "runs" / "ret" / "ckpt").is_dir():
        run(work, "ret")
    metric, _ = run(work, "mc")
    assert "mc_accuracy" in metric


@pytest.mark.multiprocess
def test_video_qa_frameqa_under_torchrun(work):
    metric, output = run(work, "qa_frameqa", "torchrun")
    assert "overall_acc" in metric and "color_acc" in metric
    assert output.count("horovod.torch is clipbert_legacy.compat.hvd") == 2
    assert "n_gpu: 2" in output


def test_video_qa_action_fp16(work):
    metric, output = run(work, "qa_action", "fp16")
    assert "overall_acc" in metric and "16-bits training: True" in output


@pytest.mark.multiprocess
@pytest.mark.skipif(not horovodrun_available(),
                    reason="Horovod is not installed (run_scripts/install_horovod.sh)")
def test_vqa_under_horovodrun(work):
    metric, output = run(work, "vqa", "horovodrun")
    assert "overall_acc" in metric and "number_acc" in metric
    assert "n_gpu: 2" in output
    assert "horovod.torch is clipbert_legacy.compat.hvd" not in output  # the installed Horovod ran it


def test_pretraining_mlm_itm(work):
    metric, _ = run(work, "pretrain")
    assert "mlm_acc" in metric and "itm_acc" in metric
