"""``--zero_stage``: optimizer-state bytes per rank and step time against the unsharded run (stage 0).

Launches ``torchrun --nproc_per_node N`` (default 2) running ``_bench_zero_worker.py``: the engine
trains the same MLP (default 6 x Linear(768, 768) + head, 3.5M parameters, BERT-base's layer width)
at zero_stage 0, 1 and 2 in turn, the order alternated over rounds, for fp32 and amp O2. Printed per
precision and stage: each rank's optimizer-state bytes (Adam's two moments, plus amp O2's fp32
masters: ``clipbert_legacy.training.zero.optimizer_state_bytes``), their ratio to stage 0 (target ~1/N), and
the median step time with its ratio to stage 0.

    python benchmarks/bench_zero.py [--np 2 --rounds 2 --steps 12 --dim 768 --layers 6]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch(np_, fp16, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(np_),
               "--master_addr", "127.0.0.1", "--master_port", str(args.port + fp16),
               os.path.join(REPO, "benchmarks", "_bench_zero_worker.py"), "--out", out, "--fp16", str(fp16),
               "--rounds", str(args.rounds), "--steps", str(args.steps), "--dim", str(args.dim),
               "--layers", str(args.layers), "--batch", str(args.batch)]
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join((os.path.join(REPO, "src"), REPO))}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            raise SystemExit(f"bench_zero: the torchrun job failed (exit {proc.returncode}):\n"
                             f"{proc.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def report(name, res):
    base = res["results"]["0"]
    base_bytes, base_t = max(base["state_bytes"]), statistics.median(base["seconds"])
    print(f"\n{name}, {res['world']} ranks ({len(base['seconds'])} timed steps per stage)")
    print(f"{'stage':>5} | {'optimizer state per rank (MB)':>34} | {'max/stage0':>10} | "
          f"{'step ms (median)':>16} | {'vs stage0':>9}")
    for z in ("0", "1", "2"):
        r = res["results"][z]
        per_rank = " / ".join(f"{b / 2 ** 20:.2f}" for b in r["state_bytes"])
        t = statistics.median(r["seconds"])
        print(f"{z:>5} | {per_rank:>34} | {max(r['state_bytes']) / base_bytes:>10.3f} | {t * 1e3:>16.1f} | "
              f"{t / base_t:>9.3f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--port", type=int, default=29731)
    ap.add_argument("--timeout", type=int, default=1200)
    args = ap.parse_args()
    for fp16, name in ((0, "fp32"), (1, "amp O2 (fp16 model, fp32 masters)")):
        report(name, launch(args.np, fp16, args))


if __name__ == "__main__":
    main()
