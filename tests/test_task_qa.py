"""Video QA entry point (src/tasks/run_video_qa.py) on a tiny synthetic dataset: frameqa and action
training, inference that reproduces the validation, ClipBERT's QA result files, unlabeled files,
CLI settings kept at inference, a real ``horovodrun -np 2`` run, and the shipped configs."""
import json
import shutil
from pathlib import Path

import pytest

from clipbert_legacy.config import parse_args
from clipbert_legacy.evaluation.qa import QA_ANSWER_TYPES, qa_scores
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.tasks.run_video_qa import VideoQATask
from clipbert_legacy.training.engine import Trainer
from tests.conftest import requires_horovod
from tests.mp_utils import check, run_horovod

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "src" / "tasks" / "run_video_qa.py"
N_TRAIN, N_VAL, N_TEST = 24, 6, 6  # videos; frameqa has 2 questions per video, action 1


# ---------------------------------------------------------------------------------------------
# fixtures: tiny demo data, configs on it, trained runs
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    root = tmp_path_factory.mktemp("demo_qa")
    data = root / "data"
    build_demo_data(str(data), n_train=N_TRAIN, n_val=N_VAL, n_test=N_TEST, img_size=64, n_frames=12,
                    fps=10, num_workers=1, log=lambda *a: None)
    from clipbert_legacy.preprocessing.pretrain_demo_cnn import pretrain_demo_cnn
    cnn = str(data / "pretrained" / "cnn.pth")  # the demo configs start from a pretrained CNN, as ClipBERT
    pretrain_demo_cnn(str(data), cnn, steps=2, batch_size=4, log=lambda *a: None)
    cfgs = {}
    for task, name in (("frameqa", "demo_qa_frameqa.json"), ("action", "demo_qa_action.json")):
        cfg = json.load(open(REPO / "configs" / name))
        cfg.update({
            "train_datasets": [{"name": "demo", "txt": {task: str(data / f"txt/{task}_train.jsonl")},
                                "img": str(data / "vis_db")}],
            "val_datasets": [{"name": "demo", "txt": {task: str(data / f"txt/{task}_val.jsonl")},
                              "img": str(data / "vis_db")}],
            "ans2label_path": str(data / "txt/ans2label.json"),
            "model_config": str(REPO / "configs/model/tiny_model.json"), "bert_weights_path": None,
            "cnn_weights_path": cnn, "max_img_size": 64, "train_batch_size": 8, "val_batch_size": 5,
            "inference_batch_size": 5, "num_train_epochs": 1, "num_valid": 2, "min_valid_steps": 2,
            "n_workers": 0,
            "output_dir": str(root / f"run_{task}"), "learning_rate": 1e-3, "cnn_learning_rate": 1e-3,
        })
        path = root / f"{task}_test.json"
        path.write_text(json.dumps(cfg, indent=1))
        cfgs[task] = path
    return {"root": root, "data": data, "cfg": cfgs}


def _train(demo, task):
    cfg = parse_args("video_qa", ["--config", str(demo["cfg"][task])])
    summary = Trainer(cfg, VideoQATask()).train()
    return {**demo, "out": Path(cfg.output_dir), "summary": summary}


@pytest.fixture(scope="module")
def frameqa_run(demo):
    """48 questions / batch 8 = 6 steps, validated at steps 4 and 6."""
    return _train(demo, "frameqa")


def _infer(out, txt, *extra, config=None, img=None):
    argv = (["--config", str(config)] if config else []) + [
        "--do_inference", "1", "--output_dir", str(out), "--inference_txt_db", str(txt)]
    if img:
        argv += ["--inference_img_db", str(img)]
    return main("video_qa", VideoQATask, argv + [str(x) for x in extra])


def _load(path):
    with open(path) as f:
        return json.load(f)


