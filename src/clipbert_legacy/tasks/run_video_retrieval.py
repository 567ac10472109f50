"""Text-to-video retrieval (ClipBERT's ``run_video_retrieval.py``): training and ``--do_inference 1``.

Train (validation = full text x video retrieval on ``val_datasets[0]``, best checkpoint on
``text2video_r1``)::

    horovodrun -np 2 python src/tasks/run_video_retrieval.py --config configs/demo_ret.json \
        --output_dir output/demo_ret

Inference (ClipBERT's result layout under ``output_dir/results_{stem(txt_db)}/step_{N}_{nclips}_{agg}/``:
``raw_args.json``, ``merged_args.json``, ``results.json`` [{vid_id, txt_id, score}], ``scores.json``
{text2video, video2text})::

    python src/tasks/run_video_retrieval.py --config configs/demo_ret.json --do_inference 1 \
        --output_dir output/demo_ret --inference_model_step -1 \
        --inference_txt_db data/demo/txt/retrieval_test.jsonl --inference_img_db data/demo/vis_db \
        --inference_n_clips 1

Every caption is scored against every video; videos are sharded across ranks and the scores
gathered. Differences from ClipBERT: each video is decoded once per caption chunk (ClipBERT once per
caption row), validation reports the retrieval metrics themselves (ClipBERT's ITM val loss/acc used
identical clips), only model-defining keys come from the stored run (CLI inference settings such as
``score_agg_func``/``num_frm`` are kept), ranks are pessimistic on ties
(clipbert_legacy.evaluation.retrieval).
"""
import logging
import sys

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config.options import RETRIEVAL
from clipbert_legacy.datasets.build import build_retrieval_datasets
from clipbert_legacy.evaluation.retrieval import (
    eval_retrieval,
    gather_retrieval_results,
    retrieval_coverage,
    with_rsum,
)
from clipbert_legacy.modeling.heads import RetrievalHead
from clipbert_legacy.tasks.bad_videos import gather_bad_videos, skipped_videos_report
from clipbert_legacy.tasks.base import ClipBertTask, clip_logits, progress_over, unwrap_model
from clipbert_legacy.tasks.entry import main

logger = logging.getLogger(__name__)


def retrieval_shard(dataset, rank, world):
    """Item indices of this rank: all caption chunks of every ``world``-th video (in order)."""
    vid_pos = {v: i for i, v in enumerate(dataset.vid_ids)}
    return [i for i, (v, _) in enumerate(dataset.items) if vid_pos[v] % world == rank]


def score_retrieval(model, loader, cfg):
    """``[{vid_id, txt_id, score}]`` of all ranks (every rank gets the full list)."""
    head = unwrap_model(model).head
    local = []
    for batch in progress_over(loader, "retrieval scoring"):
        if batch is None:
            continue
        logits = clip_logits(model, batch, cfg.inference_n_clips, cfg.num_frm, cfg.score_agg_func)
        scores = head.scores(logits).tolist()
        local.extend(dict(vid_id=batch["vid_id"], txt_id=c, score=s)
                     for c, s in zip(batch["caption_ids"], scores))
    return gather_retrieval_results(local)


def evaluate_retrieval(model, dataset, loader, cfg, with_results=False):
    """Collective: ``(metrics, skipped_videos report[, results])``. Videos skipped as undecodable
    (``skip_bad_videos 1``) leave their texts out; the report states what the metrics are over."""
    results = score_retrieval(model, loader, cfg)
    bad = gather_bad_videos(dataset)
    skipped = [k for k, _ in bad]
    metrics = with_rsum(eval_retrieval(results, dataset.gt_cap_id2vid_id, skipped_vid_ids=skipped))
    report = skipped_videos_report(bad, retrieval_coverage(results, dataset.gt_cap_id2vid_id, skipped))
    return (metrics, report, results) if with_results else (metrics, report)


def recall_line(m):
    """``R@1 a R@5 b R@10 c MdR d MnR e`` of one direction."""
    return (f"R@1 {m['r1']:.2f} R@5 {m['r5']:.2f} R@10 {m['r10']:.2f} MdR {m['medianR']:.1f} "
            f"MnR {m['meanR']:.1f}")


def retrieval_head(cfg):
    """Video-text matching head: 2-way ITM with cross-entropy (loss_type ce) or 1 logit with the rank loss."""
    return RetrievalHead(cfg.loss_type, cfg.margin, cfg.classifier, cfg.cls_hidden_scale)


class RetrievalTask(ClipBertTask):
    """Text-to-video retrieval: the task to copy for a new task that trains (docs/adding_a_task.md)."""
    spec = RETRIEVAL
    name = spec.name
    main_metric = "text2video_r1"
    curve_metrics = ("text2video_r1", "video2text_r1", "rsum")

    def build_head(self, cfg):
        return retrieval_head(cfg)

    def build_train_data(self, cfg):
        return build_retrieval_datasets(cfg, "train")

    def retrieval_loader(self, dataset, collate_fn, cfg):
        return self.build_eval_loader(dataset, collate_fn, cfg, batch_size=1,
                                      indices=retrieval_shard(dataset, hvd.rank(), hvd.size()))

    def evaluate(self, model, cfg, _global_step):
        def build():  # tokenizer + LMDB + caption chunks, this rank's share of the videos
            ds, collate = build_retrieval_datasets(cfg, "val")
            return ds, self.retrieval_loader(ds, collate, cfg)
        ds, loader = self.val_data(build)
        metrics, report = evaluate_retrieval(model, ds, loader, cfg)
        if report["count"]:  # the denominators, logged with the metrics, when videos were skipped
            metrics["evaluated"] = report["evaluated"]
        return metrics

    def run_inference(self, cfg):
        model, result_dir = self.prepare_inference(cfg, prefix="results")
        ds, collate = build_retrieval_datasets(cfg, "inference")
        metrics, report, results = evaluate_retrieval(model, ds, self.retrieval_loader(ds, collate, cfg), cfg,
                                                      with_results=True)
        self.write_inference_outputs(result_dir, {
            "results.json": [dict(vid_id=r["vid_id"], txt_id=r["txt_id"], score=round(r["score"], 4))
                             for r in results],
            "scores.json": metrics, "skipped_videos.json": report})
        if hvd.rank() == 0:
            t2v, v2t = metrics["text2video"], metrics["video2text"]
            logger.info("inference on %s (%d captions x %d videos): text2video %s; video2text %s; rsum %.2f "
                        "-> %s", cfg.inference_txt_db, len(ds.gt_cap_id2vid_id), len(ds.vid_ids),
                        recall_line(t2v), recall_line(v2t), metrics["rsum"], result_dir)
        return metrics


if __name__ == "__main__":
    sys.exit(main(RetrievalTask))
