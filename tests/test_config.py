"""Config system: precedence, typing, one-line errors for every bad case, derived keys, docs table."""
import json
import logging

import pytest

from clipbert_legacy.config import (
    Config,
    ConfigError,
    Option,
    apply_stored_model_config,
    config_reference_markdown,
    parse_args,
    parse_args_or_exit,
    register_task,
    task_options,
)


def write(tmp_path, d, name="c.json"):
    p = tmp_path / name
    p.write_text(json.dumps(d) if not isinstance(d, str) else d)
    return str(p)


DS = [{"name": "msrvtt", "txt": "/txt/train.jsonl", "img": "/img/msrvtt"}]


def test_defaults_and_types():
    cfg = parse_args("retrieval", [])
    assert cfg.learning_rate == 5e-5 and cfg.betas == [0.9, 0.98] and cfg.fp16 is False
    assert cfg.num_labels == 2 and cfg.task_type == "retrieval" and cfg.cnn_lr_mul_prefix == "grid_encoder"
    assert "config" not in cfg


def test_precedence_cli_over_json_over_default(tmp_path):
    p = write(tmp_path, {"learning_rate": 1e-4, "fps": 2, "train_datasets": DS, "betas": [0.8, 0.9]})
    cfg = parse_args("retrieval", ["--config", p, "--fps", "3"])
    assert cfg.fps == 3 and cfg.learning_rate == 1e-4 and cfg.num_frm == 3
    assert cfg.train_datasets[0].txt == "/txt/train.jsonl"  # nested attribute access
    assert isinstance(cfg.train_datasets[0], Config)
    assert "config" not in cfg.to_dict() and json.dumps(cfg.to_dict())


def test_abbreviated_flag_beats_json(tmp_path):
    p = write(tmp_path, {"learning_rate": 1e-4})
    assert parse_args("retrieval", ["--config", p, "--learning", "3e-5"]).learning_rate == 3e-5
    assert parse_args("retrieval", ["--learning_rate=2e-5", "--config", p]).learning_rate == 2e-5


def test_list_options_are_typed():
    cfg = parse_args("retrieval", ["--betas", "0.9", "0.999", "--step_decay_epochs", "3", "1",
                                   "--img_pixel_mean", "1", "2", "3"])
    assert cfg.betas == [0.9, 0.999] and all(isinstance(b, float) for b in cfg.betas)
    assert cfg.step_decay_epochs == [3, 1] and cfg.img_pixel_mean == [1.0, 2.0, 3.0]


def test_bool_options_cast():
    cfg = parse_args("retrieval", ["--fp16", "1", "--pin_mem", "0"])
    assert cfg.fp16 is True and cfg.pin_mem is False


BAD_JSON = [
    ({"learnig_rate": 1e-4}, "unknown option 'learnig_rate' in", "did you mean 'learning_rate'"),
    ({"score_agg_func": "bogus"}, "score_agg_func='bogus' (c.json)", "one of mean|max|lse"),
    ({"train_batch_size": "16"}, "train_batch_size='16'", "expected int >= 1"),
    ({"train_batch_size": 0}, "train_batch_size=0", "expected int >= 1"),
    ({"learning_rate": True}, "learning_rate=true", "expected float"),
    ({"betas": [0.9]}, "betas=[0.9]", "exactly 2 values"),
    ({"betas": [0.9, "x"]}, "betas=[0.9, \"x\"]", "2 x float"),
    ({"fp16": 2}, "fp16=2", "0|1"),
    ({"decay": "cosin"}, "decay='cosin'", "linear|invsqrt|constant|multi_step|cosine"),
    ({"data_ratio": 0}, "data_ratio=0", "> 0"),
    ({"train_datasets": [{"name": "a", "img": "b"}]}, "train_datasets[0]", "missing required key 'txt'"),
    ({"train_datasets": [{"name": "a", "txt": "t", "img": "b", "imgg": 1}]}, "unknown key 'imgg'",
     "did you mean 'img'"),
    ({"train_datasets": {"name": "a"}}, "train_datasets=", "non-empty list"),
    ({"val_datasets": [{"name": "a", "txt": 3, "img": "b"}]}, "val_datasets[0].txt=3", "string"),
    ({"loss_type": "rank", "score_agg_func": "lse"}, "score_agg_func='lse' requires loss_type='ce'", ""),
    ({"fp16": 1, "bf16": 1}, "fp16=1 and bf16=1 are exclusive", ""),
    ({"decay": "multi_step"}, "decay='multi_step' needs step_decay_epochs", ""),
    ({"grad_norm": 0}, "grad_norm=0", "-1 to disable"),
    ({"early_stop_patience": 0}, "early_stop_patience=0", ">= 1"),
    ({"dist_backend": "mpi"}, "dist_backend='mpi'", "auto|horovod|torch"),
]


