"""Image-text pretraining (src/tasks/run_pretrain.py): MLM masking and ITM negatives by ClipBERT's
rules, training + validation on the demo stills, two datasets mixed by ratio, fine-tuning a video task
from the checkpoint, and a 2-process run."""
import json
from pathlib import Path

import pytest
import torch

from clipbert_legacy.config import parse_args
from clipbert_legacy.datasets.build import load_tokenizer
from clipbert_legacy.datasets.dataset_pretrain import PretrainDataset, mask_tokens
from clipbert_legacy.modeling.build import build_model
from clipbert_legacy.preprocessing.make_demo_stills import build_demo_stills
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.tasks.run_pretrain import PretrainTask
from clipbert_legacy.utils.pretrained_paths import default_minilm_dir
from tests.conftest import requires_horovod
from tests.mp_utils import check, run_horovod

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_minilm_dir())


def test_mlm_masking_follows_berts_rule(tokenizer):
    texts = [f"a red circle and a blue square number {i} moves to the left quickly" for i in range(400)]
    enc = tokenizer(texts, padding="max_length", truncation=True, max_length=24, return_tensors="pt")
    ids, mask = enc["input_ids"], enc["attention_mask"]
    g = torch.Generator().manual_seed(0)
    masked, labels = mask_tokens(ids, mask, tokenizer, g)
    special = (ids == tokenizer.cls_token_id) | (ids == tokenizer.sep_token_id) | (mask == 0)
    chosen = labels != -100
    assert not (chosen & special).any()  # [CLS], [SEP] and padding are never chosen
    assert torch.equal(labels[chosen], ids[chosen]) and torch.equal(masked[~chosen], ids[~chosen])
    rate = chosen.sum().item() / (~special).sum().item()
    assert abs(rate - 0.15) < 0.01, rate
    to_mask = (masked == tokenizer.mask_token_id) & chosen
    kept = (masked == ids) & chosen
    n = chosen.sum().item()
    assert abs(to_mask.sum().item() / n - 0.8) < 0.03 and abs(kept.sum().item() / n - 0.1) < 0.03
    again, _ = mask_tokens(ids, mask, tokenizer, torch.Generator().manual_seed(0))
    assert torch.equal(again, masked)  # the generator alone decides


@pytest.fixture(scope="module")
def stills(tmp_path_factory):
    root = tmp_path_factory.mktemp("stills")
    build_demo_stills(str(root), n_train=40, n_val=8, size=48, log=lambda *a: None)
    return root


def test_itm_negatives_rate_and_other_images(stills):
    from clipbert_legacy.datasets.dataset_pretrain import mk_pretrain_examples
    from clipbert_legacy.datasets.jsonl import load_jsonl
    rows = load_jsonl(str(stills / "txt" / "stills_train.jsonl"))
    ex = mk_pretrain_examples(rows)
    groups = [(e["img_id"], [e]) for e in ex]
    ds = PretrainDataset(groups, str(stills / "stills_db"), itm_neg_prob=0.3, max_img_size=48, is_train=False)
    ds.is_train = True  # training draws: fresh negatives on every read
    labels = []
    for _ in range(10):
        for i in range(len(ds)):
            item = ds[i]
            assert item["vid"].shape == (1, 3, 48, 48)
            labels += [t["itm_label"] for t in item["examples"]]
            own = {e["txt"] for e in groups[i][1]}
            assert all(t["text_str"] in own for t in item["examples"] if t["itm_label"] == 1)
    neg = labels.count(0) / len(labels)
    assert abs(neg - 0.3) < 0.08, neg
    ds.is_train = False
    assert [ds[i]["examples"] for i in range(8)] == [ds[i]["examples"] for i in range(8)]  # evaluation: fixed


