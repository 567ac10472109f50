"""ClipBERT: grid-feature CNN + BERT over [text tokens; visual tokens], with a task head.

The BERT parts are ``transformers``' own ``BertEmbeddings`` / ``BertEncoder`` / ``BertPooler`` so that
HF key names (``transformer.bert.embeddings.*``, ``transformer.bert.encoder.layer.N.*``,
``transformer.bert.pooler.*``) load ``bert-base-uncased`` or MiniLM weights directly. Their LayerNorms
are swapped for :class:`clipbert_legacy.compat.layer_norm.FusedLayerNorm` (same keys), as in ClipBERT.

The encoder loop is ours (not ``BertEncoder.forward``) so we can pass ClipBERT's additive mask
``(1 - m) * -10000`` straight to every layer and checkpoint layers with ``use_reentrant=False``.
"""
import logging

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers.models.bert.modeling_bert import BertEmbeddings, BertEncoder, BertPooler

from clipbert_legacy.compat.layer_norm import FusedLayerNorm
from clipbert_legacy.modeling.backbone import convert_c2_names, is_c2_state_dict
from clipbert_legacy.utils.load_save import (
    check_weights_match,
    load_state_dict_file,
    load_state_dict_with_mismatch,
    unwrap_state_dict,
)
from clipbert_legacy.utils.pretrained_paths import find_weights_file, local_path, resolve_path

logger = logging.getLogger(__name__)

__all__ = ["VisualInputEmbedding", "ClipBertBaseModel", "ClipBertTransformer", "ClipBert",
           "repeat_tensor_rows", "init_transformer_weights", "map_bert_keys", "map_cnn_keys",
           "E2E_IGNORE_PREFIXES", "BERT_IGNORE_PREFIXES"]

# checkpoint keys ClipBERT carried but never used (detectron2 detector heads, pixel stats, MLM/ITM
# pretraining heads, HF's position_ids buffer): dropped on load with a notice, not reported as errors
E2E_IGNORE_PREFIXES = ("cnn.feature.proposal_generator.", "cnn.feature.roi_heads.",
                       "cnn.feature.pixel_mean", "cnn.feature.pixel_std", "transformer.cls.",
                       "transformer.bert.embeddings.position_ids")
_CNN_IGNORE = ("proposal_generator.", "roi_heads.", "pixel_mean", "pixel_std")


def _swap_layer_norms(module):
    """Replace torch LayerNorms by FusedLayerNorm in place (weights copied, keys unchanged)."""
    for name, child in module.named_children():
        if type(child) is nn.LayerNorm:
            fused = FusedLayerNorm(child.normalized_shape, eps=child.eps,
                                   elementwise_affine=child.elementwise_affine)
            fused.load_state_dict(child.state_dict())
            setattr(module, name, fused)
        else:
            _swap_layer_norms(child)


