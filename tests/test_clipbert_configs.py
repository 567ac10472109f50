"""ClipBERT's configs, value for value: every config in ClipBERT's ``src/configs/`` has a counterpart in
``configs/`` that sets the same value for every key ClipBERT sets, and spells out other keys only with
ClipBERT's default. ClipBERT's files are kept verbatim in ``tests/data/clipbert_configs/`` (its
``config.py``, the source of its defaults, as ``config.py.txt``), so drift on either side fails here.

Translations (paths into ClipBERT's source tree become ours): ``model_config``
``src/configs/base_model.json`` -> ``configs/model/base_model.json``; ``detectron2_model_cfg``
``src/configs/detectron2_configs/R-50-grid.yaml`` (the grid-feature ResNet-50) -> ``cnn_type: resnet50``
(no detectron2 here; the key would only log "has no effect").
"""
import ast
import hashlib
import json
from pathlib import Path

import pytest

from clipbert_legacy.config import parse_args, task_options

REPO = Path(__file__).resolve().parents[1]
CLIPBERT = REPO / "tests" / "data" / "clipbert_configs"

# git blob ids of src/configs/* in jayleicn/ClipBERT at a118b02bbe734a71bd6309e0ec6f5e155c373e20
CLIPBERT_BLOBS = {
    "anet_ret_base_resnet50.json": "2bf34c8db5a3e0ee1dbd11a81d8ac9d797216b8c",
    "base_model.json": "7e9adf1576b25f6d1b2bd1763022af1b16b892e0",
    "config.py.txt": "8b6d8f5bbd8c729682c1ea261dc108212eb80383",  # src/configs/config.py
    "didemo_ret_base_resnet50.json": "c5da5a2aa678f2c14c6bce3899cc363d3ba18cfc",
    "msrvtt_qa_base_resnet50.json": "c8b7c8d5a50653036393f367e4e7d9af87505cd1",
    "msrvtt_ret_base_resnet50.json": "1addd12676864cb25e8fa634e382e79d85e00e03",
    "pretrain_image_text_base_resnet50_mlm_itm.json": "c078ec514e333a6c8ff6275b135d4fde0c0f6442",
    "tgif_qa_action_base_resnet50.json": "dccae96c77fb5f817f08927c7bb3790ef27fbd27",
    "tgif_qa_frameqa_base_resnet50.json": "43a56e89cb658cf08d5144b555f16e55fd97cc0d",
    "tgif_qa_transition_base_resnet50.json": "beab7add1d472b0dd85f1ffec0cf579730217bec",
    "vqa_base_resnet50.json": "da7719f69388a9213a37ab2e970e88f1beb33c62",
}

# ClipBERT config -> (our task, ClipBERT's SharedConfigs method that parses it)
COUNTERPARTS = {
    "msrvtt_ret_base_resnet50.json": ("retrieval", "get_video_retrieval_args"),
    "didemo_ret_base_resnet50.json": ("retrieval", "get_video_retrieval_args"),
    "anet_ret_base_resnet50.json": ("retrieval", "get_video_retrieval_args"),
    "msrvtt_qa_base_resnet50.json": ("video_qa", "get_video_qa_args"),
    "tgif_qa_action_base_resnet50.json": ("video_qa", "get_video_qa_args"),
    "tgif_qa_transition_base_resnet50.json": ("video_qa", "get_video_qa_args"),
    "tgif_qa_frameqa_base_resnet50.json": ("video_qa", "get_video_qa_args"),
    "vqa_base_resnet50.json": ("vqa", "get_vqa_args"),
    "pretrain_image_text_base_resnet50_mlm_itm.json": ("pretrain", "get_pretraining_args"),
}
MISSING: dict = {}  # every ClipBERT config has a counterpart (a new one would have to be added here)

MODEL_CONFIG = {"src/configs/base_model.json": "configs/model/base_model.json"}
DETECTRON2_CFG = {"src/configs/detectron2_configs/R-50-grid.yaml": "resnet50"}  # -> cnn_type
ZERO_ONE = ("fp16", "pin_mem", "use_itm", "use_mlm", "debug", "freeze_cnn", "do_inference")


