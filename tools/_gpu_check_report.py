"""``OUT/summary.md`` of the GPU check, rebuilt from the part files after every part, and the one line
per part the driver prints. Standard library only; a missing or partial file is shown as such."""
import json
import os


def _load(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _x(v) -> str:
    return "n/a" if v is None else f"{v:.2f}x"


def _mib(v) -> str:
    return "n/a" if v is None else f"{v / 2 ** 20:.0f}"


def _first_line(text) -> str:
    return str(text).strip().splitlines()[0][:200] if text else ""


def figures(r: dict) -> str:
    """The part's key figures in one cell (or its error / skip reason)."""
    if r.get("status") in ("error", "skipped"):
        return _first_line(r.get("error") or r.get("reason"))
    fn = _FIGURES.get(r.get("part"))
    try:
        return fn(r) if fn else ""
    except (KeyError, TypeError, AttributeError, IndexError) as e:  # a partial file: say what is missing
        return f"(incomplete: {type(e).__name__} {e})"


def _env(r):
    g = r["gpu"]
    gpu = f"{g['name']} (sm {g['capability']}, {g['memory_bytes'] / 2 ** 30:.0f} GiB), driver {g['driver']}" \
        if g.get("cuda_available") else "no GPU"
    return f"{gpu}; torch {r['torch']} CUDA {r['torch_cuda']} cuDNN {r['cudnn']}; NCCL {g.get('nccl')}"


def _precision(r):
    cells = []
    for mode, rat in r.get("ratios", {}).items():
        if mode != "fp32":
            cells.append(f"{mode} {_x(rat['speedup'])} speed, {_x(rat['memory'])} memory")
    v = r.get("verdict") or {}
    if v.get("speedup_ok") is not None:
        cells.append(f"targets met: speed {v['speedup_ok']}, memory {v['memory_ok']}")
    return "; ".join(cells) + " (vs fp32, TF32 off)" if cells else ""


def _oracle(r):
    if r.get("mode") == "cpu-dry-run":
        imp = r.get("apex_import", {})
        apex = f"apex imports: {imp.get('imports')}" if imp.get("found") else _first_line(imp.get("reason"))
        return f"our side only (CPU): checks pass {r.get('pass')}; {apex}"
    return "; ".join(f"{lvl} equal to apex: {c['pass']} (bitwise {all(c.get('bitwise', {}).values())}, "
                     f"loss rel {c['loss_max_rel_diff']:.2g})" for lvl, c in r["levels"].items())


def _tests(r):
    c = r.get("counts", {})
    bad = [k for k, v in r.get("results", {}).items() if v["outcome"] in ("failed", "error")]
    return ", ".join(f"{v} {k}" for k, v in c.items()) + (f"; failing: {', '.join(bad)}" if bad else "")


def _loader(r):
    o2 = r.get("amp_O2_clips_per_s")
    bound = "decode-bound" if r.get("decode_bound") else "GPU-bound"
    cmp = "" if o2 is None else f" vs amp O2 {o2:.1f} clips/s: {bound}"
    build = ", Horovod build compiling meanwhile" if r.get("horovod_build_running") else ""
    need = r.get("workers_needed") or {}
    per = [f"{m}: {c:.1f} clips/s per worker" + (f", {need[m]} workers for amp O2" if need.get(m) else "")
           for m, c in (r.get("per_worker_clips_per_s") or {}).items() if c]
    if r.get("exact_resize_bit_equal") is False:
        per.append("img_resize exact NOT bit-equal to ClipBERT's resize on this CPU")
    return "; ".join([f"{r['clips_per_s']:.1f} clips/s ({r['workers']} workers{build}){cmp}", *per])


def _horovod(r):
    tr = r.get("torchrun", {})
    cells = [f"torchrun {tr.get('backend')} allreduce ok {tr.get('ok')}"]
    b = r.get("build")
    if b:
        cached = any("using cached wheel" in ln for ln in b.get("log_tail", []))
        cells.append(f"build exit {b['exit']}" + (" (cached wheel)" if cached else ""))
    h = r.get("horovodrun")
    if h:
        cells.append(f"horovodrun: nccl_built {h['nccl_built']}, allreduce ops "
                     f"{h['timeline_allreduce_ops']}, "
                     f"{len(h['steps'])} {h.get('precision')} steps, losses finite {h['losses_finite']}")
    return "; ".join(cells) + (f"; {r['error']}" if r.get("error") else "")


_FIGURES = {"env": _env, "amp_o2": _precision, "bf16": _precision, "amp_oracle": _oracle,
            "cuda_tests": _tests, "loader": _loader, "horovod": _horovod}


def one_line(r: dict) -> str:
    return f"[gpu_check] {r.get('part')}: {r.get('status')} ({r.get('seconds', '-')} s) {figures(r)}"


def precision_table(parts: list) -> list:
    rows = ["| precision | TF32 | step (ms) | clips/s | speed vs fp32 | peak memory (MiB) | memory vs fp32 |",
            "|---|---|---|---|---|---|---|"]
    for r in parts:
        for mode, m in (r or {}).get("modes", {}).items():
            rat = r.get("ratios", {}).get(mode, {})
            rows.append(f"| {m['precision']} | {m['tf32']['matmul_allow_tf32']} | {m['step_s'] * 1e3:.1f} | "
                        f"{m['clips_per_s']:.1f} | {_x(rat.get('speedup'))} | {_mib(m['peak_mem_bytes'])} | "
                        f"{_x(rat.get('memory'))} |")
    return rows if len(rows) > 2 else []


def write_summary(out: str, files: dict, dry: bool) -> None:
    loaded = {name: _load(path) for name, path in files.items()}
    head = "# GPU check" + (" (CPU dry run: code paths only, the figures mean nothing)" if dry else "")
    lines = [head, "", "| part | status | seconds | result |", "|---|---|---|---|"]
    for name, r in loaded.items():
        if r is None:
            lines.append(f"| {name} | not run | | |")
        else:
            cell = figures(r).replace("|", "/")
            lines.append(f"| {name} | {r.get('status')} | {r.get('seconds', '')} | {cell} |")
    table = precision_table([loaded.get("amp_o2"), loaded.get("bf16")])
    setup = (loaded.get("amp_o2") or {}).get("setup")
    if table and setup:
        lines += ["", f"{setup['model']} ({setup['cnn']}), {setup['videos']} videos x {setup['texts']} "
                      "texts, "
                      f"{setup['frames']} frames at {setup['img']} px, {setup['steps']} timed steps after "
                      f"{setup['warmup']} warm-up, batches already on the device", "", *table]
    tmp = os.path.join(out, f"summary.md.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, os.path.join(out, "summary.md"))
