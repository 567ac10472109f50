"""Fault injection: a hostile or clumsy user never gets a wrong number, a lost run directory or a
traceback. Every case checks the exit code, the one-line ``error:`` message (naming the file, key or
value and the fix) and what the run directory holds afterwards.

Toy-task cases run the real entry point (``clipbert_legacy.tasks.entry.main``) in-process; kills, locks and
dead ranks use subprocesses with timeouts; the video cases use a tiny synthetic retrieval dataset.
"""
import fcntl
import functools
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from clipbert_legacy.config import parse_args
from clipbert_legacy.datasets.build import build_retrieval_datasets
from clipbert_legacy.preprocessing.file2lmdb import LMDBWriter
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.tasks.run_video_retrieval import RetrievalTask
from clipbert_legacy.training.checkpoint_files import all_finite
from tests import mp_utils
from tests.toy_task import ToyTask, toy_argv

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "workers"


def run_toy(out, task=ToyTask, **overrides):
    return main("shared", task, toy_argv(out, **overrides))


def error_line(capsys):
    """The one ``error:`` line on stderr (asserting there is exactly one and no traceback)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def snapshot(run_dir, with_log=True):
    """{relative path: sha256} of every file under run_dir (the lock file aside; ``log/log.txt`` too
    with ``with_log=False``, for reruns that get as far as logging why they do nothing)."""
    out = {}
    for p in sorted(Path(run_dir).rglob("*")):
        if p.is_file() and p.name != ".run.lock" and (with_log or p.name != "log.txt"):
            out[str(p.relative_to(run_dir))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def saved_weights(path):
    """The weights in a checkpoint file (``restore.pt`` holds them under ``model``)."""
    state = torch.load(path, weights_only=True)
    return state["model"] if "global_step" in state else state


def final_weights(run_dir):
    steps = sorted(int(p.stem.split("_")[-1]) for p in (Path(run_dir) / "ckpt").glob("model_step_*.pt"))
    return steps[-1], torch.load(Path(run_dir) / "ckpt" / f"model_step_{steps[-1]}.pt")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """One finished toy run (16 steps), copied fresh for each test that reruns into it."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_toy(out) == 0
    return out