@pytest.mark.parametrize("bad,part1,part2", BAD_JSON)
def test_bad_json_values_one_line_error(tmp_path, bad, part1, part2):
    p = write(tmp_path, bad)
    with pytest.raises(ConfigError) as e:
        parse_args("retrieval", ["--config", p])
    msg = str(e.value)
    assert "\n" not in msg and part1 in msg and part2 in msg, msg


BAD_CLI = [
    (["--score_agg_func", "bogus"], "score_agg_func=bogus (command line)", "one of mean|max|lse"),
    (["--learnig_rate", "1"], "unknown option '--learnig_rate'", "did you mean 'learning_rate'"),
    (["--train_datasets", "x"], "'--train_datasets'", "only be set in the --config JSON"),
    (["--betas", "0.9"], "--betas", "expected 2 arguments"),
    (["--fps", "two"], "fps=two (command line)", "expected int"),
    (["--cnn_lr", "1e-4"], "ambiguous option: --cnn_lr could match", "--cnn_lr_mul"),
    (["--config", "/nonexistent.json"], "'/nonexistent.json': file not found", ""),
]


@pytest.mark.parametrize("argv,part1,part2", BAD_CLI)
def test_bad_cli_values_one_line_error(argv, part1, part2):
    with pytest.raises(ConfigError) as e:
        parse_args("retrieval", argv)
    msg = str(e.value)
    assert "\n" not in msg and part1 in msg and part2 in msg, msg


def test_invalid_json_file(tmp_path):
    p = write(tmp_path, '{"fps": 2,}')
    with pytest.raises(ConfigError, match=r"invalid JSON at line 1 column \d+"):
        parse_args("retrieval", ["--config", p])
    with pytest.raises(ConfigError, match="expected a JSON object"):
        parse_args("retrieval", ["--config", write(tmp_path, "[1]", "l.json")])


