"""Weights & Biases beside TensorBoard, with the real ``wandb`` package in offline mode: the same
scalars, the config and the final metrics from rank 0, the same W&B run after a restart, and no
failure of training when wandb is missing or broken."""
import json
import logging
import struct
import sys
from pathlib import Path

import pytest

from src.tasks.entry import main
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


def test_missing_wandb_warns_once_and_trains(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    caplog.set_level(logging.WARNING)
    assert main("shared", ToyTask, toy_argv(tmp_path / "run", wandb_project="p")) == 0
    warnings = [r for r in caplog.records if "wandb is not importable" in r.getMessage()]
    assert len(warnings) == 1 and "training goes on without W&B" in warnings[0].getMessage()


def test_a_failing_wandb_never_fails_training(tmp_path, monkeypatch, caplog):
    def broken(*a, **k):
        raise RuntimeError("no network and no disk for wandb")
    monkeypatch.setattr(wandb, "init", broken)
    caplog.set_level(logging.WARNING)
    assert main("shared", ToyTask, toy_argv(tmp_path / "run", wandb_project="p", wandb_mode="online")) == 0
    text = caplog.text
    assert "W&B could not start in online mode (RuntimeError: no network" in text and "trying offline" in text
    assert "W&B could not start in offline mode" in text and "training goes on without W&B" in text
