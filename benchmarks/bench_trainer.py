"""Trainer overhead vs. a hand-written torch loop, and 1 vs 2 process throughput under horovodrun.

1. Overhead. The same ClipBert (build_model on configs/model/*.json: real MiniLM BERT weights +
   the tiny CNN) and the same pre-collated retrieval batches (built from synthetic demo videos
   with make_demo_data, decoded, tokenised and normalised once, then held in memory) are trained by
   ``clipbert_legacy.training.engine.Trainer`` (through a Task) and by a plain loop (forward, backward, AdamW
   step, zero_grad) with the same optimizer (our AdamW, same param groups and hyper-parameters).
   The engine runs with grad_norm -1 and a constant LR so both do the same maths; validation and
   the restore file happen only after the last step, which is not timed. The two are interleaved
   step by step: a Hook runs one baseline step (on the batch the engine just used) between two
   engine steps, outside the engine's timed window; the engine step time is everything between
   two hooks (data loader, forward/backward, step, LR, logging, checks). Warm-up steps are dropped;
   medians of wall time (steps/s) and of process CPU time (not inflated when other jobs on this
   shared machine take the core) are compared, plus the median of each engine step over its two
   neighbouring baseline steps ("paired", cancels slow load changes). Target: ratio <= 1.05. Then the
   engine's per-step fixed costs (data loader, zero_none_grad, loss statistics, TensorBoard scalars,
   tqdm) are each timed alone, to say where any overhead comes from.
2. Scaling. ``horovodrun -np 1|2 --gloo`` of benchmarks/_bench_trainer_worker.py (the engine on the
   same batches, same per-process batch), runs alternated, median step time; samples/s = processes x
   batch / step time. One torch thread per process in both cases (the machine has 2 cores).

    .venv/bin/python benchmarks/bench_trainer.py [--steps 30] [--rounds 2] [--models minilm tiny] [--quick]
"""
import argparse
import copy
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from _bench_trainer_worker import BatchTask, StepTimer, engine_cfg

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# before transformers is first imported (model building happens in functions below)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

MODELS = {"minilm": "configs/model/minilm_model.json", "tiny": "configs/model/tiny_model.json"}
WORKER = os.path.join(REPO, "benchmarks", "_bench_trainer_worker.py")
PIXEL_MEAN, PIXEL_STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def make_batches(tmp, n_batches, videos, img, num_frm, txt_len):
    """Demo videos -> retrieval training batches (2 texts per video: caption + 1 negative), normalised."""
    from clipbert_legacy.datasets.build import build_retrieval_datasets
    from clipbert_legacy.datasets.image_ops import ImageNorm
    from clipbert_legacy.preprocessing.make_demo_data import build_demo_data
    from clipbert_legacy.utils.pretrained_paths import default_minilm_dir
    data = os.path.join(tmp, "demo")
    n_train = max(n_batches * videos, 4)
    build_demo_data(data, n_train=n_train, n_val=2, n_test=2, img_size=img, n_frames=20, fps=10,
                    num_workers=1, log=lambda *a: None)
    cfg = dict(train_datasets=[dict(name="demo", txt=os.path.join(data, "txt", "retrieval_train.jsonl"),
                                    img=os.path.join(data, "vis_db"))],
               tokenizer_dir=default_minilm_dir(), max_txt_len=txt_len, max_img_size=img, fps=3,
               num_frm=num_frm, frm_sampling_strategy="rand", train_n_clips=1, random_sample_clips=1,
               max_n_example_per_group=1, itm_neg_size=1, skip_bad_videos=0, seed=42)
    ds, collate = build_retrieval_datasets(cfg, "train")
    norm = ImageNorm(PIXEL_MEAN, PIXEL_STD)
    batches = []
    for k in range(n_batches):
        b = collate([ds[(k * videos + j) % len(ds)] for j in range(videos)])
        if b.pop("bad_videos", None):
            raise RuntimeError("a demo video failed to decode")
        b["visual_inputs"] = norm(b["visual_inputs"].float())
        batches.append(b)
    return batches


class NullModel(torch.nn.Module):
    """A model with (almost) no compute: engine minus baseline step time is then the engine's fixed
    per-step cost (loader, bookkeeping, LR, logging) in absolute terms."""

    def __init__(self):
        super().__init__()
        self.transformer = torch.nn.Linear(16, 1)

    def forward(self, batch):
        x = batch["visual_inputs"].flatten(1)[:, :16]
        return {"loss": self.transformer(x).pow(2).mean()}