@pytest.fixture
def run_copy(finished, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(finished, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# bad config values
@pytest.mark.parametrize("key, value", [("learning_rate", "nan"), ("learning_rate", "inf"),
                                        ("weight_decay", "inf"), ("warmup_ratio", "nan"), ("dropout", "nan")])
def test_non_finite_config_values_are_refused(tmp_path, capsys, key, value):
    with pytest.raises(SystemExit) as e:
        run_toy(tmp_path / "run", **{key: value})
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert key in err and value in err and "finite" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before anything is created


# ---------------------------------------------------------------------------------------------
# reruns into an existing run directory
@pytest.mark.parametrize("change", [{"learning_rate": 0.5}, {"num_train_epochs": 3}, {"train_batch_size": 2},
                                    {"debug": 1}])
def test_rerun_with_other_settings_is_refused_and_changes_nothing(run_copy, capsys, change):
    before = snapshot(run_copy)
    assert run_toy(run_copy, **change) == 1
    line = error_line(capsys)
    key = next(iter(change))
    assert line.startswith("error: RunDirError: ") and str(run_copy) in line
    assert f"{key} " in line and "--existing_run extend" in line and "--existing_run restart" in line
    assert snapshot(run_copy) == before  # args.json, checkpoints and log untouched


def test_debug_smoke_run_then_real_run_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_toy(out, debug=1) == 0
    assert run_toy(out) == 1
    assert "debug true -> false" in error_line(capsys)


def test_rerun_with_same_settings_reports_finished(run_copy, capsys, caplog):
    before = snapshot(run_copy, with_log=False)
    caplog.set_level(logging.INFO)
    assert run_toy(run_copy, n_workers=0, log_interval=3) == 0  # runtime keys may differ
    assert "training already finished at step 16" in caplog.text
    assert snapshot(run_copy, with_log=False) == before


def test_partly_done_run_with_another_batch_size_is_refused(tmp_path, capsys):
    out = tmp_path / "run"
    nan_task = functools.partial(ToyTask, nan_at_forward=15)  # stops after step 14, restore file at 12
    assert run_toy(out, nan_task) == 1
    capsys.readouterr()
    assert (out / "ckpt" / "restore.pt").is_file()
    before = snapshot(out)
    assert run_toy(out, train_batch_size=8) == 1
    assert "train_batch_size 4 -> 8" in error_line(capsys)
    assert snapshot(out) == before


def test_existing_run_extend_continues_with_new_settings(run_copy):
    stored = json.loads((run_copy / "log" / "args.json").read_text())
    assert run_toy(run_copy, num_train_epochs=3, existing_run="extend") == 0
    step, _ = final_weights(run_copy)
    assert step == 24  # 16 steps + one more epoch of 8
    assert json.loads((run_copy / "log" / "args.json").read_text())["num_train_epochs"] == 3
    kept = list((run_copy / "log").glob("args.*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == stored


def test_existing_run_extend_with_nothing_to_do_is_refused(run_copy, capsys):
    before = snapshot(run_copy, with_log=False)
    assert run_toy(run_copy, learning_rate=0.5, existing_run="extend") == 1
    assert "nothing to extend" in error_line(capsys)
    assert snapshot(run_copy, with_log=False) == before  # no args.<time>.json, no new tensorboard file


def test_existing_run_restart_archives_the_old_run(run_copy):
    before = snapshot(run_copy)
    assert run_toy(run_copy, learning_rate=0.5, existing_run="restart") == 0
    (archived,) = (run_copy / "previous_runs").iterdir()
    assert snapshot(archived) == before  # the whole earlier run, byte for byte
    assert json.loads((run_copy / "log" / "args.json").read_text())["learning_rate"] == 0.5
    assert final_weights(run_copy)[0] == 16


def test_bad_existing_run_value_is_a_config_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run_toy(tmp_path / "run", existing_run="overwrite")
    assert e.value.code == 2 and "existing_run" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# two runs, one directory; unusable output_dir
def test_second_run_into_a_busy_directory_refuses_and_stale_lock_is_free(tmp_path, capsys):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, str(WORKERS / "engine_train.py"), str(out),
                             json.dumps({"num_train_epochs": 20}), json.dumps({"sleep": 0.05})],
                            env=mp_utils._env(), cwd=str(REPO), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        mp_utils.wait_until((out / "log" / "args.json").exists, "the first run's log/args.json", proc=proc)
        holder_args = (out / "log" / "args.json").read_bytes()
        assert run_toy(out, num_train_epochs=20) == 1
        line = error_line(capsys)
        assert "is in use by another training run" in line and f"pid {proc.pid}" in line
        assert (out / "log" / "args.json").read_bytes() == holder_args
        mp_utils.wait_until((out / "ckpt" / "restore.pt").exists, "the first run's restore file", proc=proc)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    # the killed holder's lock died with it: a rerun resumes instead of reporting a busy directory
    assert run_toy(out, num_train_epochs=20) == 0
    assert final_weights(out)[0] == 160


def test_a_file_in_place_of_output_dir(tmp_path, capsys):
    f = tmp_path / "run"
    f.write_text("not a directory")
    assert run_toy(f) == 1
    line = error_line(capsys)
    assert line.startswith("error: RunDirError: cannot create ") and str(f) in line and "--output_dir" in line
    assert f.read_text() == "not a directory"


def test_interrupted_save_files_are_removed_at_start(run_copy, caplog):
    junk = run_copy / "ckpt" / "restore.pt.tmp12345"
    junk.write_bytes(b"\0" * 4096)
    caplog.set_level(logging.WARNING)
    assert run_toy(run_copy) == 0
    assert not junk.exists()
    assert "removed 1 file(s) of interrupted checkpoint saves" in caplog.text


# ---------------------------------------------------------------------------------------------
# kills: mid-save (bit-exact resume), a dead rank under horovodrun
@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    mp_utils.check(mp_utils.run_python([WORKERS / "engine_train.py", out, "{}"], timeout=180))
    return final_weights(out)


@pytest.mark.parametrize("phase", ["tmp", "swap"])
def test_kill_during_checkpoint_save_resumes_bit_exact(tmp_path, uninterrupted, phase):
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "kill_mid_save.py", out, phase, 2], timeout=180)
    assert p.returncode == -signal.SIGKILL, p.stdout + p.stderr
    assert "killing myself in the save of step 8" in p.stdout
    assert list((out / "ckpt").glob("*.tmp*"))  # the interrupted save left its temp file
    rerun = mp_utils.check(mp_utils.run_python([WORKERS / "engine_train.py", out, "{}"], timeout=180))
    assert "removed 1 file(s) of interrupted checkpoint saves" in rerun.stderr
    assert "at step 4 (epoch" in rerun.stderr  # resumed from the save before the interrupted one
    if phase == "swap":
        assert "resuming from the backup restore file" in rerun.stderr
    assert not list((out / "ckpt").glob("*.tmp*"))
    step, weights = final_weights(out)
    ref_step, ref = uninterrupted
    assert step == ref_step == 16 and weights.keys() == ref.keys()
    assert all(torch.equal(weights[k], ref[k]) for k in ref)


@pytest.mark.multiprocess
def test_dead_rank_ends_the_horovod_job_quickly(tmp_path):
    if not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    p = mp_utils.run_horovod([WORKERS / "hook_raise.py", tmp_path / "out", 1, 3, "kill"], timeout=300)
    out = p.stdout + p.stderr
    elapsed = mp_utils.seconds_since_failure(out, time.time())
    assert p.returncode != 0 and "rank 1 kills itself at step 3" in out and "finished training" not in out
    assert elapsed < mp_utils.ENDED_WITHIN_S, f"the job ended {elapsed:.0f}s after rank 1 died"
    with open(tmp_path / "out" / ".run.lock") as f:  # rank 0's lock went with the job
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


# ---------------------------------------------------------------------------------------------
# NaN and divergence
def test_nan_loss_stops_with_one_line_and_saves_only_finite_weights(tmp_path, capsys):
    out = tmp_path / "run"
    assert run_toy(out, functools.partial(ToyTask, nan_at_forward=11)) == 1
    line = error_line(capsys)
    assert line.startswith("error: NonFiniteLossError: training stopped at step 11 (epoch 1)")
    assert f"saved to {out / 'ckpt' / 'model_step_10.pt'}" in line and "restore.pt holds step 8" in line
    assert all(all_finite(saved_weights(p)) for p in (out / "ckpt").glob("*.pt"))


def test_fp16_divergence_never_saves_non_finite_weights(tmp_path, capsys):
    out = tmp_path / "run"
    rc = run_toy(out, fp16=1, learning_rate=1e6, cnn_learning_rate=1e6, num_valid=8)
    log = (out / "log" / "log.txt").read_text()
    assert rc == 1
    line = error_line(capsys)
    assert line.startswith("error: NonFiniteLossError: training ended at step 16 with non-finite weights")
    assert "not saved" in line and "the last finite weights saved are" in line
    assert "is not finite (nan/inf); amp skipped the step" in log and "steps skipped so far" in log
    assert "not a candidate for the best checkpoint" in log
    best = saved_weights(out / "ckpt" / "model_best.pt")  # chosen among finite validations only
    assert all_finite(best)
    assert all(all_finite(saved_weights(p)) for p in (out / "ckpt").glob("*.pt"))


# ---------------------------------------------------------------------------------------------
# videos, annotations, checkpoints and stores on the real retrieval task
@pytest.fixture(scope="module")
def ret(tmp_path_factory):
    """Tiny retrieval data, one 1-epoch training run (3 steps), and a copy of its video store."""
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    root = tmp_path_factory.mktemp("integrity_ret")
    data = root / "data"
    build_demo_data(str(data), n_train=12, n_val=8, n_test=4, img_size=48, n_frames=12, fps=10,
                    num_workers=1, log=lambda *a: None)
    cfg = json.load(open(REPO / "configs" / "demo_ret.json"))
    cfg.update({
        "train_datasets": [{"name": "demo", "txt": str(data / "txt/retrieval_train.jsonl"),
                            "img": str(data / "vis_db")}],
        "val_datasets": [{"name": "demo", "txt": str(data / "txt/retrieval_val.jsonl"),
                          "img": str(data / "vis_db")}],
        "model_config": str(REPO / "configs/model/tiny_model.json"), "bert_weights_path": None,
        "cnn_weights_path": None, "max_img_size": 48, "itm_neg_size": 1, "train_batch_size": 4,
        "num_train_epochs": 1, "train_n_clips": 1, "num_frm": 2, "inference_n_clips": 1, "num_valid": 1,
        "min_valid_steps": 100, "eval_retrieval_batch_size": 8, "inference_batch_size": 8, "n_workers": 0,
        "output_dir": str(root / "run"),
    })
    cfg_path = root / "ret.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    assert main("retrieval", RetrievalTask, ["--config", str(cfg_path)]) == 0
    return {"root": root, "data": data, "cfg": cfg_path, "out": root / "run"}


def _store_with(ret, tmp_path, replace):
    """A copy of the demo video store with some keys' bytes replaced."""
    dst = tmp_path / "vis_db"
    shutil.copytree(ret["data"] / "vis_db", dst)
    with LMDBWriter(str(dst)) as w:
        for k, v in replace.items():
            w.put(k, v)
    return dst


def _config_with(ret, tmp_path, **changes):
    """A copy of the fixture's config file with ``changes`` and its own output_dir."""
    cfg = {**json.loads(ret["cfg"].read_text()), "output_dir": str(tmp_path / "run"), **changes}
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return str(path)


def _infer(ret, *extra):
    argv = ["--config", str(ret["cfg"]), "--do_inference", "1", "--inference_txt_db",
            str(ret["data"] / "txt/retrieval_val.jsonl"), "--inference_img_db", str(ret["data"] / "vis_db"),
            *[str(x) for x in extra]]
    return main("retrieval", RetrievalTask, argv)


def test_undecodable_eval_video_is_skipped_and_reported(ret, tmp_path):
    store = _store_with(ret, tmp_path, {"demo_val_00002": b"\x00garbage, not a video"})
    assert _infer(ret, "--inference_img_db", store, "--inference_model_step", 3) == 0
    rdir = ret["out"] / "results_retrieval_val" / "step_3_1_mean"
    report = json.loads((rdir / "skipped_videos.json").read_text())
    assert report["count"] == 1 and report["keys"][0]["key"] == "demo_val_00002"
    assert report["evaluated"] == {"texts": 7, "texts_total": 8, "videos": 7, "videos_total": 8,
                                   "skipped_videos": 1}
    results = json.loads((rdir / "results.json").read_text())
    assert len(results) == 8 * 7 and "demo_val_00002" not in {r["vid_id"] for r in results}
    t2v = json.loads((rdir / "scores.json").read_text())["text2video"]
    assert 1 <= t2v["medianR"] <= 7  # ranks over the 7 scored videos


def test_undecodable_eval_video_without_skipping_fails_cleanly(ret, tmp_path, capsys):
    store = _store_with(ret, tmp_path, {"demo_val_00002": b""})
    rdir = ret["out"] / "results_retrieval_val" / "step_3_1_max"
    assert _infer(ret, "--inference_img_db", store, "--skip_bad_videos", 0, "--score_agg_func", "max") == 1
    line = error_line(capsys)
    assert line.startswith("error: BadVideosError: ") and "demo_val_00002" in line
    assert "--skip_bad_videos 1" in line
    assert not rdir.exists()  # a failed inference leaves no result folder


def test_nan_weights_never_score_well(ret, tmp_path, caplog):
    sd = torch.load(ret["out"] / "ckpt" / "model_step_3.pt")
    nan_path = ret["out"] / "ckpt" / "model_step_97.pt"
    torch.save({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v for k, v in sd.items()},
               nan_path)
    caplog.set_level(logging.WARNING)
    try:
        assert _infer(ret, "--inference_model_step", 97) == 0
    finally:
        nan_path.unlink()
    scores = json.loads((ret["out"] / "results_retrieval_val" / "step_97_1_mean" / "scores.json").read_text())
    assert scores["text2video"]["r1"] == 0 and scores["video2text"]["r1"] == 0  # ranked last, not first
    assert "scores are not finite (nan/inf); they rank last" in caplog.text


def test_truncated_checkpoint_at_inference(ret, capsys):
    good = (ret["out"] / "ckpt" / "model_step_3.pt").read_bytes()
    bad = ret["out"] / "ckpt" / "model_step_98.pt"
    bad.write_bytes(good[:len(good) // 3])
    try:
        assert _infer(ret, "--inference_model_step", 98) == 1
    finally:
        bad.unlink()
    line = error_line(capsys)
    assert line.startswith("error: CheckpointError: ") and str(bad) in line and "available: [3]" in line
    assert not (ret["out"] / "results_retrieval_val" / "step_98_1_mean").exists()


def test_garbage_lmdb_store(ret, tmp_path, capsys):
    store = tmp_path / "garbage_db"
    store.mkdir()
    (store / "data.mdb").write_bytes(os.urandom(64 * 1024))
    assert _infer(ret, "--inference_img_db", store, "--score_agg_func", "lse") == 1
    line = error_line(capsys)
    assert line.startswith("error: DataStoreError: ") and str(store) in line


def test_foreign_checkpoint_at_inference(ret, capsys):
    sd = torch.load(ret["out"] / "ckpt" / "model_step_3.pt")
    name = next(k for k, v in sd.items() if v.dim() == 2)
    sd[name] = torch.zeros(2, 2)
    foreign = ret["out"] / "ckpt" / "model_step_96.pt"
    torch.save(sd, foreign)
    try:
        assert _infer(ret, "--inference_model_step", 96) == 1
    finally:
        foreign.unlink()
    line = error_line(capsys)
    assert line.startswith(f"error: CheckpointError: {foreign} does not fit this model: keys 1 of another "
                           f"shape (e.g. {name} (2, 2) vs ") and "available: [3]" in line


def test_inference_into_a_read_only_output_dir_fails_before_the_work(ret, tmp_path, capsys):
    ro = tmp_path / "ro_run"
    shutil.copytree(ret["out"], ro)
    p = subprocess.run(f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro}", shell=True,
                       capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here ({p.stderr.strip()}); needs root")
    try:
        t0 = time.time()
        assert _infer(ret, "--output_dir", ro, "--inference_model_step", 3) == 1
        elapsed = time.time() - t0
    finally:
        subprocess.run(["umount", "-l", str(ro)], check=False)
    line = error_line(capsys)
    assert line.startswith(f"error: OutputWriteError: cannot write {ro}/results_retrieval_val/step_3_1_mean: "
                           f"Read-only file system"), line
    assert elapsed < 20  # refused before the model is built and the videos are scored


@pytest.mark.parametrize("what", ["train", "inference", "verify"])
def test_truncated_lmdb_store_is_named_not_a_sigbus(ret, tmp_path, what):
    """An interrupted copy of data.mdb opens fine and used to kill the process with SIGBUS (exit 135,
    nothing printed) at the first read past its end. Subprocesses: a SIGBUS would kill pytest."""
    store = tmp_path / "cut_db"
    shutil.copytree(ret["data"] / "vis_db", store)
    data = store / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    task = [str(REPO / "src/tasks/run_video_retrieval.py"), "--config"]
    argv = {"train": task + [_config_with(ret, tmp_path, train_datasets=[
                {"name": "demo", "txt": str(ret["data"] / "txt/retrieval_train.jsonl"), "img": str(store)}])],
            "inference": task + [str(ret["cfg"]), "--do_inference", "1", "--inference_img_db", str(store),
                                 "--inference_txt_db", str(ret["data"] / "txt/retrieval_val.jsonl")],
            "verify": ["-m", "clipbert_legacy.preprocessing.file2lmdb", "--lmdb_save_dir", str(store),
                       "--verify"]}[what]
    p = mp_utils.run_python(argv, timeout=120)
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert p.returncode == 1 and len(errors) == 1 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert f"LMDB store {store} is truncated: {data} has" in errors[0] and "copy the store again" in errors[0]


@pytest.mark.parametrize("bad_value", [None, 17, ""])
def test_bad_caption_names_file_and_line(ret, tmp_path, capsys, bad_value):
    rows = [json.loads(ln) for ln in open(ret["data"] / "txt/retrieval_train.jsonl")]
    rows[4]["caption"] = bad_value
    txt = tmp_path / "train.jsonl"
    txt.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = _config_with(ret, tmp_path, train_datasets=[{"name": "demo", "txt": str(txt),
                                                       "img": str(ret["data"] / "vis_db")}])
    assert main("retrieval", RetrievalTask, ["--config", cfg]) == 1
    line = error_line(capsys)
    assert f"{txt}:5" in line and "caption" in line


def test_data_ratio_shrinks_training_only(ret):
    cfg = parse_args("retrieval", ["--config", str(ret["cfg"]), "--data_ratio", "0.25"])
    train, _ = build_retrieval_datasets(cfg, "train")
    val, _ = build_retrieval_datasets(cfg, "val")
    assert len(train) == 3 and len(val.gt_cap_id2vid_id) == 8


def test_bad_training_videos_are_replaced_counted_and_summarised(ret, tmp_path, caplog):
    one_frame = _one_frame_video()
    store = _store_with(ret, tmp_path, {"demo_train_00001": b"\x00corrupt", "demo_train_00003": b"",
                                        "demo_train_00005": one_frame})
    rows = [json.loads(ln) for ln in open(ret["data"] / "txt/retrieval_train.jsonl")]
    rows[7]["clip_name"] = "no_such_video"
    txt = tmp_path / "train.jsonl"
    txt.write_text("".join(json.dumps(r) + "\n" for r in rows))
    caplog.set_level(logging.INFO)
    cfg = _config_with(ret, tmp_path, train_datasets=[{"name": "demo", "txt": str(txt), "img": str(store)}])
    assert main("retrieval", RetrievalTask, ["--config", cfg]) == 0
    summaries = [r.getMessage() for r in caplog.records if "bad video load(s) replaced" in r.getMessage()]
    assert len(summaries) == 1, summaries  # the one (last) epoch's summary is logged
    s = summaries[0]
    for key in ("demo_train_00001", "demo_train_00003", "demo_train_00005", "no_such_video"):
        assert key in s
    for reason in ("open_failed=", "empty=", "too_short=", "missing_key="):
        assert reason in s


def _one_frame_video():
    from clipbert_legacy.preprocessing.make_demo_data import encode_mp4, render_video
    return encode_mp4(render_video("red", "circle", "still", seed=0, size=48, n_frames=1), fps=10)


@pytest.mark.multiprocess
def test_ranks_without_shared_output_dir_are_refused(tmp_path, capsys):
    """Rank 0 sees a restore file, rank 1 (its own, unshared output_dir) none: the run stops at once
    with one line instead of rank 1 silently training from step 0."""
    if not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    nan_task = functools.partial(ToyTask, nan_at_forward=11)  # leaves ckpt/restore.pt at step 8
    assert run_toy(tmp_path / "rank0", nan_task) == 1
    capsys.readouterr()
    p = mp_utils.run_horovod([WORKERS / "split_output_dir.py", tmp_path], timeout=120)
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "error: RunDirError: the ranks found different restore states" in out
    assert "step per rank: [8, None]" in out and "storage every machine shares" in out
