"""Video QA (TGIF-QA frameqa/action/transition, MSRVTT-QA): training and ``--do_inference 1``.

    horovodrun -np 2 python src/tasks/run_video_qa.py --config configs/demo_qa_frameqa.json
    python src/tasks/run_video_qa.py --do_inference 1 --output_dir RUN --inference_model_step -1 \
        --inference_txt_db data/demo/txt/frameqa_test.jsonl --inference_img_db data/demo/vis_db \
        --inference_n_clips 1

Training runs the shared engine (src/clipbert_legacy/training/engine.py); validation reports ``overall_acc``
(the main metric) and, for frameqa/msrvtt_qa, ``{answer_type}_acc``; action/transition report the
5-way multiple-choice accuracy as ``overall_acc``. Inference writes ClipBERT's QA result layout::

    {output_dir}/results_{stem(inference_txt_db)}/step_{N}_{n_clips}_{agg}/
        raw_args.json  merged_args.json  results_rank{r}.json  results_all.json  scores.json

``results_all.json`` is ``[{question_id, answer, data}]`` (answer = label index for open-ended tasks,
option index for action/transition; data = the annotation). Differences from ClipBERT (bugs):

* only the model-defining keys of the trained run's ``log/args.json`` are applied
  (clipbert_legacy.config.model_keys()); ``output_dir`` and every CLI inference setting stay as given;
* the task comes from the trained run, so ``--config`` is optional at inference;
* an unlabeled annotation file (no ``answer``) gets predictions and no ``scores.json`` (ClipBERT
  crashed computing scores); a notice says so.
"""
import json
import logging
import os
import sys

import torch
import torch.nn.functional as F

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config.options import VIDEO_QA
from clipbert_legacy.datasets.build import build_qa_datasets
from clipbert_legacy.datasets.dataset_video_qa import MC_QA, OPEN_ENDED_QA
from clipbert_legacy.evaluation.predictions import finite_argmax
from clipbert_legacy.evaluation.qa import QA_ANSWER_TYPES, eval_qa, gather_qa_results, qa_scores
from clipbert_legacy.modeling.heads import MultipleChoiceHead, QAHead, aggregate_clip_logits, lse_loss
from clipbert_legacy.tasks.bad_videos import gather_bad_videos, skipped_videos_report
from clipbert_legacy.tasks.base import ClipBertTask, forward_clips, progress_over
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.inference import write_rank_outputs
from clipbert_legacy.utils.distributed import all_gather_list

logger = logging.getLogger(__name__)


class VideoQATask(ClipBertTask):
    """The engine's Task for frameqa / msrvtt_qa (open-ended) and action / transition (5-way)."""
    spec = VIDEO_QA
    name = spec.name
    main_metric = "overall_acc"

    def build_head(self, cfg):
        """5-way multiple choice over the candidate answers (action, transition), else a classifier over
        the ``num_labels`` answers of ans2label."""
        if cfg.task in MC_QA:
            return MultipleChoiceHead(cfg.num_labels, cfg.classifier, cfg.cls_hidden_scale)
        return QAHead(cfg.num_labels, cfg.loss_type, cfg.classifier, cfg.cls_hidden_scale)

    def build_train_data(self, cfg):
        return build_qa_datasets(cfg, "train")

    def qa_loader(self, cfg, split):
        """(dataset, loader) over ``split`` ("val" or "inference"), sharded over ranks in order."""
        ds, collate = build_qa_datasets(cfg, split)
        bs = cfg.inference_batch_size if split == "inference" else cfg.val_batch_size
        return ds, self.build_eval_loader(ds, collate, cfg, bs)

    def evaluate(self, model, cfg, _global_step):
        ds, loader = self.val_data(lambda: self.qa_loader(cfg, "val"))
        preds, loss_sum, n_loss = predict(model, loader, cfg, debug=cfg.debug)
        metrics = qa_metrics(ds, preds, loss_sum, n_loss)
        bad = gather_bad_videos(ds)
        if bad:
            metrics["evaluated"] = skipped_videos_report(bad, qa_coverage(ds, bad))["evaluated"]
        return metrics

    def run_inference(self, cfg):
        """Predictions of every question of ``inference_txt_db`` (+ scores when it has answers)."""
        model, res_dir = self.prepare_inference(cfg, prefix="results")
        ds, loader = self.qa_loader(cfg, "inference")
        rank = hvd.rank()
        logger.info("inference: task %s, %d questions of %s on %d process(es)", cfg.task,
                    len(ds.qid2data), cfg.inference_txt_db, hvd.size())
        local, _, _ = predict(model, loader, cfg)
        for p in local:
            p["data"] = ds.qid2data[p["question_id"]]
        results = sorted(gather_qa_results(local), key=lambda p: p["question_id"])
        bad = gather_bad_videos(ds)
        scores = None
        if ds.return_label:
            scores = qa_scores(results, ground_truth(ds), label2ans_for(ds), QA_ANSWER_TYPES.get(cfg.task))
        files = {"results_all.json": results,
                 "skipped_videos.json": skipped_videos_report(bad, qa_coverage(ds, bad))}
        if scores is not None:
            files["scores.json"] = scores
        self.write_inference_outputs(res_dir, files)
        write_rank_outputs(res_dir, {f"results_rank{rank}.json": local})  # ClipBERT's per-rank files
        if rank == 0:
            if scores is not None:
                logger.info("inference scores on %s: %s -> %s", cfg.inference_txt_db, json.dumps(scores),
                            res_dir)
            else:
                logger.warning("inference: %s has no answers (unlabeled); wrote %d predictions to %s and "
                               "no scores.json", cfg.inference_txt_db, len(results),
                               os.path.join(res_dir, "results_all.json"))
        return res_dir, results, scores


