"""Real apex.amp as the oracle for clipbert_legacy.compat.amp: the same training run on one GPU, once per
backend.

For O1 and O2 (``keep_batchnorm_fp32=True``, dynamic loss scale) the tiny ClipBERT (BERT 2x64 + tiny
ResNet with trainable BatchNorm) trains on the same fixed batches through the engine's real step
(``Trainer.run_step``: accumulation 2, ``delay_unscale``, the Horovod-compatible optimizer with one
process, ``grad_norm`` 1.0 clipping on ``amp.master_params``), once with ``AMP_BACKEND=apex`` (the real
package) and once natively, each in its own subprocess (the backend is module-level state) with
deterministic torch algorithms. A few chosen steps get their loss multiplied by 2**40, so their fp16
gradients overflow; the scaler's growth window is shortened (``--window``) so the scale also grows.

Acceptance (per opt level): identical skip decisions, loss-scale trajectory and ``amp.state_dict()``;
the same weight names and dtypes; and, as tolerances, per-step loss and grad norm (non-skipped steps)
within a relative ``2**-10`` and final master and model weights within ``1e-3`` absolute. Why these:
both sides run the same fp16 kernels on the same inputs and do the same fp32 unscaling maths
(grad * (1/scale), exact for a power-of-two scale; accumulation adds stashed grads with weight 1), so
the expected result is bit equality, reported separately (``bitwise``). The tolerances only absorb
rounding-order differences (a kernel that is not deterministic, a different fused path): 2**-10 is
fp16's relative precision, the precision of the fp16 logits the loss is computed from; 1e-3 is ten
Adam steps at the run's learning rate 1e-4 (Adam moves a weight by about the learning rate per step),
i.e. a few steps of drift from fp16-ulp-sized gradient differences, far below a real behaviour
difference (a wrongly skipped or unskipped step, a missing unscale) which moves weights by the
learning rate on every step after it. Grad norms of skipped steps are not compared: apex's
(Python-fallback) unscale stops at the first overflowing tensor and leaves the other master grads
uninitialised; ours holds inf/nan.

apex.amp comes from a wheel of apex's pure-Python package (tag 25.04 or earlier, built without its
CUDA extensions, so apex runs its Python-fallback unscale; run_scripts/gpu_bundle.sh makes it), found as
``--apex-wheel``, ``$AMP_ORACLE_APEX_WHEEL``, ``third_party_wheels/apex-*.whl``, the bundle's
``third_party_wheels/gpu_bundle/apex/`` or ``~/.cache/clipbert-legacy/apex/``, and unpacked under ``--out``
for the apex subprocess only (the inherited PYTHONPATH stays behind it); an importable legacy apex.amp is
used as is. Without one: exit 1, or with ``--if-no-apex skip`` a report with status ``skipped``.
O2 runs first, then O1; the two sides of a level run in parallel (deterministic kernels, separate
processes); the report (``--result``, default ``<out>/amp_oracle.json``) is rewritten after each level.

    python tools/amp_oracle.py --steps 300 [--out output/amp_oracle]   # needs CUDA + the wheel
    python tools/amp_oracle.py --cpu-dry-run                           # our side on CPU, seconds

``--cpu-dry-run`` runs only our side on CPU (apex needs CUDA: its ``initialize`` rejects CPU tensors and
its LossScaler allocates a ``torch.cuda.IntTensor``) for a few steps and checks what holds without an
oracle: the scale follows apex's dynamic-scaler rules step by step, exactly the injected steps are
skipped, a skipped step leaves the weights unchanged and every other step changes them, and the last
step's scale and count are what ``amp.state_dict()`` returns. Exit status 0 when every check passes.
"""
import argparse
import glob
import json
import math
import os
import subprocess
import sys
import time
import zipfile

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(REPO, "tools", "_amp_oracle_worker.py")
LEVELS = ("O2", "O1")  # O2 (ClipBERT's --fp16 1) first: it matters more
LOSS_RTOL = GRAD_NORM_RTOL = 2.0 ** -10
WEIGHT_ATOL = 1e-3
INIT_SCALE, MAX_SCALE = 2.0 ** 16, 2.0 ** 24  # apex's dynamic scaler defaults (kept by initialize)
DRY_RUN = {"steps": 10, "window": 3, "inject": [2, 6, 7]}  # halving, growth, two overflows in a row
APEX_NEEDS_CUDA = ("apex.amp needs CUDA: its initialize rejects CPU tensors and its LossScaler "
                   "allocates a torch.cuda.IntTensor")