def build_template(name):
    if name == "null":
        torch.manual_seed(0)
        return NullModel()
    from clipbert_legacy.modeling.build import build_model
    torch.manual_seed(0)
    return build_model(dict(model_config=os.path.join(REPO, MODELS[name]), task_type="retrieval",
                            loss_type="ce"))


def paired_ratio(eng, base):
    """Median over steps of engine step i / mean of the baseline steps just before and after it
    (its neighbours in time), so slow changes of the machine's load cancel out."""
    return statistics.median(e / ((b0 + b1) / 2) for e, b0, b1 in zip(eng[1:], base[:-1], base[1:]))


def plain_step(model, opt, task, times, cpu_times):
    """One step of the minimal hand-written loop on the batch the engine just used, timed."""
    def step(trainer):
        t0, c0 = time.perf_counter(), time.process_time()
        loss = model(task.last_batch)["loss"]
        loss.backward()
        opt.step()
        opt.zero_grad()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    return step


def overhead(name, batches, steps, warmup, rounds, tmp):
    """Interleaved engine / plain-loop steps -> medians (wall and CPU time) and paired ratios."""
    from clipbert_legacy.optimization.param_groups import build_optimizer
    from clipbert_legacy.training.engine import Trainer
    template = build_template(name)
    n_items = warmup + steps + 1
    res = {k: [] for k in ("eng", "base", "eng_cpu", "base_cpu", "paired", "paired_cpu")}
    for r in range(rounds):
        cfg = engine_cfg(os.path.join(tmp, f"run_{name}_{r}"), n_items)
        base_model = copy.deepcopy(template).train()
        base_opt = build_optimizer(base_model, cfg)
        task = BatchTask(template, batches, n_items)
        base_times, base_cpu = [], []
        timer = StepTimer(between=plain_step(base_model, base_opt, task, base_times, base_cpu))
        Trainer(cfg, task, hooks=[timer]).train()
        keep = slice(warmup, -1)  # warm-up dropped; last step: validation + restore file
        eng, base = timer.times[keep], base_times[keep]
        eng_c, base_c = timer.cpu_times[keep], base_cpu[keep]
        res["eng"] += eng
        res["base"] += base
        res["eng_cpu"] += eng_c
        res["base_cpu"] += base_c
        res["paired"].append(paired_ratio(eng, base))
        res["paired_cpu"].append(paired_ratio(eng_c, base_c))
    base_model(batches[0])["loss"].backward()  # params the loss does not reach (zero-filled by the engine)
    unused = sum(p.grad is None for p in base_model.parameters() if p.requires_grad)
    base_opt.zero_grad()
    med = {k: statistics.median(res[k]) for k in ("eng", "base", "eng_cpu", "base_cpu")}
    return dict(med, paired=res["paired"], paired_cpu=res["paired_cpu"], n=len(res["eng"]),
                params=sum(p.numel() for p in template.parameters()), none_grads=unused)


def fixed_costs(template, batches, tmp, n=300):
    """CPU seconds per step of the engine's non-model work, each part timed alone on this model:
    its DataLoader (resumable sampler + per-sample seeding), zero_none_grad, the loss statistics, and
    the TensorBoard scalars it logs each step (5 here; CPU of tensorboardX's writer threads included,
    calls spaced 2 ms apart as in training) and the tqdm update."""
    from _bench_trainer_worker import BatchList, first
    from tqdm import tqdm

    from clipbert_legacy.training.data import ResumableDistributedSampler, build_train_dataloader
    from clipbert_legacy.utils.logger import make_tb_logger
    from clipbert_legacy.utils.misc import zero_none_grad

    def cpu(f, reps=n, pause=0.0):
        f()
        c0 = time.process_time()
        for _ in range(reps):
            f()
            if pause:
                time.sleep(pause)
        return (time.process_time() - c0) / reps
    out = {}
    sampler = ResumableDistributedSampler(4 * n, 1, 0, shuffle=True, seed=42)
    it = iter(build_train_dataloader(BatchList(batches, 4 * n), sampler, 1, first, n_workers=0, seed=42))
    out["data loader next()"] = cpu(lambda: next(it))
    model = copy.deepcopy(template)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    out["zero_none_grad(model)"] = cpu(lambda: zero_none_grad(model))
    acc, loss = torch.zeros(3, dtype=torch.float64), torch.tensor(0.5)

    def stats():
        lv = loss.detach().double()
        fin = torch.isfinite(lv)
        acc.add_(torch.stack([torch.where(fin, lv, torch.zeros_like(lv)), (~fin).double(), fin.double()]))
        acc.tolist()
        acc.zero_()
    out["loss statistics"] = cpu(stats)
    tb = make_tb_logger(os.path.join(tmp, "tb_cost"), True)
    logs = {"train/loss": 0.5, "train/lr_transformer": 1e-4, "train/lr_cnn": 1e-4,
            "perf/examples_per_s": 10.0, "perf/data_wait_ratio": 0.01}
    step = [0]

    def tb_log():
        step[0] += 1
        tb.log_scalar_dict(logs, step=step[0])
    out["tensorboardX 5 scalars"] = cpu(tb_log, pause=0.002) - cpu(lambda: None, pause=0.002)
    tb.close()
    with open(os.devnull, "w") as null:
        bar = tqdm(total=10 * n, mininterval=2.0, file=null)
        out["tqdm update"] = cpu(lambda: bar.update(1))
        bar.close()
    return out