def test_split_mlm_itm_gives_each_caption_one_objective(stills, tokenizer):
    """split_mlm_itm: half the captions MLM (their own image, masked, ITM label -100), half ITM (whole
    caption, negatives at itm_neg_prob among them, no MLM labels); the model scores each on its own."""
    from clipbert_legacy.datasets.collate import tokenize
    from clipbert_legacy.datasets.dataset_pretrain import PretrainCollator, mk_pretrain_examples
    from clipbert_legacy.datasets.jsonl import load_jsonl
    ex = mk_pretrain_examples(load_jsonl(str(stills / "txt" / "stills_train.jsonl")))
    groups = [(e["img_id"], [e]) for e in ex]
    ds = PretrainDataset(groups, str(stills / "stills_db"), itm_neg_prob=0.5, split_objectives=True,
                         max_img_size=48, is_train=True)
    items = [ds[i] for _ in range(10) for i in range(len(ds))]
    texts = [t for it in items for t in it["examples"]]
    mlm = [t for t in texts if t["mlm"]]
    assert abs(len(mlm) / len(texts) - 0.5) < 0.06 and all(t["itm_label"] == -100 for t in mlm)
    itm = [t["itm_label"] for t in texts if not t["mlm"]]
    assert set(itm) == {0, 1} and abs(itm.count(0) / len(itm) - 0.5) < 0.08
    batch = PretrainCollator(tokenizer, 12).collate_items(items[:40], [])
    ids, _ = tokenize(tokenizer, [t["text_str"] for it in items[:40] for t in it["examples"]], 12)
    scored = batch["itm_labels"] != -100
    assert torch.equal(batch["text_input_ids"][scored], ids[scored])  # ITM captions are never masked
    assert (batch["mlm_labels"][scored] == -100).all() and (batch["mlm_labels"][~scored] != -100).any()
    cfg = parse_args("pretrain", ["--config", str(REPO / "configs/demo_pretrain.json"), "--model_config",
                                  str(REPO / "configs/model/tiny_model.json"), "--cnn_type", "tiny",
                                  "--bert_weights_path", "", "--cnn_weights_path", ""])
    from clipbert_legacy.modeling.pretrain import build_pretrain_model
    model = build_pretrain_model(cfg)
    out = model({**batch, "visual_inputs": batch["visual_inputs"].float()})
    assert out["itm_total"] == int(scored.sum())
    assert out["mlm_total"] == int((batch["mlm_labels"] != -100).sum())
    assert torch.isfinite(out["loss"])
    # mlm_loss_average all_positions: ClipBERT's scale, the masked tokens' summed loss / every position
    model.eval()
    b = {**batch, "visual_inputs": batch["visual_inputs"].float()}
    with torch.no_grad():
        masked = model(b)
        model.mlm_loss_average = "all_positions"
        everywhere = model(b)
    share = masked["mlm_total"] / batch["mlm_labels"].numel()
    assert 0 < share < 0.5
    torch.testing.assert_close(everywhere["mlm_loss"], masked["mlm_loss"] * share)
    torch.testing.assert_close(everywhere["itm_loss"], masked["itm_loss"])


def _cfg(stills, out, **kw):
    train = {"name": "stills", "vis_format": "image", "txt": str(stills / "txt/stills_train.jsonl"),
             "img": str(stills / "stills_db")}
    val = dict(train, txt=str(stills / "txt/stills_val.jsonl"))
    cfg = json.load(open(REPO / "configs" / "demo_pretrain.json"))
    cfg.update({"train_datasets": [train], "val_datasets": [val], "output_dir": str(out),
                "model_config": str(REPO / "configs/model/tiny_model.json"), "bert_weights_path": None,
                "cnn_weights_path": None, "cnn_type": "tiny", "max_img_size": 48, "train_batch_size": 8,
                "val_batch_size": 8, "num_train_epochs": 1, "n_workers": 0, **kw})
    path = Path(out).parent / f"{Path(out).name}.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def pretrained(stills, tmp_path_factory):
    out = tmp_path_factory.mktemp("pre") / "run"
    assert main("pretrain", PretrainTask, ["--config", str(_cfg(stills, out))]) == 0
    return out


def test_pretraining_trains_validates_and_saves(pretrained):
    rows = [json.loads(x) for x in open(pretrained / "log" / "metrics.jsonl")]
    valid = [r for r in rows if r["split"] == "valid"]
    assert valid and {"mlm_acc", "itm_acc", "loss", "stills_mlm_acc", "stills_itm_acc"} <= set(valid[-1])
    assert 0 <= valid[-1]["mlm_acc"] <= 100 and 0 <= valid[-1]["itm_acc"] <= 100
    train = [r for r in rows if r["split"] == "train"]
    assert {"mlm_loss", "itm_loss"} <= set(train[-1])
    sd = torch.load(pretrained / "ckpt" / "model_best.pt")
    assert any(k.startswith("transformer.cls.predictions.") for k in sd)
    assert "transformer.cls.seq_relationship.weight" in sd


