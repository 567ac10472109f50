"""Command line of the annotation converters (see the package docstring for the commands).

Each subcommand converts everything in memory, then writes all its files under --output_dir or none
(a failing run leaves no partial output) and prints one line per file with its row count and what was
left out; a bad input entry prints `error: where: reason` and exits 1.
"""
import argparse
import os
import sys

from clipbert_legacy.preprocessing.converters import (
    coco,
    msrvtt,
    msrvtt_qa,
    paragraphs,
    tgif_qa,
    visual_genome,
    vqa,
)
from clipbert_legacy.preprocessing.converters.common import write_all

MC_FILE = "msrvtt_retrieval_mc_test.jsonl"  # the name ClipBERT's MC inference command reads


def _vocab_note(ans2label, n_distinct, n_left_out, train_name):
    return (f"{len(ans2label)} answers (of {n_distinct} distinct training answers); {n_left_out} training "
            f"rows with other answers left out of {train_name}")


def run_msrvtt_ret(a):
    rows = msrvtt.convert_retrieval(a.videodata, a.test_csv, a.train_list, a.n_val_videos, a.seed)
    out = {f"{s}.jsonl": rows[s] for s in ("train", "val", "test")}
    if a.mc_csv:
        out[MC_FILE] = msrvtt.convert_mc(a.mc_csv)
    return out, {}


def run_msrvtt_mc(a):
    return {MC_FILE: msrvtt.convert_mc(a.mc_csv)}, {}


def run_msrvtt_qa(a):
    paths = {s: os.path.join(a.raw_dir, f"{s}_qa.json") for s in ("train", "val", "test")}
    paths = {s: p for s, p in paths.items() if s == "train" or os.path.isfile(p)}
    n_distinct = len({r["answer"] for r in msrvtt_qa.convert_split(paths["train"])})
    rows, ans2label, left_out = msrvtt_qa.convert_msrvtt_qa(paths, a.top_k)
    out = {f"{s}.jsonl": r for s, r in rows.items()}
    out["train_ans2label.json"] = ans2label
    return out, {"train_ans2label.json": _vocab_note(ans2label, n_distinct, left_out, "train.jsonl")}


def run_tgif_qa(a):
    out, notes = {}, {}
    for task in a.tasks:
        train_csv = os.path.join(a.raw_dir, f"Train_{task}_question.csv")
        test_csv = os.path.join(a.raw_dir, f"Test_{task}_question.csv")
        rows, ans2label, left_out = tgif_qa.convert_tgif_qa(task, train_csv, test_csv, a.val_ratio, a.top_k,
                                                            a.seed)
        out.update({f"{task}_{s}.jsonl": rows[s] for s in ("train", "val", "test")})
        if ans2label is not None:
            n_distinct = len({r["answer"] for r in tgif_qa.convert_file(task, train_csv)})
            out["frameqa_trainval_ans2label.json"] = ans2label
            notes["frameqa_trainval_ans2label.json"] = _vocab_note(ans2label, n_distinct, left_out,
                                                                   "frameqa_train.jsonl")
    return out, notes


# output file -> raw file, per dataset (ClipBERT's names: its ANet config validates on dev.jsonl = val_1)
PARAGRAPH_FILES = {"didemo_ret": {"train.jsonl": "train_data.json", "val.jsonl": "val_data.json",
                                  "test.jsonl": "test_data.json"},
                   "anet_ret": {"train.jsonl": "train.json", "dev.jsonl": "val_1.json"}}


def run_paragraphs(a):
    convert = paragraphs.convert_didemo if a.dataset == "didemo_ret" else paragraphs.convert_anet
    files = dict(PARAGRAPH_FILES[a.dataset])
    if a.dataset == "anet_ret" and a.test_file:
        files["test.jsonl"] = a.test_file
    out, notes = {}, {}
    for name, raw in files.items():
        path = os.path.join(a.raw_dir, raw)
        if a.dataset == "didemo_ret" and name == "test.jsonl" and not os.path.isfile(path):
            notes[name] = f"not written: {path} not found"
            continue
        out[name] = convert(path)
    return out, notes