def _load(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


def _clipbert_defaults() -> dict[str, dict]:
    """{SharedConfigs method: {option: default}} read from ClipBERT's config.py (``__init__`` = shared)."""
    tree = ast.parse((CLIPBERT / "config.py.txt").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SharedConfigs")
    out = {}
    for fn in cls.body:
        if not isinstance(fn, ast.FunctionDef):
            continue
        opts = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                opts[node.args[0].value.lstrip("-")] = None if default is None else ast.literal_eval(default)
        out[fn.name] = opts
    return out


DEFAULTS = _clipbert_defaults()


def clipbert_effective(name: str, method: str) -> dict:
    """Every option ClipBERT's parser gives this config: the file's value, else the default; with the
    post-parse rules that touch options (0/1 -> bool; video QA forces one example per group)."""
    cfg = {**DEFAULTS["__init__"], **DEFAULTS[method]}
    del cfg["config"]
    cfg.update(_load(CLIPBERT / name))
    for k in ZERO_ONE:
        if k in cfg:
            cfg[k] = bool(cfg[k])
    if method == "get_video_qa_args":
        cfg["max_n_example_per_group"] = 1
    return cfg


def _parse_ours(name: str, task: str, tmp_path: Path) -> dict:
    argv = ["--config", str(REPO / "configs" / name)]
    if task in ("video_qa", "vqa"):  # ClipBERT's answer vocabulary lives under /txt; parsing reads the file
        a2l = tmp_path / "ans2label.json"
        n = 3129 if task == "vqa" else 2  # VQA: num_labels is len(ans2label), ClipBERT's file has 3129
        a2l.write_text(json.dumps({f"a{i}": i for i in range(n)}))
        argv += ["--ans2label_path", str(a2l)]
    return parse_args(task, argv)


def _check_counterpart(name: str, task: str, method: str, tmp_path: Path) -> None:
    path = REPO / "configs" / name
    assert path.is_file(), f"configs/{name}: ClipBERT's src/configs/{name} has no counterpart"
    clip, ours = _load(CLIPBERT / name), _load(path)
    # 1. every key ClipBERT sets, with ClipBERT's value (its own paths translated)
    expect = dict(clip)
    expect["model_config"] = MODEL_CONFIG[clip["model_config"]]
    expect["cnn_type"] = DETECTRON2_CFG[expect.pop("detectron2_model_cfg")]
    missing = sorted(set(expect) - set(ours))
    differ = {k: (ours[k], v) for k, v in expect.items() if k in ours and ours[k] != v}
    assert not missing and not differ, f"{name}: missing {missing}; (ours, ClipBERT) {differ}"
    assert "detectron2_model_cfg" not in ours  # replaced by cnn_type
    # 2. keys ClipBERT leaves to defaults: only with ClipBERT's default
    clip_opts = {**DEFAULTS["__init__"], **DEFAULTS[method]}
    extra = {k: v for k, v in ours.items() if k not in expect}
    unknown = sorted(set(extra) - set(clip_opts))
    assert not unknown, f"{name}: keys that are no ClipBERT option: {unknown}"
    not_default = {k: (v, clip_opts[k]) for k, v in extra.items() if v != clip_opts[k]}
    assert not not_default, f"{name}: (ours, ClipBERT default) {not_default}"
    # 3. parsed, every ClipBERT option has ClipBERT's effective value (our defaults included)
    cfg = _parse_ours(name, task, tmp_path)
    effective = clipbert_effective(name, method)
    effective["model_config"] = MODEL_CONFIG[effective["model_config"]]
    effective["detectron2_model_cfg"] = ""  # ours: unset (cnn_type above)
    if task in ("video_qa", "vqa"):
        effective.pop("ans2label_path")  # given on the command line above; the file value is checked in 1.
    assert set(effective) <= set(task_options(task)), sorted(set(effective) - set(task_options(task)))
    differ = {k: (cfg[k], v) for k, v in effective.items() if cfg[k] != v}
    assert not differ, f"{name} parsed: (ours, ClipBERT) {differ}"
    assert cfg.cnn_type == "resnet50"


@pytest.mark.parametrize("name", sorted(CLIPBERT_BLOBS))
def test_clipbert_copies_are_verbatim(name):
    """The copies are ClipBERT's files byte for byte (git blob ids): fix configs/, never these."""
    data = (CLIPBERT / name).read_bytes()
    blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert blob == CLIPBERT_BLOBS[name]


def test_every_clipbert_config_is_classified():
    names = {p.name for p in CLIPBERT.glob("*.json")} - {"base_model.json"}
    assert names == set(COUNTERPARTS) | set(MISSING)
    assert not set(COUNTERPARTS) & set(MISSING)


def test_our_defaults_are_clipberts(monkeypatch):
    """A key a config leaves out gets our schema's default: it must be ClipBERT's. The one deliberate
    exception, n_workers, is unset and resolves to ClipBERT's 4 wherever a process has 4 cores."""
    from clipbert_legacy.utils.device import num_workers
    for method, task in (("get_video_retrieval_args", "retrieval"), ("get_video_qa_args", "video_qa"),
                         ("get_vqa_args", "vqa")):
        opts = task_options(task)
        for k, v in {**DEFAULTS["__init__"], **DEFAULTS[method]}.items():
            if k == "n_workers":
                assert opts[k].default is None
                monkeypatch.setattr("clipbert_legacy.utils.device.cpus_per_process", lambda: 16)
                assert num_workers(opts[k].default) == v == 4
            elif k != "config":
                assert opts[k].default == (bool(v) if k in ZERO_ONE else v), (task, k)


@pytest.mark.parametrize("name", sorted(COUNTERPARTS))
def test_config_matches_clipbert(name, tmp_path):
    _check_counterpart(name, *COUNTERPARTS[name], tmp_path)



def test_model_config_matches_clipbert():
    clip, ours = _load(CLIPBERT / "base_model.json"), _load(REPO / "configs" / "model" / "base_model.json")
    assert {k: ours.get(k) for k in clip} == clip
    assert {k: v for k, v in ours.items() if k not in clip} == {"cnn_type": "resnet50",
                                                               "attn_implementation": "eager"}
