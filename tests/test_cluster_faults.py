"""Cluster faults (issue 29): preemption signals, a full disk, a truncated LMDB store, a frozen rank
under torchrun, a finished run whose restore files were deleted, damaged run files.

Every case uses the real thing (signals sent with ``os.kill``, a real tmpfs filled to the last byte,
a ``data.mdb`` cut short, a rank stopped with SIGSTOP) and is bounded in time.
"""
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

from clipbert_legacy.utils.errors import RunDirError
from tests import mp_utils
from tests.test_run_integrity import error_line, final_weights, run_toy, snapshot

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "workers"


def restore_step(run_dir):
    return torch.load(Path(run_dir) / "ckpt" / "restore.pt", weights_only=True)["global_step"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted single-process toy run (16 steps) the resumed runs must equal bit for bit."""
    out = tmp_path_factory.mktemp("ref") / "run"
    mp_utils.check(mp_utils.run_python([WORKERS / "engine_train.py", out, "{}"], timeout=180))
    return final_weights(out)


# ---------------------------------------------------------------------------------------------
# preemption: SIGTERM / SIGUSR1 / SIGINT
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_signal_saves_the_step_and_the_rerun_resumes_bit_exact(tmp_path, reference, sig):
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 6, sig], timeout=120)
    text = p.stdout + p.stderr
    assert p.returncode == 75, text[-3000:]
    # the signal came after step 6's allreduce: all stop at the next step boundary, 7
    assert f"stopped at step 7 of 16 (epoch 0): {sig} received; {out}/ckpt/restore.pt holds this step" in text
    assert "Traceback" not in text and "error:" not in text
    assert restore_step(out) == 7  # between the periodic saves (every 4 steps)
    assert not list((out / "ckpt").glob("*.tmp*"))
    rerun = mp_utils.check(mp_utils.run_python([WORKERS / "engine_train.py", out, "{}"], timeout=180))
    assert "at step 7 (epoch" in rerun.stderr
    step, weights = final_weights(out)
    assert step == reference[0] == 16
    assert_same_weights(weights, reference[1])


def test_second_ctrl_c_stops_at_once_without_saving(tmp_path):
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 6, "SIGINT", 2], timeout=120)
    assert p.returncode in (1, -signal.SIGINT, 130) and "KeyboardInterrupt" in p.stderr, p.stderr[-3000:]
    assert restore_step(out) == 4  # the last periodic save; nothing written on the way out


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1"])
def test_a_repeated_sigterm_is_the_same_request(tmp_path, sig):
    """torchrun and horovodrun forward the SIGTERM the scheduler already sent to every process: the
    copy must not cut the save short."""
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 6, sig, 2], timeout=120)
    assert p.returncode == 75, p.stderr[-3000:]
    assert restore_step(out) == 7


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torchrun"])
def test_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, launcher):
    if launcher == "horovod" and not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    run = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
    env = {"TOY_DIST_BACKEND": "horovod" if launcher == "horovod" else "torch"}
    ref = tmp_path / "ref"
    mp_utils.check(run([WORKERS / "signal_stop.py", ref, 1, 99, "SIGUSR1"], timeout=180, env=env))
    out = tmp_path / "run"
    p = run([WORKERS / "signal_stop.py", out, 1, 3, "SIGUSR1"], timeout=180, env=env)
    text = p.stdout + p.stderr
    assert p.returncode != 0 and "rank 1 sends itself SIGUSR1 at step 3" in text, text[-3000:]
    # rank 0 got no signal, writes the restore file of step 4 with rank 1 and names the cause
    assert "stopped at step 4 of 8 (epoch 0): a stop signal reached another rank" in text, text[-3000:]
    # the launcher reports the status (horovodrun: a RuntimeError of its own; torchrun: ChildFailedError)
    assert "Exit code: 75" in text if launcher == "horovod" else "exitcode  : 75" in text, text[-3000:]
    assert f"{REPO}/src/" not in text  # no traceback from the workers themselves
    assert restore_step(out) == 4
    mp_utils.check(run([WORKERS / "signal_stop.py", out, 1, 99, "SIGUSR1"], timeout=180, env=env))
    assert_same_weights(final_weights(out)[1], final_weights(ref)[1])


# ---------------------------------------------------------------------------------------------
# a full disk
@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MB tmpfs (root with mount rights; else skipped)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True,
                       text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({p.stderr.strip()}); needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_disk_ends_the_run_with_one_line_and_the_rerun_resumes(small_disk, reference):
    out = small_disk / "run"
    t0 = time.time()
    p = mp_utils.run_python([WORKERS / "fill_disk.py", out, 6], timeout=120)
    elapsed = time.time() - t0
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert p.returncode == 1 and len(errors) == 1, (p.stdout + p.stderr)[-3000:]
    assert "Traceback" not in p.stderr and elapsed < 60
    line = errors[0]
    assert f"cannot write {out}/" in line and "no space left on device" in line and "MB free" in line
    assert "rerun the same command" in line
    if "restore.pt" in line:  # a checkpoint knows its size
        assert "needed" in line
    assert restore_step(out) == 4  # the last good restore file, intact
    assert not list(out.rglob("*.tmp*"))  # no temp file left behind
    (out / "filler").unlink()
    rerun = mp_utils.check(mp_utils.run_python([WORKERS / "engine_train.py", out, "{}"], timeout=180))
    assert "at step 4 (epoch" in rerun.stderr
    step, weights = final_weights(out)
    assert step == reference[0]
    assert_same_weights(weights, reference[1])


def test_tensorboard_write_failure_raises_instead_of_blocking(small_disk):
    """tensorboardX's writer thread died on ENOSPC and the next add_scalar blocked forever."""
    from clipbert_legacy.utils.errors import OutputWriteError
    from clipbert_legacy.utils.logger import TensorboardLogger
    tb = TensorboardLogger()
    tb.create(str(small_disk / "log"))
    (small_disk / "filler").write_bytes(b"\0" * (4 * 2 ** 20 - 64 * 1024))
    t0 = time.time()
    with pytest.raises(OutputWriteError) as e:
        for step in range(100000):
            tb.add_scalar("train/loss", 0.5, step)
            tb.flush()
    assert time.time() - t0 < 30
    assert f"cannot write {small_disk}/log/events.out.tfevents." in str(e.value)
    assert "no space left on device" in str(e.value)
    tb.close()  # closing after the failure neither raises nor blocks


# ---------------------------------------------------------------------------------------------
# reruns into a run directory whose files were deleted or damaged (toy task, in-process)
@pytest.fixture(scope="module")
def finished_toy(tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run_toy(out) == 0
    return out


@pytest.fixture
def toy_copy(finished_toy, tmp_path):
    shutil.copytree(finished_toy, tmp_path / "run")
    return tmp_path / "run"


def test_finished_run_without_restore_files_reports_finished(toy_copy, caplog):
    for name in ("restore.pt", "restore_backup.pt"):
        (toy_copy / "ckpt" / name).unlink()
    before = snapshot(toy_copy, with_log=False)
    caplog.set_level(logging.INFO)
    assert run_toy(toy_copy) == 0
    assert snapshot(toy_copy, with_log=False) == before  # nothing retrained or rewritten
    assert (f"training already finished at step 16 ({toy_copy}/ckpt/model_step_16.pt; its restore files "
            f"were deleted)") in caplog.text


@pytest.mark.parametrize("policy", ["resume", "extend"])
def test_trained_run_without_restore_files_is_refused(toy_copy, capsys, policy):
    for name in ("restore.pt", "restore_backup.pt", "model_step_16.pt"):
        (toy_copy / "ckpt" / name).unlink()
    before = snapshot(toy_copy, with_log=False)
    assert run_toy(toy_copy, existing_run=policy) == 1
    line = error_line(capsys)
    assert line.startswith(f"error: RunDirError: {toy_copy} holds a trained run (ckpt/model_best.pt, "
                           f"ckpt/model_step_8.pt, log/metrics.jsonl) but no ckpt/restore.pt or "
                           f"ckpt/restore_backup.pt")
    assert "--existing_run restart" in line
    assert snapshot(toy_copy, with_log=False) == before
    assert run_toy(toy_copy, existing_run="restart") == 0  # the way out the message names


def test_run_whose_ckpt_folder_was_deleted_is_refused(toy_copy, capsys):
    shutil.rmtree(toy_copy / "ckpt")
    assert run_toy(toy_copy) == 1
    line = error_line(capsys)
    assert f"{toy_copy} holds a trained run (log/metrics.jsonl) but no ckpt/restore.pt" in line
    assert "ckpt/model_step_16.pt" in line and "--existing_run restart" in line


def test_run_that_stopped_before_its_first_save_starts_again(toy_copy):
    """No checkpoint and no validation yet (a crash at step 6 of a run saving every 8): only training
    lines in metrics.jsonl. The same command starts again: nothing is lost."""
    for p in (toy_copy / "ckpt").iterdir():
        p.unlink()
    metrics = toy_copy / "log" / "metrics.jsonl"
    metrics.write_text("".join(ln for ln in metrics.read_text().splitlines(keepends=True)
                               if '"train"' in ln and '"step": 5,' in ln))
    assert run_toy(toy_copy) == 0
    assert final_weights(toy_copy)[0] == 16


def test_empty_args_json_is_named_with_the_fix(toy_copy, capsys):
    (toy_copy / "log" / "args.json").write_text("")
    assert run_toy(toy_copy) == 1
    line = error_line(capsys)
    assert line.startswith(f"error: RunDirError: {toy_copy}/log/args.json is empty or not JSON")
    assert "--existing_run restart" in line
    assert run_toy(toy_copy, existing_run="restart") == 0


def test_metrics_log_cut_mid_line_is_dropped_and_the_run_resumes(tmp_path, caplog):
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 6, "SIGTERM"], timeout=120)
    assert p.returncode == 75, p.stderr[-2000:]
    metrics = out / "log" / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write('{"split": "train", "step": 10, "ep')  # a crash in the middle of an append
    caplog.set_level(logging.WARNING)
    assert run_toy(out) == 0
    assert f"{metrics}: dropping its last line, cut off by an interrupted write" in caplog.text
    rows = [json.loads(ln) for ln in metrics.read_text().splitlines()]
    steps = [(r["split"], r["step"]) for r in rows]
    assert len(steps) == len(set(steps)) and ("train", 15) in steps and ("valid", 16) in steps