def init_transformer_weights(module, initializer_range=0.02):
    """ClipBERT / BERT init: Linear and Embedding N(0, 0.02), biases 0, LayerNorm weight 1 bias 0."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=initializer_range)
        elif isinstance(m, nn.LayerNorm) and m.elementwise_affine:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)


def repeat_tensor_rows(tensor, repeat_counts):
    """Repeat row i of ``tensor`` repeat_counts[i] times (one video feature per text)."""
    if len(repeat_counts) != tensor.shape[0]:
        raise ValueError(f"n_examples_list has {len(repeat_counts)} entries but visual_inputs has "
                         f"{tensor.shape[0]} videos")
    if all(c == 1 for c in repeat_counts):
        return tensor
    counts = torch.as_tensor(list(repeat_counts), device=tensor.device)
    return torch.repeat_interleave(tensor, counts, dim=0)


class VisualInputEmbedding(nn.Module):
    """Grid (B, T, h, w, d) -> tokens (B, h*w, d): mean over frames, + row/col + token type, LN, dropout."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        # kept for ClipBERT key parity only; ClipBERT never used it. Frozen so it is not weight-decayed.
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.position_embeddings.weight.requires_grad_(False)
        self.row_position_embeddings = nn.Embedding(config.max_grid_row_position_embeddings,
                                                    config.hidden_size)
        self.col_position_embeddings = nn.Embedding(config.max_grid_col_position_embeddings,
                                                    config.hidden_size)
        self.token_type_embeddings = nn.Embedding(1, config.hidden_size)
        self.LayerNorm = FusedLayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, grid):
        bsz, _, height, width, hsz = grid.shape
        if height > self.row_position_embeddings.num_embeddings or \
                width > self.col_position_embeddings.num_embeddings:
            raise ValueError(f"visual grid {height}x{width} exceeds max_grid_row/col_position_embeddings "
                             f"({self.row_position_embeddings.num_embeddings}x"
                             f"{self.col_position_embeddings.num_embeddings}); lower max_img_size")
        grid = grid.mean(1)  # temporal mean pooling, (B, h, w, d)
        rows = self.row_position_embeddings(torch.arange(height, device=grid.device))
        cols = self.col_position_embeddings(torch.arange(width, device=grid.device))
        grid = grid + rows.view(1, height, 1, hsz) + cols.view(1, 1, width, hsz)
        tokens = grid.reshape(bsz, height * width, hsz)
        n_sample = getattr(self.config, "pixel_random_sampling_size", 0) or 0
        if self.training and 0 < n_sample < tokens.shape[1]:  # training only; same positions per batch
            idx = torch.randperm(tokens.shape[1], device=tokens.device)[:n_sample].sort().values
            tokens = tokens.index_select(1, idx)
        tokens = tokens + self.token_type_embeddings.weight[0]
        return self.dropout(self.LayerNorm(tokens))


class ClipBertBaseModel(nn.Module):
    """BERT over [text; visual] tokens; returns (sequence_output, pooled_output)."""

    def __init__(self, config, grad_ckpt=False):
        super().__init__()
        self.config = config
        self.grad_ckpt = bool(grad_ckpt)
        self.embeddings = BertEmbeddings(config)
        self.visual_embeddings = VisualInputEmbedding(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)
        _swap_layer_norms(self)

    def forward(self, text_input_ids, visual_inputs=None, attention_mask=None):
        """text_input_ids/attention_mask (N, Lt); visual_inputs grid (N, T, h, w, d) or None (text only)."""
        if attention_mask is None:
            attention_mask = torch.ones_like(text_input_ids)
        hidden = self.embeddings(input_ids=text_input_ids)
        if visual_inputs is not None:
            visual = self.visual_embeddings(visual_inputs)
            if visual.shape[0] != hidden.shape[0]:
                raise ValueError(f"{visual.shape[0]} visual rows for {hidden.shape[0]} texts")
            hidden = torch.cat([hidden, visual.to(hidden.dtype)], dim=1)
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(visual.shape[:2])], dim=1)
        ext_mask = (1.0 - attention_mask[:, None, None, :].to(hidden.dtype)) * -10000.0
        use_ckpt = self.grad_ckpt and self.training and torch.is_grad_enabled()
        for layer in self.encoder.layer:
            if use_ckpt:
                hidden = checkpoint(layer, hidden, ext_mask, use_reentrant=False)
            else:
                hidden = layer(hidden, ext_mask)
        return hidden, self.pooler(hidden)


class ClipBertTransformer(nn.Module):
    """``transformer.*``: ``bert`` + dropout + ``classifier`` (keys as ClipBERT's task classes)."""

    def __init__(self, config, head, grad_ckpt=False):
        super().__init__()
        self.config = config
        self.bert = ClipBertBaseModel(config, grad_ckpt=grad_ckpt)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = head.build_classifier(config.hidden_size)
        init_transformer_weights(self, config.initializer_range)

    def forward(self, text_input_ids, visual_inputs, text_input_mask):
        _, pooled = self.bert(text_input_ids, visual_inputs, text_input_mask)
        return self.classifier(self.dropout(pooled))


