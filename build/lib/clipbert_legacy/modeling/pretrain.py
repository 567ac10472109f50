"""ClipBERT's image-text pretraining model: masked language modelling (MLM) + image-text matching (ITM).

Same CNN and BERT-over-[text; visual] as the task models, with BERT's pretraining heads under
ClipBERT's names: ``transformer.cls.predictions.*`` (the MLM head, decoder tied to the word
embeddings) and ``transformer.cls.seq_relationship.*`` (ITM, 2-way over the pooled output). A
pretraining checkpoint therefore loads into every task model (``--e2e_weights_path``): ``cnn.*`` and
``transformer.bert.*`` match, the ``transformer.cls.*`` heads are ignored, the task's classifier starts
fresh (the load table says so). ``pixel_random_sampling_size`` keeps a random subset of visual tokens
in training (clipbert_legacy.modeling.clipbert.VisualInputEmbedding).

The MLM loss is the mean cross-entropy over masked tokens of matched pairs only (a caption of another
image teaches nothing about this one); ClipBERT averaged per-position losses over every position,
ignored ones included, which scaled its MLM loss by the masking rate.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers.models.bert.modeling_bert import BertPreTrainingHeads

from clipbert_legacy.modeling.build import build_cnn, load_initial_weights, load_model_config
from clipbert_legacy.modeling.clipbert import (
    ClipBert,
    ClipBertBaseModel,
    init_transformer_weights,
    repeat_tensor_rows,
)


class ClipBertPretrainTransformer(nn.Module):
    """``transformer.bert`` + ``transformer.cls`` (MLM predictions + ITM seq_relationship)."""

    def __init__(self, config, grad_ckpt=False):
        super().__init__()
        self.config = config
        self.bert = ClipBertBaseModel(config, grad_ckpt=grad_ckpt)
        self.cls = BertPreTrainingHeads(config)
        init_transformer_weights(self, config.initializer_range)
        self.cls.predictions.decoder.weight = self.bert.embeddings.word_embeddings.weight  # tied, as BERT

    def forward(self, text_input_ids, visual_inputs, text_input_mask, mlm_positions):
        """MLM logits at ``mlm_positions`` (a bool (N, L) mask; only those rows are decoded, the
        vocabulary projection being the costly part) and ITM logits (N, 2)."""
        hidden, pooled = self.bert(text_input_ids, visual_inputs, text_input_mask)
        text = hidden[:, :text_input_ids.shape[1]]
        mlm_logits = self.cls.predictions(text[mlm_positions])
        itm_logits = self.cls.seq_relationship(pooled)
        return mlm_logits, itm_logits


class ClipBertForPretraining(ClipBert):
    """``model(batch) -> {"loss", "mlm_loss", "itm_loss", counts for accuracies}``.

    batch: ClipBert's keys plus ``mlm_labels`` (N, L) (-100 where not masked) and ``itm_labels`` (N,)
    (1 matched, 0 a caption of another image, -100 not scored: split_mlm_itm). ``use_mlm`` / ``use_itm``
    choose the losses.
    """

    def __init__(self, cnn, transformer, use_mlm=True, use_itm=True, mlm_loss_average="masked"):
        super().__init__(cnn, transformer, head=None)
        if not (use_mlm or use_itm):
            raise ValueError("pretraining needs use_mlm and/or use_itm")
        self.use_mlm, self.use_itm = bool(use_mlm), bool(use_itm)
        self.mlm_loss_average = mlm_loss_average

    def forward(self, batch):
        counts = [int(n) for n in batch["n_examples_list"]]
        visual = repeat_tensor_rows(self.cnn(batch["visual_inputs"]), counts)
        mlm_labels, itm_labels = batch["mlm_labels"], batch["itm_labels"]
        if not self.use_mlm:
            mlm_labels = torch.full_like(mlm_labels, -100)
        positions = mlm_labels != -100
        mlm_logits, itm_logits = self.transformer(batch["text_input_ids"], visual, batch["text_input_mask"],
                                                  positions)
        targets = mlm_labels[positions]
        zero = itm_logits.sum() * 0.0  # keeps every head in the graph (one allreduce set per step)
        mlm_loss = F.cross_entropy(mlm_logits.float(), targets) if targets.numel() else zero + \
            mlm_logits.sum() * 0.0
        if self.mlm_loss_average == "all_positions":  # ClipBERT's scale: / every text position
            mlm_loss = mlm_loss * (targets.numel() / mlm_labels.numel())
        itm_scored = itm_labels != -100  # -100: a caption used for MLM only (split_mlm_itm)
        itm_loss = F.cross_entropy(itm_logits.float(), itm_labels) if self.use_itm and itm_scored.any() \
            else zero
        loss = (mlm_loss if self.use_mlm else zero) + itm_loss
        return {"loss": loss, "mlm_loss": mlm_loss.detach(), "itm_loss": itm_loss.detach(),
                "mlm_correct": (mlm_logits.argmax(-1) == targets).sum().detach(),
                "mlm_total": targets.numel(),
                "itm_correct": ((itm_logits.argmax(-1) == itm_labels) & itm_scored).sum().detach(),
                "itm_total": int(itm_scored.sum())}


def build_pretrain_model(cfg) -> ClipBertForPretraining:
    """The pretraining model of ``cfg`` (model_config, the CNN keys, pixel_random_sampling_size,
    use_mlm/use_itm, grad_ckpt, freeze_cnn) with its initial weights (e2e, else CNN + BERT)."""
    config, raw = load_model_config(cfg.model_config)
    config.pixel_random_sampling_size = int(cfg.pixel_random_sampling_size)
    cnn = build_cnn(cfg, config, raw)
    transformer = ClipBertPretrainTransformer(config, grad_ckpt=bool(cfg.grad_ckpt))
    model = ClipBertForPretraining(cnn, transformer, use_mlm=cfg.use_mlm, use_itm=cfg.use_itm,
                                   mlm_loss_average=cfg.mlm_loss_average)
    load_initial_weights(model, cfg, raw)
    if cfg.freeze_cnn:
        model.freeze_cnn_backbone()
    return model
