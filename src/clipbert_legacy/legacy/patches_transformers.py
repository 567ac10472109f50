"""transformers 3.x/4.x names that later releases removed, put back where (and only where) they are missing.

Each patch adds a name to a real transformers module after it loads, and only if that module lacks it,
so an installed transformers that still has a name keeps its own. The module paths that disappeared
(``transformers.configuration_bert``, ``transformers.modeling_bert`` ...) are stand-in files in
``shims/transformers/`` instead (served only where the real path no longer exists).

* ``activations.swish``: ``x * sigmoid(x)`` (3.x).
* ``file_utils.add_start_docstrings_to_callable``: the 3.x name of ``add_start_docstrings_to_model_forward``.
* ``modeling_utils.prune_linear_layer`` / ``apply_chunking_to_forward`` /
  ``find_pruneable_heads_and_indices``.
* ``PreTrainedModel.get_extended_attention_mask`` / ``get_head_mask`` / ``invert_attention_mask``: 3.x
  semantics (an additive mask of ``-10000`` in the model's dtype; ``-1e4``/``-1e9`` for the inverted one).
* ``PreTrainedModel.init_weights`` called in ``__init__`` (the 3.x lifecycle): transformers 5 needs
  ``post_init()`` to have run first (``all_tied_weights_keys``); where it has not, ``post_init()`` runs
  (which initialises the weights through the model's ``_init_weights``, as 3.x's ``init_weights`` did).
* transformers' optional-dependency probes (``is_torchvision_available`` ...) answer False for a package
  that only the layer's stand-in provides: transformers then never uses the stand-in torchvision's (or
  apex's) missing parts, and keeps working where the real torchvision cannot load.
* the tokenizer's private ``_pad_token`` / ``_mask_token`` ... (3.x's storage, read by MLM masking code).
* ``encode_plus`` / ``batch_encode_plus`` with 2.x/3.x keywords (``pad_to_max_length=True``,
  ``return_attention_masks``): mapped onto ``__call__`` (``padding="max_length"``, and with a
  ``max_length`` and no ``truncation``, longest-first truncation as 3.x did).
"""
from __future__ import annotations

_MISSING = object()


def _add(owner, name, value) -> None:
    if getattr(owner, name, _MISSING) is _MISSING:
        setattr(owner, name, value)


def _swish(x):
    import torch
    return x * torch.sigmoid(x)


def patch_activations(module) -> None:
    _add(module, "swish", _swish)
    if hasattr(module, "ACT2FN") and isinstance(module.ACT2FN, dict):
        module.ACT2FN.setdefault("swish", _swish)


def patch_file_utils(module) -> None:
    from transformers import utils
    forward_doc = getattr(utils, "add_start_docstrings_to_model_forward", None)
    if forward_doc is not None:
        _add(module, "add_start_docstrings_to_callable", forward_doc)


def find_pruneable_heads_and_indices(heads, n_heads, head_size, already_pruned_heads):
    """transformers 3.x/4.x: the heads left to prune and the flat indices of the kept ones."""
    import torch
    mask = torch.ones(n_heads, head_size)
    heads = set(heads) - already_pruned_heads
    for head in heads:
        head = head - sum(1 if h < head else 0 for h in already_pruned_heads)
        mask[head] = 0
    mask = mask.view(-1).contiguous().eq(1)
    index = torch.arange(len(mask))[mask].long()
    return heads, index


def get_extended_attention_mask(self, attention_mask, input_shape, device=None):  # noqa: ARG001 (3.x)
    """3.x: a (B, 1, 1|L, L) additive mask, 0 where attended and -10000 where masked, in the model dtype."""
    import torch
    if attention_mask.dim() == 3:
        extended = attention_mask[:, None, :, :]
    elif attention_mask.dim() == 2:
        if getattr(self.config, "is_decoder", False):
            batch_size, seq_length = input_shape[0], input_shape[1]
            seq_ids = torch.arange(seq_length, device=attention_mask.device)
            causal = seq_ids[None, None, :].repeat(batch_size, seq_length, 1) <= seq_ids[None, :, None]
            causal = causal.to(attention_mask.dtype)
            extended = causal[:, None, :, :] * attention_mask[:, None, None, :]
        else:
            extended = attention_mask[:, None, None, :]
    else:
        raise ValueError(f"Wrong shape for input_ids (shape {tuple(input_shape)}) or attention_mask "
                         f"(shape {tuple(attention_mask.shape)})")
    extended = extended.to(dtype=self.dtype)
    return (1.0 - extended) * -10000.0


def invert_attention_mask(self, encoder_attention_mask):
    """3.x: the encoder mask made additive (-1e4 in fp16 models, -1e9 otherwise)."""
    import torch
    if encoder_attention_mask.dim() == 3:
        extended = encoder_attention_mask[:, None, :, :]
    else:
        extended = encoder_attention_mask[:, None, None, :]
    extended = extended.to(dtype=self.dtype)
    return (1.0 - extended) * (-1e4 if self.dtype == torch.float16 else -1e9)


