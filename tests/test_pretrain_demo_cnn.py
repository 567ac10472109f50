"""The demo CNN pretraining (src/clipbert_legacy/preprocessing/pretrain_demo_cnn.py): it learns the
attributes, its file is a detectron2-style backbone checkpoint that the demo configs load key for key, it is
deterministic, and bad input fails with one line naming the file and the fix."""
import json
import os
from pathlib import Path

import pytest
import torch

from clipbert_legacy.config import parse_args
from clipbert_legacy.modeling.build import build_model
from clipbert_legacy.preprocessing import pretrain_demo_cnn as pdc
from clipbert_legacy.preprocessing.make_demo_data import build_demo_data

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("pre") / "demo")
    build_demo_data(out, n_train=40, n_val=10, n_test=4, img_size=64, n_frames=12, fps=10, num_workers=1,
                    log=lambda *a: None)
    return out


@pytest.fixture(scope="module")
def pretrained(data):
    torch.set_num_threads(1)
    # 64-pixel frames (the videos are 64 pixels): the same fit as at 128, in 10 s of CPU instead of 34
    stats = pdc.pretrain_demo_cnn(data, steps=150, batch_size=16, max_img_size=64, log=lambda *a: None)
    return stats, os.path.join(data, pdc.WEIGHTS_NAME)


def test_decode_split_shapes_and_labels(data):
    frames, labels = pdc.decode_split(data, "val", num_frm=3, fps=1, max_img_size=128)
    assert frames.dtype == torch.uint8 and frames.shape == (10, 3, 3, 128, 128)
    rows = [json.loads(x) for x in open(os.path.join(data, "txt", "attributes_val.jsonl"))]
    for name, values in pdc.ATTRIBUTES.items():
        assert [values[i] for i in labels[name].tolist()] == [r[name] for r in rows]


def test_learns_the_training_attributes(pretrained):
    """40 videos, 150 steps of 64-pixel frames: the probe fits colour and motion (chance 16.7% / 20%)."""
    stats, path = pretrained
    assert stats["train_acc"]["color"] >= 95 and stats["train_acc"]["motion"] >= 90
    assert stats["chance_acc"] == {"color": 16.67, "shape": 33.33, "motion": 20.0}
    assert json.load(open(os.path.splitext(path)[0] + ".json"))["val_acc"] == stats["val_acc"]


def test_checkpoint_loads_into_the_demo_model(pretrained, data):
    _, path = pretrained
    saved = torch.load(path, weights_only=True)
    assert set(saved) == {"model", "meta"} and saved["meta"]["cnn_type"] == "tiny"
    assert saved["model"] and all(k.startswith("backbone.") for k in saved["model"])  # detectron2 names
    cfg = parse_args("video_qa", ["--config", str(REPO / "configs" / "demo_qa_action.json"),
                                  "--cnn_weights_path", path, "--bert_weights_path", "",
                                  "--model_config", str(REPO / "configs/model/tiny_model.json")])
    model = build_model(cfg)
    summary = model.load_summaries["cnn"]
    assert len(summary.loaded) == len(saved["model"]) and not summary.unexpected and not summary.mismatched
    assert sorted(summary.missing) == ["grid_encoder.0.weight"]  # the task model's grid encoder starts fresh
    state = model.cnn.state_dict()
    for k, v in saved["model"].items():
        assert torch.equal(state["feature." + k], v), k


def test_deterministic(data, tmp_path):
    a, b = str(tmp_path / "a.pth"), str(tmp_path / "b.pth")
    for out in (a, b):
        pdc.pretrain_demo_cnn(data, out, steps=3, batch_size=4, log=lambda *x: None)
    sa, sb = torch.load(a, weights_only=True)["model"], torch.load(b, weights_only=True)["model"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_missing_labels_and_missing_weights_are_one_line_errors(data, tmp_path, capsys):
    empty = tmp_path / "old_demo"
    (empty / "txt").mkdir(parents=True)
    assert pdc.main(["--data_dir", str(empty), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "attributes_train.jsonl" in err and "make_demo_data" in err
    missing = str(tmp_path / "nowhere" / pdc.WEIGHTS_NAME)
    cfg = parse_args("video_qa", ["--config", str(REPO / "configs" / "demo_qa_action.json"),
                                  "--cnn_weights_path", missing, "--bert_weights_path", "",
                                  "--model_config", str(REPO / "configs/model/tiny_model.json")])
    with pytest.raises(FileNotFoundError, match="pretrain_demo_cnn --data_dir .*nowhere"):
        build_model(cfg)
