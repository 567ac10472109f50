"""build_model(cfg): the one place that turns ClipBERT config keys into a ready ClipBert.

Reads the model JSON (``cfg.model_config``, a BertConfig plus ClipBERT's grid keys), builds the CNN
(``cnn_type``), the transformer and the task head, initialises weights (BERT init N(0, 0.02)), then
loads ``e2e_weights_path`` (whole model) or else ``cnn_weights_path`` / ``bert_weights_path``, and
applies ``freeze_cnn``. Every load logs a key table (clipbert_legacy.utils.load_save); the summaries are kept
in ``model.load_summaries``.
"""
import logging
import os
from collections.abc import Mapping
from typing import Any

from transformers import BertConfig

from clipbert_legacy.config import with_defaults
from clipbert_legacy.config.json_file import load_json_object
from clipbert_legacy.modeling.backbone import GridFeatBackbone, build_resnet
from clipbert_legacy.modeling.clipbert import ClipBert, ClipBertTransformer
from clipbert_legacy.modeling.heads import make_head
from clipbert_legacy.modeling.model_config_check import check_model_config
from clipbert_legacy.utils.pretrained_paths import resolve_path

logger = logging.getLogger(__name__)

__all__ = ["build_model", "load_model_config", "MODEL_CONFIG_DEFAULTS", "HEAD_KEYS"]

# ClipBERT keys of the model JSON beyond BertConfig, with their ClipBERT defaults
MODEL_CONFIG_DEFAULTS = {
    "backbone_channel_in_size": None,  # checked against the CNN's output channels when given
    "max_grid_row_position_embeddings": 100,
    "max_grid_col_position_embeddings": 100,
    "max_temporal_position_embeddings": 100,  # unused, as in ClipBERT
    "attn_implementation": "eager",  # "sdpa" is faster; "eager" is ClipBERT's maths
}


def load_model_config(path: str) -> tuple[BertConfig, dict]:
    """Model JSON -> (BertConfig, raw dict); ``pkg:`` paths allowed."""
    path = resolve_path(path)
    if not path or not os.path.isfile(path):
        raise FileNotFoundError(f"model_config {path!r} does not exist; point model_config at a JSON "
                                "such as configs/model/base_model.json")
    raw = load_json_object(path, "model_config")  # bounded size and depth, no key given twice
    values = {**MODEL_CONFIG_DEFAULTS, **raw}
    for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size",
                "vocab_size"):
        if key not in values:
            raise KeyError(f"model_config {path!r} lacks {key!r} (a BertConfig field)")
    check_model_config(values, path)  # fields and values BertConfig really has (one ConfigError line)
    if values["hidden_size"] % values["num_attention_heads"]:
        raise ValueError(f"model_config {path!r}: hidden_size={values['hidden_size']} is not a multiple "
                         f"of num_attention_heads={values['num_attention_heads']}")
    attn = values.pop("attn_implementation")
    if attn not in ("eager", "sdpa"):
        raise ValueError(f"model_config {path!r}: attn_implementation={attn!r}; use 'eager' or 'sdpa'")
    config = BertConfig(**values, attn_implementation=attn)
    return config, raw


