"""Build (dataset, collator) per task from a ClipBERT config attribute-dict.

Keys read: train_datasets / val_datasets ([{name, txt, img}], element 0; `txt` may be a dict keyed
by task), inference_txt_db / inference_img_db (split "inference"), tokenizer_dir, max_txt_len,
max_img_size, img_resize, fps, num_frm, frm_sampling_strategy, train_n_clips, inference_n_clips,
random_sample_clips, max_n_example_per_group, itm_neg_size, ans2label_path, task,
skip_bad_videos, data_ratio, max_eval_examples, seed, eval_retrieval_batch_size / inference_batch_size,
min_video_frames, max_frame_pixels. Defaults are the config schema's (a plain dict is completed by
``clipbert_legacy.config.with_defaults``). When `txt` is a dict, the key is the task: cfg.task for
video QA, "retrieval" for retrieval and "msrvtt_mc" for MC.

Clip plans (as in ClipBERT's dataloaders): training samples `train_n_clips` clips with the configured
strategy, independently if `random_sample_clips` else uniformly with the duration safeguard; retrieval
and MC evaluation use "middle" for "rand", 1 clip by strategy or `inference_n_clips` uniform
clips; QA evaluation always uses uniform clips (1 clip = the video start).
"""
import logging
import random
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

from clipbert_legacy.config import Config, with_defaults
from clipbert_legacy.config.options import MSRVTT_MC, RETRIEVAL, VIDEO_QA, load_ans2label
from clipbert_legacy.datasets.data_utils import mk_input_group
from clipbert_legacy.datasets.dataset_mc import VideoMCCollator, VideoMCDataset, mk_mc_examples
from clipbert_legacy.datasets.dataset_retrieval import (
    VideoRetrievalCollator,
    VideoRetrievalDataset,
    VideoRetrievalEvalDataset,
    mk_retrieval_examples,
)
from clipbert_legacy.datasets.dataset_video_qa import (
    OPEN_ENDED_QA,
    QA_TASKS,
    VideoQACollator,
    VideoQADataset,
    mk_qa_examples,
)
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.datasets.multi import MultiDataset

if TYPE_CHECKING:
    from transformers import BertTokenizerFast

logger = logging.getLogger(__name__)
SPLITS = ("train", "val", "inference")


def load_tokenizer(tokenizer_dir: str) -> "BertTokenizerFast":
    """BertTokenizerFast from a local directory (vocab.txt / tokenizer.json); ``pkg:`` paths allowed."""
    from transformers import BertTokenizerFast

    from clipbert_legacy.utils.pretrained_paths import local_path
    if not tokenizer_dir:
        raise ValueError("config key tokenizer_dir is missing; point it at a folder with vocab.txt")
    tokenizer_dir = local_path(tokenizer_dir, "tokenizer_dir")
    try:
        return BertTokenizerFast.from_pretrained(tokenizer_dir)
    except Exception as e:
        raise ValueError(f"cannot load a BERT tokenizer from tokenizer_dir={tokenizer_dir!r} ({e}); "
                         f"point it at a folder with vocab.txt") from None