def run_vqa(a):
    rows, ans2label = vqa.convert_vqa_k(a.raw_dir, a.min_count, a.image_key, _karpathy_test(a))
    out = {f"{name}.jsonl": r for name, r in rows.items()}
    out["trainval_ans2label.json"] = ans2label
    return out, {"trainval_ans2label.json": f"{len(ans2label)} answers (most common answer of at least "
                                            f"{a.min_count} vqa_k_trainval questions)"}


def _karpathy_test(a):
    if not a.karpathy_split:
        return None
    return {i for i, s in coco.karpathy_splits(a.karpathy_split).items() if s == "test"}


def run_coco_captions(a):
    rows, skipped = coco.convert_coco_captions(a.captions_train, a.captions_val, a.karpathy_split)
    return {f"{n}.jsonl": r for n, r in rows.items()}, {"coco_train_captions.jsonl": _skips(skipped)}


def _vg_inputs(a):
    stems = coco.image_stems(a.coco_annotations)
    val_ids = {i for i, stem in stems.items() if "_val2014_" in stem}  # COCO_val2014_000000000042
    if not a.karpathy_split and not val_ids:
        raise ValueError("--coco_annotations: give captions_val2014.json (its images are held out), or "
                         "--karpathy_split dataset_coco.json")
    return visual_genome.coco_ids(a.image_data), stems, coco.held_out_ids(val_ids, a.karpathy_split)


def run_vg_captions(a):
    vg2coco, _, held = _vg_inputs(a)
    rows, skipped = visual_genome.convert_vg_captions(a.region_descriptions, vg2coco, held, a.n_val_images,
                                                      a.seed)
    return {f"{n}.jsonl": r for n, r in rows.items()}, {"vg_train_captions.jsonl": _skips(skipped)}


def run_vg_qa(a):
    from clipbert_legacy.config.options import load_ans2label
    vg2coco, stems, held = _vg_inputs(a)
    rows, skipped = visual_genome.convert_vg_qa(a.question_answers, vg2coco, stems, held,
                                                load_ans2label(a.ans2label))
    return {f"{n}.jsonl": r for n, r in rows.items()}, {"vg_k_trainval.jsonl": _skips(skipped)}


def _skips(skipped):
    return "left out: " + ", ".join(f"{n} {what}" for what, n in skipped.items())