def _check_vocab(tokenizer_dir, config):
    if not tokenizer_dir:
        return
    vocab = os.path.join(resolve_path(tokenizer_dir), "vocab.txt")
    if os.path.isfile(vocab):
        with open(vocab, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > config.vocab_size:
            raise ValueError(f"tokenizer_dir {tokenizer_dir!r} has {n} tokens but the model config "
                             f"vocab_size is {config.vocab_size}; use a matching model_config")


def _check_cnn_weights(path):
    """A missing CNN weights file fails before the model is built, with the command that makes the
    demo's one (``DATA/pretrained/cnn_tiny_grid.pth``, written by
    clipbert_legacy.preprocessing.pretrain_demo_cnn)."""
    if not path or os.path.isfile(resolve_path(path)):
        return
    hint = ("point cnn_weights_path at a detectron2/grid-feat/ClipBERT CNN checkpoint, or pass "
            "--cnn_weights_path '' to start the CNN from random weights")
    norm = os.path.normpath(path)
    if norm.endswith(os.path.join("pretrained", "cnn_tiny_grid.pth")):
        data_dir = os.path.dirname(os.path.dirname(norm)) or "."
        hint = ("it is the demo's pretrained CNN: python -m clipbert_legacy.preprocessing.pretrain_demo_cnn "
                f"--data_dir {data_dir} (make_demo_data writes it too), or --cnn_weights_path '' "
                "for a random CNN")
    raise FileNotFoundError(f"cnn_weights_path {path!r} does not exist; {hint}")


HEAD_KEYS = ("num_labels", "loss_type", "margin", "classifier", "cls_hidden_scale")
"""The config keys of ``make_head`` (the head of a caller that gives ``task_type`` and no head)."""


def build_model(cfg: Mapping[str, Any], head: Any = None) -> ClipBert:
    """ClipBert from cfg keys: model_config, tokenizer_dir, bert_weights_path, e2e_weights_path,
    cnn_weights_path (alias detectron2_weights_path), cnn_type, freeze_cnn, grad_ckpt,
    img_input_format (+ optional cnn_norm 'FrozenBN'|'BN', cnn_freeze_at) and the task's ``head`` (an
    object of clipbert_legacy.modeling.heads).

    A task gives its head (``ClipBertTask.build_head``); a library caller may give ``task_type``
    (retrieval|qa_open|qa_mc) and the HEAD_KEYS it sets instead (``make_head``'s defaults for the rest).
    The schema's defaults are filled where the config is parsed; a plain dict is completed here by
    ``clipbert_legacy.config.with_defaults`` (the shared options: nothing of a task's), which leaves a parsed
    config as it is. The model JSON may give cnn_type / cnn_norm / cnn_freeze_at / bert_weights_path where the
    config leaves them unset."""
    cfg = with_defaults(cfg)
    if head is None:
        head = make_head(cfg.get("task_type") or "retrieval",
                         **{k: cfg[k] for k in HEAD_KEYS if cfg.get(k) is not None})
    config, raw = load_model_config(cfg.model_config)
    _check_vocab(cfg.tokenizer_dir, config)
    grad_ckpt = bool(cfg.grad_ckpt)
    cnn = build_cnn(cfg, config, raw)
    config.pixel_random_sampling_size = int(cfg.pixel_random_sampling_size)
    model = ClipBert(cnn, ClipBertTransformer(config, head, grad_ckpt=grad_ckpt), head)
    load_initial_weights(model, cfg, raw)
    if cfg.freeze_cnn:
        model.freeze_cnn_backbone()
    n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
    logger.info("built ClipBert: cnn=%s (%d ch), hidden=%d, layers=%d, head=%r, grad_ckpt=%s, "
                "%d trainable params", cnn.cnn_type, cnn.backbone_channels, config.hidden_size,
                config.num_hidden_layers, head, grad_ckpt, n_train)
    return model


def build_cnn(cfg, config, raw: dict) -> GridFeatBackbone:
    """The grid CNN of ``cfg`` (cnn_type, cnn_norm, cnn_freeze_at, grad_ckpt, img_input_format; the
    model JSON ``raw`` fills what the config leaves unset) projecting to ``config.hidden_size``."""
    cnn_type = cfg.cnn_type or raw.get("cnn_type", "resnet50")
    backbone = build_resnet(cnn_type, norm=cfg.get("cnn_norm") or raw.get("cnn_norm", "FrozenBN"),
                            freeze_at=cfg.get("cnn_freeze_at", raw.get("cnn_freeze_at")),
                            grad_ckpt=bool(cfg.grad_ckpt))
    want = raw.get("backbone_channel_in_size")
    if want is not None and want != backbone.out_channels:
        raise ValueError(f"model_config backbone_channel_in_size={want} but cnn_type={cnn_type!r} "
                         f"outputs {backbone.out_channels} channels; fix one of them")
    cnn = GridFeatBackbone(backbone, config.hidden_size, input_format=cfg.img_input_format)
    cnn.cnn_type, cnn.backbone_channels = cnn_type, backbone.out_channels
    return cnn


def load_initial_weights(model: ClipBert, cfg, raw: dict) -> None:
    """End-to-end weights (e2e_weights_path), else the CNN and BERT weights separately."""
    cnn_weights = cfg.cnn_weights_path or cfg.detectron2_weights_path
    _check_cnn_weights(cnn_weights)
    allow = bool(cfg.allow_unmatched_weights)
    if cfg.e2e_weights_path:
        model.load_e2e_weights(cfg.e2e_weights_path, allow_unmatched=allow)
    else:
        model.load_separate_ckpt(cnn_weights_path=cnn_weights, allow_unmatched=allow,
                                 bert_weights_path=cfg.bert_weights_path or raw.get("bert_weights_path"))
