"""The training engine on the toy task: accumulation equivalence, cadence, NaN stop, best checkpoint,
early stopping, logs, and the resumable data order."""
import json
import os
import re
import struct

import pytest
import torch
from torch.utils.data import DistributedSampler

from clipbert_legacy.training.data import ResumableDistributedSampler, build_train_dataloader
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.hooks import metric_mode
from clipbert_legacy.training.nonfinite import NonFiniteLossError
from clipbert_legacy.training.plan import num_train_steps, save_interval, valid_interval
from tests.toy_task import ToyDataset, ToyTask, collate, toy_cfg


def load_ckpt(out, name):
    return torch.load(os.path.join(out, "ckpt", name), map_location="cpu")


def test_cadence_formulas():
    assert valid_interval(1234, 20, 100) == 100 and len(range(100, 1235, 100)) + 1 == 13
    assert valid_interval(10000, 20, 100) == 500
    assert save_interval(50, 0.01) == 1 and save_interval(1000, 0.01) == 10
    assert num_train_steps(100, 10, 4, 8, 2) == 16  # ceil(1000 / 64)
    assert metric_mode("valid_loss") == "min" and metric_mode("text2video_medianR") == "min"
    assert metric_mode("text2video_r1") == "max" and metric_mode("loss", "max") == "max"


def test_accumulation_equals_large_batch(tmp_path):
    common = dict(num_train_epochs=2, grad_norm=1.0, num_valid=1, min_valid_steps=100)
    a = Trainer(toy_cfg(tmp_path / "a", train_batch_size=2, gradient_accumulation_steps=4, **common),
                ToyTask(n_train=32, dropout=0.0)).train()
    b = Trainer(toy_cfg(tmp_path / "b", train_batch_size=8, gradient_accumulation_steps=1, **common),
                ToyTask(n_train=32, dropout=0.0)).train()
    assert a["global_step"] == b["global_step"] == 8
    wa, wb = load_ckpt(tmp_path / "a", "model_step_8.pt"), load_ckpt(tmp_path / "b", "model_step_8.pt")
    start = ToyTask(dropout=0.0).build_model(None).state_dict()
    assert any((wa[k] - start[k]).abs().max() > 1e-3 for k in wa)  # it trained
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=1e-5)


def test_nan_loss_stops_with_step_and_last_good_checkpoint(tmp_path):
    out = tmp_path / "nan"
    with pytest.raises(NonFiniteLossError) as e:
        Trainer(toy_cfg(out, num_valid=1, min_valid_steps=100), ToyTask(nan_at_forward=6)).train()
    msg = str(e.value)
    assert "training stopped at step 6" in msg and "non-finite loss" in msg
    assert f"saved to {out}/ckpt/model_step_5.pt" in msg and "restore.pt holds step 4" in msg
    good = load_ckpt(out, "model_step_5.pt")
    assert all(torch.isfinite(v).all() for v in good.values())
    assert torch.load(out / "ckpt" / "restore.pt", weights_only=True)["global_step"] == 4


def test_best_checkpoint_and_early_stopping(tmp_path):
    out = tmp_path / "es"
    curve = {1: 1.0, 2: 2.0, 3: 3.0, 4: 2.5, 5: 2.9, 6: 9.0}
    cfg = toy_cfg(out, num_valid=16, min_valid_steps=1, best_metric="score", early_stop_patience=2)
    s = Trainer(cfg, ToyTask(metric_curve=curve.get)).train()
    assert s["global_step"] == 5 and s["stopped_early"] and s["best"] == {"metric": "score", "value": 3.0,
                                                                          "step": 3}
    best, step3 = load_ckpt(out, "model_best.pt"), load_ckpt(out, "model_step_3.pt")
    assert all(torch.equal(best[k], step3[k]) for k in best)
    assert json.load(open(out / "log" / "best_metric.json"))["step"] == 3
    again = Trainer(toy_cfg(out, num_valid=16, min_valid_steps=1, best_metric="score", early_stop_patience=2),
                    ToyTask(metric_curve=curve.get)).train()  # same command: nothing left to do
    assert again["global_step"] == 5 and again["best"]["step"] == 3