def test_damaged_metrics_log_line_is_named(toy_copy, capsys):
    from clipbert_legacy.training.metrics_log import read_metrics
    metrics = toy_copy / "log" / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    lines[1] = lines[1][:10]
    metrics.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunDirError) as e:
        read_metrics(str(metrics))
    assert str(e.value).startswith(f"{metrics}:2: not a JSON line")


def test_json_inputs_may_start_with_a_bom(tmp_path):
    from clipbert_legacy.datasets.jsonl import load_json, load_jsonl
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"caption": "a dog", "clip_name": "v1"}\n'
                     b'{"caption": "b", "clip_name": "v2"}\n')
    assert [r["clip_name"] for r in load_jsonl(str(path), required_fields=("caption",))] == ["v1", "v2"]
    (tmp_path / "b.json").write_bytes(b'\xef\xbb\xbf{"x": 1}')
    assert load_json(str(tmp_path / "b.json")) == {"x": 1}


def test_foreign_restore_file_is_a_one_line_checkpoint_error(tmp_path, capsys):
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 2, "SIGTERM"], timeout=120)
    assert p.returncode == 75, p.stderr[-2000:]
    restore = out / "ckpt" / "restore.pt"
    state = torch.load(restore, weights_only=True)
    state["model"]["transformer.dense.weight"] = torch.zeros(3, 3)  # another model's layer
    torch.save(state, restore)
    assert run_toy(out) == 1
    line = error_line(capsys)
    assert line.startswith(f"error: CheckpointError: {restore} does not fit this model: keys 1 of another "
                           f"shape (e.g. transformer.dense.weight (3, 3) vs (6, 6) here)")
    assert "--existing_run restart" in line


