"""Cost of the restore file per save under ``zero_stage 1``: ``horovodrun -np N`` against ``torchrun
--nproc_per_node N``, and the project's gather against the previous version's, from the same run.

Issue 38 measured ``horovodrun -np 2 --zero_stage 1`` with a restore file every step at 239 s for 96 steps
against 37 s under torchrun. Each save gathers every rank's optimizer shard (and under amp O2 the fp32
masters): the previous version sent it through ``hvd.allgather_object``, and Horovod's implementation
pickles the object and then builds ``torch.ByteTensor(bytearray(pickle))`` one element at a time (about
0.3 s per MB here), on every rank, every save; torch.distributed's ``all_gather_object`` uses the buffer
directly. The project now sends the tensors' bytes as one flat uint8 allgather
(``clipbert_legacy.utils.distributed.allgather_with_tensors``). This launches ``_bench_restore_worker.py``
under both launchers (bench_zero's MLP, default 3.5M parameters) and prints, per launcher and way, the median
seconds of a save, of its gathers and of writing the file (rank 0), with the previous/current ratio.

    python benchmarks/bench_restore_save.py [--np 2 --rounds 2 --steps 6 --dim 768 --layers 6 --fp16 0]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "benchmarks", "_bench_restore_worker.py")
BIN = os.path.dirname(sys.executable)


def launch(launcher, args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        worker = [WORKER, "--out", out, "--fp16", str(args.fp16), "--rounds", str(args.rounds),
                  "--steps", str(args.steps), "--dim", str(args.dim), "--layers", str(args.layers),
                  "--batch", str(args.batch)]
        if launcher == "horovodrun":
            cmd = [os.path.join(BIN, "horovodrun"), "-np", str(args.np), "-H", f"localhost:{args.np}",
                   "--gloo", sys.executable, *worker, "--backend", "horovod"]
        else:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.np),
                   "--master_addr", "127.0.0.1", "--master_port", str(args.port), *worker,
                   "--backend", "torch"]
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join((os.path.join(REPO, "src"), REPO)),
               "PATH": BIN + os.pathsep + os.environ.get("PATH", "")}
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        if proc.returncode != 0:
            raise SystemExit(f"bench_restore_save: the {launcher} job failed (exit {proc.returncode}):\n"
                             f"{proc.stderr[-4000:]}")
        with open(out) as f:
            return json.load(f)


def report(launcher, res):
    print(f"\n{launcher}, {res['world']} ranks, zero_stage 1, restore file every step "
          f"({len(res['results']['current']['saves'])} timed saves per way)")
    print(f"{'gather':>9} | {'save ms':>9} | {'gather ms':>9} | {'write ms':>8} | {'file MB':>7}")
    med = {}
    for way in ("previous", "current"):
        r = res["results"][way]
        save, gather, write = (statistics.median(col) * 1e3 for col in zip(*r["saves"]))
        med[way] = save
        print(f"{way:>9} | {save:>9.1f} | {gather:>9.1f} | {write:>8.1f} | {r['file_bytes'] / 2 ** 20:>7.1f}")
    print(f"previous / current (save): {med['previous'] / med['current']:.2f}x")
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--fp16", type=int, default=0)
    ap.add_argument("--port", type=int, default=29741)
    ap.add_argument("--timeout", type=int, default=1800)
    args = ap.parse_args()
    med = {launcher: report(launcher, launch(launcher, args)) for launcher in ("horovodrun", "torchrun")}
    for way in ("previous", "current"):
        print(f"{way}: horovodrun / torchrun (save): {med['horovodrun'][way] / med['torchrun'][way]:.2f}x")


if __name__ == "__main__":
    main()
