"""Score your own videos with a trained model: ranked captions (retrieval) or answers (open-ended QA).

    python -m clipbert_legacy.tasks.score_videos --output_dir output/demo_ret --videos clip1.mp4 clips/ \\
        --captions "a red circle moves left" "a blue square stays still" [--json] [--top_k 5]
    python -m clipbert_legacy.tasks.score_videos --output_dir output/demo_frameqa --videos clips/ \\
        --questions "what color is the shape?" [--questions_file qs.txt]

The run is a training output_dir (its stored model config and latest or ``--inference_model_step``
checkpoint), or ``--config X --e2e_weights_path model.pt``; any other config flag (``--num_frm``,
``--inference_n_clips``, ``--score_agg_func``) passes through. The videos go through the same decoding,
frame sampling and scoring as the task's inference (a temporary LMDB and annotation file), so the
scores equal what inference would compute. Videos that cannot be decoded are listed, not dropped.
Rank 0 prints a table, or JSON with ``--json``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import lmdb
import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.config import parse_args_or_exit
from clipbert_legacy.datasets.build import build_retrieval_datasets
from clipbert_legacy.datasets.dataset_video_qa import OPEN_ENDED_QA
from clipbert_legacy.modeling.heads import aggregate_clip_logits
from clipbert_legacy.tasks.bad_videos import gather_bad_videos
from clipbert_legacy.tasks.base import forward_clips, progress_over
from clipbert_legacy.tasks.cpu import limit_cpu_threads
from clipbert_legacy.tasks.run_video_qa import VideoQATask, label2ans_for
from clipbert_legacy.tasks.run_video_retrieval import RetrievalTask, score_retrieval
from clipbert_legacy.utils.errors import UserError, one_line
from clipbert_legacy.utils.logger import setup_logging

VIDEO_EXTS = (".mp4", ".avi", ".webm", ".mkv", ".mov", ".m4v", ".gif")


def _parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    ap.add_argument("--videos", nargs="+", required=True, help="video files and/or folders of videos")
    texts = ap.add_mutually_exclusive_group(required=True)
    texts.add_argument("--captions", nargs="+", help="captions to rank for each video (retrieval model)")
    texts.add_argument("--captions_file", help="a file with one caption per line")
    texts.add_argument("--questions", nargs="+", help="questions to answer for each video (QA model)")
    texts.add_argument("--questions_file", help="a file with one question per line")
    ap.add_argument("--top_k", type=int, default=5, help="captions / answers shown per video")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return ap.parse_known_args(argv)


def collect_videos(paths: list[str]) -> dict[str, str]:
    """{key (file stem): path} of the files and the videos in the folders; equal stems are an error."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.lower().endswith(VIDEO_EXTS))
        elif os.path.isfile(p):
            files.append(p)
        else:
            raise FileNotFoundError(f"--videos {p!r} is neither a file nor a folder")
    if not files:
        raise FileNotFoundError(f"--videos {paths}: no video files ({', '.join(VIDEO_EXTS)})")
    out = {}
    for f in files:
        key = os.path.splitext(os.path.basename(f))[0]
        if key in out:
            raise ValueError(f"--videos: {out[key]!r} and {f!r} have the same name {key!r}; rename one")
        out[key] = f
    return out


def _texts(given, path, what):
    if given is not None:
        texts = given
    else:
        with open(path, encoding="utf-8-sig") as f:
            texts = [ln.strip() for ln in f if ln.strip()]
    if not texts or not all(t.strip() for t in texts):
        raise ValueError(f"no (or empty) {what} given; pass non-empty --{what} or --{what}_file")
    return texts