def test_accumulation_longer_than_an_epoch_warns_with_the_numbers(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    assert run_toy(tmp_path / "run", gradient_accumulation_steps=12, num_train_epochs=3) == 0
    assert ("gradient_accumulation_steps 12 is more than the 8 batch(es) of an epoch per process "
            "(32 examples / (1 processes x batch 4))") in caplog.text


# ---------------------------------------------------------------------------------------------
# a frozen rank under torchrun
def _pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone in all but name
        return f.read().split()[2] != "Z"


@pytest.mark.multiprocess
def test_frozen_rank_under_torchrun_ends_the_job_within_a_minute(tmp_path):
    p = mp_utils.run_torchrun([WORKERS / "stall_rank.py", tmp_path / "run", 1, 3, "stop"], timeout=300,
                              env={"TOY_DIST_BACKEND": "torch", "DIST_PEER_TIMEOUT_S": "20"})
    text = p.stdout + p.stderr
    elapsed = mp_utils.seconds_since_failure(text, time.time())
    assert p.returncode != 0 and "rank 1 stalls (stop) at step 3" in text, text[-3000:]
    lines = [ln for ln in text.splitlines() if "has not responded for" in ln]
    assert len(lines) == 1 and lines[0].startswith("error: rank 1 (host "), text[-3000:]
    assert "(DIST_PEER_TIMEOUT_S=20); ending the job" in lines[0]
    # the watchdog's 20 s of silence, then the launcher's end of the job
    assert elapsed < 20 + mp_utils.ENDED_WITHIN_S, f"the job ended {elapsed:.0f}s after rank 1 froze"
    pid = int(text.split("at step 3, pid ")[1].split()[0])
    assert not _pid_alive(pid)  # the stopped worker is not left behind


@pytest.mark.multiprocess
@pytest.mark.parametrize("mode", ["gil", "sleep"])
def test_a_rank_busy_alone_for_longer_than_the_timeout_is_not_a_frozen_rank(tmp_path, mode):
    p = mp_utils.run_torchrun([WORKERS / "stall_rank.py", tmp_path / "run", 0, 3, mode], timeout=150,
                              env={"TOY_DIST_BACKEND": "torch", "DIST_PEER_TIMEOUT_S": "4"})
    text = p.stdout + p.stderr
    assert p.returncode == 0 and f"rank 0 stalls ({mode}) at step 3" in text, text[-3000:]
    assert "has not responded" not in text


# ---------------------------------------------------------------------------------------------
# SLURM's warning signal through the batch shell (run_scripts/_preemptible.sh)
@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["python", "horovodrun"])
def test_slurm_warning_signal_is_forwarded_saved_and_requeued(tmp_path, launcher):
    if launcher == "horovodrun" and not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    bindir, log = tmp_path / "bin", tmp_path / "scontrol.log"
    bindir.mkdir()
    (bindir / "scontrol").write_text(f"#!/bin/sh\necho \"$*\" >> {log}\n")
    (bindir / "scontrol").chmod(0o755)
    out = tmp_path / "run"
    launch = (f"{mp_utils.BIN}/horovodrun -np 2 -H localhost:2 --gloo {sys.executable}"
              if launcher == "horovodrun" else sys.executable)
    script = "tests/workers/slow_toy.py"
    # as in the sbatch scripts: under set -e
    cmd = (f"set -euo pipefail; source run_scripts/_preemptible.sh; "
           f"preemptible {script} {launch} {script} {out}")
    env = mp_utils._env({"PATH": f"{bindir}:{mp_utils._env()['PATH']}", "SLURM_JOB_ID": "4242",
                         "TOY_DIST_BACKEND": "horovod" if launcher == "horovodrun" else "auto"})
    # another job's process of the same script on this node (a shared node): must not be signalled
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", script],
                             start_new_session=True)
    p = subprocess.Popen(["bash", "-c", cmd], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.time() + 90
        while not (out / "ckpt" / "restore.pt").exists() and time.time() < deadline and p.poll() is None:
            time.sleep(0.2)
        os.kill(p.pid, signal.SIGUSR1)  # what `#SBATCH --signal=B:USR1@120` does
        stdout, stderr = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        other_alive = other.poll() is None
        other.kill()
    text = stdout + stderr
    assert p.returncode == 0, text[-3000:]
    assert other_alive, "SIGUSR1 reached a process outside this job's process tree"
    n = 2 if launcher == "horovodrun" else 1
    assert f"[slurm] SIGUSR1: asked {n} training process(es) of {script}" in text
    assert "[slurm] job 4242 requeued" in text and log.read_text().split() == ["requeue", "4242"]
    stopped, _, total = text.split("stopped at step ")[1].split()[:3]
    assert 0 < int(stopped) < int(total) and restore_step(out) == int(stopped)


@pytest.mark.parametrize("change", [{"cpu_sched_batch": 0}, {"elastic_commit_steps": 3},
                                    {"row_sparse_allreduce": 1}])
def test_runtime_only_settings_do_not_block_a_rerun(toy_copy, caplog, change):
    """Settings of how a run executes, not what it trains, may change between reruns (they were missing
    from the run directory's list, so such a rerun was refused as another training setting)."""
    caplog.set_level(logging.INFO)
    assert run_toy(toy_copy, **change) == 0
    assert "training already finished at step 16" in caplog.text