# ---------------------------------------------------------------------------------------------
def test_frameqa_inference_reproduces_validation(frameqa_run):
    r = frameqa_run
    s = r["summary"]
    assert s["global_step"] == 6 and s["best"]["metric"] == "overall_acc"
    val = s["last_metrics"]
    assert set(val) == {"overall_acc", "color_acc", "object_acc", "loss"}
    # 2 questions per val video, one per type: overall is the mean of the two type accuracies
    assert val["overall_acc"] == pytest.approx((val["color_acc"] + val["object_acc"]) / 2)
    assert (r["out"] / "ckpt" / "model_step_6.pt").is_file() and (r["out"] / "ckpt/model_step_4.pt").is_file()

    txt = r["data"] / "txt/frameqa_val.jsonl"
    assert _infer(r["out"], txt, "--inference_model_step", "6", config=r["cfg"]["frameqa"],
                  img=r["data"] / "vis_db") == 0
    rdir = r["out"] / "results_frameqa_val" / "step_6_1_mean"
    scores = _load(rdir / "scores.json")
    for k in ("overall_acc", "color_acc", "object_acc"):
        assert scores[k] == pytest.approx(val[k], abs=0.006)  # the validation at step 6, 2 decimals
    # ClipBERT's scores.json (run_video_qa.validate + save_json(save_pretty=True)): ratios first as
    # [percent, count], then every frameqa answer type in its order, empty ones as 0
    assert list(scores) == ["ratios", "overall_acc", "object_acc", "number_acc", "color_acc", "location_acc"]
    assert scores["ratios"] == {"object_ratio": [50.0, N_VAL], "number_ratio": [0.0, 0],
                                "color_ratio": [50.0, N_VAL], "location_ratio": [0.0, 0]}
    assert scores["number_acc"] == scores["location_acc"] == 0
    assert (rdir / "scores.json").read_text() == json.dumps(scores, indent=4)
    results = _load(rdir / "results_all.json")
    label2ans = {v: k for k, v in _load(r["data"] / "txt/ans2label.json").items()}
    gts = {x["question_id"]: x["data"] for x in results}
    assert scores == qa_scores(results, gts, label2ans, QA_ANSWER_TYPES["frameqa"])
    assert [x["question_id"] for x in results] == list(range(2 * N_VAL))
    correct = sum(label2ans[x["answer"]] == x["data"]["answer"] for x in results)
    assert 100.0 * correct / len(results) == pytest.approx(val["overall_acc"])
    rank0 = sorted(_load(rdir / "results_rank0.json"), key=lambda x: x["question_id"])
    assert rank0 == results  # one process: rank 0 answered everything
    for name in ("raw_args.json", "merged_args.json"):
        assert (rdir / name).is_file()


def test_inference_unlabeled_file_and_cli_settings_kept(frameqa_run, tmp_path):
    r = frameqa_run
    moved = tmp_path / "moved_run"  # a run directory moved elsewhere: results go where we say
    shutil.copytree(r["out"], moved)
    unlabeled = tmp_path / "frameqa_unlabeled.jsonl"
    rows = [json.loads(x) for x in open(r["data"] / "txt/frameqa_test.jsonl")]
    with open(unlabeled, "w") as f:
        for row in rows:
            f.write(json.dumps({k: v for k, v in row.items() if k not in ("answer", "answer_type")}) + "\n")
    # no --config: task, model and tokenizer come from the trained run's log/args.json
    rc = _infer(moved, unlabeled, "--inference_model_step", "-1", "--score_agg_func", "max", "--fps", "5",
                "--inference_batch_size", "3", "--max_txt_len", "7", "--n_workers", "0",
                img=r["data"] / "vis_db")
    assert rc == 0
    rdir = moved / "results_frameqa_unlabeled" / "step_6_1_max"
    assert not (rdir / "scores.json").exists()
    results = _load(rdir / "results_all.json")
    assert [x["question_id"] for x in results] == list(range(len(rows)))
    assert all(0 <= x["answer"] < 9 and x["data"]["answer"] is None for x in results)
    merged = _load(rdir / "merged_args.json")
    stored = _load(r["out"] / "log" / "args.json")
    assert merged["output_dir"] == str(moved)  # ClipBERT overwrote it with the stored path
    assert (merged["score_agg_func"], merged["fps"], merged["inference_batch_size"]) == ("max", 5, 3)
    assert merged["max_txt_len"] == stored["max_txt_len"] != 7  # model-defining: from the trained run
    assert merged["task"] == "frameqa" and merged["num_labels"] == 9
    assert _load(rdir / "raw_args.json")["task"] is None
    assert not (r["out"] / "results_frameqa_unlabeled").exists()


def test_action_task_trains_and_infers(demo):
    r = _train(demo, "action")  # 24 questions / batch 8 = 3 steps
    s = r["summary"]
    assert s["global_step"] == 3 and set(s["last_metrics"]) == {"overall_acc", "loss"}
    assert _infer(r["out"], r["data"] / "txt/action_test.jsonl", "--inference_model_step", "-1",
                  "--inference_n_clips", "2", config=demo["cfg"]["action"],
                  img=r["data"] / "vis_db") == 0
    rdir = r["out"] / "results_action_test" / "step_3_2_mean"
    results = _load(rdir / "results_all.json")
    assert len(results) == N_TEST and all(x["answer"] in range(5) for x in results)
    acc = 100.0 * sum(x["answer"] == x["data"]["answer"] for x in results) / N_TEST
    assert _load(rdir / "scores.json") == {"overall_acc": round(acc, 2)}