# ------------------------------------------------------------------------------------------ the scaler
def check_scaler_rules(records: list[dict], window: int, init: float = INIT_SCALE,
                       max_scale: float = MAX_SCALE) -> list[str]:
    """Violations of apex's dynamic scaler by the recorded trajectory: an overflow halves the scale
    and resets the clean count; ``window`` clean steps in a row double it (capped at ``max_scale``)."""
    bad, scale, unskipped = [], init, 0
    for r in records:
        if r["skipped"]:
            scale, unskipped = scale / 2.0, 0
        else:
            unskipped += 1
            if unskipped == window:
                scale, unskipped = min(max_scale, scale * 2.0), 0
        if (r["loss_scale"], r["unskipped"]) != (scale, unskipped):
            bad.append(f"step {r['step']}: scale {r['loss_scale']} unskipped {r['unskipped']}, "
                       f"apex's rules give {scale} / {unskipped}")
            scale, unskipped = r["loss_scale"], r["unskipped"]  # report each departure once
    return bad


def side_checks(res: dict, window: int, inject: list[int], exact_skips: bool) -> dict:
    """What one side's run must satisfy on its own (dry run: all of it; GPU: for both sides)."""
    recs = res["records"]
    skipped = [r["step"] for r in recs if r["skipped"]]
    last, sd = recs[-1], next(iter(res["amp_state_dict"].values()))
    checks = {
        "scaler_rules": check_scaler_rules(recs, window) == [],
        "injected_steps_skipped": set(inject) <= set(skipped),
        "skips_are_exactly_the_injected": skipped == sorted(inject),
        "skipped_total_counted": last["skipped_total"] == len(skipped),
        "skipped_steps_leave_weights": all(r["weights_changed"] != r["skipped"] for r in recs),
        "grad_norm_finite_when_stepping": all(math.isfinite(r["grad_norm"])
                                              for r in recs if not r["skipped"]),
        "state_dict_is_last_step": (sd["loss_scale"], sd["unskipped"])
        == (last["loss_scale"], last["unskipped"]),
        "masters_fp32": all(t.dtype == torch.float32 for t in res["masters"].values()),
    }
    if not exact_skips:  # on the GPU a naturally overflowing step is allowed (both sides must agree)
        del checks["skips_are_exactly_the_injected"]
    checks.update(dtype_checks(res))
    return checks


def dtype_checks(res: dict) -> dict:
    """O2 runs an fp16 model with fp32 BatchNorm; O1 leaves the model fp32."""
    model = res["model"]
    bn = [t.dtype for n, t in model.items() if ".norm." in n and t.is_floating_point()]
    fp16 = [n for n, t in model.items() if t.dtype == torch.float16]
    if res["opt_level"] == "O2":
        return {"O2_model_fp16": len(fp16) > 0, "O2_batchnorm_fp32": bool(bn) and set(bn) == {torch.float32}}
    return {"O1_model_fp32": fp16 == []}


# ------------------------------------------------------------------------------------------ comparing
def _rel(a: float, b: float) -> float:
    if a == b:  # also equal infinities
        return 0.0
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def _max_abs(x: dict, y: dict) -> float:
    return max((float((x[n].double() - y[n].double()).abs().max()) if x[n].numel() else 0.0) for n in x)


def _bitwise(x: dict, y: dict) -> bool:
    return all(x[n].dtype == y[n].dtype and torch.equal(x[n], y[n]) for n in x)


