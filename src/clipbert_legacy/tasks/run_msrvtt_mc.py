"""MSRVTT multiple choice (ClipBERT's ``run_msrvtt_mc.py``): inference only, with a retrieval model.

Each question is a video with 5 candidate captions; the retrieval head scores every (video, caption)
pair and the best-scoring option is the answer::

    python src/tasks/run_msrvtt_mc.py --config configs/demo_ret.json --do_inference 1 \
        --output_dir output/demo_ret --inference_model_step -1 \
        --inference_txt_db data/demo/txt/mc_test.jsonl --inference_img_db data/demo/vis_db

writes ``output_dir/mc_results_{stem(txt_db)}/step_{N}_{nclips}_{agg}/``: ``raw_args.json``,
``merged_args.json``, ``mc_test_results.json`` ({qid: option index}) and ``mc_test_scores.json``
({"mc_accuracy": "xx.xx"}, a string as in ClipBERT). Question ids are JSON string keys on every
rank (ClipBERT mixed int and str keys and its accuracy assert failed on several GPUs).
"""
import logging
import sys
from typing import NoReturn

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config.options import MSRVTT_MC
from clipbert_legacy.datasets.build import build_mc_dataset
from clipbert_legacy.datasets.dataset_mc import N_OPTIONS
from clipbert_legacy.evaluation.mc import eval_mc, format_mc_accuracy, gather_mc_predictions, mc_predict
from clipbert_legacy.tasks.bad_videos import gather_bad_videos, skipped_videos_report
from clipbert_legacy.tasks.base import ClipBertTask, clip_logits, progress_over, unwrap_model
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.tasks.run_video_retrieval import retrieval_head

logger = logging.getLogger(__name__)


class MSRVTTMCTask(ClipBertTask):
    """Multiple choice by retrieval scores; inference only (no training data, no validation)."""
    spec = MSRVTT_MC
    name = spec.name
    main_metric = "mc_accuracy"

    def build_head(self, cfg):
        return retrieval_head(cfg)

    def build_train_data(self, _cfg) -> NoReturn:
        raise ValueError("msrvtt_mc is inference only: train with src/tasks/run_video_retrieval.py and "
                         "run this with --do_inference 1 on that run's output_dir")

    def evaluate(self, _model, _cfg, _global_step) -> NoReturn:
        raise ValueError("msrvtt_mc is inference only (use --do_inference 1)")

    def predict(self, model, loader, cfg):
        """{str(qid): option index} of all ranks."""
        head = unwrap_model(model).head
        local = {}
        for batch in progress_over(loader, "MSRVTT-MC"):
            if batch is None:
                continue
            logits = clip_logits(model, batch, cfg.inference_n_clips, cfg.num_frm, cfg.score_agg_func)
            scores = head.scores(logits) if hasattr(head, "scores") else logits.float()
            pred = mc_predict(scores, N_OPTIONS)  # -1 (wrong) for a question with nan/inf scores
            for qid, p in zip(batch["question_ids"], pred):
                local[str(qid)] = int(p)
        return gather_mc_predictions(local)

    def run_inference(self, cfg):
        model, result_dir = self.prepare_inference(cfg, prefix="mc_results")
        ds, collate = build_mc_dataset(cfg, "inference")
        loader = self.build_eval_loader(ds, collate, cfg, batch_size=cfg.inference_batch_size)
        preds = self.predict(model, loader, cfg)
        gts = {str(d["qid"]): d["answer"] for d in ds.datalist}
        if len(gts) != len(ds.datalist):
            raise ValueError(f"{cfg.inference_txt_db}: question ids (qid) are not unique")
        missing = sorted(set(gts) - set(preds))
        if missing and not cfg.skip_bad_videos:
            raise RuntimeError(f"msrvtt_mc: {len(missing)} question(s) got no prediction, e.g. {missing[:5]}")
        bad = gather_bad_videos(ds)
        scores = None
        if all(v is not None for v in gts.values()):
            acc = eval_mc(preds, {k: int(v) for k, v in gts.items()})["mc_accuracy"]
            scores = {"mc_accuracy": format_mc_accuracy(acc)}
        files = {"mc_test_results.json": preds, "skipped_videos.json": skipped_videos_report(
            bad, {"questions": len(preds), "questions_total": len(gts), "skipped_videos": len(bad)})}
        if scores is not None:
            files["mc_test_scores.json"] = scores
        self.write_inference_outputs(result_dir, files)
        if hvd.rank() == 0:
            if scores is not None:
                logger.info("msrvtt_mc on %s: %d questions, accuracy %s%% (chance %.0f%%) -> %s",
                            cfg.inference_txt_db, len(preds), scores["mc_accuracy"], 100.0 / N_OPTIONS,
                            result_dir)
            else:
                logger.info("msrvtt_mc on %s: %d predictions (no answers to score) -> %s",
                            cfg.inference_txt_db, len(preds), result_dir)
        return scores


if __name__ == "__main__":
    sys.exit(main(MSRVTTMCTask))
