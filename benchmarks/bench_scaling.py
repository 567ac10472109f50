"""1 vs 2 processes on the real pipeline: the retrieval entry point on the demo data (LMDB, decoding,
collate, model, allreduce), not a pre-collated toy step.

Each setting trains ``configs/demo_ret.json`` for one epoch over ``--data_ratio`` of the training
videos from the same start (fresh output dir; the final validation is not part of the figures), and
the engine's own per-step figures are read back from ``log/metrics.jsonl``
(``--log_interval 1``): examples/s over all processes, and the share of each step spent waiting for
data and blocked in the gradient allreduce after the last backward (exposed communication); the rest
is compute (forward, backward, optimizer) and overhead. Settings are run in alternation, ``--rounds``
times; the table gives medians over the steps after ``--warmup``, and the ratios to the baseline
(1 process, 1 thread). Run it on an otherwise idle machine.

    .venv/bin/python benchmarks/bench_scaling.py [--data_ratio 0.15] [--rounds 2] [--data_dir data/demo]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
SCRIPT = os.path.join(REPO, "src", "tasks", "run_video_retrieval.py")

# name: (processes, threads per process, extra flags); batch 16 per process, as the demo config
SETTINGS = {
    "1 proc x 1 thread": (1, 1, []),
    "1 proc x 2 threads": (1, 2, []),
    "2 procs x 1 thread": (2, 1, []),
    "2 procs, fp16 allreduce": (2, 1, ["--grad_compression", "fp16"]),
    "1 proc, batch 4 x accum 4": (1, 1, ["--train_batch_size", "4", "--gradient_accumulation_steps", "4"]),
    "2 procs, batch 4 x accum 4": (2, 1, ["--train_batch_size", "4", "--gradient_accumulation_steps", "4"]),
}


def command(n_proc, extra, out, data_dir, data_ratio):
    """The training command line of one setting (horovodrun for 2 processes)."""
    args = [SCRIPT, "--config", os.path.join(REPO, "configs", "demo_ret.json"), "--output_dir", out,
            "--log_interval", "1", "--num_valid", "1", "--min_valid_steps", str(10 ** 6),
            "--num_train_epochs", "1", "--data_ratio", str(data_ratio), *extra]
    args = [a.replace("data/demo", data_dir) for a in args]
    if n_proc == 1:
        return [sys.executable, *args]
    return [os.path.join(BIN, "horovodrun"), "-np", str(n_proc), "-H", f"localhost:{n_proc}", "--gloo",
            sys.executable, *args]


def run_setting(name, data_dir, data_ratio, warmup):
    n_proc, threads, extra = SETTINGS[name]
    out = tempfile.mkdtemp(prefix="bench_scaling_")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CLIPBERT_PROGRESS": "off",
           "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
    t0 = time.time()
    p = subprocess.run(command(n_proc, extra, out, data_dir, data_ratio), cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=1800)
    wall = time.time() - t0
    if p.returncode != 0:
        raise SystemExit(f"{name} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = [json.loads(x) for x in open(os.path.join(out, "log", "metrics.jsonl"))]
    rows = [r for r in rows if r["split"] == "train" and r["step"] > warmup]
    shutil.rmtree(out, ignore_errors=True)
    return {"ex_s": [r["examples_per_s"] for r in rows], "data": [r["data_wait_ratio"] for r in rows],
            "comm": [r["comm_wait_ratio"] for r in rows], "wall": wall}


def summarise(runs):
    med = {k: statistics.median(v for r in runs for v in r[k]) for k in ("ex_s", "data", "comm")}
    med["compute"] = 1 - med["data"] - med["comm"]
    med["wall"] = statistics.median(r["wall"] for r in runs)
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data_ratio", type=float, default=0.15)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data_dir", default="data/demo")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(REPO, a.data_dir, "stats.json")):
        raise SystemExit(f"no demo data in {a.data_dir}: run ./run_scripts/quickstart.sh (or "
                         f"make_demo_data and pretrain_demo_cnn into {a.data_dir})")
    runs = {name: [] for name in a.settings}
    for r in range(a.rounds):  # alternated, so slow phases of a shared machine hit every setting
        for name in a.settings:
            runs[name].append(run_setting(name, a.data_dir, a.data_ratio, a.warmup))
            print(f"round {r + 1}: {name}: {statistics.median(runs[name][-1]['ex_s']):.1f} ex/s", flush=True)
    base = summarise(runs[a.settings[0]])
    print(f"\n| setting | ex/s | vs {a.settings[0]} | data wait | allreduce wait | compute+other |")
    print("|---|---|---|---|---|---|")
    results = {}
    for name in a.settings:
        m = summarise(runs[name])
        results[name] = m
        print(f"| {name} | {m['ex_s']:.1f} | {m['ex_s'] / base['ex_s']:.2f}x | {100 * m['data']:.0f}% | "
              f"{100 * m['comm']:.0f}% | {100 * m['compute']:.0f}% |")
    print(json.dumps({"data_ratio": a.data_ratio, "rounds": a.rounds, "results": results}))


if __name__ == "__main__":
    main()
