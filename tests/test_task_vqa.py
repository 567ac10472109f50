"""VQA (src/tasks/run_vqa.py): soft-score targets and the BCE loss on crafted numbers, VQA accuracy with
answers given by 1, 2 and 3+ humans, image decoding, a tiny end-to-end train + validation + inference on
the demo VQA data, the results file format, and a real ``horovodrun -np 2`` run whose ranks agree."""
import io
import json
import math
from pathlib import Path

import pytest
import torch

from clipbert_legacy.config import parse_args
from clipbert_legacy.datasets.dataset_vqa import (
    answer_scores,
    best_constant_answer,
    build_ans2label,
    decode_image,
    mk_vqa_examples,
    vqa_target,
)
from clipbert_legacy.datasets.decoder import VideoDecodeError
from clipbert_legacy.evaluation.vqa import eval_vqa, vqa_scores
from clipbert_legacy.modeling.heads import QAHead
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.tasks.run_vqa import VQATask, vqa_loss
from clipbert_legacy.training.engine import Trainer
from tests.conftest import requires_horovod
from tests.mp_utils import check, run_horovod

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------------
# targets, loss, accuracy on crafted cases
def test_soft_scores_are_min_humans_over_3():
    humans = ["cat"] + ["dog"] * 2 + ["cow"] * 3 + ["pig"] * 4
    assert answer_scores(humans) == {"cat": pytest.approx(1 / 3), "dog": pytest.approx(2 / 3), "cow": 1.0,
                                     "pig": 1.0}
    # ClipBERT's scatter into the vocabulary; answers outside it ("cat", "pig") stay 0 instead of KeyError
    target = vqa_target(answer_scores(humans), {"cow": 0, "dog": 1, "yes": 2})
    assert target.tolist() == pytest.approx([1.0, 2 / 3, 0.0])
    rows = mk_vqa_examples([{"question": "q?", "image_id": 7, "question_id": 1, "answers": humans},
                            {"question": "q?", "image_id": 7, "question_id": 2, "labels": {"dog": 0.3}},
                            {"question": "q?", "image_id": 8, "question_id": 3}])
    assert rows[0]["labels"] == answer_scores(humans) and rows[0]["img_id"] == "7"
    assert rows[1]["labels"] == {"dog": 0.3} and rows[2]["labels"] is None


def test_bad_rows_are_named():
    with pytest.raises(ValueError, match="row 2: question_id 5 is not unique"):
        mk_vqa_examples([{"question": "a", "image_id": 1, "question_id": 5}] * 2, "x.jsonl")
    with pytest.raises(ValueError, match="row 1: 'labels' must be"):
        mk_vqa_examples([{"question": "a", "image_id": 1, "question_id": 5, "labels": {"a": 2}}])


def test_bce_loss_sums_answers_and_averages_questions():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    targets = torch.tensor([[1.0, 2 / 3, 0.0], [0.0, 1.0, 1 / 3]])
    # softplus(x) - x*y per element: 0.126928 + 0.693147 + 0.313262; second row 3 x ln 2
    per_q = vqa_loss(logits, targets)
    assert per_q.tolist() == pytest.approx([1.133337, 3 * math.log(2)], abs=1e-6)
    # ClipBERT's run_vqa: elementwise BCE .mean() * num_labels (the head's bce loss)
    clipbert = QAHead(3, "bce").calc_loss(logits, targets).mean() * 3
    assert float(per_q.mean()) == pytest.approx(float(clipbert), abs=1e-6)

    class Stub(torch.nn.Module):
        def forward(self, batch):
            assert batch["labels"] is None  # the task computes the loss itself
            return {"logits": logits}
    loss = VQATask().forward_train(Stub(), {"labels": targets}, None)
    assert float(loss) == pytest.approx((1.133337 + 3 * math.log(2)) / 2, abs=1e-6)


def _gts():
    labels = answer_scores(["cat"] + ["dog"] * 2 + ["cow"] * 3 + ["pig"] * 4)
    types = {1: "other", 2: "other", 3: "number", 4: "yes/no", 5: "other"}
    return {q: {"labels": labels, "answer_type": t} for q, t in types.items()}