@pytest.mark.multiprocess
@requires_horovod
def test_horovodrun_two_processes_train_and_infer(demo):
    out = demo["root"] / "run_hvd"
    check(run_horovod([SCRIPT, "--config", demo["cfg"]["frameqa"], "--output_dir", out], np=2, timeout=150))
    best = _load(out / "log" / "best_metric.json")
    args = _load(out / "log" / "args.json")
    assert args["n_gpu"] == 2 and args["num_train_steps"] == 3  # ceil(48 / (2 x 8))
    check(run_horovod([SCRIPT, "--do_inference", "1", "--output_dir", out, "--inference_model_step",
                       best["step"], "--inference_txt_db", demo["data"] / "txt/frameqa_val.jsonl",
                       "--inference_img_db", demo["data"] / "vis_db", "--n_workers", "0"], np=2, timeout=120))
    rdir = out / "results_frameqa_val" / f"step_{best['step']}_1_mean"
    ranks = [_load(rdir / f"results_rank{k}.json") for k in (0, 1)]
    qids = sorted(x["question_id"] for part in ranks for x in part)
    assert qids == list(range(2 * N_VAL))  # every question answered once, split over the ranks
    assert all(len(part) == N_VAL for part in ranks)
    assert len(_load(rdir / "results_all.json")) == 2 * N_VAL
    assert _load(rdir / "scores.json")["overall_acc"] == pytest.approx(best["value"], abs=0.006)


# ---------------------------------------------------------------------------------------------
GPU_CONFIGS = {
    "msrvtt_qa_base_resnet50.json": dict(task="msrvtt_qa", fps=2, num_frm=2, train_n_clips=8,
                                         score_agg_func="lse", max_txt_len=100, num_train_epochs=10,
                                         max_img_size=448),
    **{f"tgif_qa_{t}_base_resnet50.json": dict(task=t, fps=1, num_frm=1, train_n_clips=1,
                                               score_agg_func="mean", max_txt_len=25, num_train_epochs=15,
                                               max_img_size=768)
       for t in ("action", "transition", "frameqa")},
}


@pytest.mark.parametrize("name", sorted(GPU_CONFIGS))
def test_gpu_configs_parse(name, tmp_path):
    ans2label = tmp_path / "ans2label.json"  # the real one lives under /txt on the cluster
    ans2label.write_text(json.dumps({"a": 0, "b": 1, "c": 2}))
    cfg = parse_args("video_qa", ["--config", str(REPO / "configs" / name),
                                  "--ans2label_path", str(ans2label)])
    for k, v in GPU_CONFIGS[name].items():
        assert cfg[k] == v, k
    assert (cfg.train_batch_size, cfg.gradient_accumulation_steps, cfg.fp16) == (16, 1, True)
    assert cfg.img_pixel_mean == [123.675, 116.28, 103.53] and cfg.img_pixel_std == [1.0, 1.0, 1.0]
    assert (cfg.img_input_format, cfg.cnn_type, cfg.model_config) == ("BGR", "resnet50",
                                                                      "configs/model/base_model.json")
    assert cfg.num_labels == (5 if cfg.task in ("action", "transition") else 3)
    raw = _load(REPO / "configs" / name)
    assert raw["tokenizer_dir"].startswith("/pretrain/") and raw["output_dir"].startswith("/storage/")
    for key in ("train_datasets", "val_datasets"):
        entry = raw[key][0]
        assert entry["img"].startswith("/img/") and entry["txt"][cfg.task].startswith("/txt/")


def test_score_your_own_videos_answers_questions(frameqa_run, tmp_path, capsys):
    """score_videos on a frameqa run: per video, the top answers with probabilities; the top answer is
    the one inference predicts for the same video and question."""
    from clipbert_legacy.datasets.lmdb_store import LMDBStore
    from clipbert_legacy.tasks.score_videos import main as score_main
    r = frameqa_run
    rows = [json.loads(x) for x in open(r["data"] / "txt/frameqa_val.jsonl")]
    vid_key = "gif_name" if "gif_name" in rows[0] else "video_id"
    row = rows[0]
    store = LMDBStore(str(r["data"] / "vis_db"))
    (tmp_path / f"{row[vid_key]}.mp4").write_bytes(store.get(row[vid_key]))
    assert score_main(["--output_dir", str(r["out"]), "--videos", str(tmp_path / f"{row[vid_key]}.mp4"),
                       "--questions", row["question"], "--json", "--top_k", "3",
                       "--inference_model_step", "6"]) == 0
    out = json.loads(capsys.readouterr().out)
    (q,) = out["videos"][row[vid_key]]["questions"]
    probs = [a["prob"] for a in q["answers"]]
    assert q["question"] == row["question"] and len(probs) == 3 and probs == sorted(probs, reverse=True)
    assert 0 < sum(probs) <= 1.0001
    txt = tmp_path / "one.jsonl"
    txt.write_text(json.dumps(row) + "\n")
    assert _infer(r["out"], txt, "--inference_model_step", "6", config=r["cfg"]["frameqa"],
                  img=r["data"] / "vis_db") == 0
    (pred,) = _load(r["out"] / "results_one" / "step_6_1_mean" / "results_all.json")
    label2ans = {v: k for k, v in _load(r["data"] / "txt/ans2label.json").items()}
    assert q["answers"][0]["answer"] == label2ans[pred["answer"]]
