"""Print the quickstart's results table (task, metric, chance baseline, ours, wall time).

Reads the ``scores.json`` files written by ``--do_inference 1`` and the chance baselines that
``make_demo_data`` stored in ``stats.json``; exits non-zero if a result is missing.
"""
import argparse
import glob
import json
import os
import sys


def latest_scores(run_dir, txt_stem):
    """``scores.json`` of the newest inference result directory for ``txt_stem``."""
    paths = glob.glob(os.path.join(run_dir, f"results_{txt_stem}", "*", "scores.json"))
    if not paths:
        raise FileNotFoundError(f"no inference scores under {run_dir}/results_{txt_stem}/*/scores.json")
    path = max(paths, key=os.path.getmtime)
    with open(path) as f:
        return json.load(f), path


def _wall(out, name):
    try:
        with open(os.path.join(out, f"{name}.wall")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def rows(out, data_dir):
    with open(os.path.join(data_dir, "stats.json")) as f:
        test = json.load(f)["test"]
    ret, _ = latest_scores(os.path.join(out, "demo_ret"), "retrieval_test")
    qa, _ = latest_scores(os.path.join(out, "demo_qa_frameqa"), "frameqa_test")
    t_ret = sum(filter(None, (_wall(out, "ret_train"), _wall(out, "ret_infer"))))
    t_qa = sum(filter(None, (_wall(out, "qa_train"), _wall(out, "qa_infer"))))
    t2v = ret["text2video"]
    return [
        ("retrieval (text->video)", "R@1", test["retrieval_r1_chance"], t2v["r1"], t_ret),
        ("retrieval (text->video)", "R@5", test["retrieval_r5_chance"], t2v["r5"], None),
        ("frame QA", "accuracy", test["frameqa_best_constant_acc"], qa["overall_acc"], t_qa),
    ]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--output_dir", required=True)
    ap.add_argument("--data_dir", required=True)
    ap.add_argument("--total_s", type=int, default=None)
    a = ap.parse_args(argv)
    try:
        table = rows(a.output_dir, a.data_dir)
    except (OSError, KeyError) as e:
        print(f"quickstart_report: {e}", file=sys.stderr)
        return 1
    print(f"{'task':<26}{'metric':<10}{'chance':>9}{'ours':>9}{'wall':>8}")
    for task, metric, chance, ours, wall in table:
        w = f"{wall}s" if wall else ""
        print(f"{task:<26}{metric:<10}{float(chance):>8.2f}%{float(ours):>8.2f}%{w:>8}")
    print("(chance: random ranking for retrieval, best constant answer for QA; demo test split)")
    if a.total_s is not None:
        print(f"total wall time: {a.total_s} s")
    print(f"tensorboard logs: {a.output_dir}/*/log   (tensorboard --logdir {a.output_dir})")
    print(f"checkpoints:      {a.output_dir}/*/ckpt/model_step_*.pt")
    print(f"inference files:  {a.output_dir}/*/results_*/step_*/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
