"""Image-text pretraining (ClipBERT's ``src/pretrain/run_pretrain.py``): MLM + ITM on captioned images,
several datasets mixed by ratio, on the one engine::

    horovodrun -np 8 python src/tasks/run_pretrain.py \\
        --config configs/pretrain_image_text_base_resnet50_mlm_itm.json --output_dir /storage/pretrain

Training batches come from one ``train_datasets`` entry at a time, drawn by ``ratio`` (ClipBERT's
MetaLoader, clipbert_legacy.training.data.MetaSampler). Validation reports, per ``val_datasets`` entry and
over all, MLM accuracy (masked tokens predicted right) and loss, ITM accuracy and loss; ``loss`` (their sum)
picks the best checkpoint. A checkpoint fine-tunes any task: ``--e2e_weights_path ckpt/model_best.pt``
(the pretraining heads are left out, the task's classifier starts fresh; the load table lists both).
"""
import sys
from typing import NoReturn

import torch

from clipbert_legacy.config.options_pretrain import PRETRAIN
from clipbert_legacy.datasets.build_pretrain import build_pretrain_datasets
from clipbert_legacy.modeling.pretrain import build_pretrain_model
from clipbert_legacy.tasks.base import ClipBertTask, progress_over, unwrap_model
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.utils.distributed import all_gather_list

# per validation dataset: summed losses and counts, so every rank's share weighs by its size
_SUMS = ("mlm_loss_sum", "mlm_correct", "mlm_total", "itm_loss_sum", "itm_correct", "itm_total")


class PretrainTask(ClipBertTask):
    """MLM + ITM pretraining: its own model (the pretraining heads) instead of a task head."""
    spec = PRETRAIN
    name = spec.name
    main_metric = "loss"

    def build_model(self, cfg):
        return build_pretrain_model(cfg)

    def build_train_data(self, cfg):
        return build_pretrain_datasets(cfg, "train")

    def forward_train(self, model, batch, _cfg):
        out = model(batch)
        return {"loss": out["loss"], "mlm_loss": out["mlm_loss"], "itm_loss": out["itm_loss"]}

    def evaluate(self, model, cfg, _global_step):
        def build():
            sets, collate = build_pretrain_datasets(cfg, "val")
            return [(name, self.build_eval_loader(ds, collate, cfg, cfg.val_batch_size)) for name, ds in sets]
        metrics, total = {}, dict.fromkeys(_SUMS, 0.0)
        for name, loader in self.val_data(build):
            sums = _sum_ranks(_val_sums(model, loader, name))
            metrics[name] = _rates(sums, unwrap_model(model))
            total = {k: total[k] + sums[k] for k in _SUMS}
        overall = _rates(total, unwrap_model(model))
        return {**overall, "loss": overall.get("mlm_loss", 0.0) + overall.get("itm_loss", 0.0), **metrics}

    def run_inference(self, _cfg) -> NoReturn:
        raise ValueError("pretraining has no inference step: fine-tune from a checkpoint "
                         "(--e2e_weights_path OUTPUT/ckpt/model_best.pt) or evaluate its validation")


@torch.no_grad()
def _val_sums(model, loader, name):
    sums = dict.fromkeys(_SUMS, 0.0)
    for batch in progress_over(loader, f"pretrain validation {name}"):
        if batch is None or batch.get("visual_inputs") is None:
            continue
        out = model(batch)
        sums["mlm_loss_sum"] += float(out["mlm_loss"]) * out["mlm_total"]
        sums["itm_loss_sum"] += float(out["itm_loss"]) * out["itm_total"]
        for k in ("mlm_correct", "mlm_total", "itm_correct", "itm_total"):
            sums[k] += float(out[k])
    return sums


def _sum_ranks(sums):
    parts = all_gather_list(sums)
    return {k: sum(p[k] for p in parts) for k in _SUMS}


def _rates(s, model):
    """Accuracies in percent and mean losses of the enabled objectives."""
    out = {}
    if model.use_mlm and s["mlm_total"]:
        out.update(mlm_acc=100.0 * s["mlm_correct"] / s["mlm_total"],
                   mlm_loss=s["mlm_loss_sum"] / s["mlm_total"])
    if model.use_itm and s["itm_total"]:
        out.update(itm_acc=100.0 * s["itm_correct"] / s["itm_total"],
                   itm_loss=s["itm_loss_sum"] / s["itm_total"])
    return out


if __name__ == "__main__":
    sys.exit(main(PretrainTask))
