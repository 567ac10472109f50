"""Build (dataset, collator) for image-text pretraining from a config (ClipBERT's pretraining loaders).

Training reads *every* ``train_datasets`` entry ``{name, txt, img[, vis_format, ratio]}`` (captions
grouped ``max_n_example_per_group`` per image, one CNN pass for them) and joins several in a
MultiDataset, whose batches the engine draws by ``ratio`` (ClipBERT's MetaLoader). Validation returns
one dataset per ``val_datasets`` entry (one caption per item), evaluated and reported by name.
"""
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from clipbert_legacy.config import with_defaults
from clipbert_legacy.config.options_pretrain import PRETRAIN
from clipbert_legacy.datasets.build import _apply_data_ratio, _common, apply_eval_subset, load_tokenizer
from clipbert_legacy.datasets.data_utils import mk_input_group
from clipbert_legacy.datasets.dataset_pretrain import PretrainCollator, PretrainDataset, mk_pretrain_examples
from clipbert_legacy.datasets.jsonl import load_jsonl
from clipbert_legacy.datasets.multi import MultiDataset


def _entry_dataset(cfg, entry, i, split):
    for k in ("txt", "img"):
        if k not in entry:
            raise ValueError(f"{split}_datasets[{i}] has no {k!r} field; present: {sorted(entry)}")
    txt = entry["txt"][0] if isinstance(entry["txt"], (list, tuple)) else entry["txt"]
    name = entry.get("name", f"{split}{i}")
    rows = load_jsonl(txt, required_fields=("caption",), str_fields=("caption",))
    rows = apply_eval_subset(_apply_data_ratio(rows, cfg, split), cfg, split, txt)
    examples = mk_pretrain_examples(rows, txt)
    grouped = defaultdict(list)
    for e in examples:
        grouped[e["img_id"]].append(e)
    is_train = split == "train"
    group = int(cfg.max_n_example_per_group) if is_train else 1
    groups = mk_input_group(grouped, max_n_example_per_group=group, is_train=is_train)
    strategy = cfg.frm_sampling_strategy if is_train else "middle"
    ds = PretrainDataset(groups, entry["img"], vis_format=entry.get("vis_format", "image"),
                         itm_neg_prob=float(cfg.itm_neg_prob),
                         split_objectives=bool(cfg.split_mlm_itm and cfg.use_mlm and cfg.use_itm),
                         **_common(cfg, f"{name}_{split}", is_train),
                         n_clips=1, clip_mode="strategy", frm_sampling_strategy=strategy)
    return ds, entry.get("ratio", 1), name


def build_pretrain_datasets(cfg: Mapping[str, Any], split: str):
    """train: (dataset or MultiDataset, collator); val: ([(name, dataset)], collator)."""
    cfg = with_defaults(cfg, PRETRAIN.name)
    key = "train_datasets" if split == "train" else "val_datasets"
    entries = cfg[key]
    if not entries:
        raise ValueError(f"config key {key} is missing or empty; give "
                         f"[{{name, txt, img[, vis_format, ratio]}}]")
    parts = [_entry_dataset(cfg, e, i, "train" if split == "train" else "val") for i, e in enumerate(entries)]
    collator = PretrainCollator(load_tokenizer(cfg.tokenizer_dir), cfg.max_txt_len)
    if split != "train":
        return [(name, ds) for ds, _, name in parts], collator
    if len(parts) == 1:
        return parts[0][0], collator
    return MultiDataset.join(parts), collator
