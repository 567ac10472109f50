"""Print the quickstart's results table (task, metric, chance baseline, ours, wall time).

Step 7 of ``run_scripts/quickstart.sh``::

    python run_scripts/quickstart_report.py --output_dir OUT --data_dir data/demo [--total_s SECONDS]

Reads the ``scores.json`` files written by ``--do_inference 1`` and the chance baselines that
``make_demo_data`` stored in ``stats.json``; exits non-zero if a result is missing.
"""
import argparse
import glob
import json
import os
import sys


def _newest(pattern, what):
    paths = glob.glob(pattern)
    if not paths:
        raise FileNotFoundError(f"no {what} under {pattern}")
    path = max(paths, key=os.path.getmtime)
    with open(path) as f:
        return json.load(f), path


def latest_scores(run_dir, txt_stem):
    """``scores.json`` of the newest inference result directory for ``txt_stem``."""
    return _newest(os.path.join(run_dir, f"results_{txt_stem}", "*", "scores.json"), "inference scores")


def latest_mc_scores(run_dir, txt_stem="mc_test"):
    """``mc_test_scores.json`` of the newest ``run_msrvtt_mc.py`` result directory."""
    return _newest(os.path.join(run_dir, f"mc_results_{txt_stem}", "*", "mc_test_scores.json"),
                   "multiple-choice scores")


def _wall(out, *names):
    total = 0
    for name in names:
        try:
            with open(os.path.join(out, f"{name}.wall")) as f:
                total += int(f.read().strip())
        except (OSError, ValueError):
            pass
    return total or None


def rows(out, data_dir):
    """(task, metric, chance %, ours %, wall s) for every quickstart result, from the files on disk."""
    with open(os.path.join(data_dir, "stats.json")) as f:
        test = json.load(f)["test"]
    ret, _ = latest_scores(os.path.join(out, "demo_ret"), "retrieval_test")
    mc, _ = latest_mc_scores(os.path.join(out, "demo_ret"))
    qa, _ = latest_scores(os.path.join(out, "demo_qa_frameqa"), "frameqa_test")
    action, _ = latest_scores(os.path.join(out, "demo_qa_action"), "action_test")
    t2v = ret["text2video"]
    return [
        ("retrieval (text->video)", "R@1", test["retrieval_r1_chance"], t2v["r1"],
         _wall(out, "ret_train", "ret_infer")),
        ("retrieval (text->video)", "R@5", test["retrieval_r5_chance"], t2v["r5"], None),
        ("multiple choice (ret.)", "accuracy", test["mc_chance_acc"], mc["mc_accuracy"],
         _wall(out, "mc_infer")),
        ("frame QA", "accuracy", test["frameqa_best_constant_acc"], qa["overall_acc"],
         _wall(out, "qa_train", "qa_infer")),
        ("action (5-way QA)", "accuracy", test["action_majority_index_acc"], action["overall_acc"],
         _wall(out, "action_train", "action_infer")),
    ]


def subset_note(out):
    """A line when the results are over the first rows only (``--max_eval_examples``, QUICKSTART_FAST)."""
    folders = glob.glob(os.path.join(out, "*", "*results_*", "*_first*"))
    firsts = sorted({m.rsplit("_first", 1)[1] for m in folders})
    if not firsts:
        return None
    return (f"(scores over the first {'/'.join(firsts)} test examples only (--max_eval_examples): "
            f"the chance figures are the whole split's)")


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
    print("(chance: random ranking for retrieval, 1 in 5 for multiple choice, best constant answer for "
          "frame QA,\n most frequent answer index for action; demo test split)")
    note = subset_note(a.output_dir)
    if note:
        print(note)
    if a.total_s is not None:
        print(f"total wall time: {a.total_s} s")
    print(f"tensorboard logs: {a.output_dir}/*/log   (tensorboard --logdir {a.output_dir})")
    print(f"checkpoints:      {a.output_dir}/*/ckpt/model_step_*.pt")
    print(f"inference files:  {a.output_dir}/*/results_*/step_*/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