def test_cli_entry_prints_one_line_and_exits_2(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args_or_exit("retrieval", ["--optim", "sgd"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == "config error: optim=sgd (command line) is invalid: expected one of adamw|adam|adamax"


def test_unused_options_accepted_with_notice(tmp_path, caplog):
    p = write(tmp_path, {"dropout": 0.2, "cnn_optim": "sgd", "use_itm": 1})
    with caplog.at_level(logging.WARNING, logger="clipbert_legacy.config"):
        cfg = parse_args("retrieval", ["--config", p])
    assert cfg.dropout == 0.2
    notes = [r.getMessage() for r in caplog.records]
    assert any("'dropout'" in n and "no effect" in n for n in notes)
    assert any("'use_itm'" in n and "pretraining" in n for n in notes)
    assert len(notes) == 3


def test_retrieval_num_labels_derived(caplog):
    assert parse_args("retrieval", ["--loss_type", "rank"]).num_labels == 1
    with caplog.at_level(logging.WARNING, logger="clipbert_legacy.config"):
        assert parse_args("retrieval", ["--num_labels", "7"]).num_labels == 2
    assert any("derived" in r.getMessage() for r in caplog.records)


def test_detectron2_weights_alias():
    assert parse_args("retrieval", ["--detectron2_weights_path", "/p/w.pth"]).cnn_weights_path == "/p/w.pth"


def test_video_qa_rules(tmp_path):
    with pytest.raises(ConfigError, match="task=null is invalid"):
        parse_args("video_qa", [])
    cfg = parse_args("video_qa", ["--task", "action", "--max_n_example_per_group", "3"])
    assert cfg.num_labels == 5 and cfg.max_n_example_per_group == 1 and cfg.task_type == "qa_mc"
    with pytest.raises(ConfigError, match="ans2label_path=null is invalid for task='frameqa'"):
        parse_args("video_qa", ["--task", "frameqa"])
    with pytest.raises(ConfigError, match="file not found"):
        parse_args("video_qa", ["--task", "frameqa", "--ans2label_path", str(tmp_path / "no.json")])
    a2l = write(tmp_path, {"dog": 0, "cat": 1, "red": 2}, "a2l.json")
    cfg = parse_args("video_qa", ["--task", "frameqa", "--ans2label_path", a2l])
    assert cfg.num_labels == 3 and cfg.task_type == "qa_open" and cfg.loss_type == "ce"
    with pytest.raises(ConfigError, match="labels must be 0..1 without gaps"):
        parse_args("video_qa", ["--task", "msrvtt_qa", "--ans2label_path",
                                write(tmp_path, {"a": 0, "b": 5}, "gap.json")])
    p = write(tmp_path, {"task": "frameqa", "ans2label_path": a2l,
                         "train_datasets": [{"name": "tgif", "txt": {"action": "a.jsonl"}, "img": "i"}]})
    with pytest.raises(ConfigError, match="train_datasets\\[0\\].txt has no entry for task 'frameqa'"):
        parse_args("video_qa", ["--config", p])
    with pytest.raises(ConfigError, match="one of action|transition|frameqa|msrvtt_qa"):
        parse_args("video_qa", ["--task", "count"])


def test_msrvtt_mc_requires_inference():
    with pytest.raises(ConfigError, match="do_inference=1"):
        parse_args("msrvtt_mc", [])
    assert parse_args("msrvtt_mc", ["--do_inference", "1"]).num_labels == 2


@pytest.fixture
def isolated_registry(monkeypatch):
    """Tasks registered by a test are gone afterwards (the config reference lists every registered task)."""
    import clipbert_legacy.config.tasks as registry
    monkeypatch.setattr(registry, "_SPECS", dict(registry._SPECS))


def test_register_task_adds_options(isolated_registry):
    def post(cfg, _notices):
        cfg.derived_k = cfg.my_k * 2
    register_task("_test_task", [Option("my_k", int, 3, "k", min=1)], post, parent="retrieval")
    cfg = parse_args("_test_task", ["--my_k", "4"])
    assert cfg.derived_k == 8 and cfg.margin == 0.2
    with pytest.raises(ConfigError, match="my_k=0"):
        parse_args("_test_task", ["--my_k", "0"])


def test_inference_merge_keeps_cli_settings():
    cfg = parse_args("retrieval", ["--score_agg_func", "max", "--fps", "4"])
    stored = {"score_agg_func": "lse", "fps": 2, "max_txt_len": 50, "loss_type": "ce", "output_dir": "/old"}
    apply_stored_model_config(cfg, stored)
    assert cfg.score_agg_func == "max" and cfg.fps == 4 and cfg.max_txt_len == 50 and cfg.output_dir is None


def test_reference_markdown_lists_every_option():
    md = config_reference_markdown()
    names = set(task_options("retrieval")) | set(task_options("video_qa"))
    for n in names:
        assert f"| `{n}` |" in md
    header_cols = md.splitlines()[0].count("|")
    assert all(line.count("|") - line.count("\\|") == header_cols for line in md.splitlines())


LEGACY_RET = {  # the key set of ClipBERT's shipped msrvtt_ret_base_resnet50.json
    "train_datasets": [{"name": "msrvtt", "txt": "/txt/msrvtt_retrieval/train.jsonl", "img": "/img/msrvtt"}],
    "val_datasets": [{"name": "msrvtt_retrieval", "txt": "/txt/msrvtt_retrieval/val.jsonl",
                      "img": "/img/msrvtt"}],
    "max_txt_len": 100, "max_img_size": 448, "img_pixel_mean": [123.675, 116.28, 103.53],
    "img_pixel_std": [1.0, 1.0, 1.0], "img_input_format": "BGR", "fps": 2, "num_frm": 2, "train_n_clips": 8,
    "score_agg_func": "lse", "max_n_example_per_group": 1, "model_config": "src/configs/base_model.json",
    "detectron2_model_cfg": "src/configs/detectron2_configs/R-50-grid.yaml",
    "e2e_weights_path": "/pretrain/clipbert_image_text_pretrained.pt", "detectron2_weights_path": None,
    "bert_weights_path": None, "tokenizer_dir": "/pretrain/bert-base-uncased/",
    "output_dir": "/storage/msrvtt_ret_default", "train_batch_size": 16, "val_batch_size": 16,
    "gradient_accumulation_steps": 1, "num_train_epochs": 20, "min_valid_steps": 100, "num_valid": 100,
    "learning_rate": 5e-5, "weight_decay": 1e-3, "decay": "linear", "optim": "adamw", "betas": [0.9, 0.98],
    "dropout": 0.1, "grad_norm": 5.0, "cnn_learning_rate": 5e-5, "cnn_weight_decay": 1e-3,
    "cnn_lr_decay": "linear", "seed": 42, "fp16": 1, "loss_type": "ce", "itm_neg_size": 1}


def test_legacy_clipbert_configs_parse(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="clipbert_legacy.config"):
        cfg = parse_args("retrieval", ["--config", write(tmp_path, LEGACY_RET), "--train_batch_size", "4"])
    assert cfg.fp16 is True and cfg.train_batch_size == 4 and cfg.num_labels == 2 and cfg.grad_norm == 5.0
    assert sorted(r.getMessage().split("'")[1] for r in caplog.records) == ["detectron2_model_cfg", "dropout"]
    a2l = write(tmp_path, {"yes": 0, "no": 1}, "a2l.json")
    qa = {k: v for k, v in LEGACY_RET.items() if k not in ("loss_type", "itm_neg_size")}
    qa.update(task="frameqa", ans2label_path=a2l, classifier="mlp", cls_hidden_scale=2,
              train_datasets=[{"name": "tgif_qa", "img": "/img/tgif",
                               "txt": {"action": "/txt/a.jsonl", "frameqa": "/txt/f.jsonl"}}])
    cfg = parse_args("video_qa", ["--config", write(tmp_path, qa, "qa.json")])
    assert cfg.num_labels == 2 and cfg.train_datasets[0].txt.frameqa == "/txt/f.jsonl"


def test_env_overrides_are_appended_last(monkeypatch, tmp_path):
    import json as _json

    from clipbert_legacy.config import parse_args
    cfg_file = tmp_path / "c.json"
    cfg_file.write_text(_json.dumps({"learning_rate": 1e-3, "num_train_epochs": 7}))
    monkeypatch.setenv("CLIPBERT_OVERRIDES", "--num_train_epochs 1 --data_ratio 0.5")
    cfg = parse_args("retrieval", ["--config", str(cfg_file), "--num_train_epochs", "3"])
    assert cfg.num_train_epochs == 1 and cfg.data_ratio == 0.5 and cfg.learning_rate == 1e-3
    monkeypatch.setenv("CLIPBERT_OVERRIDES", "--data_ratio 2")
    import pytest as _pytest

    from clipbert_legacy.config import ConfigError
    with _pytest.raises(ConfigError, match="data_ratio"):
        parse_args("retrieval", [])


# the hand-written lists these sets replaced (issue 31): generation must not change their meaning
FORMER_MODEL_KEYS = {"model_config", "tokenizer_dir", "max_txt_len", "max_img_size", "img_pixel_mean",
                     "img_pixel_std", "img_input_format", "cnn_type", "num_labels", "loss_type", "classifier",
                     "cls_hidden_scale", "task", "task_type", "ans2label_path", "freeze_cnn", "grad_ckpt"}
FORMER_RUNTIME_KEYS = {
    "output_dir", "existing_run", "n_workers", "pin_mem", "log_interval", "dist_backend",
    "do_inference", "inference_model_step", "inference_txt_db", "inference_img_db", "inference_batch_size",
    "inference_n_clips", "val_batch_size", "eval_retrieval_batch_size", "skip_bad_videos",
    "keep_last_k", "keep_top_k", "path_prefix", "cpu_sched_batch", "elastic_commit_steps",
    "row_sparse_allreduce", "profile_steps", "wandb_project", "wandb_entity", "wandb_run_name", "wandb_tags",
    "wandb_mode", "zero_stage",  # zero_stage: added with issue 32 (the restore file is unsharded)
    "allow_unmatched_weights",  # issue 38: whether a poorly matching weights file may start the run
    "max_eval_examples"}  # issue 46: how much of the split validation reads, not what is trained


def test_generated_key_sets_match_the_former_hand_lists():
    import clipbert_legacy.config as config
    from clipbert_legacy.training.run_dir import setting_differences
    keys = config.model_keys()
    assert set(keys) == FORMER_MODEL_KEYS and len(keys) == len(FORMER_MODEL_KEYS)
    assert config.runtime_keys() == FORMER_RUNTIME_KEYS
    # the keys the hand list once lacked: a rerun with --cpu_sched_batch 0 is no changed training setting
    stored = {"cpu_sched_batch": True, "row_sparse_allreduce": 0, "learning_rate": 1e-4}
    assert setting_differences(stored, {**stored, "cpu_sched_batch": False, "row_sparse_allreduce": 1}) == {}
    assert setting_differences(stored, {**stored, "learning_rate": 2e-4}) == {"learning_rate": (1e-4, 2e-4)}


def test_flags_agree_for_a_name_several_tasks_define():
    """num_labels, loss_type, ... are defined per task: a flag on one definition only would make the
    generated sets depend on which tasks are registered."""
    from clipbert_legacy.config.tasks import all_options
    flags = {}
    for o in all_options():
        flags.setdefault(o.name, set()).add((o.model, o.runtime))
    assert {n: f for n, f in flags.items() if len(f) > 1} == {}
    model = {n for n, f in flags.items() if (True, False) in f}
    assert model >= {"num_labels", "loss_type", "ans2label_path"}


def test_an_option_cannot_be_model_and_runtime():
    with pytest.raises(ValueError, match="'x': model=True and runtime=True"):
        Option("x", int, 1, "x", model=True, runtime=True)


def test_registered_task_feeds_every_generated_list(isolated_registry):
    import clipbert_legacy.config as config
    from clipbert_legacy.training.run_dir import setting_differences
    register_task("_captioning", [Option("beam_size", int, 3, "beams at inference", min=1, runtime=True),
                                  Option("vocab_path", str, None, "caption vocabulary", model=True)])
    assert "vocab_path" in config.model_keys() and "beam_size" in config.runtime_keys()
    assert "_captioning" in config.documented_tasks()
    md = config_reference_markdown()
    assert "| `beam_size` | int | `3` | >= 1 | _captioning | beams at inference |" in md
    cfg = parse_args("_captioning", ["--do_inference", "1"])
    apply_stored_model_config(cfg, {"vocab_path": "/run/vocab.json", "beam_size": 9})
    assert cfg.vocab_path == "/run/vocab.json" and cfg.beam_size == 3
    assert setting_differences({"beam_size": 3}, {"beam_size": 5}) == {}


def test_register_task_needs_a_known_parent(isolated_registry):
    with pytest.raises(ConfigError, match="task '_x': parent '_nope' is not registered"):
        register_task("_x", [], parent="_nope")


def test_ans2label_is_read_once_per_file_version(tmp_path, monkeypatch):
    """Config check, dataset builds and every validation share one read of ans2label_path."""
    import clipbert_legacy.config.options as options
    path = write(tmp_path, {"yes": 0, "no": 1}, "a2l.json")
    reads = []
    real_load = options.json.load
    monkeypatch.setattr(options.json, "load", lambda f: reads.append(f.name) or real_load(f))
    first = options.load_ans2label(path)
    first["maybe"] = 2  # a caller's copy: the cached content stays as read
    assert options.load_ans2label(path) == {"yes": 0, "no": 1} and len(reads) == 1
    parse_args("video_qa", ["--task", "frameqa", "--ans2label_path", path])
    assert len(reads) == 1
    write(tmp_path, {"yes": 0, "no": 1, "blue": 2}, "a2l.json")  # a new version is read again
    assert options.load_ans2label(path) == {"yes": 0, "no": 1, "blue": 2} and len(reads) == 2