def _write_inputs(tmp, videos, rows):
    """The temporary LMDB of the video bytes and the annotation file the task's dataset reads."""
    env = lmdb.open(os.path.join(tmp, "vis_db"), map_size=sum(os.path.getsize(p) for p in videos.values())
                    + 2 ** 24)
    with env.begin(write=True) as txn:
        for key, path in videos.items():
            with open(path, "rb") as f:
                txn.put(key.encode("utf-8"), f.read())
    env.close()
    with open(os.path.join(tmp, "texts.jsonl"), "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def rank_captions(cfg, captions, keys, top_k):
    task = RetrievalTask()
    model, _ = task.prepare_inference(cfg)
    ds, collate = build_retrieval_datasets(cfg, "inference", vid_ids=keys)
    results = score_retrieval(model, task.retrieval_loader(ds, collate, cfg), cfg)
    by_vid = {k: [] for k in keys}
    for r in results:
        by_vid[r["vid_id"]].append({"caption": captions[r["txt_id"]], "score": round(r["score"], 4)})
    ranked = {k: sorted(v, key=lambda d: -d["score"])[:top_k] for k, v in by_vid.items() if v}
    return ranked, gather_bad_videos(ds)


@torch.no_grad()
def answer_questions(cfg, _questions, _keys, top_k):  # rank_captions' signature: the texts are in cfg
    task = VideoQATask()
    model, _ = task.prepare_inference(cfg)  # the run's task (frameqa, action, ...) comes with its config
    if cfg.task not in OPEN_ENDED_QA:
        raise ValueError(f"task {cfg.task} chooses among given options; score_videos answers open-ended "
                         f"questions ({', '.join(sorted(OPEN_ENDED_QA))} models)")
    ds, loader = task.qa_loader(cfg, "inference")
    label2ans = label2ans_for(ds)
    out = {}
    for batch in progress_over(loader, "video QA"):
        if batch is None:
            continue
        stacked = forward_clips(model, batch, cfg.inference_n_clips, cfg.num_frm).float()
        logits = aggregate_clip_logits(stacked, cfg.score_agg_func)
        probs = torch.softmax(logits, dim=-1)
        top = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
        for qid, p, idx in zip(batch["question_ids"], top.values.tolist(), top.indices.tolist()):
            d = ds.qid2data[qid]
            answers = [{"answer": label2ans.get(i, str(i)), "prob": round(v, 4)} for v, i in zip(p, idx)]
            out.setdefault(d["vid_id"], []).append({"question": d["question"], "answers": answers})
    return out, gather_bad_videos(ds)


def _print_table(result, bad, kind):
    for key, items in result.items():
        print(f"== {key}")
        if kind == "captions":
            for i, c in enumerate(items, 1):
                print(f"  {i}. {c['score']:.4f}  {c['caption']}")
        else:
            for q in items:
                print(f"  Q: {q['question']}")
                print("     " + "; ".join(f"{a['answer']} ({a['prob']:.3f})" for a in q["answers"]))
    for key, reason in bad:
        print(f"== {key}: not scored, the video could not be decoded ({reason})")


def run(argv=None) -> int:
    own, rest = _parse(argv)
    videos = collect_videos(own.videos)
    kind = "captions" if own.captions is not None or own.captions_file else "questions"
    texts = _texts(own.captions if kind == "captions" else own.questions,
                   own.captions_file if kind == "captions" else own.questions_file, kind)
    with tempfile.TemporaryDirectory(prefix="score_videos_") as tmp:
        first = next(iter(videos))
        rows = ([{"caption": t, "clip_name": first} for t in texts] if kind == "captions" else
                [{"question": q, "video_id": k} for k in videos for q in texts])
        _write_inputs(tmp, videos, rows)
        task = RetrievalTask if kind == "captions" else VideoQATask
        cfg = parse_args_or_exit(task.name, rest + [
            "--do_inference", "1", "--inference_txt_db", os.path.join(tmp, "texts.jsonl"),
            "--inference_img_db", os.path.join(tmp, "vis_db"), "--skip_bad_videos", "1"])
        score = rank_captions if kind == "captions" else answer_questions
        result, bad = score(cfg, texts, list(videos), own.top_k)
    if hvd.rank() == 0:
        if own.json:
            print(json.dumps({"videos": {k: {"path": videos[k], kind: v} for k, v in result.items()},
                              "not_scored": [{"key": k, "path": videos[k], "reason": r} for k, r in bad]},
                             indent=1))
        else:
            _print_table(result, bad, kind)
    return 0


def main(argv=None) -> int:
    limit_cpu_threads()
    setup_logging()
    try:
        return run(argv)
    except (UserError, FileNotFoundError, ValueError, KeyError, OSError) as e:
        if os.environ.get("CLIPBERT_TRACEBACK"):
            raise
        print(f"error: {one_line(e)}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
