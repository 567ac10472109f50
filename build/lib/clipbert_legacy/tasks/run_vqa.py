"""VQA 2.0 on images (ClipBERT's ``run_vqa.py``): training, validation and ``--do_inference 1``.

    horovodrun -np 8 python src/tasks/run_vqa.py --config configs/vqa_base_resnet50.json
    python src/tasks/run_vqa.py --config configs/demo_vqa.json            # CPU demo
    python src/tasks/run_vqa.py --do_inference 1 --output_dir RUN --inference_model_step -1 \
        --inference_txt_db data/demo/txt/vqa_test.jsonl --inference_img_db data/demo/vqa_img_db

An image is a 1-frame clip (``train_n_clips``, ``num_frm``, ``fps`` and ``score_agg_func`` do not
apply); questions of one image share its CNN pass (``max_n_example_per_group`` in training). The
loss is ClipBERT's: binary cross-entropy of the answer logits against the soft VQA scores
``min(#humans / 3, 1)``, summed over the answers and averaged over the questions (ClipBERT's
``mean() * num_labels``). Validation reports VQA accuracy ``overall_acc`` (main metric),
``yes/no_acc`` / ``number_acc`` / ``other_acc`` for the types present, and the loss. Inference writes::

    {output_dir}/results_{stem(inference_txt_db)}/step_{N}/
        raw_args.json  merged_args.json  results_all.json  scores.json  skipped_images.json

``results_all.json`` is the VQA submission format ``[{"question_id", "answer": str}]``;
``scores.json`` (only when the file has labels/answers; ClipBERT wrote none) holds the accuracies
rounded to 2 decimals. ClipBERT named the folder ``results_{inference_split}step_{N}``.
"""
import logging
import os
import sys

import torch
import torch.nn.functional as F

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config.options_vqa import VQA
from clipbert_legacy.datasets.build_vqa import build_vqa_datasets
from clipbert_legacy.evaluation.predictions import finite_argmax
from clipbert_legacy.evaluation.qa import gather_qa_results
from clipbert_legacy.evaluation.vqa import eval_vqa, vqa_scores
from clipbert_legacy.modeling.heads import QAHead
from clipbert_legacy.tasks.bad_videos import gather_bad_videos, skipped_videos_report
from clipbert_legacy.tasks.base import ClipBertTask, progress_over
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.inference import inference_result_dir
from clipbert_legacy.utils.distributed import all_gather_list

logger = logging.getLogger(__name__)


def vqa_loss(logits, targets):
    """Per-question BCE summed over the answers (N,): ClipBERT's elementwise BCE ``.mean() * K``."""
    return F.binary_cross_entropy_with_logits(logits.float(), targets.float(), reduction="none").sum(1)


class VQATask(ClipBertTask):
    """The engine's Task for VQA: images through the video pipeline as 1-frame clips."""
    spec = VQA
    name = spec.name
    main_metric = "overall_acc"

    def build_head(self, cfg):
        """A classifier over the ``num_labels`` answers of ans2label, trained with the soft-score BCE."""
        return QAHead(cfg.num_labels, cfg.loss_type, cfg.classifier, cfg.cls_hidden_scale)

    def build_train_data(self, cfg):
        return build_vqa_datasets(cfg, "train")

    def forward_train(self, model, batch, _cfg):
        logits = model({**batch, "labels": None})["logits"]
        return vqa_loss(logits, batch["labels"]).mean()

    def vqa_loader(self, cfg, split):
        """(dataset, loader) over ``split`` ("val" or "inference"), sharded over ranks in order."""
        ds, collate = build_vqa_datasets(cfg, split)
        bs = cfg.inference_batch_size if split == "inference" else cfg.val_batch_size
        return ds, self.build_eval_loader(ds, collate, cfg, bs)

    def evaluate(self, model, cfg, _global_step):
        ds, loader = self.val_data(lambda: self.vqa_loader(cfg, "val"))
        local, loss_sum, n_loss = predict(model, loader, ds.label2ans, debug=cfg.debug)
        preds = gather_qa_results(local)
        metrics = eval_vqa(preds, ground_truth(ds))
        parts = all_gather_list((loss_sum, n_loss))
        total = sum(n for _, n in parts)
        if total:
            metrics["loss"] = sum(s for s, _ in parts) / total
        bad = gather_bad_videos(ds)
        if bad:
            metrics["evaluated"] = skipped_videos_report(bad, coverage(ds, bad))["evaluated"]
        return metrics

    def run_inference(self, cfg):
        """VQA answers of every question of ``inference_txt_db`` (+ scores when it has labels)."""
        model, _ = self.prepare_inference(cfg, prefix="results")
        res_dir = inference_result_dir(cfg, prefix="results", with_clips=False)
        ds, loader = self.vqa_loader(cfg, "inference")
        logger.info("inference: %d questions of %s on %d process(es)", len(ds.qid2data), cfg.inference_txt_db,
                    hvd.size())
        local, _, _ = predict(model, loader, ds.label2ans)
        results = sorted(gather_qa_results(local), key=_qid_order)
        bad = gather_bad_videos(ds)
        scores = vqa_scores(results, ground_truth(ds)) if ds.return_label else None
        files = {"results_all.json": results,
                 "skipped_images.json": skipped_videos_report(bad, coverage(ds, bad))}
        if scores is not None:
            files["scores.json"] = scores
        self.write_inference_outputs(res_dir, files)
        if hvd.rank() == 0:
            if scores is not None:
                logger.info("VQA inference on %s: accuracy %.2f%% over %d questions -> %s",
                            cfg.inference_txt_db, scores["overall_acc"], scores["n_questions"], res_dir)
            else:
                logger.warning("inference: %s has no labels; wrote %d answers to %s and no scores.json",
                               cfg.inference_txt_db, len(results), os.path.join(res_dir, "results_all.json"))
        return res_dir, results, scores


@torch.no_grad()
def predict(model, loader, label2ans, debug=False):
    """This rank's ``[{question_id, answer: str or None}]`` and the summed loss / count of labeled
    questions (answer None where the logits are not finite: scored 0)."""
    preds, loss_sum, n_loss = [], 0.0, 0
    for i, batch in enumerate(progress_over(loader, "VQA")):
        if batch is None:
            continue
        logits = model({**batch, "labels": None})["logits"].float()
        labels, _ = finite_argmax(logits, "VQA")
        preds.extend({"question_id": q, "answer": label2ans.get(int(a))}
                     for q, a in zip(batch["question_ids"], labels))
        if batch.get("labels") is not None:
            loss_sum += float(vqa_loss(logits, batch["labels"]).sum())
            n_loss += logits.shape[0]
        if debug and i >= 4:  # ClipBERT's debug mode: a few validation batches
            break
    return preds, loss_sum, n_loss


def _qid_order(p):
    q = p["question_id"]
    return (isinstance(q, str), q)


def ground_truth(dataset):
    """{question_id: {labels, answer_type}} from the dataset's annotations."""
    return {q: {"labels": d["labels"] or {}, "answer_type": d.get("answer_type")}
            for q, d in dataset.qid2data.items()}


def coverage(dataset, bad):
    """Denominators when images were skipped: questions answered out of all."""
    skipped = {k for k, _ in bad}
    answered = sum(d["img_id"] not in skipped for d in dataset.qid2data.values())
    return {"questions": answered, "questions_total": len(dataset.qid2data), "skipped_images": len(bad)}


if __name__ == "__main__":
    sys.exit(main(VQATask))