def compare(ours: dict, apex: dict) -> dict:
    """The oracle comparison of one opt level (see the module docstring for the tolerances)."""
    a, b = ours["records"], apex["records"]
    stepping = [(x, y) for x, y in zip(a, b) if not x["skipped"] and not y["skipped"]]
    same_names = set(ours["masters"]) == set(apex["masters"]) and set(ours["model"]) == set(apex["model"])
    out = {
        "steps": [len(a), len(b)],
        "skip_decisions_equal": [r["skipped"] for r in a] == [r["skipped"] for r in b],
        "loss_scale_trajectory_equal": [(r["loss_scale"], r["unskipped"]) for r in a]
        == [(r["loss_scale"], r["unskipped"]) for r in b],
        "state_dict_equal": ours["amp_state_dict"] == apex["amp_state_dict"],
        "same_weight_names": same_names,
        "loss_max_rel_diff": max(_rel(x["loss"], y["loss"]) for x, y in zip(a, b)),
        "grad_norm_max_rel_diff": max((_rel(x["grad_norm"], y["grad_norm"]) for x, y in stepping),
                                      default=0.0),
    }
    if same_names:
        out["model_dtypes_equal"] = all(t.dtype == apex["model"][n].dtype for n, t in ours["model"].items())
        out["masters_max_abs_diff"] = _max_abs(ours["masters"], apex["masters"])
        out["model_max_abs_diff"] = _max_abs(ours["model"], apex["model"])
        out["bitwise"] = {"masters": _bitwise(ours["masters"], apex["masters"]),
                          "model": _bitwise(ours["model"], apex["model"]),
                          "losses": [x["loss"] for x in a] == [y["loss"] for y in b]}
    out["pass"] = acceptance(out)
    return out


def acceptance(c: dict) -> bool:
    """Exact agreement where the maths is discrete, the stated tolerances where it is floating point."""
    exact = all(c[k] for k in ("skip_decisions_equal", "loss_scale_trajectory_equal", "state_dict_equal",
                               "same_weight_names")) and c["steps"][0] == c["steps"][1]
    return (exact and c.get("model_dtypes_equal", False) and c["loss_max_rel_diff"] <= LOSS_RTOL
            and c["grad_norm_max_rel_diff"] <= GRAD_NORM_RTOL and c["masters_max_abs_diff"] <= WEIGHT_ATOL
            and c["model_max_abs_diff"] <= WEIGHT_ATOL)