def test_finetuning_from_the_pretraining_checkpoint_maps_keys(pretrained):
    """A retrieval model loads cnn.* and transformer.bert.* from the pretraining checkpoint; the MLM/ITM
    heads are ignored and only the task classifier is missing (reported)."""
    ckpt = pretrained / "ckpt" / "model_best.pt"
    cfg = parse_args("retrieval", ["--model_config", str(REPO / "configs/model/tiny_model.json"),
                                   "--cnn_type", "tiny", "--e2e_weights_path", str(ckpt)])
    model = build_model(cfg)
    summary = model.load_summaries["e2e"]
    assert summary.missing and all(k.startswith("transformer.classifier.") for k in summary.missing)
    assert any(k.startswith("transformer.cls.") for k in summary.ignored) and not summary.mismatched
    sd = torch.load(ckpt)
    own = model.state_dict()
    assert all(torch.equal(own[k], sd[k]) for k in own if k.startswith(("cnn.", "transformer.bert.")))


def test_two_datasets_mixed_by_ratio(stills, tmp_path):
    first = {"name": "a", "vis_format": "image", "txt": str(stills / "txt/stills_train.jsonl"),
             "img": str(stills / "stills_db"), "ratio": 1}
    second = dict(first, name="b", ratio=3)
    out = tmp_path / "mix"
    cfg = _cfg(stills, out, use_itm=0)
    raw = json.loads(cfg.read_text())
    raw["train_datasets"] = [first, second]
    cfg.write_text(json.dumps(raw))
    assert main("pretrain", PretrainTask, ["--config", str(cfg)]) == 0
    log = (out / "log" / "log.txt").read_text()
    assert "2 training datasets, each batch from one, drawn by ratio: a (" in log
    valid = [json.loads(x) for x in open(out / "log" / "metrics.jsonl") if '"valid"' in x]
    assert "itm_acc" not in valid[-1] and "mlm_acc" in valid[-1]  # use_itm 0: no ITM metrics


@pytest.mark.multiprocess
@requires_horovod
def test_pretraining_under_horovodrun(stills, tmp_path):
    out = tmp_path / "hvd"
    cfg = _cfg(stills, out)
    check(run_horovod(["src/tasks/run_pretrain.py", "--config", cfg], timeout=240))
    valid = [json.loads(x) for x in open(out / "log" / "metrics.jsonl") if '"valid"' in x]
    assert valid and 0 <= valid[-1]["itm_acc"] <= 100


def test_zero_shot_retrieval_from_the_pretraining_checkpoint(pretrained, stills, tmp_path):
    """With --classifier linear the ITM head is the retrieval classifier: a pretraining checkpoint
    (trained on images) is evaluated on video retrieval as it is (checkpoint-file inference, every key
    present)."""
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    from clipbert_legacy.tasks.run_video_retrieval import RetrievalTask
    ckpt = pretrained / "ckpt" / "model_best.pt"
    cfg = parse_args("retrieval", ["--model_config", str(REPO / "configs/model/tiny_model.json"),
                                   "--cnn_type", "tiny", "--classifier", "linear",
                                   "--e2e_weights_path", str(ckpt)])
    model = build_model(cfg)
    sd = torch.load(ckpt)
    assert torch.equal(model.state_dict()["transformer.classifier.weight"],
                       sd["transformer.cls.seq_relationship.weight"])
    assert not model.load_summaries["e2e"].missing
    data = tmp_path / "videos"
    build_demo_data(str(data), n_train=4, n_val=8, n_test=4, img_size=48, n_frames=12, fps=10,
                    num_workers=1, log=lambda *a: None)
    conf = json.loads(_cfg(stills, tmp_path / "unused").read_text())
    conf.update(classifier="linear", fps=2, num_frm=2, inference_n_clips=1, max_txt_len=12)
    for k in ("use_mlm", "use_itm", "itm_neg_prob", "pixel_random_sampling_size"):
        conf.pop(k)
    path = tmp_path / "ret_cfg.json"
    path.write_text(json.dumps(conf))
    argv = ["--config", str(path), "--do_inference", "1", "--e2e_weights_path", str(ckpt),
            "--output_dir", str(tmp_path / "zs"), "--inference_txt_db", str(data / "txt/retrieval_val.jsonl"),
            "--inference_img_db", str(data / "vis_db")]
    assert main("retrieval", RetrievalTask, argv) == 0
    (scores,) = (tmp_path / "zs").glob("results_retrieval_val/model_best_1_mean/scores.json")
    t2v = json.loads(scores.read_text())["text2video"]
    assert 0 <= t2v["r1"] <= 100 and 1 <= t2v["medianR"] <= 8
