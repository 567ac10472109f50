"""Parts 2 and 3 of the GPU check: training step rate and peak memory per precision on the base model.

Each mode runs the engine's own precision classes (clipbert_legacy.training.precision) on ClipBERT's base
model (BERT-base config, ResNet-50 grid backbone, random weights) at its MSRVTT retrieval input; warm-up
steps, then timed steps of forward, (scaled) backward and AdamW step. The input batches are built on the
device before the clock starts, so the timed loop holds no host-side batch building or host-to-device copy
(amp O2 waits on the host every step for its overflow check and would pay that time in full, while
fp32/bf16 would hide it). TF32 is off for every mode except ``fp32_tf32`` (both torch flags are set and
recorded per mode). Part 2 is ``--modes fp32 amp_O2`` (amp's module state keeps its model alive, so O2 runs
last in its process), part 3 ``--modes bf16 fp32_tf32 --baseline <part 2's file>``. The result file is
rewritten after every mode."""
import gc
import json
import os
import sys
import time

import _common
import torch

# apex O2's credited gains on Tensor Core GPUs: 1.5-3x speed, 50-60% memory
TARGET_SPEEDUP, TARGET_MEMORY = 2.0, 0.6
MODES = ("fp32", "amp_O2", "bf16", "fp32_tf32")


def set_tf32(on: bool) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    return {"matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32}


def precision(mode: str, dev: torch.device):
    from clipbert_legacy.training.precision import AmpO2Precision, FullPrecision
    if mode == "amp_O2":
        return AmpO2Precision(dev)
    prec = FullPrecision(dev, bf16=mode == "bf16")
    if mode == "fp32_tf32":
        prec.name = "fp32 (TF32)"
    return prec


def build(p: dict, dev: torch.device):
    from clipbert_legacy.modeling.build import build_model
    torch.manual_seed(0)
    cfg = {"model_config": os.path.join(_common.REPO, p["model"]), "task_type": "retrieval",
           "loss_type": "ce", "cnn_type": p["cnn"], "cnn_weights_path": ""}
    model = build_model(cfg).to(dev).train()
    return model, torch.optim.AdamW(model.parameters(), lr=1e-5)


def make_batch(p: dict, dev: torch.device, seed: int) -> dict:
    """One retrieval batch, generated on the device itself."""
    g = torch.Generator(device=dev).manual_seed(seed)
    n_txt = p["videos"] * p["texts"]
    shape = (p["videos"], p["frames"], 3, p["img"], p["img"])
    return {"visual_inputs": torch.randn(*shape, generator=g, device=dev),
            "text_input_ids": torch.randint(1000, 2000, (n_txt, p["txt_len"]), generator=g, device=dev),
            "text_input_mask": torch.ones(n_txt, p["txt_len"], dtype=torch.long, device=dev),
            "n_examples_list": [p["texts"]] * p["videos"],
            "labels": torch.tensor(([1] + [0] * (p["texts"] - 1)) * p["videos"], device=dev)}


def measure(mode: str, p: dict, dev: torch.device) -> dict:
    """Warm-up then ``steps`` timed training steps in ``mode`` over two batches already on the device."""
    flags = set_tf32(mode == "fp32_tf32")
    prec = precision(mode, dev)
    model, opt = prec.prepare(*build(p, dev))
    batches = [make_batch(p, dev, seed) for seed in (0, 1)]

    def step(i):
        with prec.autocast():
            loss = model(batches[i % 2])["loss"]
        with prec.scale_loss(loss, opt) as scaled:
            scaled.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()
    for i in range(p["warmup"]):
        step(i)
    _common.sync(dev)
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    t0 = time.perf_counter()
    for i in range(p["steps"]):
        loss = step(i)
    _common.sync(dev)
    step_s = (time.perf_counter() - t0) / p["steps"]
    in_bytes = sum(t.numel() * t.element_size() for b in batches for t in b.values() if torch.is_tensor(t))
    return {"mode": mode, "precision": prec.name, "tf32": flags, "step_s": step_s, "steps_per_s": 1 / step_s,
            "clips_per_s": p["videos"] / step_s,
            "peak_mem_bytes": torch.cuda.max_memory_allocated(dev) if cuda else None,
            "held_mem_bytes": torch.cuda.memory_allocated(dev) if cuda else None,  # weights + optimizer
            "input_batches_bytes": in_bytes,
            "final_loss": float(loss), "loss_finite": bool(torch.isfinite(loss)),
            "param_dtype": str(next(model.parameters()).dtype), "layer_norm": layer_norm_path(model)}


def layer_norm_path(model) -> dict:
    """Which implementation the model's FusedLayerNorms run: apex's CUDA kernel or torch's layer_norm."""
    from clipbert_legacy.compat import layer_norm as ln
    mods = [m for m in model.modules() if isinstance(m, ln.FusedLayerNorm)]
    dev = next(model.parameters()).device
    fused = bool(mods) and mods[0]._use_fused(torch.empty(1, device=dev))
    return {"modules": len(mods), "path": "apex fused_layer_norm_cuda" if fused else "torch layer_norm"}


def ratios(modes: dict, base: dict | None) -> dict:
    """Each mode's speed-up and memory as multiples of fp32 with TF32 off."""
    if base is None:
        return {}
    out = {}
    for mode, r in modes.items():
        both = r["peak_mem_bytes"] and base["peak_mem_bytes"]
        mem = r["peak_mem_bytes"] / base["peak_mem_bytes"] if both else None
        out[mode] = {"speedup": base["step_s"] / r["step_s"], "memory": mem}
    return out


def verdict(rat: dict, dry: bool) -> dict | None:
    o2 = rat.get("amp_O2")
    if o2 is None:
        return None
    if dry:
        return {"speedup_ok": None, "memory_ok": None, "note": "CPU dry run: code paths only, no figures"}
    return {"speedup_ok": o2["speedup"] >= TARGET_SPEEDUP,
            "memory_ok": o2["memory"] is not None and o2["memory"] <= TARGET_MEMORY,
            "note": f"targets: amp O2 >= {TARGET_SPEEDUP}x the fp32 (TF32 off) step rate, "
                    f"peak memory <= {TARGET_MEMORY}x"}


def main() -> int:
    def extra(ap):
        ap.add_argument("--part", required=True, help="the part's name (amp_o2 | bf16)")
        ap.add_argument("--modes", nargs="+", choices=MODES, required=True)
        ap.add_argument("--baseline", default=None, help="a result file holding the fp32 mode")
    a = _common.parse(__doc__.split("\n")[0], extra)
    res = _common.Result(a.part, a.result, a.cpu_dry_run)
    dev, p = _common.device(a), _common.setup(a)
    res.save(setup=p, device=torch.cuda.get_device_name(0) if dev.type == "cuda" else "CPU", modes={})
    base = None
    if a.baseline and os.path.isfile(a.baseline):
        with open(a.baseline) as f:
            base = json.load(f).get("modes", {}).get("fp32")
    modes = {}
    for mode in a.modes:
        print(f"[gpu_check] {a.part}: {mode}, {p['warmup']} warm-up + {p['steps']} timed steps", flush=True)
        modes[mode] = measure(mode, p, dev)
        base = modes.get("fp32", base)
        rat = ratios(modes, base)
        res.save(modes=modes, ratios=rat, verdict=verdict(rat, a.cpu_dry_run))
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the finished mode's model is gone: its cached blocks too
    return res.finish(all(r["loss_finite"] for r in modes.values()))


if __name__ == "__main__":
    sys.exit(main())