def _txt_img(cfg, split, task=None):
    """(txt path, img lmdb dir, dataset name) for the split."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} must be one of {SPLITS}")
    if split == "inference" and cfg.inference_txt_db:
        txt, img, name = cfg.inference_txt_db, cfg.inference_img_db, "inference"
        if not img:
            img = _dataset_entry(cfg, "val")["img"]
    else:
        entry = _dataset_entry(cfg, "train" if split == "train" else "val")
        txt, img, name = entry["txt"], entry["img"], entry.get("name", split)
    if isinstance(txt, dict):
        if task not in txt:
            raise KeyError(f"{split} dataset txt is keyed by task ({sorted(txt)}) but task={task!r} is not "
                           "one of them")
        txt = txt[task]
    if isinstance(txt, (list, tuple)):
        if len(txt) != 1:
            raise ValueError(f"{split} dataset gives {len(txt)} txt files; video tasks take one")
        txt = txt[0]
    return txt, img, name


def _multi_train(cfg, build):
    """Several ``train_datasets``: each built alone, joined in a MultiDataset whose batches the engine
    draws per step in proportion to each entry's ``ratio`` (default 1), as ClipBERT's MetaLoader."""
    parts, collate = [], None
    for i, entry in enumerate(cfg.train_datasets):
        sub = Config(cfg)
        sub.train_datasets = [entry]
        ds, collate = build(sub, "train")
        parts.append((ds, entry.get("ratio", 1), entry.get("name", f"train{i}")))
    return MultiDataset.join(parts), collate


def _dataset_entry(cfg, which):
    key = "train_datasets" if which == "train" else "val_datasets"
    lst = cfg[key]
    if not lst:
        raise ValueError(f"config key {key} is missing or empty; give [{{name, txt, img}}]")
    entry = lst[0]
    for k in ("txt", "img"):
        if k not in entry:
            raise ValueError(f"{key}[0] has no {k!r} field; present: {sorted(entry)}")
    return entry


def _apply_data_ratio(rows, cfg, split):
    """ClipBERT's ``data_ratio``: a seeded random fraction of the *training* annotations (validation and
    inference always use every example, so their metrics stay comparable across runs)."""
    if split != "train":
        return rows
    ratio = float(cfg.data_ratio)
    if not 0 < ratio <= 1:
        raise ValueError(f"data_ratio must be in (0, 1], got {ratio}")
    if ratio < 1.0:  # ClipBERT: shuffle then keep int(n * r); seeded so all ranks agree
        rows = list(rows)
        random.Random(cfg.seed).shuffle(rows)
        rows = rows[:max(1, int(len(rows) * ratio))]
    return rows


def apply_eval_subset(rows, cfg, split, source):
    """``max_eval_examples N`` (a quick check, as Hugging Face's ``max_eval_samples``): validation and
    inference keep the first N rows of the annotation file, so every id stays its row (ClipBERT's caption
    ids); retrieval scores those captions against their videos. Training is never cut (``data_ratio``
    is for that). Logged, never silent."""
    n = int(cfg.max_eval_examples or 0)
    if split == "train" or n <= 0 or n >= len(rows):
        return rows
    logger.warning("%s: %s uses the first %d of %d examples (--max_eval_examples %d): its scores are over "
                   "that subset, not the whole file", source, split, n, len(rows), n)
    return rows[:n]


def _common(cfg, name, is_train):
    return {"fps": cfg.fps, "num_frm": cfg.num_frm,
            "max_img_size": cfg.max_img_size, "img_resize": cfg.img_resize, "is_train": is_train,
            "skip_bad_videos": bool(cfg.skip_bad_videos),
            "min_video_frames": cfg.min_video_frames, "max_frame_pixels": cfg.max_frame_pixels, "name": name}


def _train_clips(cfg):
    n = int(cfg.train_n_clips)
    rand = bool(cfg.random_sample_clips)
    return {"n_clips": n, "clip_mode": "strategy" if (n == 1 or rand) else "uniform",
            "frm_sampling_strategy": cfg.frm_sampling_strategy}


def _eval_clips(cfg):
    n = int(cfg.inference_n_clips)
    strategy = cfg.frm_sampling_strategy
    strategy = "middle" if strategy == "rand" else strategy
    return {"n_clips": n, "clip_mode": "strategy" if n == 1 else "uniform", "frm_sampling_strategy": strategy}


def build_retrieval_datasets(
        cfg: Mapping[str, Any], split: str, vid_ids: Optional[list[str]] = None,
) -> tuple[Union[VideoRetrievalDataset, VideoRetrievalEvalDataset], VideoRetrievalCollator]:
    """(dataset, collator) for retrieval. split "train": VideoRetrievalDataset over groups of
    `max_n_example_per_group` captions with `itm_neg_size` negatives; "val"/"inference":
    VideoRetrievalEvalDataset (batch_size 1; captions chunked by eval_retrieval_batch_size or
    inference_batch_size; ``vid_ids`` adds videos to score beyond the ground truth)."""
    cfg = with_defaults(cfg, RETRIEVAL.name)
    if split == "train" and len(cfg.train_datasets or []) > 1:
        return _multi_train(cfg, build_retrieval_datasets)
    txt, img, name = _txt_img(cfg, split, RETRIEVAL.name)
    rows = _apply_data_ratio(load_jsonl(txt, required_fields=("caption", "clip_name"),
                                        str_fields=("caption",)), cfg, split)
    examples = mk_retrieval_examples(apply_eval_subset(rows, cfg, split, txt))
    tokenizer = load_tokenizer(cfg.tokenizer_dir)
    collator = VideoRetrievalCollator(tokenizer, cfg.max_txt_len)
    if split == "train":
        grouped = defaultdict(list)
        for e in examples:
            grouped[e["vid_id"]].append(e)
        groups = mk_input_group(grouped, max_n_example_per_group=int(cfg.max_n_example_per_group),
                                is_train=True)
        ds = VideoRetrievalDataset(groups, img, itm_neg_size=cfg.itm_neg_size,
                                   **_common(cfg, f"{name}_train", True), **_train_clips(cfg))
    else:
        bs_key = "inference_batch_size" if split == "inference" else "eval_retrieval_batch_size"
        ds = VideoRetrievalEvalDataset(examples, img, caption_batch_size=cfg[bs_key], vid_ids=vid_ids,
                                       **_common(cfg, f"{name}_{split}", False), **_eval_clips(cfg))
    return ds, collator


def build_qa_datasets(cfg: Mapping[str, Any], split: str) -> tuple[VideoQADataset, VideoQACollator]:
    """(dataset, collator) for video QA (cfg.task in frameqa|msrvtt_qa|action|transition).
    Training groups 1 question per item (ClipBERT forces max_n_example_per_group=1 for QA)."""
    cfg = with_defaults(cfg, VIDEO_QA.name)
    if split == "train" and len(cfg.train_datasets or []) > 1:
        return _multi_train(cfg, build_qa_datasets)
    task = cfg.task
    if task not in QA_TASKS:
        raise ValueError(f"config task={task!r} must be one of {QA_TASKS}")
    txt, img, name = _txt_img(cfg, split, task)
    any_of = ("gif_name", "video_id")
    rows = _apply_data_ratio(load_jsonl(txt, required_fields=("question",), any_of_fields=any_of,
                                        str_fields=("question",)), cfg, split)
    rows = apply_eval_subset(rows, cfg, split, txt)
    examples = mk_qa_examples(rows, task, txt)
    has_answers = all(e["answer"] is not None for e in examples)
    if split == "train" and not has_answers:
        missing = next(i for i, e in enumerate(examples) if e["answer"] is None)
        raise ValueError(f"{txt}: example {missing + 1} has no 'answer'; training needs answers")
    ans2label = None
    if task in OPEN_ENDED_QA:
        path = cfg.ans2label_path
        if not path:
            raise ValueError(f"task {task} needs ans2label_path (a JSON {{answer: label}})")
        ans2label = load_ans2label(path)
    grouped = defaultdict(list)
    for e in examples:
        grouped[e["vid_id"]].append(e)
    is_train = split == "train"
    groups = mk_input_group(grouped, max_n_example_per_group=1, is_train=is_train,
                            example_unique_key="question_id")
    if is_train:
        clips = _train_clips(cfg)
    else:  # ClipBERT's QA eval: always uniform clips
        clips = {"n_clips": int(cfg.inference_n_clips), "clip_mode": "uniform",
                 "frm_sampling_strategy": "uniform"}
    ds = VideoQADataset(task, groups, img, ans2label=ans2label, return_label=has_answers,
                        **_common(cfg, f"{name}_{task}_{split}", is_train), **clips)
    collator = VideoQACollator(load_tokenizer(cfg.tokenizer_dir), cfg.max_txt_len, task)
    return ds, collator


def build_mc_dataset(cfg: Mapping[str, Any],
                     split: str = "inference") -> tuple[VideoMCDataset, VideoMCCollator]:
    """(dataset, collator) for MSRVTT-MC style evaluation (jsonl {qid, clip_name, options, answer})."""
    cfg = with_defaults(cfg, MSRVTT_MC.name)
    txt, img, name = _txt_img(cfg, split, MSRVTT_MC.name)
    rows = _apply_data_ratio(load_jsonl(txt, required_fields=("qid", "clip_name", "options")), cfg, split)
    rows = apply_eval_subset(rows, cfg, split, txt)
    ds = VideoMCDataset(mk_mc_examples(rows, txt), img, **_common(cfg, f"{name}_mc", False),
                        **_eval_clips(cfg))
    return ds, VideoMCCollator(load_tokenizer(cfg.tokenizer_dir), cfg.max_txt_len)

