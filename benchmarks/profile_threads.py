"""Where each training process's CPU time goes, thread by thread (issue 51): the settings of
``bench_scaling.py`` (1 process; 2 under horovodrun; 2 under torchrun; 2 independent processes, the
ceiling), the same training command, one epoch over ``--data_ratio`` of the demo's training videos.

While a setting runs, every training process's threads are read from ``/proc/<pid>/task/<tid>/stat``
twice a second (user + system CPU seconds, the kernel's thread name) and ``status`` (involuntary context
switches: how often the kernel took the core away from the thread). Python threads are named with
``py-spy dump`` (``pip install py-spy``; without it they show as the kernel's name), the main thread is
the one whose id is the process's; the others are native (Horovod's background loop, Gloo's and torch's
pools). The table gives, per setting, the CPU seconds of each thread group summed over the ranks, the
share of all CPU time, and the wall time; ``--json`` keeps every thread.

    .venv/bin/python benchmarks/profile_threads.py [--data_ratio 0.25] [--settings ...] [--json out.json]

Run it on an otherwise idle machine (the figures are CPU seconds, but the competition between threads is
what is measured).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

try:  # its settings and command line: the same runs
    import bench_scaling  # run as a script: benchmarks/ is the script's directory
except ModuleNotFoundError:  # imported as benchmarks.profile_threads (the tests)
    from benchmarks import bench_scaling

TICK = os.sysconf("SC_CLK_TCK")
DEFAULT_SETTINGS = ["1 proc x 1 thread", "2 procs (horovodrun)", "2 procs (torchrun)",
                    "2 independent procs (ceiling)"]
PY_SPY = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")


def _tids(pid: int) -> list[str]:
    """The process's thread ids (none once it has ended)."""
    try:
        return os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []


def _children(pid: int) -> list[int]:
    """Every thread's children (horovodrun starts its ranks from a thread)."""
    out = []
    for t in _tids(pid):
        try:
            with open(f"/proc/{pid}/task/{t}/children") as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def training_pids(roots: list[int]) -> list[int]:
    """The processes under ``roots`` (and the roots) that run the training script."""
    found, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        todo += _children(pid)
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
        except OSError:
            continue
        launcher = any(a.endswith((b"horovodrun", b"torchrun", b"torch.distributed.run")) for a in cmd)
        if cmd and not launcher and any(a.endswith(b"run_video_retrieval.py") for a in cmd):
            found.append(pid)
    return found


