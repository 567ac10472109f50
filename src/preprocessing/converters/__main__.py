"""Command line of the annotation converters (see the package docstring for the commands).

Each subcommand writes its files under --output_dir and prints one line per file with its row count;
a bad input row prints `error: path:line: reason` and exits 1.
"""
import argparse
import os
import sys

from src.preprocessing.converters import msrvtt, msrvtt_qa, paragraphs, tgif_qa, vqa
from src.preprocessing.converters.common import write_json, write_jsonl


def _write_rows(out_dir, names_rows, log):
    for name, rows in names_rows:
        n = write_jsonl(os.path.join(out_dir, name), rows)
        log(f"{os.path.join(out_dir, name)}: {n} rows")


def _write_vocab(path, ans2label, n_train_answers, log):
    write_json(path, ans2label)
    log(f"{path}: {len(ans2label)} answers (of {n_train_answers} distinct training answers)")


def run_msrvtt_ret(a, log):
    rows = msrvtt.convert_retrieval(a.videodata, a.test_csv, a.train_list, a.n_val_videos, a.seed)
    _write_rows(a.output_dir, [(f"{s}.jsonl", rows[s]) for s in ("train", "val", "test")], log)
    if a.mc_csv:
        _write_rows(a.output_dir, [("msrvtt_retrieval_mc_test.jsonl", msrvtt.convert_mc(a.mc_csv))], log)


def run_msrvtt_qa(a, log):
    paths = {s: os.path.join(a.raw_dir, f"{s}_qa.json") for s in ("train", "val", "test")}
    paths = {s: p for s, p in paths.items() if s == "train" or os.path.isfile(p)}
    rows, ans2label = msrvtt_qa.convert_msrvtt_qa(paths, a.top_k)
    _write_rows(a.output_dir, [(f"{s}.jsonl", r) for s, r in rows.items()], log)
    n_distinct = len({r["answer"] for r in rows["train"]})
    _write_vocab(os.path.join(a.output_dir, "train_ans2label.json"), ans2label, n_distinct, log)


def run_tgif_qa(a, log):
    for task in a.tasks:
        train_csv = os.path.join(a.raw_dir, f"Train_{task}_question.csv")
        test_csv = os.path.join(a.raw_dir, f"Test_{task}_question.csv")
        rows, ans2label = tgif_qa.convert_tgif_qa(task, train_csv, test_csv, a.val_ratio, a.top_k, a.seed)
        _write_rows(a.output_dir, [(f"{task}_{s}.jsonl", rows[s]) for s in ("train", "val", "test")], log)
        if ans2label is not None:
            n_distinct = len({r["answer"] for r in rows["train"] + (rows["val"] if a.val_ratio else [])})
            _write_vocab(os.path.join(a.output_dir, "frameqa_trainval_ans2label.json"), ans2label,
                         n_distinct, log)


# output split name -> raw file name, per dataset (ClipBERT's ANet test is val_1)
PARAGRAPH_FILES = {"didemo": {"train": "train_data.json", "val": "val_data.json", "test": "test_data.json"},
                   "anet": {"train": "train.json", "val": "val_1.json", "test": "val_1.json"}}


def run_paragraphs(a, log):
    convert = paragraphs.convert_didemo if a.dataset == "didemo_ret" else paragraphs.convert_anet
    files = PARAGRAPH_FILES[a.dataset.split("_")[0]]
    if a.dataset == "anet_ret" and a.test_file:
        files = {**files, "test": a.test_file}
    for split, name in files.items():
        path = os.path.join(a.raw_dir, name)
        if split != "train" and not os.path.isfile(path):
            log(f"{path}: not found, no {split}.jsonl")
            continue
        _write_rows(a.output_dir, [(f"{split}.jsonl", convert(path))], log)


def run_vqa(a, log):
    rows, ans2label = vqa.convert_vqa(a.raw_dir, tuple(a.vocab_splits), a.min_count, a.image_key)
    _write_rows(a.output_dir, [(f"{s}.jsonl", r) for s, r in rows.items()], log)
    n_distinct = len({x for s in a.vocab_splits for r in rows[s] for x in r["answers"]})
    _write_vocab(os.path.join(a.output_dir, "train_ans2label.json"), ans2label, n_distinct, log)


def build_parser():
    p = argparse.ArgumentParser(prog="python -m src.preprocessing.converters", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="dataset", required=True)
    r = sub.add_parser("msrvtt_ret", help="MSRVTT retrieval (+ MSRVTT-MC with --mc_csv)")
    r.add_argument("--videodata", nargs="+", required=True,
                   help="train_val_videodata.json [test_videodata.json] or MSRVTT_data.json")
    r.add_argument("--test_csv", required=True, help="the 1k-A split, MSRVTT_JSFUSION_test.csv")
    r.add_argument("--train_list", help="MSRVTT_train.7k.csv or MSRVTT_train.9k.csv (default: official "
                                        "train+validate videos)")
    r.add_argument("--n_val_videos", type=int, default=0, help="hold out this many training videos as "
                                                                "val.jsonl (0: val.jsonl = the 1k-A test)")
    r.add_argument("--mc_csv", help="MSR_MC_test.csv -> msrvtt_retrieval_mc_test.jsonl")
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
    d.add_argument("--raw_dir", required=True,
                   help="folder with train_data.json, val_data.json, test_data.json")
    n = sub.add_parser("anet_ret", help="ActivityNet Captions paragraph retrieval (train.json, val_1.json)")
    n.add_argument("--raw_dir", required=True, help="folder with train.json and val_1.json")
    n.add_argument("--test_file", help="raw file for test.jsonl instead of val_1.json (e.g. val_2.json)")
    v = sub.add_parser("vqa", help="VQA 2.0 (v2_OpenEnded_mscoco_*_questions.json, "
                                   "v2_mscoco_*_annotations.json)")
    v.add_argument("--raw_dir", required=True, help="folder with the question and annotation files")
    v.add_argument("--vocab_splits", nargs="+", choices=("train", "val"), default=["train"],
                   help="splits whose answers make the vocabulary (ClipBERT's 3,129: train val)")
    v.add_argument("--min_count", type=int, default=vqa.DEFAULT_MIN_COUNT,
                   help="keep answers that are the most common answer of at least this many questions")
    v.add_argument("--image_key", choices=("coco", "id"), default="coco",
                   help="image_id as COCO's file stem (COCO_val2014_000000000042, file2lmdb's key) or the "
                        "bare integer id")
    for s in (r, q, t, d, n, v):
        s.add_argument("--output_dir", required=True)
        s.add_argument("--seed", type=int, default=42)
    return p


def main(argv=None, log=print):
    args = build_parser().parse_args(argv)
    run = {"msrvtt_ret": run_msrvtt_ret, "msrvtt_qa": run_msrvtt_qa, "tgif_qa": run_tgif_qa,
           "didemo_ret": run_paragraphs, "anet_ret": run_paragraphs, "vqa": run_vqa}[args.dataset]
    try:
        run(args, log)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
