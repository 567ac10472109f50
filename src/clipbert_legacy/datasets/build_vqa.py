"""Build (dataset, collator) for VQA from a config: ClipBERT's ``mk_vqa_dataloader`` data part.

Split "train" / "val" read ``train_datasets[0]`` / ``val_datasets[0]`` (``txt`` a path or a list of
paths, concatenated: ClipBERT trains on VQA + Visual Genome questions; ``img`` the image LMDB),
"inference" ``inference_txt_db`` / ``inference_img_db``. Several ``train_datasets`` entries (each
with its own images) are mixed per step by ``ratio``, as for the other tasks (clipbert_legacy.datasets.multi).
Training groups ``max_n_example_per_group`` questions per image (one CNN pass for them), evaluation one.
"""
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from clipbert_legacy.config import with_defaults
from clipbert_legacy.config.options import load_ans2label
from clipbert_legacy.config.options_vqa import VQA
from clipbert_legacy.datasets.build import (
    _apply_data_ratio,
    _common,
    _dataset_entry,
    _multi_train,
    apply_eval_subset,
    load_tokenizer,
)
from clipbert_legacy.datasets.data_utils import mk_input_group
from clipbert_legacy.datasets.dataset_vqa import VQACollator, VQADataset, mk_vqa_examples
from clipbert_legacy.datasets.jsonl import load_jsonl


def _paths(cfg, split):
    """([txt paths], img lmdb dir, dataset name) of the split."""
    if split == "inference" and cfg.inference_txt_db:
        if not cfg.inference_img_db and not cfg.val_datasets:
            raise ValueError("--inference_img_db is not set: give the image LMDB of inference_txt_db")
        img = cfg.inference_img_db or _dataset_entry(cfg, "val")["img"]
        return [cfg.inference_txt_db], img, "inference"
    if split not in ("train", "val", "inference"):
        raise ValueError(f"split={split!r} must be one of train|val|inference")
    entry = _dataset_entry(cfg, "train" if split == "train" else "val")
    txt = entry["txt"]
    if isinstance(txt, dict):
        if VQA.name not in txt:
            raise KeyError(f"{split} dataset txt is keyed by task ({sorted(txt)}) but has no 'vqa' entry")
        txt = txt[VQA.name]
    return (list(txt) if isinstance(txt, (list, tuple)) else [txt]), entry["img"], entry.get("name", split)


def build_vqa_datasets(cfg: Mapping[str, Any], split: str) -> tuple[VQADataset, VQACollator]:
    """(dataset, collator) of ``split`` (train | val | inference); unlabeled files only for inference."""
    cfg = with_defaults(cfg, VQA.name)
    if split == "train" and len(cfg.train_datasets or []) > 1:  # mixed per step by ratio, as other tasks
        return _multi_train(cfg, build_vqa_datasets)
    paths, img, name = _paths(cfg, split)
    rows = []
    for p in paths:
        rows.extend(load_jsonl(p, required_fields=("question", "image_id", "question_id"),
                               str_fields=("question",)))
    rows = apply_eval_subset(_apply_data_ratio(rows, cfg, split), cfg, split, ", ".join(paths))
    examples = mk_vqa_examples(rows, ", ".join(paths))
    has_labels = all(e["labels"] is not None for e in examples)
    is_train = split == "train"
    if is_train and not has_labels:
        missing = next(e["question_id"] for e in examples if e["labels"] is None)
        raise ValueError(f"{', '.join(paths)}: question_id {missing!r} has no 'labels' or 'answers'; "
                         f"training needs them")
    if not cfg.ans2label_path:
        raise ValueError("VQA needs ans2label_path (a JSON {answer: label} of the training answers)")
    grouped = defaultdict(list)
    for e in examples:
        grouped[e["img_id"]].append(e)
    group_size = int(cfg.max_n_example_per_group) if is_train else 1
    groups = mk_input_group(grouped, max_n_example_per_group=group_size, is_train=is_train,
                            example_unique_key="question_id")
    ds = VQADataset(groups, img, load_ans2label(cfg.ans2label_path), return_label=has_labels,
                    **_common(cfg, f"{name}_vqa_{split}", is_train))
    return ds, VQACollator(load_tokenizer(cfg.tokenizer_dir), cfg.max_txt_len)
