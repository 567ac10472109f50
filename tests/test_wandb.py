"""Weights & Biases beside TensorBoard, with the real ``wandb`` package in offline mode: the same
scalars, the config and the final metrics from rank 0, the same W&B run after a restart, and no
failure of training when wandb is missing or broken."""
import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from clipbert_legacy.tasks.entry import main
from tests import mp_utils
from tests.toy_task import ToyTask, toy_argv

wandb = pytest.importorskip("wandb")
WORKERS = Path(__file__).resolve().parent / "workers"
WANDB_ARGS = {"wandb_project": "clipbert-test", "wandb_tags": ["toy", "ci"], "wandb_mode": "offline"}


def wandb_records(run_file):
    """The records of a ``run-<id>.wandb`` file (LevelDB log format: 7-byte file header, 32 KB blocks,
    records of crc32 / length / type chunks), decoded with wandb's own protobuf."""
    from wandb.proto import wandb_internal_pb2 as pb
    data, pos, block, chunks = Path(run_file).read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos < len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if n == 0 and kind == 0:
            break
        chunks += data[pos + 7:pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def history(run_file):
    """{global step: {key: value}} of the logged rows (merged: a step's training and validation rows)."""
    out = {}
    for r in wandb_records(run_file):
        if r.WhichOneof("record_type") == "history":
            row = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            out.setdefault(row["trainer/global_step"], {}).update(row)
    return out


def run_files(out):
    return sorted((Path(out) / "log" / "wandb").glob("offline-run-*/run-*.wandb"))


def test_offline_run_logs_the_tensorboard_scalars_config_and_summary(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    out = tmp_path / "run"
    assert main("shared", ToyTask, toy_argv(out, **WANDB_ARGS)) == 0
    (run_file,) = run_files(out)
    run_id = (out / "log" / "wandb_run_id.txt").read_text().strip()
    assert run_file.name == f"run-{run_id}.wandb"
    records = list(wandb_records(run_file))
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "clipbert-test" and list(run.tags) == ["toy", "ci"] and run.display_name == "run"
    config = {i.key: json.loads(i.value_json) for i in run.config.update}
    assert config["learning_rate"] == 0.01 and config["train_batch_size"] == 4
    rows = history(run_file)
    assert sorted(rows) == list(range(1, 17))  # every optimizer step, as TensorBoard
    assert {"train/loss", "train/lr_transformer", "train/grad_norm", "perf/memory_mb"} <= set(rows[1])
    assert "valid/loss" in rows[8] and "valid/loss" in rows[16] and "valid/loss" not in rows[7]
    metrics = [json.loads(x) for x in open(out / "log" / "metrics.jsonl")]
    valid16 = next(m for m in metrics if m["split"] == "valid" and m["step"] == 16)
    assert rows[16]["valid/loss"] == pytest.approx(valid16["loss"])
    summary = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json)
                            for i in r.summary.update})
    assert summary["final/loss"] == pytest.approx(valid16["loss"]) and summary["global_step"] == 16


def test_a_resumed_run_continues_the_same_wandb_run(tmp_path):
    out = tmp_path / "run"
    argv = ["--wandb_project", "clipbert-test", "--wandb_mode", "offline"]
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 6, "SIGTERM", 1, *argv], timeout=120)
    assert p.returncode == 75, p.stderr[-2000:]
    assert main("shared", ToyTask, toy_argv(out, wandb_project="clipbert-test", wandb_mode="offline")) == 0
    first, second = run_files(out)
    run_id = (out / "log" / "wandb_run_id.txt").read_text().strip()
    assert first.name == second.name == f"run-{run_id}.wandb"  # one W&B run, two sessions
    assert max(history(first)) == 7 and min(history(second)) == 8 and max(history(second)) == 16


def test_the_run_file_is_complete_when_training_returns(tmp_path):
    """In a process that goes on after the training (a notebook, a sweep, this test): when ``main`` returns,
    W&B's service has written the run's file to the end (every step's history row, the exit record last)
    and has stopped, so nothing is written after the caller reads it (issue 46: a resumed run's history
    was once read empty on a busy machine)."""
    from wandb.sdk import wandb_setup
    out = tmp_path / "run"
    assert main("shared", ToyTask, toy_argv(out, wandb_project="clipbert-test", wandb_mode="offline")) == 0
    (run_file,) = run_files(out)
    kinds = [r.WhichOneof("record_type") for r in wandb_records(run_file)]
    assert kinds[-1] == "exit", kinds[-5:]
    assert sorted(history(run_file)) == list(range(1, 17))
    assert wandb_setup._singleton is None, "W&B's service still runs after the training returned"


