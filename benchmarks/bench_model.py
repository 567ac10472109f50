"""Forward+backward throughput and peak memory of ClipBert on CPU, with and without grad checkpointing.

Each (model config, grad_ckpt) case runs in its own subprocess so peak RSS is not shared between
cases. Reported per case: samples/s (texts per second through forward+backward+zero_grad), the process
peak RSS (ru_maxrss, includes oneDNN's cached conv scratch buffers, which checkpointing does not
change) and the RSS rise during the timed steps above the RSS after one warm-up step (sampled every
2 ms, with a fixed glibc mmap threshold so freed tensors leave RSS): live activations plus parameter
gradients of a step. Last, the exact activation memory autograd keeps after a forward
(:func:`saved_activation_mb`), which is what gradient checkpointing cuts. Baseline = grad_ckpt 0, ours =
grad_ckpt 1, measured in the same run; the ratio lines compare them.

    .venv/bin/python benchmarks/bench_model.py [--configs tiny minilm r50] [--steps 5] [--img 224]

``r50`` (ClipBERT's ResNet-50, FREEZE_AT=2, with the tiny BERT) is where CNN checkpointing pays off;
with the ``tiny`` CNN the peak is set by the stem's own backward, which checkpointing cannot shrink.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {"tiny": "configs/model/tiny_model.json", "minilm": "configs/model/minilm_model.json",
           "r50": "configs/model/tiny_model.json"}  # r50: ClipBERT's ResNet-50 CNN + the tiny BERT


def _rss_bytes():
    import psutil
    return psutil.Process().memory_info().rss


def saved_activation_mb(model, batch):
    """MB of tensors autograd keeps for backward after one forward (unique storages, weights excluded).

    Tensors saved inside a checkpointed region are not kept (only the region's inputs are), so this is
    the activation memory that grad_ckpt trades for recomputation; it is exact, unlike RSS.
    """
    import torch
    weights = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    seen, total = set(), [0]

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights and ptr not in seen:
            seen.add(ptr)
            total[0] += t.untyped_storage().nbytes()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(batch)["loss"]
    loss.backward()
    model.zero_grad(set_to_none=True)
    return total[0] / 2 ** 20


def run_case(args):
    """Child process: build, warm up, time ``steps`` fwd+bwd steps, print one JSON line."""
    import torch
    torch.set_num_threads(args.threads)
    from clipbert_legacy.modeling.build import build_model
    torch.manual_seed(0)
    model_config = os.path.join(REPO, CONFIGS[args.case])
    cnn_type = None
    if args.case == "r50":
        with open(model_config) as f:
            conf = dict(json.load(f), backbone_channel_in_size=2048, cnn_type="resnet50")
        model_config = os.path.join(tempfile.mkdtemp(), "r50_tiny_bert.json")
        with open(model_config, "w") as f:
            json.dump(conf, f)
        cnn_type = "resnet50"
    model = build_model({"model_config": model_config, "task_type": "retrieval", "loss_type": "ce",
                         "cnn_type": cnn_type, "grad_ckpt": args.grad_ckpt}).train()
    n_txt = args.videos * args.texts_per_video
    labels = torch.tensor(([1] + [0] * (args.texts_per_video - 1)) * args.videos)
    batch = {"visual_inputs": torch.randn(args.videos, args.num_frm, 3, args.img, args.img),
             "text_input_ids": torch.randint(1000, 2000, (n_txt, args.txt_len)),
             "text_input_mask": torch.ones(n_txt, args.txt_len, dtype=torch.long),
             "n_examples_list": [args.texts_per_video] * args.videos, "labels": labels}

    def step():
        model(batch)["loss"].backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up: allocator, oneDNN scratch buffers and caches reach their steady size
    saved_mb = saved_activation_mb(model, batch)
    base = _rss_bytes()
    peak = [base]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _rss_bytes())
            time.sleep(0.002)
    t = threading.Thread(target=sample, daemon=True)
    t.start()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    elapsed = time.perf_counter() - t0
    done.set()
    t.join()
    print(json.dumps({"case": args.case, "grad_ckpt": args.grad_ckpt,
                      "samples_per_s": n_txt * args.steps / elapsed, "step_s": elapsed / args.steps,
                      "saved_activation_mb": saved_mb,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "step_rss_rise_mb": (peak[0] - base) / 2 ** 20}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", nargs="+", default=["tiny", "minilm"], choices=sorted(CONFIGS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--videos", type=int, default=4)
    ap.add_argument("--texts_per_video", type=int, default=2)
    ap.add_argument("--num_frm", type=int, default=2)
    ap.add_argument("--img", type=int, default=224)
    ap.add_argument("--txt_len", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--case", help=argparse.SUPPRESS)
    ap.add_argument("--grad_ckpt", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.case:
        return run_case(args)

    print(f"# bench_model: retrieval batch {args.videos} videos x {args.texts_per_video} texts, "
          f"{args.num_frm} frames {args.img}x{args.img}, text len {args.txt_len}, {args.steps} timed steps, "
          f"torch threads {args.threads}, CPU")
    # fixed mmap threshold: glibc then returns freed tensor memory at once, so RSS follows live tensors
    # (with its default dynamic threshold, freed activations stay in the heap and RSS shows fragmentation)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               MALLOC_MMAP_THRESHOLD_="131072")
    results = {}
    for name in args.configs:
        for ckpt in (0, 1):
            cmd = [sys.executable, os.path.abspath(__file__), "--case", name, "--grad_ckpt", str(ckpt)]
            cmd += [f"--{k}={getattr(args, k)}" for k in ("steps", "videos", "texts_per_video", "num_frm",
                                                          "img", "txt_len", "threads")]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
            if proc.returncode != 0:
                sys.exit(f"case {name} grad_ckpt={ckpt} failed:\n{proc.stderr[-3000:]}")
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            results[(name, ckpt)] = r
            print(f"{name:7s} grad_ckpt={ckpt}  {r['samples_per_s']:8.2f} samples/s  "
                  f"step {r['step_s']:.3f}s  peak RSS {r['peak_rss_mb']:8.1f} MB  "
                  f"RSS rise over steps {r['step_rss_rise_mb']:7.1f} MB  "
                  f"saved activations {r['saved_activation_mb']:7.1f} MB")
    for name in args.configs:
        base, ours = results[(name, 0)], results[(name, 1)]
        print(f"{name}: throughput baseline(no ckpt) {base['samples_per_s']:.2f} vs ours(grad_ckpt) "
              f"{ours['samples_per_s']:.2f} samples/s -> ratio "
              f"{ours['samples_per_s'] / base['samples_per_s']:.2f}x")
        print(f"{name}: peak RSS baseline {base['peak_rss_mb']:.1f} vs ours {ours['peak_rss_mb']:.1f} MB -> "
              f"ratio {ours['peak_rss_mb'] / base['peak_rss_mb']:.2f}x; RSS rise over steps baseline "
              f"{base['step_rss_rise_mb']:.1f} vs ours {ours['step_rss_rise_mb']:.1f} MB -> ratio "
              f"{ours['step_rss_rise_mb'] / max(base['step_rss_rise_mb'], 1e-6):.2f}x")
        print(f"{name}: saved activations baseline {base['saved_activation_mb']:.1f} vs ours "
              f"{ours['saved_activation_mb']:.1f} MB -> ratio "
              f"{ours['saved_activation_mb'] / max(base['saved_activation_mb'], 1e-6):.2f}x")


if __name__ == "__main__":
    main()