def test_vqa_accuracy_by_number_of_humans():
    preds = [{"question_id": 1, "answer": "cat"},   # 1 human: 1/3
             {"question_id": 2, "answer": "dog"},   # 2 humans: 2/3
             {"question_id": 3, "answer": "cow"},   # 3 humans: 1
             {"question_id": 4, "answer": "horse"},  # nobody: 0
             {"question_id": 5, "answer": None},    # non-finite logits: 0
             {"question_id": 1, "answer": "pig"}]   # a repeated question keeps the first answer
    m = eval_vqa(preds, _gts())
    assert m["overall_acc"] == pytest.approx(100 * (1 / 3 + 2 / 3 + 1) / 5)  # 40
    assert m["other_acc"] == pytest.approx(100 / 3) and m["number_acc"] == 100 and m["yes/no_acc"] == 0
    assert list(m) == ["overall_acc", "yes/no_acc", "number_acc", "other_acc", "ratios"]
    assert m["ratios"] == {"yes/no_ratio": [20.0, 1], "number_ratio": [20.0, 1], "other_ratio": [60.0, 3]}
    s = vqa_scores(preds, _gts())
    assert (s["overall_acc"], s["other_acc"], s["n_questions"]) == (40.0, 33.33, 5)
    with pytest.raises(ValueError, match="question_id 9 has no ground truth"):
        eval_vqa([{"question_id": 9, "answer": "cat"}], _gts())


def test_best_constant_answer_and_vocabulary():
    labels = [{"yes": 1.0, "no": 1 / 3}, {"no": 1.0}, {"yes": 2 / 3, "red": 1.0}]
    assert best_constant_answer(labels) == ("yes", pytest.approx(100 * (5 / 3) / 3))
    rows = [{"labels": d} for d in labels] + [{"answers": ["red"] * 3}, {"answers": ["red", "blue"]},
                                              {"labels": {"blue": 0.0}}]  # red 3, no/yes 2, blue 1
    assert build_ans2label(rows) == {"red": 0, "no": 1, "yes": 2, "blue": 3}  # by count, ties alphabetical
    assert build_ans2label(rows, min_count=2, top_k=2) == {"red": 0, "no": 1}


def test_images_decode_with_pil():
    from PIL import Image
    buf = io.BytesIO()
    Image.new("RGB", (6, 4), (10, 200, 30)).save(buf, format="PNG")
    img = decode_image(buf.getvalue())
    assert img.shape == (1, 3, 4, 6) and img[0, :, 0, 0].tolist() == [10, 200, 30]
    with pytest.raises(VideoDecodeError) as e:
        decode_image(b"not an image")
    assert e.value.reason == "decode_failed"


# ---------------------------------------------------------------------------------------------
# end to end on the demo VQA data
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    from clipbert_legacy.preprocessing.make_demo_vqa import build_demo_vqa
    root = tmp_path_factory.mktemp("demo_vqa")
    data = root / "data"
    build_demo_data(str(data), n_train=8, n_val=4, n_test=4, img_size=64, n_frames=6, fps=10, num_workers=1,
                    log=lambda *a: None)
    stats = build_demo_vqa(str(data), log=lambda *a: None)
    cfg = json.load(open(REPO / "configs" / "demo_vqa.json"))
    cfg.update({
        "train_datasets": [{"name": "demo", "txt": str(data / "txt/vqa_train.jsonl"),
                            "img": str(data / "vqa_img_db"), "vis_format": "image"}],
        "val_datasets": [{"name": "demo", "txt": str(data / "txt/vqa_val.jsonl"),
                          "img": str(data / "vqa_img_db"), "vis_format": "image"}],
        "ans2label_path": str(data / "txt/vqa_ans2label.json"),
        "model_config": str(REPO / "configs/model/tiny_model.json"), "bert_weights_path": None,
        "cnn_weights_path": None, "max_img_size": 64, "train_batch_size": 4, "val_batch_size": 5,
        "inference_batch_size": 5, "num_train_epochs": 1, "num_valid": 2, "min_valid_steps": 2,
        "output_dir": str(root / "run"), "learning_rate": 1e-3, "cnn_learning_rate": 1e-3,
    })
    path = root / "vqa_test.json"
    path.write_text(json.dumps(cfg, indent=1))
    return {"root": root, "data": data, "cfg": path, "stats": stats}


def _load(path):
    with open(path) as f:
        return json.load(f)