def test_missing_wandb_warns_once_and_trains(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    caplog.set_level(logging.WARNING)
    assert main("shared", ToyTask, toy_argv(tmp_path / "run", wandb_project="p")) == 0
    warnings = [r for r in caplog.records if "wandb is not importable" in r.getMessage()]
    assert len(warnings) == 1 and "training goes on without W&B" in warnings[0].getMessage()


def test_a_failing_wandb_never_fails_training(tmp_path, monkeypatch, caplog):
    from clipbert_legacy.training import wandb_logger

    def broken(*a, **k):
        raise RuntimeError("no network and no disk for wandb")
    monkeypatch.setattr(wandb, "init", broken)
    monkeypatch.setattr(wandb_logger, "server_unreachable", lambda: None)  # the server answers
    caplog.set_level(logging.WARNING)
    assert main("shared", ToyTask, toy_argv(tmp_path / "run", wandb_project="p", wandb_mode="online")) == 0
    text = caplog.text
    assert "W&B could not start in online mode (RuntimeError: no network" in text and "trying offline" in text
    assert "W&B could not start in offline mode" in text and "training goes on without W&B" in text


@pytest.fixture
def wandb_server(monkeypatch):
    """W&B pointed at a local address (with an API key, for mode auto): ``set(port)`` also resets
    W&B's process-wide settings, which it reads once."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "0" * 40)

    def point_at(port):
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
        wandb.teardown()
    yield point_at
    monkeypatch.undo()
    wandb.teardown()


def test_auto_with_a_key_and_no_network_starts_offline_at_once(tmp_path, wandb_server, caplog):
    port = mp_utils.free_port()  # nothing listens there: the connection is refused
    wandb_server(port)
    caplog.set_level(logging.INFO)
    out = tmp_path / "run"
    assert main("shared", ToyTask, toy_argv(out, wandb_project="p", wandb_mode="auto")) == 0
    text = caplog.text
    assert f"W&B: its server 127.0.0.1:{port} does not answer (ConnectionRefusedError" in text
    assert "starting offline" in text and "could not start" not in text
    (run_file,) = run_files(out)
    assert run_file.name == f"run-{(out / 'log' / 'wandb_run_id.txt').read_text().strip()}.wandb"
    assert sorted(history(run_file)) == list(range(1, 17))


def test_a_failed_online_start_falls_back_offline_with_the_same_run_id(tmp_path, wandb_server, monkeypatch,
                                                                       caplog):
    """The server accepts connections and never answers: the online start times out, and the offline
    start then gets the same run id (W&B's service used to refuse it: "run ID ... is in use")."""
    import socket

    from clipbert_legacy.training import wandb_logger
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        wandb_server(silent.getsockname()[1])
        monkeypatch.setattr(wandb_logger, "INIT_TIMEOUT_S", 3)
        caplog.set_level(logging.INFO)
        out = tmp_path / "run"
        assert main("shared", ToyTask, toy_argv(out, wandb_project="p", wandb_mode="auto")) == 0
    text = caplog.text
    assert "W&B could not start in online mode" in text and "trying offline" in text
    assert "could not start in offline mode" not in text and "is in use" not in text
    (run_file,) = run_files(out)
    assert run_file.name == f"run-{(out / 'log' / 'wandb_run_id.txt').read_text().strip()}.wandb"
    assert sorted(history(run_file)) == list(range(1, 17))


def test_a_full_wandb_directory_mid_run_warns_once(tmp_path, monkeypatch, caplog):
    """W&B's service loses what it cannot write and says nothing: the free space under its directory
    is watched. Here it runs out after step 6 (a stand-in for the file system, measured by the real
    statvfs in test_a_full_wandb_file_system_warns)."""
    from clipbert_legacy.training import wandb_logger
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setattr(wandb_logger, "SPACE_CHECK_S", 0.0)
    checked = []

    def free(path):
        checked.append(path)
        return 10 * 2 ** 30 if len(checked) <= 6 else 2 ** 19
    monkeypatch.setattr(wandb_logger, "free_bytes", free)
    caplog.set_level(logging.WARNING)
    out = tmp_path / "run"
    assert main("shared", ToyTask, toy_argv(out, **WANDB_ARGS)) == 0
    warnings = [r.getMessage() for r in caplog.records if "W&B: its directory" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert f"{out}/log/wandb/offline-run-" in warnings[0] and "has 0.5 MB free" in warnings[0]
    assert "training goes on" in warnings[0]
    assert len(checked) == 7  # no check after the warning
    steps = [json.loads(x)["step"] for x in open(out / "log" / "metrics.jsonl") if '"train"' in x]
    assert steps[-1] == 16


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="mounts a tmpfs (root only)")
def test_a_full_wandb_file_system_warns(tmp_path, caplog):
    """A real full file system under log/wandb (a 128 KB tmpfs): one warning, the training goes on."""
    wandb_dir = tmp_path / "run" / "log" / "wandb"
    wandb_dir.mkdir(parents=True)
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128k", "tmpfs", str(wandb_dir)],
                           capture_output=True, text=True)
    if mount.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mount.stderr.strip()}")
    try:
        caplog.set_level(logging.WARNING)
        assert main("shared", ToyTask, toy_argv(tmp_path / "run", **WANDB_ARGS)) == 0
        warnings = [r.getMessage() for r in caplog.records if "W&B: its directory" in r.getMessage()]
        assert len(warnings) == 1 and "MB free: W&B cannot record the rest of this run" in warnings[0]
    finally:
        subprocess.run(["umount", "-l", str(wandb_dir)], check=False)