def test_early_stop_min_delta_small_gains_do_not_reset_patience(tmp_path):
    """MMF's / Lightning's min_delta: gains of 0.05 and 0.03 (< 0.1) still update the best checkpoint
    but count as validations without improvement, so patience 2 stops after step 3."""
    curve = {1: 1.0, 2: 1.05, 3: 1.08}

    def score(step):
        return curve.get(step, 5.0)
    cfg = toy_cfg(tmp_path / "md", num_valid=16, min_valid_steps=1, best_metric="score",
                  early_stop_patience=2, early_stop_min_delta=0.1)
    s = Trainer(cfg, ToyTask(metric_curve=score)).train()
    assert s["global_step"] == 3 and s["stopped_early"]
    assert s["best"] == {"metric": "score", "value": 1.08, "step": 3}
    without = Trainer(toy_cfg(tmp_path / "no", num_valid=16, min_valid_steps=1, best_metric="score",
                              early_stop_patience=2), ToyTask(metric_curve=score)).train()
    assert without["global_step"] == 6 and without["best"] == {"metric": "score", "value": 5.0, "step": 4}


def test_unknown_best_metric_is_a_clear_error(tmp_path):
    with pytest.raises(KeyError, match="best_metric='r1' is not among the validation metrics "
                                       "\\(extra_neg_loss, loss\\)"):
        Trainer(toy_cfg(tmp_path, best_metric="r1"), ToyTask()).train()


def _tb_tags(log_dir):
    from tensorboardX.proto import event_pb2
    tags = set()
    for f in os.listdir(log_dir):
        if not f.startswith("events.out.tfevents"):
            continue
        data = open(os.path.join(log_dir, f), "rb").read()
        i = 0
        while i < len(data):
            n = struct.unpack("<Q", data[i:i + 8])[0]
            ev = event_pb2.Event()
            ev.ParseFromString(data[i + 12:i + 12 + n])
            tags.update(v.tag for v in ev.summary.value)
            i += 12 + n + 4
    return tags


def test_logs_and_outputs(tmp_path):
    out = tmp_path / "logs"
    mc = tmp_path / "model.json"
    mc.write_text(json.dumps({"hidden_size": 6}))
    Trainer(toy_cfg(out, model_config=str(mc), log_interval=4), ToyTask()).train()
    args = json.load(open(out / "log" / "args.json"))
    assert args["num_train_steps"] == 16 and args["valid_steps"] == 8 and args["n_gpu"] == 1
    assert args["save_steps"] == 4 and "config" not in args
    assert json.load(open(out / "log" / "model_config.json")) == {"hidden_size": 6}
    lines = open(out / "log" / "log.txt").read().splitlines()
    pat = re.compile(r"^\d\d/\d\d/\d{4} \d\d:\d\d:\d\d - INFO - [\w.]+ -   ")
    assert lines and all(pat.match(x) for x in lines if x.strip())
    assert any("step 16/16" in x for x in lines) and any("validation at step 8: loss" in x for x in lines)
    tags = _tb_tags(out / "log")
    assert {"train/loss", "train/lr_transformer", "train/lr_cnn", "train/grad_norm", "perf/examples_per_s",
            "perf/data_wait_ratio", "perf/memory_mb", "valid/loss", "valid/extra_neg_loss"} <= tags
    # peak memory per step (the CPU RSS here): in the log line and in metrics.jsonl
    step_lines = [x for x in lines if "step 16/16" in x]
    mem = float(re.search(r" mem (\d+) MB", step_lines[0]).group(1))
    rows = [json.loads(x) for x in open(out / "log" / "metrics.jsonl") if '"train"' in x]
    assert 50 < mem < 20000 and all(50 < r["memory_mb"] < 20000 for r in rows)
    assert sorted(os.listdir(out / "ckpt")) == ["model_best.pt", "model_step_16.pt", "model_step_8.pt",
                                               "restore.pt", "restore_backup.pt"]


def test_bf16_and_fp32_clip_off_run(tmp_path):
    s = Trainer(toy_cfg(tmp_path / "bf", bf16=1, grad_norm=-1), ToyTask()).train()
    assert s["global_step"] == 16 and s["last_metrics"]["loss"] < 100


@pytest.mark.parametrize("world", [1, 3])
def test_sampler_matches_distributed_sampler_and_skips(world):
    for rank in range(world):
        ours = ResumableDistributedSampler(10, world, rank, shuffle=True, seed=5)
        ref = DistributedSampler(list(range(10)), world, rank, shuffle=True, seed=5)
        for epoch in (0, 1):
            ours.set_epoch(epoch)
            ref.set_epoch(epoch)
            assert [i for i, _ in ours] == list(ref)
        ours.skip(2)
        assert [i for i, _ in ours] == list(ref)[2:] and len(ours) == len(ref) - 2
        ours.set_epoch(2)
        assert len(ours) == len(ref)