BERT_IGNORE_PREFIXES = ("cls.", "bert.embeddings.position_ids")  # pretraining heads, HF buffer


def map_bert_keys(state_dict):
    """Map BERT checkpoint keys onto ``ClipBertTransformer`` names.

    ``bert.*`` stays; ``transformer.bert.*`` loses ``transformer.``; bare BertModel keys
    (``embeddings.*``, ``encoder.*``, ``pooler.*``) gain ``bert.``; old TF-style ``gamma``/``beta`` become
    ``weight``/``bias``. Pretraining heads (``cls.*``) keep their names and are ignored on load.
    """
    mapped = {}
    for k, v in state_dict.items():
        if k.startswith("transformer."):
            k = k[len("transformer."):]
        if k.startswith(("embeddings.", "encoder.", "pooler.", "visual_embeddings.")):
            k = "bert." + k
        if k.endswith(".gamma"):
            k = k[:-len("gamma")] + "weight"
        elif k.endswith(".beta"):
            k = k[:-len("beta")] + "bias"
        mapped[k] = v
    return mapped


def map_cnn_keys(state_dict):
    """Map detectron2 / grid-feats / ClipBERT / Caffe2 (MSRA .pkl) CNN keys onto ``GridFeatBackbone``
    names (``feature.backbone.*``, ``grid_encoder.*``)."""
    if is_c2_state_dict(state_dict):  # ImageNet MSRA R-50.pkl, ClipBERT's detectron2 MODEL.WEIGHTS
        state_dict, unused = convert_c2_names(state_dict)
        if unused:
            logger.info("CNN weights (Caffe2 names): %d keys not part of the backbone skipped: %s",
                        len(unused), ", ".join(sorted(unused)[:8]) + (" ..." if len(unused) > 8 else ""))
    mapped, skipped = {}, 0
    for k, v in state_dict.items():
        if k.startswith("transformer."):  # a full ClipBERT checkpoint given as CNN weights
            skipped += 1
            continue
        if k.startswith("cnn."):
            k = k[len("cnn."):]
        if k.startswith("feature."):
            k = k[len("feature."):]
        if k.startswith(("stem.", "res")):
            k = "backbone." + k
        mapped["feature." + k if not k.startswith("grid_encoder.") else k] = v
    if skipped:
        logger.info("CNN weights: skipped %d transformer.* keys (not part of the CNN)", skipped)
    return mapped