def horovodrun_path():
    path = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    if not os.path.isfile(path):
        sys.exit(f"horovodrun not found next to {sys.executable}; build Horovod "
                 "(run_scripts/install_horovod.sh) or run with --skip_scaling")
    return path


def scaling(batches_file, steps, warmup, rounds, tmp, timeout):
    """Alternate horovodrun -np 1 / -np 2 runs; per np: median over runs of samples/s."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join((os.path.join(REPO, "src"), REPO)))
    env.pop("HOROVOD_RANK", None)
    results = {1: [], 2: []}
    hvdrun = horovodrun_path()
    for r in range(rounds):
        for n in ((1, 2) if r % 2 == 0 else (2, 1)):
            out = os.path.join(tmp, f"scale_{n}_{r}.json")
            cmd = [hvdrun, "-np", str(n), "--gloo", "-H", f"localhost:{n}", sys.executable, WORKER,
                   "--batches", batches_file, "--steps", str(steps), "--warmup", str(warmup),
                   "--threads", "1", "--out", out]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
            if proc.returncode != 0 or not os.path.isfile(out):
                sys.exit(f"horovodrun -np {n} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-3000:]}")
            with open(out) as f:
                res = json.load(f)
            step, cpu = statistics.median(res["step_times"]), statistics.median(res["cpu_step_times"])
            per_proc = res["samples_per_step"] / n
            results[n].append((res["samples_per_step"] / step, cpu / step, per_proc / cpu))
    med = {n: tuple(statistics.median(x[i] for x in v) for i in range(3)) for n, v in results.items()}
    return med, results


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30, help="timed steps per round (overhead)")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2, help="engine runs per model (step times pooled)")
    ap.add_argument("--models", nargs="+", default=["minilm", "tiny"], choices=sorted(MODELS) + ["null"],
                    help="null: a Linear(16, 1) model, to measure the engine's fixed per-step cost")
    ap.add_argument("--videos", type=int, default=4, help="videos per batch (per process)")
    ap.add_argument("--img", type=int, default=64, help="frame size (demo videos, max_img_size)")
    ap.add_argument("--num_frm", type=int, default=2)
    ap.add_argument("--txt_len", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads for the overhead part")
    ap.add_argument("--scale_steps", type=int, default=12, help="timed steps per horovodrun run")
    ap.add_argument("--scale_rounds", type=int, default=2, help="runs per process count (alternated)")
    ap.add_argument("--scale_model", default="minilm", choices=sorted(MODELS))
    ap.add_argument("--skip_scaling", action="store_true")
    ap.add_argument("--quick", action="store_true", help="smoke test (< 60 s): tiny model, few steps")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.warmup, a.rounds, a.models = 10, 2, 1, ["tiny"]
        a.scale_steps, a.scale_rounds, a.scale_model = 5, 1, "tiny"
    torch.set_num_threads(a.threads)
    logging.disable(logging.INFO)  # engine/model INFO lines would interleave with the report
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_trainer_") as tmp:
        batches = make_batches(tmp, 4, a.videos, a.img, a.num_frm, a.txt_len)
        b0 = batches[0]
        n_txt = b0["text_input_ids"].shape[0]
        print(f"# bench_trainer: retrieval batch {a.videos} videos x {n_txt // a.videos} texts "
              f"(demo mp4s, {a.num_frm} frames {a.img}x{a.img}, text len {a.txt_len}), 4 distinct "
              f"pre-collated batches in memory, CPU, torch threads {torch.get_num_threads()}")
        print("# engine: Trainer + Task, fp32, grad_norm -1, constant LR, AdamW (ours), n_workers 0; "
              "validation/restore file only after the last (untimed) step")
        print(f"# baseline: plain forward/backward/AdamW step/zero_grad, same model init, same batch "
              f"each step; interleaved step by step, {a.warmup} warm-up steps dropped, medians")
        print("# load average at start: {:.2f} {:.2f} {:.2f} on {} cores (other jobs share the machine; "
              "CPU-time figures are not inflated by them, wall-time ones are)".format(*os.getloadavg(),
                                                                                     os.cpu_count()))
        for name in a.models:
            r = overhead(name, batches, a.steps, a.warmup, a.rounds, tmp)
            label = MODELS.get(name, "NullModel: Linear(16, 1), no real compute")
            print(f"[{name}] model {label} ({r['params'] / 1e6:.2f}M params), {r['n']} steps each "
                  f"({a.rounds} round(s) x {a.steps})")
            for label, key in (("plain torch loop", "base"), ("engine (ours)   ", "eng")):
                print(f"[{name}]   {label} : {1 / r[key]:8.2f} steps/s  ({r[key] * 1e3:8.2f} ms/step wall, "
                      f"{r[key + '_cpu'] * 1e3:8.2f} ms CPU)")
            print(f"[{name}]   overhead ratio   : {r['eng'] / r['base']:8.3f} wall, "
                  f"{r['eng_cpu'] / r['base_cpu']:.3f} CPU (ratio of medians; target <= 1.05); engine - "
                  f"baseline = {(r['eng'] - r['base']) * 1e3:+.2f} ms wall, "
                  f"{(r['eng_cpu'] - r['base_cpu']) * 1e3:+.2f} ms CPU per step")
            print(f"[{name}]   paired ratio     : per round wall "
                  f"{', '.join(f'{x:.3f}' for x in r['paired'])}; "
                  f"CPU {', '.join(f'{x:.3f}' for x in r['paired_cpu'])}  (median of step i / its neighbour "
                  "baseline steps)")
            if r["none_grads"]:
                print(f"[{name}]   note: {r['none_grads']} parameter tensors get no gradient; the engine "
                      "zero-fills them (zero_none_grad, ClipBERT) and AdamW then updates them too")
        parts = fixed_costs(build_template(a.models[0]), batches, tmp, n=100 if a.quick else 300)
        print(f"engine fixed cost per step (CPU, each part timed alone, model {a.models[0]}): "
              + ", ".join(f"{k} {v * 1e6:.0f} us" for k, v in parts.items())
              + f"; sum {sum(parts.values()) * 1e3:.2f} ms")
        if a.skip_scaling:
            print(f"total {time.perf_counter() - t_start:.0f} s")
            return
        bfile = os.path.join(tmp, "batches.pt")
        torch.save({"model_config": os.path.join(REPO, MODELS[a.scale_model]), "batches": batches}, bfile)
        med, runs = scaling(bfile, a.scale_steps, a.warmup, a.scale_rounds, tmp, timeout=600)
        print(f"# scaling: horovodrun -np 1|2 --gloo, engine on model {a.scale_model}, same per-process "
              f"batch ({a.videos} videos, {n_txt} texts), {a.scale_steps} timed steps per run, "
              f"{a.scale_rounds} alternated run(s) per count, median step time; torch threads = 1 per "
              f"process in both cases (this machine has {os.cpu_count()} cores, shared with other jobs)")
        for n in (1, 2):
            print(f"{n} process{'es' if n > 1 else '  '}: {med[n][0]:8.2f} samples/s (videos/s)   runs: "
                  f"{', '.join(f'{x[0]:.2f}' for x in runs[n])}   rank-0 CPU share {med[n][1]:.2f} of a "
                  f"core, {med[n][2]:.2f} samples per CPU-second per process")
        print(f"scaling ratio (2 procs / 1 proc): {med[2][0] / med[1][0]:.3f}  (ideal 2.0; wall-clock, "
              "limited by the cores other jobs leave free)")
        print(f"per-CPU-second efficiency (2 procs / 1 proc): {med[2][2] / med[1][2]:.3f}  (1.0 = the "
              "allreduce and the second process cost no extra CPU per sample; independent of machine load)")
    print("load average at end: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(f"total {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