def test_batches_do_not_depend_on_worker_count():
    ds = ToyDataset(12)

    def batches(n_workers):
        s = ResumableDistributedSampler(12, 1, 0, seed=3)
        s.set_epoch(1)
        return [b["x"] for b in build_train_dataloader(ds, s, 4, collate, n_workers=n_workers, seed=3)]

    torch.manual_seed(0)
    before = torch.get_rng_state()
    a = batches(0)
    assert torch.equal(before, torch.get_rng_state())  # loading does not touch the training RNG
    b = batches(2)
    assert all(torch.equal(x, y) for x, y in zip(a, b)) and len(a) == 3


class _NoneBatchTask(ToyTask):
    """The wrapper yields None for every 3rd batch (e.g. all its videos failed to decode)."""

    def wrap_train_loader(self, loader, cfg, device):
        class Wrap:
            def __iter__(self_inner):
                for i, b in enumerate(loader):
                    yield None if i % 3 == 2 else b
        return Wrap()


def test_unusable_batch_is_a_zero_loss_micro_step(tmp_path):
    s = Trainer(toy_cfg(tmp_path, gradient_accumulation_steps=2), _NoneBatchTask()).train()
    assert s["global_step"] == 8
    w = load_ckpt(tmp_path, "model_step_8.pt")
    assert all(torch.isfinite(v).all() for v in w.values())


def test_debug_stops_after_3_steps(tmp_path):
    assert Trainer(toy_cfg(tmp_path, debug=1), ToyTask()).train()["global_step"] == 3


def test_inference_helpers(tmp_path):
    from clipbert_legacy.config import parse_args
    from clipbert_legacy.training.inference import (
        inference_result_dir,
        load_trained_model,
        prepare_inference_config,
    )
    Trainer(toy_cfg(tmp_path, max_txt_len=30), ToyTask()).train()
    cfg = parse_args("retrieval", ["--output_dir", str(tmp_path), "--do_inference", "1",
                                   "--score_agg_func", "max", "--inference_txt_db", "/txt/test.jsonl",
                                   "--inference_n_clips", "4"])
    prepare_inference_config(cfg)
    assert cfg.inference_model_step == 16 and cfg.max_txt_len == 30 and cfg.score_agg_func == "max"
    model = load_trained_model(cfg, ToyTask())
    w = load_ckpt(tmp_path, "model_step_16.pt")
    assert all(torch.equal(model.state_dict()[k], w[k]) for k in w) and not model.training
    assert inference_result_dir(cfg).endswith("results_test/step_16_4_max")
    cfg.inference_model_step = 5
    with pytest.raises(FileNotFoundError, match="available steps: \\[8, 16\\]"):
        prepare_inference_config(cfg)


def test_misc_and_logger_helpers():
    import random

    from clipbert_legacy.utils.logger import RunningMeter
    from clipbert_legacy.utils.misc import NoOp, set_random_seed, zero_none_grad
    from tests.toy_task import ToyModel
    m = ToyModel()
    m(torch.randn(2, 6)).sum().backward()
    assert m.transformer.unused_head.weight.grad is None
    zero_none_grad(m)
    assert torch.equal(m.transformer.unused_head.weight.grad, torch.zeros(1, 6))
    set_random_seed(3)
    a = (random.random(), torch.rand(1).item())
    set_random_seed(3)
    assert a == (random.random(), torch.rand(1).item())
    assert NoOp().anything(1, x=2) is None and not NoOp()
    r = RunningMeter("loss")
    r(2.0)
    r(1.0)
    assert r.val == pytest.approx(0.01 * 1.0 + 0.99 * 2.0)


def test_profile_steps_writes_a_trace_and_the_top_operators(tmp_path, caplog):
    import logging
    caplog.set_level(logging.INFO)
    out = tmp_path / "prof"
    Trainer(toy_cfg(out, profile_steps="3-5"), ToyTask()).train()
    trace = out / "log" / "profile" / "steps_3-5.pt.trace.json"
    events = json.load(open(trace))["traceEvents"]
    names = {e.get("name") for e in events}
    assert "aten::addmm" in names and any(n and n.startswith("Optimizer.step") for n in names)
    assert f"profile of steps 3-5 -> {trace}; top operators by self CPU time:" in caplog.text
    # the run is otherwise unchanged: the same weights as without profiling
    Trainer(toy_cfg(tmp_path / "plain"), ToyTask()).train()
    a, b = load_ckpt(out, "model_step_16.pt"), load_ckpt(tmp_path / "plain", "model_step_16.pt")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("spec", ["5-3", "0-2", "x", "3-"])
def test_bad_profile_steps_is_a_config_error(tmp_path, spec):
    from clipbert_legacy.config import ConfigError
    with pytest.raises(ConfigError, match=f"profile_steps='{spec}' is invalid: expected A-B"):
        toy_cfg(tmp_path, profile_steps=spec)