def read_threads(pid: int) -> dict[int, dict]:
    """tid -> {comm, cpu_s, nonvol}: this moment's cumulative figures of every thread of ``pid``."""
    out = {}
    for t in _tids(pid):
        try:
            with open(f"/proc/{pid}/task/{t}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{t}/status") as f:
                status = f.read()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2:].split()
        m = re.search(r"nonvoluntary_ctxt_switches:\s+(\d+)", status)
        out[int(t)] = {"comm": comm, "cpu_s": (int(fields[11]) + int(fields[12])) / TICK,
                       "nonvol": int(m.group(1)) if m else 0}
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """Native thread id -> Python thread name, from ``py-spy dump`` (empty without py-spy)."""
    if not os.path.exists(PY_SPY):
        return {}
    try:
        p = subprocess.run([PY_SPY, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                           text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found = re.findall(r'^Thread (\d+) \([a-z]+\): "([^"]*)"', p.stdout, re.M)
    return {int(tid): name for tid, name in found}


def group_of(pid: int, tid: int, comm: str, names: dict[int, str]) -> str:
    """A thread's group: the main thread, a Python thread by its name (a process set's prefix dropped),
    or a native thread by the kernel's name (Horovod's background loop is a native thread the kernel calls
    "python")."""
    if tid == pid:
        return "main (compute)"
    if tid in names:
        return "py: " + re.sub(r"-clipbert/\S*$", "", names[tid])  # a process set's threads, one group
    return "native: " + re.sub(r"\d+$", "#", comm)


def train_step(metrics_path: str) -> int:
    """The last training step the run's ``log/metrics.jsonl`` has logged (0 before the first)."""
    step = 0
    try:
        with open(metrics_path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:  # a line being written
                    continue
                if row.get("split") == "train":
                    step = max(step, int(row["step"]))
    except OSError:
        pass
    return step


class Sampler:
    """Polls the training processes of a running setting until ``stop``. Besides every thread's last
    reading, it keeps a snapshot of all of them each time the runs' logged training steps change, from
    when every run is past its ``warmup``-th step; from the first to the last but one (the last step's
    line comes after the final validation) is the training loop alone (no start-up, model build, first
    steps or final validation)."""

    def __init__(self, roots: list[int], metrics: list[str], warmup: int, every: float = 0.5) -> None:
        self.roots, self.every, self.metrics, self.warmup = roots, every, metrics, warmup
        self.window: dict[str, Any] = {}  # "marks": [(steps per run, {pid: {tid: reading}}, time)]
        self.last: dict[int, dict[int, dict]] = {}   # pid -> tid -> the last reading
        self.names: dict[int, dict[int, str]] = {}   # pid -> tid -> Python thread name
        self.first_seen: dict[int, float] = {}
        self.dumps: dict[int, list[float]] = {}       # pid -> when its threads were named
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            now = time.monotonic()
            steps = [train_step(m) for m in self.metrics]
            readings = {}
            for pid in training_pids(self.roots):
                threads = read_threads(pid)
                if not threads:
                    continue
                readings[pid] = threads
                self.last.setdefault(pid, {}).update(threads)
                self.first_seen.setdefault(pid, now)
                # name the Python threads twice (after the first steps, and later for threads started
                # later): py-spy reads the process without pausing it, but not for free
                due = [20.0, 60.0][len(self.dumps.get(pid, [])):][:1]
                if due and now - self.first_seen[pid] > due[0]:
                    self.dumps.setdefault(pid, []).append(now)
                    self.names.setdefault(pid, {}).update(python_thread_names(pid))
            marks = self.window.setdefault("marks", [])
            if not marks:
                if readings and min(steps) > self.warmup:
                    marks.append((steps, readings, now))
            elif steps != marks[-1][0] and len(readings) == len(marks[0][1]):
                marks.append((steps, readings, now))


def _examples_per_step(launcher: str, extra: list[str]) -> int:
    """Examples one run's training step takes, over all its processes (the config's batch, or
    --train_batch_size x --gradient_accumulation_steps in the setting's flags)."""
    with open(os.path.join(bench_scaling.REPO, "configs", "demo_ret.json")) as f:
        cfg = json.load(f)
    flags = dict(zip(extra[::2], extra[1::2]))
    batch = int(flags.get("--train_batch_size", cfg["train_batch_size"]))
    accum = int(flags.get("--gradient_accumulation_steps", cfg.get("gradient_accumulation_steps", 1)))
    return batch * accum * (2 if launcher in ("horovodrun", "torchrun") else 1)


def _by_group(readings: dict[int, dict[int, dict]], names: dict[int, dict[int, str]],
              since: dict[int, dict[int, dict]] | None = None) -> tuple[dict[str, dict], list[dict]]:
    """CPU seconds and preemptions per thread group (minus ``since``'s, for threads in both)."""
    groups: dict[str, dict] = collections.defaultdict(lambda: {"cpu_s": 0.0, "nonvol": 0, "threads": 0})
    per_thread = []
    for pid, threads in readings.items():
        for tid, t in threads.items():
            before = (since or {}).get(pid, {}).get(tid)
            if since is not None and before is None:
                continue
            cpu = t["cpu_s"] - (before["cpu_s"] if before else 0.0)
            nonvol = t["nonvol"] - (before["nonvol"] if before else 0)
            g = group_of(pid, tid, t["comm"], names.get(pid, {}))
            groups[g]["cpu_s"] += cpu
            groups[g]["nonvol"] += nonvol
            groups[g]["threads"] += 1
            per_thread.append({"pid": pid, "tid": tid, "group": g, "comm": t["comm"], "cpu_s": cpu,
                               "nonvol": nonvol})
    return dict(groups), per_thread


def run(name: str, data_dir: str, data_ratio: float, warmup: int) -> dict:
    launcher, threads, extra, extra_env = bench_scaling.SETTINGS[name]
    outs = [tempfile.mkdtemp(prefix="profile_threads_") for _ in range(2 if launcher == "independent" else 1)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "CLIPBERT_PROGRESS": "off",
           "DIST_BACKEND": "torch" if launcher == "torchrun" else "auto",
           "PATH": bench_scaling.BIN + os.pathsep + os.environ.get("PATH", ""), **extra_env}
    t0 = time.monotonic()
    procs = [subprocess.Popen(bench_scaling.command(launcher, extra, out, data_dir, data_ratio),
                              cwd=bench_scaling.REPO, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True) for out in outs]
    metrics = [os.path.join(out, "log", "metrics.jsonl") for out in outs]
    with Sampler([p.pid for p in procs], metrics, warmup) as sampler:
        errs = [p.communicate(timeout=1800)[1] for p in procs]
    wall = time.monotonic() - t0
    for p, err, out in zip(procs, errs, outs):
        shutil.rmtree(out, ignore_errors=True)
        if p.returncode != 0:
            raise SystemExit(f"{name} failed ({p.returncode}):\n{err[-3000:]}")
    whole, per_thread = _by_group(sampler.last, sampler.names)
    result = {"wall_s": wall, "processes": len(sampler.last), "groups": whole, "threads": per_thread}
    marks = sampler.window.get("marks", [])
    if len(marks) >= 3:  # the last step is logged after the final validation: end at the one before
        (s0, r0, t_0), (s1, r1, t_1) = marks[0], marks[-2]
        loop, loop_threads = _by_group(r1, sampler.names, since=r0)
        examples = sum(b - a for a, b in zip(s0, s1)) * _examples_per_step(launcher, extra)
        result["loop"] = {"groups": loop, "threads": loop_threads, "examples": examples,
                          "seconds": t_1 - t_0, "steps": [s0, s1]}
    return result


def table(results: dict[str, dict]) -> str:
    """Two tables: the training loop per example (what scaling is about), then the whole run."""
    rows = []
    loops = {n: r["loop"] for n, r in results.items() if "loop" in r}
    if loops:
        names = sorted({g for r in loops.values() for g in r["groups"]},
                       key=lambda g: -max(r["groups"].get(g, {"cpu_s": 0})["cpu_s"] for r in loops.values()))
        rows += ["Training loop (after the warm-up steps, until the last step): CPU ms per example, its "
                 "share, involuntary preemptions per 100 examples", "",
                 "| thread group | " + " | ".join(loops) + " |", "|---|" + "---|" * len(loops)]
        for g in names:
            cells = []
            for r in loops.values():
                x, total = r["groups"].get(g), sum(v["cpu_s"] for v in r["groups"].values())
                cells.append("-" if x is None else f"{1000 * x['cpu_s'] / r['examples']:.2f} ms "
                             f"({100 * x['cpu_s'] / total:.1f}%), {100 * x['nonvol'] / r['examples']:.0f}")
            rows.append(f"| {g} | " + " | ".join(cells) + " |")
        rows.append("| **all threads, ms/example; examples/s (wall)** | " + " | ".join(
            f"{1000 * sum(v['cpu_s'] for v in r['groups'].values()) / r['examples']:.2f} ms; "
            f"{r['examples'] / r['seconds']:.1f} ex/s" for r in loops.values()) + " |")
        rows += ["", "Whole run (start-up, model build, training, final validation): CPU seconds", ""]
    names = sorted({g for r in results.values() for g in r["groups"]},
                   key=lambda g: -max(r["groups"].get(g, {"cpu_s": 0})["cpu_s"] for r in results.values()))
    rows += ["| thread group | " + " | ".join(results) + " |", "|---|" + "---|" * len(results)]
    for g in names:
        cells = []
        for r in results.values():
            x, total = r["groups"].get(g), sum(v["cpu_s"] for v in r["groups"].values())
            cells.append("-" if x is None else f"{x['cpu_s']:.1f} s ({100 * x['cpu_s'] / total:.1f}%)")
        rows.append(f"| {g} | " + " | ".join(cells) + " |")
    rows.append("| **all threads (CPU s) / wall s** | " + " | ".join(
        f"{sum(v['cpu_s'] for v in r['groups'].values()):.1f} / {r['wall_s']:.0f}" for r in results.values())
        + " |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data_ratio", type=float, default=0.25)
    ap.add_argument("--data_dir", default="data/demo")
    ap.add_argument("--warmup", type=int, default=2, help="training steps left out of the loop's figures")
    ap.add_argument("--settings", nargs="+", default=DEFAULT_SETTINGS, choices=list(bench_scaling.SETTINGS))
    ap.add_argument("--json", help="write every thread's figures here")
    a = ap.parse_args()
    if not os.path.isfile(os.path.join(bench_scaling.REPO, a.data_dir, "stats.json")):
        raise SystemExit(f"no demo data in {a.data_dir}: run ./run_scripts/quickstart.sh first")
    if not os.path.exists(PY_SPY):
        print("py-spy not found: Python threads are shown by the kernel's name (pip install py-spy)",
              file=sys.stderr)
    results = {}
    for name in a.settings:
        results[name] = run(name, a.data_dir, a.data_ratio, a.warmup)
        r = results[name]
        print(f"{name}: {r['wall_s']:.0f} s, {r['processes']} process(es)", flush=True)
    print()
    print(table(results))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"data_ratio": a.data_ratio, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
