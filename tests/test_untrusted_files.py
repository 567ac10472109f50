"""Issue 38, items 1-4, through the real entry points: a file planted where the project loads one carries a
payload whose ``__reduce__`` would create a marker file; the task stops with one ``error:`` line naming the
file, exit 1, and the marker never appears.

The task's command line runs in this process (``python -m clipbert_legacy.tasks``'s ``main``, what
``src/tasks/run_video_retrieval.py`` calls), where a payload that ran would leave its marker just the same;
the environment-variable case runs the script in a process of its own, as a user's shell would."""
import json
import pickle
import shutil
import subprocess

import pytest
import torch

from clipbert_legacy.config import parse_args
from clipbert_legacy.tasks.__main__ import main as task_main
from clipbert_legacy.tasks.run_video_retrieval import RetrievalTask
from clipbert_legacy.training.engine import Trainer
from tests.mp_utils import REPO, run_python
from tests.test_safe_load import Payload

SCRIPT = REPO / "src" / "tasks" / "run_video_retrieval.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Demo data, a config on it, and one finished 2-step training run (ckpt/model_step_2.pt, restore.pt)."""
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    root = tmp_path_factory.mktemp("untrusted")
    data = root / "data"
    build_demo_data(str(data), n_train=8, n_val=4, n_test=4, img_size=64, n_frames=6, fps=10, num_workers=1,
                    log=lambda *a: None)
    cfg = json.load(open(REPO / "configs" / "demo_ret.json"))
    cfg.update({
        "train_datasets": [{"name": "demo", "txt": str(data / "txt/retrieval_train.jsonl"),
                            "img": str(data / "vis_db")}],
        "val_datasets": [{"name": "demo", "txt": str(data / "txt/retrieval_val.jsonl"),
                          "img": str(data / "vis_db")}],
        "model_config": str(REPO / "configs/model/tiny_model.json"), "bert_weights_path": None,
        "cnn_weights_path": None, "max_img_size": 64, "itm_neg_size": 1, "train_batch_size": 4,
        "num_train_epochs": 1, "train_n_clips": 1, "num_frm": 2, "inference_n_clips": 1, "num_valid": 1,
        "min_valid_steps": 100, "eval_retrieval_batch_size": 4, "inference_batch_size": 4, "n_workers": 0,
        "dist_backend": "torch", "output_dir": str(root / "trained")})
    cfg_path = root / "cfg.json"
    cfg_path.write_text(json.dumps(cfg))
    summary = Trainer(parse_args("retrieval", ["--config", str(cfg_path)]), RetrievalTask()).train()
    assert summary["global_step"] == 2
    return {"root": root, "data": data, "cfg": cfg_path, "trained": root / "trained"}


def _copy_of_trained(run, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(run["trained"], out, ignore=shutil.ignore_patterns(".run.lock"))
    return out


def _task(run, capsys, *args):
    """The retrieval task's command line, run by ``python -m clipbert_legacy.tasks``'s ``main`` here."""
    capsys.readouterr()
    rc = task_main(["retrieval", "--config", str(run["cfg"]), *map(str, args)])
    return subprocess.CompletedProcess("retrieval", rc, stderr=capsys.readouterr().err)


def _inference_args(run, out):
    return ["--do_inference", "1", "--output_dir", out, "--inference_txt_db",
            run["data"] / "txt/retrieval_val.jsonl", "--inference_img_db", run["data"] / "vis_db"]


def _script_inference(run, out, env):
    """The inference command as a user runs it: ``python src/tasks/run_video_retrieval.py ...``."""
    return run_python([SCRIPT, "--config", run["cfg"], *_inference_args(run, out)], timeout=180, env=env)


def _assert_refused(proc, path, marker):
    """Exit 1, exactly one ``error:`` line (no traceback) naming ``path``, and no marker."""
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr
    assert errors[0].startswith("error: UnsafeFileError: ") and f"{path} was refused" in errors[0], errors[0]
    assert not marker.exists()


@pytest.mark.parametrize("name", ["restore.pt", "restore_backup.pt"])
def test_a_planted_restore_file_is_refused(run, tmp_path, name, capsys):
    """Item 1: rerunning the same training command loads the run's restore file."""
    out, marker = _copy_of_trained(run, tmp_path), tmp_path / "marker"
    ckpt = out / "ckpt"
    assert torch.load(ckpt / "restore.pt", weights_only=True)["global_step"] == 2  # the genuine one loads
    (ckpt / "restore.pt").unlink()
    (ckpt / "restore_backup.pt").unlink(missing_ok=True)
    torch.save({"global_step": 2, "rng": Payload(marker)}, ckpt / name)
    _assert_refused(_task(run, capsys, "--output_dir", out), ckpt / name, marker)


@pytest.mark.parametrize("option", ["cnn_weights_path", "detectron2_weights_path", "e2e_weights_path",
                                    "bert_weights_path"])
def test_a_planted_pkl_weights_file_is_refused(run, tmp_path, option, capsys):
    """Item 2: each *_weights_path of a fresh training run."""
    weights, marker = tmp_path / "weights.pkl", tmp_path / "marker"
    weights.write_bytes(pickle.dumps({"model": {"w": Payload(marker)}, "__author__": "x"}))
    proc = _task(run, capsys, "--output_dir", tmp_path / "out", f"--{option}", weights)
    _assert_refused(proc, weights, marker)


def test_a_model_config_edit_in_the_run_dir_is_refused(run, tmp_path, capsys):
    """Item 3: inference takes the model config from the run's log/model_config.json."""
    out, marker, weights = _copy_of_trained(run, tmp_path), tmp_path / "marker", tmp_path / "x.pkl"
    weights.write_bytes(pickle.dumps({"model": {"w": Payload(marker)}}))
    mc = out / "log" / "model_config.json"
    mc.write_text(json.dumps({**json.loads(mc.read_text()), "bert_weights_path": str(weights)}))
    _assert_refused(_task(run, capsys, *_inference_args(run, out)), weights, marker)
    assert not list(out.glob("results_*"))


def test_a_planted_model_step_file_is_refused_with_torch_forced_unsafe(run, tmp_path):
    """Item 4: ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` in the environment does not make the load unsafe."""
    out, marker = _copy_of_trained(run, tmp_path), tmp_path / "marker"
    step = out / "ckpt" / "model_step_2.pt"
    genuine = _script_inference(run, out, env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"})
    assert genuine.returncode == 0, genuine.stderr[-3000:]
    torch.save({**torch.load(step, weights_only=True), "extra": Payload(marker)}, step)
    _assert_refused(_script_inference(run, out, env={"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}), step, marker)