def test_demo_vqa_data(demo):
    s = demo["stats"]
    assert s["n_images"] == {"train": 8, "val": 4, "test": 4} and s["n_questions"]["val"] == 12
    rows = [json.loads(x) for x in open(demo["data"] / "txt/vqa_val.jsonl")]
    assert all(len(r["answers"]) == 10 and r["labels"] == answer_scores(r["answers"]) for r in rows)
    assert {r["answer_type"] for r in rows} == {"yes/no", "other"}
    answer, acc = best_constant_answer(r["labels"] for r in rows)
    assert s["val"]["best_constant_answer"] == answer and s["val"]["best_constant_acc"] == round(acc, 2)
    ans2label = _load(demo["data"] / "txt/vqa_ans2label.json")
    assert set(ans2label) >= {"yes", "no"} and sorted(ans2label.values()) == list(range(len(ans2label)))


def test_train_validate_and_infer(demo, tmp_path):
    cfg = parse_args("vqa", ["--config", str(demo["cfg"])])
    assert cfg.num_labels == len(_load(demo["data"] / "txt/vqa_ans2label.json"))
    assert cfg.task_type == "qa_open"
    summary = Trainer(cfg, VQATask()).train()
    # 8 images x 3 questions in groups of 2 -> 16 groups / batch 4 = 4 steps, validated at 2 and 4
    assert summary["global_step"] == 4 and summary["best"]["metric"] == "overall_acc"
    val = summary["last_metrics"]
    assert set(val) == {"overall_acc", "yes/no_acc", "other_acc", "loss"}  # 4 yes/no, 8 other questions
    assert val["overall_acc"] == pytest.approx((val["yes/no_acc"] + 2 * val["other_acc"]) / 3)
    out = Path(cfg.output_dir)
    txt = demo["data"] / "txt/vqa_val.jsonl"
    assert main("vqa", VQATask, ["--do_inference", "1", "--output_dir", str(out),
                                 "--inference_model_step", "4",
                                 "--inference_txt_db", str(txt), "--n_workers", "0",
                                 "--inference_img_db", str(demo["data"] / "vqa_img_db")]) == 0
    rdir = out / "results_vqa_val" / "step_4"
    results = _load(rdir / "results_all.json")
    answers = set(_load(demo["data"] / "txt/vqa_ans2label.json"))
    rows = [json.loads(x) for x in open(txt)]
    assert [set(r) for r in results] == [{"question_id", "answer"}] * len(rows)  # VQA submission format
    assert [r["question_id"] for r in results] == sorted(r["question_id"] for r in rows)
    assert all(r["answer"] in answers for r in results)
    scores = _load(rdir / "scores.json")
    assert scores["overall_acc"] == pytest.approx(val["overall_acc"], abs=0.006)  # same model, same data
    by_q = {r["question_id"]: r for r in rows}
    acc = 100 * sum(by_q[r["question_id"]]["labels"].get(r["answer"], 0) for r in results) / len(rows)
    assert scores["overall_acc"] == round(acc, 2) and scores["n_questions"] == len(rows)
    # an unlabeled file: answers, no scores
    unlabeled = tmp_path / "vqa_unlabeled.jsonl"
    unlabeled.write_text("".join(json.dumps({k: r[k] for k in ("question", "image_id", "question_id")}) + "\n"
                                 for r in rows[:4]))
    assert main("vqa", VQATask, ["--do_inference", "1", "--output_dir", str(out), "--inference_txt_db",
                                 str(unlabeled), "--n_workers", "0"]) == 1  # which images?
    assert main("vqa", VQATask, ["--do_inference", "1", "--output_dir", str(out), "--inference_txt_db",
                                 str(unlabeled), "--n_workers", "0",
                                 "--inference_img_db", str(demo["data"] / "vqa_img_db")]) == 0
    udir = out / "results_vqa_unlabeled" / "step_4"
    assert not (udir / "scores.json").exists()
    assert [r["question_id"] for r in _load(udir / "results_all.json")] == [r["question_id"]
                                                                           for r in rows[:4]]


def test_several_train_datasets_are_mixed(demo):
    from clipbert_legacy.datasets.build_vqa import build_vqa_datasets
    cfg = parse_args("vqa", ["--config", str(demo["cfg"])])
    entry = cfg.train_datasets[0]
    cfg.train_datasets = [dict(entry, name="a"), dict(entry, name="b", ratio=2)]
    ds, _ = build_vqa_datasets(cfg, "train")
    assert (ds.names, ds.sizes, ds.ratios) == (["a", "b"], [16, 16], [1.0, 2.0])  # 16 groups each


