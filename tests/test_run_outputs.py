"""What a run shows and leaves behind: progress that reads well under launchers, the DataLoader worker
default, log/metrics.jsonl (kept consistent across a resume), the curves PNG, checkpoint retention."""
import functools
import importlib.util
import io
import json

import pytest

from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.checkpoint_files import checkpoints_to_keep
from clipbert_legacy.training.metrics_log import read_metrics
from clipbert_legacy.utils import device
from clipbert_legacy.utils.progress import Progress, progress_mode
from tests import mp_utils
from tests.toy_task import ToyTask, toy_argv

_spec = importlib.util.spec_from_file_location("plot", mp_utils.REPO / "tools" / "plot.py")  # a script
plot = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot)
plot_main = plot.main


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


# ---------------------------------------------------------------------------------------------
# progress
def test_progress_mode_follows_terminal_and_launchers(monkeypatch):
    for k in ("CLIPBERT_PROGRESS", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "LOCAL_RANK",
              "SLURM_PROCID"):
        monkeypatch.delenv(k, raising=False)
    assert progress_mode(FakeTTY()) == "bar" and progress_mode(io.StringIO()) == "lines"
    monkeypatch.setenv("HOROVOD_RANK", "0")  # under horovodrun a terminal still gets lines
    assert progress_mode(FakeTTY()) == "lines"
    monkeypatch.setenv("CLIPBERT_PROGRESS", "bar")
    assert progress_mode(io.StringIO()) == "bar"
    monkeypatch.setenv("CLIPBERT_PROGRESS", "fancy")
    with pytest.raises(ValueError, match="CLIPBERT_PROGRESS='fancy'"):
        progress_mode()


def test_progress_lines_have_rate_eta_and_postfix_and_no_carriage_returns(monkeypatch):
    monkeypatch.setenv("CLIPBERT_PROGRESS", "lines")
    out = io.StringIO()
    p = Progress(4, "train", initial=1, interval=0, stream=out)
    for i in range(3):
        p.update(1, loss=0.5 + i)
    p.close()
    p.update(1)  # after close: nothing
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue() and len(lines) == 3
    assert lines[0].startswith("train: 2/4 (50%) ") and "it/s elapsed 0:00:00 ETA " in lines[0]
    assert lines[-1].startswith("train: 4/4 (100%) ") and lines[-1].endswith("loss 2.5")
    quiet = io.StringIO()
    q = Progress(100, "x", interval=3600, stream=quiet)
    for _ in range(99):
        q.update()
    assert quiet.getvalue() == ""  # lines only every `interval` seconds ...
    q.update()
    assert quiet.getvalue().startswith("x: 100/100 (100%)")  # ... and at the end
    off = io.StringIO()
    Progress(3, "y", enabled=False, interval=0, stream=off).update(3)
    assert off.getvalue() == ""


@pytest.mark.multiprocess
def test_training_progress_under_horovodrun_is_plain_lines(tmp_path):
    if not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    p = mp_utils.check(mp_utils.run_horovod(["tests/workers/engine_train.py", tmp_path / "out", "{}"],
                                            timeout=180, env={"CLIPBERT_PROGRESS_INTERVAL": "0"}))
    out = p.stdout + p.stderr
    assert "\r" not in out
    lines = [ln for ln in out.splitlines() if ln.startswith("[0]<stderr>:train: ")]
    assert len(lines) == 8 and lines[-1].startswith("[0]<stderr>:train: 8/8 (100%)")
    assert not [ln for ln in out.splitlines() if ln.startswith("[1]<stderr>:train: ")]  # rank 0 only


# ---------------------------------------------------------------------------------------------
# n_workers
def test_default_workers_follow_cores_per_process(monkeypatch):
    from clipbert_legacy.compat import launcher_env
    for k in launcher_env._LOCAL_SIZE_VARS:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: set(range(2)))
    assert device.cpus_per_process() == 2 and device.num_workers(None) == 2
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "2")
    assert device.cpus_per_process() == 1 and device.num_workers(None) == 1
    monkeypatch.setattr(device.os, "sched_getaffinity", lambda pid: set(range(64)))
    assert device.num_workers(None) == 4  # ClipBERT's 4 where there are cores for it
    assert device.num_workers(0) == 0 and device.num_workers(7) == 7  # a value given is used


# ---------------------------------------------------------------------------------------------
# metrics.jsonl, plot, retention
def test_checkpoints_to_keep():
    steps = [2, 4, 6, 8, 10]
    hist = {2: 0.5, 4: 0.9, 6: 0.1, 8: float("nan"), 10: 0.2}
    assert checkpoints_to_keep(steps, hist, "max", -1, -1, set()) == set(steps)
    assert checkpoints_to_keep(steps, hist, "max", 2, -1, {4}) == {4, 8, 10}
    assert checkpoints_to_keep(steps, hist, "max", -1, 2, set()) == {4, 2, 10}  # top 2 + the latest
    assert checkpoints_to_keep(steps, hist, "min", -1, 1, set()) == {6, 10}
    assert checkpoints_to_keep(steps, hist, "max", 1, 1, {2}) == {2, 4, 10}


def _curve(step):  # validation score by step: best at 4, then 12
    return {2: 1.0, 4: 9.0, 6: 3.0, 8: 2.0, 10: 4.0, 12: 8.0, 14: 5.0, 16: 6.0}[step]


def test_keep_last_and_top_k_never_lose_best_or_latest(tmp_path):
    out = tmp_path / "run"
    task = functools.partial(ToyTask, metric_curve=_curve)
    assert main("shared", task, toy_argv(out, num_valid=8, best_metric="score", keep_last_k=2,
                                         keep_top_k=2)) == 0
    kept = sorted(int(p.stem.split("_")[-1]) for p in (out / "ckpt").glob("model_step_*.pt"))
    assert kept == [4, 12, 14, 16]  # top 2 (4, 12) + last 2 (14, 16); best 4 and latest 16 among them
    assert (out / "ckpt" / "model_best.pt").is_file()
    assert json.loads((out / "log" / "best_metric.json").read_text())["step"] == 4


def test_zero_keep_is_a_config_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main("shared", ToyTask, toy_argv(tmp_path / "run", keep_last_k=0))
    assert e.value.code == 2 and "keep_last_k=0" in capsys.readouterr().err


def test_metrics_jsonl_has_each_step_once_after_a_resume_and_plots(tmp_path, capsys):
    out = tmp_path / "run"
    nan_task = functools.partial(ToyTask, nan_at_forward=15)  # stops at step 15; restore file at 12
    assert main("shared", nan_task, toy_argv(out, num_valid=8, log_interval=1)) == 1
    first = read_metrics(str(out / "log" / "metrics.jsonl"))
    assert max(r["step"] for r in first) == 14  # steps 13, 14 logged, then redone after the resume
    capsys.readouterr()
    assert main("shared", ToyTask, toy_argv(out, num_valid=8, log_interval=1)) == 0
    rows = read_metrics(str(out / "log" / "metrics.jsonl"))
    train = [r["step"] for r in rows if r["split"] == "train"]
    valid = [r["step"] for r in rows if r["split"] == "valid"]
    assert train == list(range(1, 17)) and valid == list(range(2, 17, 2))
    keys = {"loss", "lr_transformer", "lr_cnn", "epoch", "time"}
    assert all(keys <= set(r) for r in rows if r["split"] == "train")
    assert plot_main([str(out)]) == 0
    png = out / "log" / "curves.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert plot_main([str(tmp_path / "nothing_here")]) == 1
    assert "has no metrics" in capsys.readouterr().err