def _add_commands(sub):
    """The dataset sub-commands and their inputs; returns the parsers (each gets --output_dir, --seed)."""
    r = sub.add_parser("msrvtt_ret", help="MSRVTT retrieval (+ MSRVTT-MC with --mc_csv)")
    r.add_argument("--videodata", nargs="+", required=True, help="train_val_videodatainfo.json "
                   "[test_videodatainfo.json] (MSR-VTT) or CLIP4Clip's MSRVTT_data.json")
    r.add_argument("--test_csv", required=True, help="the 1k-A split, MSRVTT_JSFUSION_test.csv")
    r.add_argument("--train_list", help="MSRVTT_train.7k.csv or MSRVTT_train.9k.csv (default: official "
                                        "train+validate videos)")
    r.add_argument("--n_val_videos", type=int, default=0, help="hold out this many training videos as "
                                                                "val.jsonl (0: val.jsonl = the 1k-A test)")
    r.add_argument("--mc_csv", help=f"MSR_MC_test.csv -> {MC_FILE}")
    m = sub.add_parser("msrvtt_mc", help=f"MSRVTT multiple choice (JSFusion's MSR_MC_test.csv) -> {MC_FILE}")
    m.add_argument("--mc_csv", required=True, help="MSR_MC_test.csv (tab-separated; vid_key or video_id)")
    q = sub.add_parser("msrvtt_qa", help="MSRVTT-QA ({train,val,test}_qa.json)")
    q.add_argument("--raw_dir", required=True, help="folder with train_qa.json, val_qa.json, test_qa.json")
    q.add_argument("--top_k", type=int, default=msrvtt_qa.DEFAULT_TOP_K, help="answer vocabulary size")
    t = sub.add_parser("tgif_qa", help="TGIF-QA (Train_/Test_{task}_question.csv)")
    t.add_argument("--raw_dir", required=True, help="tgif-qa's dataset/ folder")
    t.add_argument("--tasks", nargs="+", choices=tgif_qa.TASKS, default=list(tgif_qa.TASKS))
    t.add_argument("--val_ratio", type=float, default=0.0, help="fraction of training GIFs held out as "
                                                                 "{task}_val.jsonl (0: val = test)")
    t.add_argument("--top_k", type=int, default=tgif_qa.DEFAULT_TOP_K, help="frameqa answer vocabulary size")
    d = sub.add_parser("didemo_ret", help="DiDeMo paragraph retrieval ({train,val,test}_data.json)")
    d.add_argument("--raw_dir", required=True, help="folder with train_data.json, val_data.json "
                                                    "[, test_data.json]")
    n = sub.add_parser("anet_ret", help="ActivityNet Captions paragraph retrieval (train.json, val_1.json "
                                        "-> train.jsonl, dev.jsonl)")
    n.add_argument("--raw_dir", required=True, help="folder with train.json and val_1.json")
    n.add_argument("--test_file", help="also write test.jsonl from this raw file (e.g. val_2.json)")
    v = sub.add_parser("vqa", help="VQA 2.0 -> vqa_k_trainval.jsonl, vqa_k_test.jsonl, "
                                   "trainval_ans2label.json")
    v.add_argument("--raw_dir", required=True, help="folder with v2_OpenEnded_mscoco_*_questions.json and "
                                                    "v2_mscoco_*_annotations.json")
    v.add_argument("--min_count", type=int, default=vqa.DEFAULT_MIN_COUNT,
                   help="keep answers that are the most common answer of at least this many questions")
    v.add_argument("--image_key", choices=("coco", "id"), default="coco",
                   help="image_id as COCO's file stem (COCO_val2014_000000000042, file2lmdb's key) or the "
                        "bare integer id")
    c = sub.add_parser("coco_captions", help="COCO captions -> coco_{train,val}_captions.jsonl (pretraining)")
    c.add_argument("--captions_train", required=True, help="captions_train2014.json")
    c.add_argument("--captions_val", required=True, help="captions_val2014.json")
    g = sub.add_parser("vg_captions", help="Visual Genome region descriptions -> "
                                           "vg_{train,val}_captions.jsonl")
    g.add_argument("--region_descriptions", required=True, help="region_descriptions.json")
    g.add_argument("--n_val_images", type=int, default=5000, help="VG images (seeded) for vg_val_captions")
    k = sub.add_parser("vg_qa", help="Visual Genome QA on COCO images -> vg_k_trainval.jsonl (VQA config)")
    k.add_argument("--question_answers", required=True, help="question_answers.json")
    k.add_argument("--ans2label", required=True, help="the VQA converter's trainval_ans2label.json")
    for s in (g, k):
        s.add_argument("--image_data", required=True, help="VG's image_data.json (its coco_id links)")
        s.add_argument("--coco_annotations", nargs="+", required=True,
                       help="captions_train2014.json captions_val2014.json (COCO file names and splits)")
    for s in (v, c, g, k):
        s.add_argument("--karpathy_split", help="Karpathy's dataset_coco.json: hold out its test images "
                                                "(default: hold out all of val2014)")
    return (r, m, q, t, d, n, v, c, g, k)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m clipbert_legacy.preprocessing.converters",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for s in _add_commands(p.add_subparsers(dest="dataset", required=True)):
        s.add_argument("--output_dir", required=True)
        s.add_argument("--seed", type=int, default=42)
    return p


RUN = {"msrvtt_ret": run_msrvtt_ret, "msrvtt_mc": run_msrvtt_mc, "msrvtt_qa": run_msrvtt_qa,
       "tgif_qa": run_tgif_qa, "didemo_ret": run_paragraphs, "anet_ret": run_paragraphs, "vqa": run_vqa,
       "coco_captions": run_coco_captions, "vg_captions": run_vg_captions, "vg_qa": run_vg_qa}


def main(argv=None, log=print):
    from clipbert_legacy.config.schema import ConfigError
    args = build_parser().parse_args(argv)
    try:
        out, notes = RUN[args.dataset](args)
        write_all({os.path.join(args.output_dir, name): payload for name, payload in out.items()})
    except (ValueError, ConfigError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    for name, payload in out.items():
        if name.endswith(".jsonl"):
            what = f"{len(payload)} rows" + (f"; {notes[name]}" if name in notes else "")
        else:
            what = notes.get(name, f"{len(payload)} entries")
        log(f"{os.path.join(args.output_dir, name)}: {what}")
    for name, note in notes.items():
        if name not in out:
            log(f"{os.path.join(args.output_dir, name)}: {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