def test_shipped_configs_parse(tmp_path):
    a2l = tmp_path / "a2l.json"
    a2l.write_text(json.dumps({"yes": 0, "no": 1, "2": 2}))
    cfg = parse_args("vqa", ["--config", str(REPO / "configs/vqa_base_resnet50.json"), "--ans2label_path",
                             str(a2l)])
    assert (cfg.num_labels, cfg.loss_type, cfg.max_n_example_per_group) == (3, "bce", 2)
    assert cfg.learning_rate == 1e-4
    assert cfg.train_datasets[0].txt == ["/txt/vqa/vqa_k_trainval.jsonl", "/txt/vqa/vg_k_trainval.jsonl"]
    demo_cfg = parse_args("vqa", ["--config", str(REPO / "configs/demo_vqa.json"),
                                  "--ans2label_path", str(a2l)])
    assert demo_cfg.train_datasets[0].vis_format == "image"
    from clipbert_legacy.config import ConfigError
    with pytest.raises(ConfigError, match="vis_format='video': VQA reads images"):
        bad = json.load(open(REPO / "configs/demo_vqa.json"))
        bad["train_datasets"][0]["vis_format"] = "video"
        (tmp_path / "bad.json").write_text(json.dumps(bad))
        parse_args("vqa", ["--config", str(tmp_path / "bad.json"), "--ans2label_path", str(a2l)])


@pytest.mark.multiprocess
@requires_horovod
def test_horovodrun_two_processes_agree(demo):
    cfg = _load(demo["cfg"])
    cfg["output_dir"] = str(demo["root"] / "run_hvd")
    path = demo["root"] / "vqa_hvd.json"
    path.write_text(json.dumps(cfg))
    out = demo["root"] / "hvd_ranks"
    check(run_horovod([REPO / "tests/workers/vqa_train.py", path, out], np=2, timeout=150))
    r0, r1 = _load(out / "rank0.json"), _load(out / "rank1.json")
    assert r0["size"] == r1["size"] == 2
    assert r0["summary"]["global_step"] == 2  # ceil(16 groups / (2 x 4))
    assert r0["weights"] == r1["weights"]  # one model after the allreduced steps
    assert r0["summary"]["last_metrics"] == r1["summary"]["last_metrics"]  # gathered over both ranks
    assert 0 <= r0["summary"]["last_metrics"]["overall_acc"] <= 100
    assert _load(Path(cfg["output_dir"]) / "log" / "args.json")["n_gpu"] == 2


def test_inference_with_a_corrupt_image_skips_it_and_says_so(demo, tmp_path):
    """An undecodable image at evaluation (skip_bad_videos 1): its questions are left out, named in
    skipped_images.json with the reason, and the accuracy is over the rest, with its denominators."""
    import shutil

    import lmdb
    cfg = parse_args("vqa", ["--config", str(demo["cfg"]), "--output_dir", str(tmp_path / "run"),
                             "--num_train_epochs", "1"])
    Trainer(cfg, VQATask()).train()
    db = tmp_path / "img_db"
    shutil.copytree(demo["data"] / "vqa_img_db", db)
    txt = demo["data"] / "txt/vqa_val.jsonl"
    rows = [json.loads(x) for x in open(txt)]
    broken = str(rows[0]["image_id"])
    env = lmdb.open(str(db), map_size=1 << 28)
    with env.begin(write=True) as txn:
        assert txn.get(broken.encode()) is not None
        txn.put(broken.encode(), b"\x89PNG truncated")
    env.close()
    assert main("vqa", VQATask, ["--do_inference", "1", "--output_dir", str(tmp_path / "run"),
                                 "--inference_txt_db", str(txt), "--inference_img_db", str(db),
                                 "--n_workers", "0"]) == 0
    rdir = next((tmp_path / "run" / "results_vqa_val").iterdir())
    skipped = _load(rdir / "skipped_images.json")
    n_broken = sum(str(r["image_id"]) == broken for r in rows)
    assert skipped["count"] == 1 and skipped["keys"] == [{"key": broken, "reason": "decode_failed"}]
    assert skipped["evaluated"] == {"questions": len(rows) - n_broken, "questions_total": len(rows),
                                    "skipped_images": 1}
    results = _load(rdir / "results_all.json")
    assert len(results) == len(rows) - n_broken
    assert {r["question_id"] for r in results} == {r["question_id"] for r in rows
                                                   if str(r["image_id"]) != broken}
    assert _load(rdir / "scores.json")["n_questions"] == len(rows) - n_broken
