"""1 vs 2 processes on the real pipeline: the retrieval entry point on the demo data (LMDB, decoding,
collate, model, allreduce), not a pre-collated toy step.

Each setting trains ``configs/demo_ret.json`` for one epoch over ``--data_ratio`` of the training
videos from the same start (fresh output dir; the final validation is not part of the figures), and
the engine's own per-step figures are read back from ``log/metrics.jsonl``
(``--log_interval 1``): examples/s over all processes, and the share of each step spent waiting for
data and blocked in the gradient allreduce after the last backward (exposed communication); the rest
is compute (forward, backward, optimizer) and overhead. Settings are run in alternation, ``--rounds``
times; the table gives medians over the steps after ``--warmup``, and the ratios to the baseline
(1 process, 1 thread). Run it on an otherwise idle machine. ``--baseline DIR`` compares the torchrun
setting with another checkout's ``src/`` (the ratio column is then against it).

    .venv/bin/python benchmarks/bench_scaling.py [--data_ratio 0.25] [--rounds 2] [--data_dir data/demo]
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

# name: (launcher, threads per process, extra flags, extra env); batch 16 per process, as the demo config.
# Launchers: "one" (a single process), "horovodrun" / "torchrun" (2 processes), "independent" (two
# separate single-process trainings at once, no communication: the ceiling of any 2-process scheme
# on this machine; its ex/s is their sum).
ACCUM = ["--train_batch_size", "4", "--gradient_accumulation_steps", "4"]
SETTINGS = {
    "1 proc x 1 thread": ("one", 1, [], {}),
    "1 proc x 2 threads": ("one", 2, [], {}),
    "2 procs (horovodrun)": ("horovodrun", 1, [], {}),
    "2 procs (horovodrun), default scheduling": ("horovodrun", 1, ["--cpu_sched_batch", "0"], {}),
    "2 procs (horovodrun), Horovod's 1 ms cycle": ("horovodrun", 1, [], {"HOROVOD_CYCLE_TIME": "1"}),
    "2 procs (horovodrun), Horovod's spinning wait": ("horovodrun", 1, [], {"CLIPBERT_HVD_WAIT": "spin"}),
    "2 procs (horovodrun), row-sparse embedding": ("horovodrun", 1, ["--row_sparse_allreduce", "1"], {}),
    "2 procs (horovodrun), fp16 allreduce": ("horovodrun", 1, ["--grad_compression", "fp16"], {}),
    "2 procs (torchrun)": ("torchrun", 1, [], {}),
    "2 procs (torchrun), row-sparse embedding": ("torchrun", 1, ["--row_sparse_allreduce", "1"], {}),
    "2 independent procs (ceiling)": ("independent", 1, [], {}),
    "1 proc, batch 4 x accum 4": ("one", 1, ACCUM, {}),
    "2 procs (horovodrun), batch 4 x accum 4": ("horovodrun", 1, ACCUM, {}),
}
BASELINE = "2 procs (torchrun), baseline checkout"


def command(launcher, extra, out, data_dir, data_ratio):
    """The training command line of one process group of a setting."""
    args = [SCRIPT, "--config", os.path.join(REPO, "configs", "demo_ret.json"), "--output_dir", out,
            "--log_interval", "1", "--num_valid", "1", "--min_valid_steps", str(10 ** 6),
            "--num_train_epochs", "1", "--data_ratio", str(data_ratio), *extra]
    args = [a.replace("data/demo", data_dir) for a in args]
    if launcher in ("one", "independent"):
        return [sys.executable, *args]
    if launcher == "torchrun":
        return [os.path.join(BIN, "torchrun"), "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
                "--master_port", "29533", *args]
    return [os.path.join(BIN, "horovodrun"), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, *args]


def run_setting(name, data_dir, data_ratio, warmup):
    launcher, threads, extra, extra_env = SETTINGS[name]
    outs = [tempfile.mkdtemp(prefix="bench_scaling_") for _ in range(2 if launcher == "independent" else 1)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CLIPBERT_PROGRESS": "off",
           "DIST_BACKEND": "torch" if launcher == "torchrun" else "auto",
           "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), **extra_env}
    t0 = time.time()
    procs = [subprocess.Popen(command(launcher, extra, out, data_dir, data_ratio), cwd=REPO, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for out in outs]
    errs = [p.communicate(timeout=1800)[1] for p in procs]
    wall = time.time() - t0
    for p, err in zip(procs, errs):
        if p.returncode != 0:
            raise SystemExit(f"{name} failed ({p.returncode}):\n{err[-3000:]}")
    per_run = []
    for out in outs:
        rows = [json.loads(x) for x in open(os.path.join(out, "log", "metrics.jsonl"))]
        per_run.append([r for r in rows if r["split"] == "train" and r["step"] > warmup])
        shutil.rmtree(out, ignore_errors=True)
    n = min(len(rows) for rows in per_run)  # independent runs: step i of each, side by side, summed
    return {"ex_s": [sum(rows[i]["examples_per_s"] for rows in per_run) for i in range(n)],
            "data": [per_run[0][i]["data_wait_ratio"] for i in range(n)],
            "comm": [per_run[0][i]["comm_wait_ratio"] for i in range(n)], "wall": wall}


def summarise(runs):
    med = {k: statistics.median(v for r in runs for v in r[k]) for k in ("ex_s", "data", "comm")}
    med["compute"] = 1 - med["data"] - med["comm"]
    med["wall"] = statistics.median(r["wall"] for r in runs)
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data_ratio", type=float, default=0.25)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data_dir", default="data/demo")
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--baseline", help="another checkout (e.g. a git worktree of main): adds the setting "
                    f"'{BASELINE}', its src/ first on PYTHONPATH, first in the table")
    a = ap.parse_args()
    if a.baseline:
        base_src = os.path.join(os.path.realpath(a.baseline), "src")  # the parent of its clipbert_legacy
        SETTINGS[BASELINE] = ("torchrun", 1, [], {"PYTHONPATH": base_src})
        a.settings = [BASELINE] + [s for s in a.settings if s != BASELINE]
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
