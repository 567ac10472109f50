"""The model JSON (``model_config``) checked against what ``BertConfig`` really has, before it is built.

``BertConfig(**values)`` sets every key as an attribute: ``__class__``, ``__dict__`` or ``to_dict`` from a
file went onto the config object (``to_dict: 1`` was accepted silently and broke every later save), and
``num_attention_heads: 0`` ended in a ZeroDivisionError traceback. Here a key must be a field of
``BertConfig`` (``BertConfig().to_dict()``), a setter of it (``num_labels``), or one of this project's keys;
a key that names a method, a read-only attribute or a private name is refused, and an unknown plain key
(an extra of a Hugging Face ``config.json``) is kept with one warning. Sizes are integers in range, rates
numbers in [0, 1], and the whole model at most :data:`MAX_PARAMETERS` parameters. Each refusal is one
``ConfigError`` line (exit status 2) naming the file, the key and the value.
"""
from __future__ import annotations

import inspect
import logging
import math

from transformers import BertConfig
from transformers.activations import ACT2FN

from clipbert_legacy.config.schema import ConfigError
from clipbert_legacy.utils.errors import clip, shown

logger = logging.getLogger(__name__)

PROJECT_KEYS = frozenset({"backbone_channel_in_size", "max_grid_row_position_embeddings",
                          "max_grid_col_position_embeddings", "max_temporal_position_embeddings",
                          "attn_implementation", "cnn_type", "bert_weights_path"})
MAX_PARAMETERS = 20_000_000_000
"""Parameters the transformer a model JSON describes may have (80 GB in fp32; BERT-large has 0.34 G): a
JSON of a few bytes must not ask for terabytes."""
_SIZES = {  # key -> (smallest, largest)
    "hidden_size": (1, 2 ** 16), "num_attention_heads": (1, 2 ** 12), "num_hidden_layers": (1, 2 ** 10),
    "intermediate_size": (1, 2 ** 18), "vocab_size": (1, 2 ** 24), "max_position_embeddings": (1, 2 ** 20),
    "type_vocab_size": (1, 2 ** 16), "max_grid_row_position_embeddings": (1, 2 ** 16),
    "max_grid_col_position_embeddings": (1, 2 ** 16), "max_temporal_position_embeddings": (1, 2 ** 16),
    "backbone_channel_in_size": (1, 2 ** 16),
}
_RATES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")


def _fields() -> frozenset:
    return frozenset(BertConfig().to_dict())


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_model_config(values: dict, path: str) -> None:
    """Refuse (one :class:`ConfigError` line) a key or value of the model JSON ``path`` that ``BertConfig``
    should not get (see the module docstring); warn once about unknown plain keys."""
    name = f"model_config {clip(repr(path))}"
    fields, unknown = _fields(), []
    for key in values:
        if key in fields or key in PROJECT_KEYS:
            continue
        attr = inspect.getattr_static(BertConfig, key, None) if isinstance(key, str) else None
        if not isinstance(key, str) or not key.isidentifier() or key.startswith("_"):
            raise ConfigError(f"{name}: key {shown(key)} is not a BertConfig field (a private or special "
                              f"name); remove it")
        if attr is not None and not (isinstance(attr, property) and attr.fset is not None):
            what = "a method" if callable(attr) or isinstance(attr, (staticmethod, classmethod)) else \
                "a read-only attribute"
            raise ConfigError(f"{name}: key {shown(key)} names {what} of BertConfig, not a field; remove it")
        if attr is None:
            unknown.append(key)
    if unknown:
        logger.warning("%s: key(s) %s are not BertConfig fields nor this project's; they are kept on the "
                       "config but nothing reads them", name, ", ".join(map(repr, unknown[:10])))
    for key, (low, high) in _SIZES.items():
        v = values.get(key)
        if v is None and key in ("backbone_channel_in_size",):
            continue
        if key in values and not (_is_int(v) and low <= v <= high):
            raise ConfigError(f"{name}: {key}={shown(v)} is invalid: expected an integer in [{low}, {high}]")
    for key in _RATES:
        v = values.get(key)
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1):
            raise ConfigError(f"{name}: {key}={shown(v)} is invalid: expected a number in [0, 1]")
    for key in ("layer_norm_eps", "initializer_range"):
        v = values.get(key)
        if v is not None and not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                                  and v >= 0 and (v > 0 or key == "initializer_range")):
            raise ConfigError(f"{name}: {key}={shown(v)} is invalid: expected a finite positive number")
    act = values.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ACT2FN:
        raise ConfigError(f"{name}: hidden_act={shown(act)} is invalid: expected one of "
                          f"{', '.join(sorted(ACT2FN))[:300]}")
    _check_parameters(values, name)


def _check_parameters(values: dict, name: str) -> None:
    h, layers = values.get("hidden_size", 768), values.get("num_hidden_layers", 12)
    keys = ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "max_position_embeddings",
            "type_vocab_size")
    if not all(_is_int(values.get(k, 1)) for k in keys):
        return  # the size checks above name the key
    embeddings = h * (values.get("vocab_size", 30522) + values.get("max_position_embeddings", 512)
                      + values.get("type_vocab_size", 2))
    per_layer = 4 * h * h + 2 * h * values.get("intermediate_size", 3072)
    n = embeddings + layers * per_layer
    if n > MAX_PARAMETERS:
        raise ConfigError(f"{name}: these sizes make a transformer of about {n / 1e9:.0f} G parameters, more "
                          f"than {MAX_PARAMETERS / 1e9:.0f} G ({4 * n / 2 ** 30:.0f} GB in fp32); check "
                          f"hidden_size, intermediate_size, vocab_size and num_hidden_layers")
