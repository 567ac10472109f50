"""--path_prefix / $CLIPBERT_PATH_PREFIX: ClipBERT's container paths (/txt, /img, /pretrain, /storage)
mapped to the user's folders, in the JSON config and on the command line, nothing else touched."""
import json

import pytest

from clipbert_legacy.config import ConfigError, parse_args
from clipbert_legacy.config.path_roots import PREFIX_ENV, map_path, map_paths, parse_prefix


def test_map_path_only_touches_the_four_roots():
    roots = parse_prefix("/scratch/me")
    assert map_path("/txt/msrvtt_qa/train.jsonl", roots) == "/scratch/me/txt/msrvtt_qa/train.jsonl"
    assert map_path("/img/anet/", roots) == "/scratch/me/img/anet/"
    assert map_path("/storage", roots) == "/scratch/me/storage"
    for other in ("/txtdb/a.jsonl", "/data/txt/a.jsonl", "txt/a.jsonl", "configs/model/base_model.json"):
        assert map_path(other, roots) == other
    nested = {"txt": {"frameqa": "/txt/a.jsonl"}, "img": "/img/t", "list": ["/pretrain/x.pt", 3]}
    assert map_paths(nested, roots) == {"txt": {"frameqa": "/scratch/me/txt/a.jsonl"},
                                        "img": "/scratch/me/img/t", "list": ["/scratch/me/pretrain/x.pt", 3]}


def test_a_prefix_under_a_root_is_not_mapped_itself():
    """``--path_prefix /storage/me`` (a cluster folder) is that folder, not /storage/me/storage/me."""
    cfg = parse_args("retrieval", ["--config", "configs/msrvtt_ret_base_resnet50.json", "--path_prefix",
                                   "/storage/me"])
    assert cfg.path_prefix == "/storage/me" and cfg.output_dir == "/storage/me/storage/msrvtt_ret_default"
    assert cfg.train_datasets[0].txt == "/storage/me/txt/msrvtt_retrieval/train.jsonl"
    assert map_paths("/storage/me", parse_prefix("/x"), key="path_prefix") == "/storage/me"


def test_root_by_root_and_bad_specs():
    roots = parse_prefix("txt=/data/txt_db, img=/fast/vis_db")
    assert roots == {"txt": "/data/txt_db", "img": "/fast/vis_db"}
    assert map_path("/txt/a.jsonl", roots) == "/data/txt_db/a.jsonl"
    assert map_path("/storage/run", roots) == "/storage/run"  # not named: unchanged
    for bad in ("txt=/a,videos=/b", "txt=", "txt=/a,/b"):
        with pytest.raises(ConfigError, match="path_prefix=.* is invalid: expected a folder, or root=folder"):
            parse_prefix(bad)


def test_shipped_config_redirected_by_flag_and_env(tmp_path, monkeypatch):
    cfg_path = "configs/tgif_qa_frameqa_base_resnet50.json"
    a2l = tmp_path / "txt" / "tgif_qa" / "frameqa_trainval_ans2label.json"
    a2l.parent.mkdir(parents=True)
    a2l.write_text(json.dumps({"cat": 0, "dog": 1}))
    cfg = parse_args("video_qa", ["--config", cfg_path, "--path_prefix", str(tmp_path)])
    assert cfg.ans2label_path == str(a2l) and cfg.num_labels == 2  # read through the prefix
    assert cfg.train_datasets[0].txt["frameqa"] == f"{tmp_path}/txt/tgif_qa/frameqa_train.jsonl"
    assert cfg.train_datasets[0].img == f"{tmp_path}/img/tgif"
    assert cfg.output_dir == f"{tmp_path}/storage/tgif_qa_frameqa_default"
    assert cfg.e2e_weights_path == f"{tmp_path}/pretrain/clipbert_image_text_pretrained.pt"
    assert cfg.model_config == "configs/model/base_model.json" and cfg.path_prefix == str(tmp_path)
    # command-line paths too; the environment variable when no flag is given; the flag wins over it
    monkeypatch.setenv(PREFIX_ENV, str(tmp_path))
    cfg = parse_args("video_qa", ["--config", cfg_path, "--output_dir", "/storage/mine"])
    assert cfg.output_dir == f"{tmp_path}/storage/mine" and cfg.path_prefix == str(tmp_path)
    with pytest.raises(ConfigError, match="ans2label_path=.*/elsewhere/txt/tgif_qa/.*file not found"):
        parse_args("video_qa", ["--config", cfg_path, "--path_prefix", str(tmp_path / "elsewhere")])
    monkeypatch.delenv(PREFIX_ENV)
    with pytest.raises(ConfigError, match="ans2label_path='/txt/tgif_qa/frameqa_trainval_ans2label.json'"):
        parse_args("video_qa", ["--config", cfg_path])  # no prefix: ClipBERT's container paths