class ClipBert(nn.Module):
    """``model(batch) -> {"logits", ["loss"]}`` for one clip; see :meth:`forward`."""

    def __init__(self, cnn, transformer, head):
        super().__init__()
        self.cnn = cnn
        self.transformer = transformer
        self.head = head
        self.load_summaries = {}

    def forward(self, batch):
        """batch: visual_inputs (B, T, 3, H, W) normalised, text_input_ids / text_input_mask (N, L),
        n_examples_list (len B, sum N), optional labels. The CNN runs once per video and its grid is
        repeated for that video's texts. Returns logits (N, C), (B, n_options) for multiple choice,
        plus ``loss`` (scalar mean of ``head.calc_loss``) when labels are given. The batch is not mutated."""
        for key in ("visual_inputs", "text_input_ids", "text_input_mask", "n_examples_list"):
            if key not in batch:
                raise KeyError(f"model batch is missing {key!r} (have {sorted(batch)})")
        repeat_counts = [int(n) for n in batch["n_examples_list"]]
        n_text = batch["text_input_ids"].shape[0]
        if sum(repeat_counts) != n_text:
            raise ValueError(f"n_examples_list sums to {sum(repeat_counts)} but text_input_ids has "
                             f"{n_text} rows")
        visual = repeat_tensor_rows(self.cnn(batch["visual_inputs"]), repeat_counts)
        logits = self.transformer(batch["text_input_ids"], visual, batch["text_input_mask"])
        logits = self.head.reshape_logits(logits, repeat_counts)
        out = {"logits": logits}
        if batch.get("labels") is not None:
            out["loss"] = self.head.calc_loss(logits, batch["labels"], repeat_counts).mean()
        return out

    def load_separate_ckpt(self, cnn_weights_path=None, bert_weights_path=None, allow_unmatched=False):
        """Load CNN weights (detectron2/grid-feats/ClipBERT file) and BERT weights (file or HF dir). A file
        that fits little of its part is an error unless ``allow_unmatched`` (``check_weights_match``)."""
        if cnn_weights_path:
            path = resolve_path(cnn_weights_path)
            sd = map_cnn_keys(unwrap_state_dict(load_state_dict_file(path), path))
            self.load_summaries["cnn"] = load_state_dict_with_mismatch(
                self.cnn, sd, ignore_prefixes=tuple("feature." + p for p in _CNN_IGNORE), source=path)
            check_weights_match(self.load_summaries["cnn"], self.cnn, path, "cnn_weights_path",
                                allow_unmatched)
        if bert_weights_path:
            path = find_weights_file(local_path(bert_weights_path, "bert_weights_path"))
            mapped = map_bert_keys(unwrap_state_dict(load_state_dict_file(path), path))
            self.load_summaries["bert"] = load_state_dict_with_mismatch(
                self.transformer, mapped, ignore_prefixes=BERT_IGNORE_PREFIXES, source=path)
            check_weights_match(self.load_summaries["bert"], self.transformer, path, "bert_weights_path",
                                allow_unmatched)
        return self.load_summaries

    def load_e2e_weights(self, path_or_state_dict, allow_unmatched=False):
        """Load a full ClipBERT checkpoint (``cnn.*`` + ``transformer.*``), ignoring its unused detector
        keys. From a pretraining checkpoint into a 2-way linear retrieval classifier (``--classifier
        linear``), the ITM head becomes the classifier: zero-shot retrieval, and fine-tuning starts from
        it. A file that fits little of the model is an error unless ``allow_unmatched``."""
        sd, source = path_or_state_dict, None
        if not isinstance(sd, dict):
            source = resolve_path(sd)
            sd = unwrap_state_dict(load_state_dict_file(source), source)
        sd = itm_as_retrieval_classifier(sd, self)
        self.load_summaries["e2e"] = load_state_dict_with_mismatch(
            self, sd, ignore_prefixes=E2E_IGNORE_PREFIXES, source=source)
        check_weights_match(self.load_summaries["e2e"], self, source or "<state dict>", "e2e_weights_path",
                            allow_unmatched)
        return self.load_summaries["e2e"]

    def freeze_cnn_backbone(self):
        """ClipBERT's freeze_cnn: ``cnn.feature.*`` gets no gradients."""
        self.cnn.freeze_backbone()


ITM_KEYS = ("transformer.cls.seq_relationship.weight", "transformer.cls.seq_relationship.bias")


def itm_as_retrieval_classifier(state_dict, model):
    """``state_dict`` with a pretraining checkpoint's ITM head copied to ``transformer.classifier.*``
    when the model's classifier is a 2-way linear layer (same shape; label 1 = matching pair in both)
    and the checkpoint has no classifier of its own; otherwise unchanged."""
    own = model.state_dict()
    targets = ("transformer.classifier.weight", "transformer.classifier.bias")
    if not all(k in state_dict for k in ITM_KEYS) or any(k in state_dict for k in targets) or \
            not all(k in own for k in targets) or \
            any(own[t].shape != state_dict[k].shape for t, k in zip(targets, ITM_KEYS)):
        return state_dict
    logger.info("the pretraining ITM head (transformer.cls.seq_relationship) becomes the 2-way retrieval "
                "classifier (transformer.classifier)")
    out = dict(state_dict)
    for t, k in zip(targets, ITM_KEYS):
        out[t] = state_dict[k]
    return out