# ------------------------------------------------------------------------------------------ running
def default_inject(steps: int) -> list[int]:
    """Overflowing steps spread over the run, two of them in a row (the scale halves twice)."""
    picks = {steps // 10, steps // 10 + 1, steps // 3, steps // 2 + 1, (3 * steps) // 4}
    return sorted(s for s in picks if 2 <= s < steps)


def run_side(level: str, backend: str, a, out_dir: str, extra_env: dict) -> subprocess.Popen:
    """Start one side's worker; its result goes to ``<out>/<level>_<backend>.pt``."""
    env = {**os.environ, **extra_env, "AMP_BACKEND": backend}
    # the apex side's unpacked wheel first, then the checkout, then what the caller had (pip --target dirs)
    inherited = os.environ.get("PYTHONPATH")
    bench = os.path.join(REPO, "benchmarks")  # the worker's shared helpers (_bench_trainer_worker)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (extra_env.get("PYTHONPATH"), REPO, bench, inherited) if p)
    cmd = [sys.executable, WORKER, "--opt-level", level, "--steps", str(a.steps), "--window", str(a.window),
           "--out", os.path.join(out_dir, f"{level}_{backend}.pt"), "--inject", *map(str, a.inject)]
    log = open(os.path.join(out_dir, f"{level}_{backend}.log"), "w")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def wait_side(proc: subprocess.Popen, timeout: float, out_dir: str, level: str, backend: str) -> dict:
    """The side's saved result; its log's tail in the error if it failed."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        rc = "timeout"
    path = os.path.join(out_dir, f"{level}_{backend}.pt")
    if rc != 0 or not os.path.isfile(path):
        with open(os.path.join(out_dir, f"{level}_{backend}.log")) as f:
            tail = f.read()[-3000:]
        raise RuntimeError(f"{level} {backend} side failed (exit {rc}):\n{tail}")
    return torch.load(path, weights_only=True)


def find_apex(a, out_dir: str) -> tuple[dict, str] | None:
    """(extra env for the apex side, where apex comes from), or None where no legacy apex is found."""
    probe = "import apex.amp as m; assert all(hasattr(m, f) for f in ('initialize', 'scale_loss'))"
    if subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0:
        return {}, "installed apex"
    cands = [a.apex_wheel, os.environ.get("AMP_ORACLE_APEX_WHEEL")]
    cands += sorted(glob.glob(os.path.join(REPO, "third_party_wheels", "apex-*.whl")))
    cands += sorted(glob.glob(os.path.join(REPO, "third_party_wheels", "gpu_bundle", "apex", "apex-*.whl")))
    cands += sorted(glob.glob(os.path.expanduser("~/.cache/clipbert-legacy/apex/apex-*.whl")))
    wheel = next((c for c in cands if c and os.path.isfile(c)), None)
    if wheel is None:
        return None
    site = os.path.join(out_dir, "apex_site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return {"PYTHONPATH": site}, wheel


# ------------------------------------------------------------------------------------------ reporting
def _fmt(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "S" if x else "."
    return f"{x:.6g}" if isinstance(x, float) else str(x)


def step_table(level: str, sides: dict, every: int) -> list[str]:
    """Per-step rows (loss, scale, skipped, grad norm per side): skipped steps, scale changes, any
    disagreement, and every ``every``-th step."""
    names = list(sides)
    cols = ("loss", "scale", "skip", "gnorm")
    head = f"{level} step  " + "  ".join(f"{k + ':' + n:>14}" for n in names for k in cols)
    rows, prev = [head], None
    for i, r0 in enumerate(sides[names[0]]["records"]):
        rs = [sides[n]["records"][i] for n in names]
        keys = [(r["skipped"], r["loss_scale"]) for r in rs]
        if not (r0["skipped"] or r0["loss_scale"] != prev or len(set(keys)) > 1 or r0["step"] % every == 0
                or i == 0):
            prev = r0["loss_scale"]
            continue
        prev = r0["loss_scale"]
        cells = [_fmt(v) for r in rs for v in (r["loss"], r["loss_scale"], r["skipped"], r["grad_norm"])]
        rows.append(f"{level} {r0['step']:>4}  " + "  ".join(f"{c:>14}" for c in cells))
    return rows


def summary_rows(results: dict) -> list[str]:
    """One line per opt level: the acceptance figures."""
    rows = [f"{'level':<6}{'skips=':>7}{'scales=':>8}{'sd=':>6}{'loss rel':>11}{'gnorm rel':>11}"
            f"{'masters abs':>13}{'model abs':>11}{'bitwise':>9}{'pass':>6}"]
    for level, c in results.items():
        bit = all(c.get("bitwise", {}).values()) if c.get("bitwise") else False
        eq = "".join(f"{str(c[k]):>{w}}" for k, w in (("skip_decisions_equal", 7),
                     ("loss_scale_trajectory_equal", 8), ("state_dict_equal", 6)))
        nan = float("nan")
        rows.append(f"{level:<6}{eq}{c['loss_max_rel_diff']:>11.3g}{c['grad_norm_max_rel_diff']:>11.3g}"
                    f"{c.get('masters_max_abs_diff', nan):>13.3g}{c.get('model_max_abs_diff', nan):>11.3g}"
                    f"{str(bit):>9}{str(c['pass']):>6}")
    return rows


def side_summary(res: dict) -> dict:
    """The JSON figures of one side: its per-step records and final amp state."""
    recs = res["records"]
    return {"backend": res["backend"], "device": res["device"], "torch": res["torch"],
            "skipped_steps": [r["step"] for r in recs if r["skipped"]],
            "final_loss_scale": recs[-1]["loss_scale"], "amp_state_dict": res["amp_state_dict"],
            "records": recs}


def write_json(a, report: dict) -> str:
    """The report (``--result``, else ``<out>/amp_oracle.json``), rewritten whole after every level."""
    path = a.result or os.path.join(a.out, "amp_oracle.json")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=1, default=str)
    os.replace(tmp, path)
    return path


def no_apex(a) -> int:
    """No legacy apex.amp: a recorded skip (``--if-no-apex skip``) or exit 1 saying how to get one."""
    how = ("build apex's pure-Python wheel (run_scripts/gpu_bundle.sh, or APEX_SRC=<apex 25.04 source> "
           "run_scripts/gpu_bundle.sh on any machine) and pass --apex-wheel")
    if a.if_no_apex == "fail":
        print(f"amp_oracle: no legacy apex.amp: {how}", file=sys.stderr)
        return 1
    os.makedirs(a.out, exist_ok=True)
    write_json(a, {"part": "amp_oracle", "status": "skipped", "reason": a.skip_reason, "how": how})
    print(f"amp_oracle: {a.skip_reason}")
    return 0


# ------------------------------------------------------------------------------------------ modes
def gpu_compare(a) -> int:
    """Both backends per opt level (O2 first) on the GPU, the two sides of a level in parallel; exit status
    0 when every level passes. The report is written after each level."""
    if not torch.cuda.is_available():
        raise SystemExit(f"amp_oracle: no CUDA device ({APEX_NEEDS_CUDA}); run --cpu-dry-run instead")
    os.makedirs(a.out, exist_ok=True)
    found = find_apex(a, a.out)
    if found is None:
        return no_apex(a)
    apex_env, apex_from = found
    det = {"AMP_ORACLE_DETERMINISTIC": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    report = {"part": "amp_oracle", "status": "running", "mode": "gpu", "steps": a.steps, "window": a.window,
              "inject": a.inject, "apex_from": apex_from, "gpu": torch.cuda.get_device_name(0),
              "tolerances": {"loss_rel": LOSS_RTOL, "grad_norm_rel": GRAD_NORM_RTOL,
                             "weights_abs": WEIGHT_ATOL},
              "levels": {}}
    for level in a.levels:
        t0 = time.time()
        envs = {"native": det, "apex": {**det, **apex_env}}
        procs = {b: run_side(level, b, a, a.out, env) for b, env in envs.items()}
        sides = {b: wait_side(p, a.timeout, a.out, level, b) for b, p in procs.items()}
        c = compare(sides["native"], sides["apex"])
        for backend, res in sides.items():
            c[f"{backend}_checks"] = side_checks(res, a.window, a.inject, exact_skips=False)
        c["pass"] = c["pass"] and all(all(c[f"{b}_checks"].values()) for b in sides)
        c["seconds"] = round(time.time() - t0, 1)
        c["sides"] = {b: side_summary(r) for b, r in sides.items()}
        report["levels"][level] = c
        write_json(a, report)
        print("\n".join(step_table(level, sides, every=max(1, a.steps // 10))), flush=True)
    report["pass"] = all(c["pass"] for c in report["levels"].values())
    report["status"] = "ok" if report["pass"] else "failed"
    print("\n".join(summary_rows(report["levels"])))
    print(f"amp_oracle: {'PASS' if report['pass'] else 'FAIL'}; report {write_json(a, report)}")
    return 0 if report["pass"] else 1


def apex_import_check(a) -> dict:
    """CPU dry run: does the found apex import beside this torch (its amp cannot run on CPU)?"""
    found = find_apex(a, a.out)
    if found is None:
        return {"found": False, "reason": a.skip_reason}
    env = {**os.environ, **found[0]}
    paths = (found[0].get("PYTHONPATH"), os.environ.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    probe = "import apex, apex.amp as m; print(apex.__file__); assert hasattr(m, 'initialize')"
    p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    return {"found": True, "from": found[1], "imports": p.returncode == 0,
            "detail": (p.stdout + p.stderr).strip()[-1500:]}


def cpu_dry_run(a) -> int:
    """Our side only, on CPU, both levels in parallel; the single-side checks must all hold."""
    print(f"amp_oracle --cpu-dry-run: apex side skipped ({APEX_NEEDS_CUDA})")
    os.makedirs(a.out, exist_ok=True)
    t0 = time.time()
    env = {"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    procs = {level: run_side(level, "native", a, a.out, env) for level in a.levels}
    sides = {level: wait_side(p, a.timeout, a.out, level, "native") for level, p in procs.items()}
    report = {"part": "amp_oracle", "status": "running", "mode": "cpu-dry-run",
              "apex": f"side skipped: {APEX_NEEDS_CUDA}", "apex_import": apex_import_check(a),
              "steps": a.steps,
              "window": a.window, "inject": a.inject, "levels": {}}
    for level, res in sides.items():
        checks = side_checks(res, a.window, a.inject, exact_skips=True)
        report["levels"][level] = {"checks": checks, "pass": all(checks.values()),
                                   "rule_violations": check_scaler_rules(res["records"], a.window),
                                   **side_summary(res)}
        print("\n".join(step_table(level, {"ours": res}, every=1)))
        print(f"{level}: " + ", ".join(f"{k}={v}" for k, v in checks.items()))
    report["seconds"] = round(time.time() - t0, 1)
    imports = report["apex_import"]["imports"] if report["apex_import"]["found"] else True
    report["pass"] = all(v["pass"] for v in report["levels"].values()) and imports
    report["status"] = "ok" if report["pass"] else "failed"
    print(f"amp_oracle dry run: {'PASS' if report['pass'] else 'FAIL'} in {report['seconds']} s; "
          f"report {write_json(a, report)}")
    return 0 if report["pass"] else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per run (GPU default 300)")
    ap.add_argument("--cpu-dry-run", action="store_true", help="our side only, on CPU, a few steps")
    ap.add_argument("--levels", nargs="+", choices=LEVELS, default=list(LEVELS))
    ap.add_argument("--window", type=int, default=None, help="dynamic scaler growth window (GPU default 20)")
    ap.add_argument("--inject", type=int, nargs="*", default=None, help="1-based steps whose loss overflows")
    ap.add_argument("--out", default=os.path.join(REPO, "output", "amp_oracle"))
    ap.add_argument("--apex-wheel", default=None, help="apex's pure-Python wheel (else searched)")
    ap.add_argument("--timeout", type=float, default=300, help="seconds per side")
    ap.add_argument("--result", default=None, help="the JSON report (default <out>/amp_oracle.json)")
    ap.add_argument("--if-no-apex", choices=("fail", "skip"), default="fail",
                    help="without a legacy apex: exit 1 (default) or write a skipped report and exit 0")
    ap.add_argument("--skip-reason", default="skipped: no legacy apex.amp found", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    base = DRY_RUN if a.cpu_dry_run else {"steps": 300, "window": 20}
    a.steps = a.steps or base["steps"]
    a.window = a.window or base["window"]
    if a.inject is None:
        dry_default = a.cpu_dry_run and a.steps == DRY_RUN["steps"]
        a.inject = DRY_RUN["inject"] if dry_default else default_inject(a.steps)
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    if os.environ.get("GPU_CHECK_FAIL_PART") == "amp_oracle":  # the GPU check's forced failure (its CI test)
        raise RuntimeError("forced failure of part 'amp_oracle' (GPU_CHECK_FAIL_PART=amp_oracle)")
    return cpu_dry_run(a) if a.cpu_dry_run else gpu_compare(a)


if __name__ == "__main__":
    sys.exit(main())