@torch.no_grad()
def predict(model, loader, cfg, debug=False):
    """This rank's ``[{question_id, answer}]`` and the summed loss / count over labeled questions.

    Clip logits are pooled with ``score_agg_func`` (lse: logsumexp), answer = argmax.
    """
    preds, loss_sum, n_loss = [], 0.0, 0
    for i, batch in enumerate(progress_over(loader, "video QA")):
        if batch is None:
            continue
        stacked = forward_clips(model, batch, cfg.inference_n_clips, cfg.num_frm).float()
        logits = aggregate_clip_logits(stacked, cfg.score_agg_func)
        answers, _ = finite_argmax(logits, "video QA")  # -1 (wrong) where the logits are nan/inf
        preds.extend({"question_id": q, "answer": int(a)} for q, a in zip(batch["question_ids"], answers))
        labels = batch.get("labels")
        if labels is not None:
            keep = labels != -100  # answers unseen in training: no loss, counted wrong
            if keep.any():
                if cfg.score_agg_func == "lse":
                    losses = lse_loss(stacked[:, keep], labels[keep])
                else:
                    losses = F.cross_entropy(logits[keep], labels[keep], reduction="none")
                loss_sum += float(losses.sum())
                n_loss += int(keep.sum())
        if debug and i >= 4:  # ClipBERT's debug mode: 5 validation batches
            break
    return preds, loss_sum, n_loss


def ground_truth(dataset):
    """{question_id: {answer, answer_type}} from the dataset's annotations."""
    return {q: {"answer": d["answer"], "answer_type": d.get("answer_type")}
            for q, d in dataset.qid2data.items()}


def label2ans_for(dataset):
    """{label: answer} of an open-ended task's dataset (predictions are compared as strings), else None;
    from the ``ans2label`` the dataset was built with (ans2label_path is read when the dataset is built,
    not again at every validation)."""
    if dataset.qa_task not in OPEN_ENDED_QA:
        return None
    return {int(v): k for k, v in dataset.ans2label.items()}


def qa_metrics(dataset, local_preds, loss_sum=0.0, n_loss=0):
    """Collective: {overall_acc, <type>_acc..., ratios, loss} over every rank's predictions."""
    preds = gather_qa_results(local_preds)
    parts = all_gather_list((loss_sum, n_loss))
    metrics = eval_qa(preds, ground_truth(dataset), label2ans_for(dataset))
    total = sum(n for _, n in parts)
    if total:
        metrics["loss"] = sum(s for s, _ in parts) / total
    return metrics


def qa_coverage(dataset, bad):
    """Denominators of the QA metrics when videos were skipped: questions answered out of all."""
    skipped = {k for k, _ in bad}
    answered = sum(d["vid_id"] not in skipped for d in dataset.qid2data.values())
    return {"questions": answered, "questions_total": len(dataset.qid2data), "skipped_videos": len(bad)}


if __name__ == "__main__":
    sys.exit(main(VideoQATask))