def get_head_mask(self, head_mask, num_hidden_layers, is_attention_chunked=False):
    """3.x: ``[None] * num_hidden_layers`` without a mask, else a 5-D mask in the model dtype."""
    if head_mask is None:
        return [None] * num_hidden_layers
    if head_mask.dim() == 1:
        head_mask = head_mask[None, :, None, None, None].expand(num_hidden_layers, -1, -1, -1, -1)
    elif head_mask.dim() == 2:
        head_mask = head_mask[:, None, :, None, None]
    head_mask = head_mask.to(dtype=self.dtype)
    return head_mask.unsqueeze(-1) if is_attention_chunked else head_mask


def _legacy_init_weights(original):
    def init_weights(self):
        """Called from ``__init__`` (3.x) before ``post_init()`` ran: run ``post_init()`` instead."""
        if "all_tied_weights_keys" not in self.__dict__:
            return self.post_init()
        return original(self)
    init_weights.__wrapped__ = original
    init_weights.__doc__ = original.__doc__
    return init_weights


def patch_modeling_utils(module) -> None:
    from transformers import pytorch_utils
    for name in ("prune_linear_layer", "apply_chunking_to_forward"):
        if hasattr(pytorch_utils, name):
            _add(module, name, getattr(pytorch_utils, name))
    _add(module, "find_pruneable_heads_and_indices", find_pruneable_heads_and_indices)
    model = module.PreTrainedModel
    _add(model, "get_extended_attention_mask", get_extended_attention_mask)
    _add(model, "invert_attention_mask", invert_attention_mask)
    _add(model, "get_head_mask", get_head_mask)
    original = model.init_weights
    if (hasattr(model, "post_init") and not hasattr(original, "__wrapped__")
            and "all_tied_weights_keys" in _source_or_empty(model.post_init)):
        model.init_weights = _legacy_init_weights(original)


def _source_or_empty(fn) -> str:
    import inspect
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _legacy_kwargs(kwargs: dict) -> dict:
    kwargs = dict(kwargs)
    if kwargs.pop("pad_to_max_length", False) and "padding" not in kwargs:
        kwargs["padding"] = "max_length"
    if "return_attention_masks" in kwargs:
        kwargs.setdefault("return_attention_mask", kwargs.pop("return_attention_masks"))
    if kwargs.get("max_length") is not None and "truncation" not in kwargs \
            and "truncation_strategy" not in kwargs:
        kwargs["truncation"] = "longest_first"
    if "truncation_strategy" in kwargs:
        kwargs["truncation"] = kwargs.pop("truncation_strategy")
    return kwargs


def _encode_plus(self, text, text_pair=None, **kwargs):
    """2.x/3.x ``encode_plus``: one text (or pair), old keywords accepted."""
    return self(text, text_pair=text_pair, **_legacy_kwargs(kwargs))


def _batch_encode_plus(self, batch_text_or_text_pairs, **kwargs):
    """2.x/3.x ``batch_encode_plus``: a list of texts or of (text, pair) tuples, old keywords accepted."""
    items = list(batch_text_or_text_pairs)
    if items and all(isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], str) for x in items):
        return self([a for a, _ in items], text_pair=[b for _, b in items], **_legacy_kwargs(kwargs))
    return self(items, **_legacy_kwargs(kwargs))


_SPECIAL = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")


def _private_special(name):
    key = f"_{name}_token"

    def get(self):
        if key in self.__dict__:
            return self.__dict__[key]
        token = getattr(self, f"{name}_token", None)
        return None if token is None else str(token)

    def set_(self, value):
        self.__dict__[key] = value

    return property(get, set_, doc=f"3.x's private ``{key}`` (the special token's string, or None)")


def patch_tokenization_base(module) -> None:
    base = module.PreTrainedTokenizerBase
    for name in _SPECIAL:  # 3.x code reads tokenizer._pad_token (None when the token is not set)
        if not any(f"_{name}_token" in vars(klass) for klass in base.__mro__):
            setattr(base, f"_{name}_token", _private_special(name))
    _add(base, "encode_plus", _encode_plus)
    _add(base, "batch_encode_plus", _batch_encode_plus)


def _stand_in_only(pkg_name) -> bool:
    import importlib.util

    from clipbert_legacy.legacy.finder import SHIM_ROOT
    try:
        spec = importlib.util.find_spec(pkg_name)
    except (ImportError, ValueError):
        return False
    return spec is not None and str(SHIM_ROOT) in (spec.origin or "")


def patch_import_utils(module) -> None:
    probe = getattr(module, "_is_package_available", None)
    if probe is None or hasattr(probe, "__wrapped__"):
        return

    # what "not installed" looks like in this release: (False, "N/A") in 5.x; False in 4.x unless a version
    # was asked for
    tuple_always = isinstance(probe("clipbert_legacy_no_such_package"), tuple)

    def is_package_available(pkg_name, *args, **kwargs):
        """transformers' probe: "not installed" for a package only the legacy layer stands in for."""
        if _stand_in_only(pkg_name):
            return (False, "N/A") if tuple_always or args or kwargs.get("return_version") else False
        return probe(pkg_name, *args, **kwargs)

    is_package_available.__wrapped__ = probe
    module._is_package_available = is_package_available


# (module name, patch): applied by layer.install when the module loads (or at once if loaded)
PATCHES = (
    ("transformers.utils.import_utils", patch_import_utils),
    ("transformers.activations", patch_activations),
    ("transformers.file_utils", patch_file_utils),
    ("transformers.modeling_utils", patch_modeling_utils),
    ("transformers.tokenization_utils_base", patch_tokenization_base),
)
