"""Run Horovod's own test suite (``test/parallel/test_torch.py``) against ``clipbert_legacy.compat.hvd``.

For anyone with a copy of Horovod's source (the suite is not part of this repository): the test file
and its helper ``test/utils/common.py`` are copied to a temporary directory, where only the line
``import horovod.torch as hvd`` is rewritten (``--module``, default ``clipbert_legacy.compat.hvd``; give
``horovod.torch`` to run real Horovod as the baseline). Each test then runs in its own job of
``--np`` processes under ``horovodrun`` (Gloo) or ``torchrun``, with a timeout; every rank writes a
JUnit report, and a test passed when every rank passed it, was skipped when every rank skipped it,
hung when the job ran past ``--timeout``, and failed otherwise. Prints one line per test and the table
(passed / failed / skipped / hung); ``--json`` keeps the outcomes, ``--compare`` lists the tests whose
outcome differs from an earlier ``--json``.

    git clone --branch v0.28.1 https://github.com/horovod/horovod /tmp/horovod   # or any copy of v0.28.1
    nice -n 10 .venv/bin/python benchmarks/run_horovod_suite.py \\
        --tests /tmp/horovod/test/parallel/test_torch.py --launcher torchrun --json torchrun.json

The suite's helper module needs ``horovod`` (its ``horovod.runner`` package), ``mock``, ``pytest`` and
``numpy`` importable. A test whose job is killed at the timeout is reported as hung, with its last
output lines.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

BIN = Path(sys.executable).parent
IMPORT_LINE = "import horovod.torch as hvd"
DRIVER = """import os, sys
import pytest
rank = os.environ.get("HOROVOD_RANK") or os.environ.get("RANK") or "0"
sys.exit(pytest.main([sys.argv[1], "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                      "--junitxml=" + os.path.join(sys.argv[2], "rank" + rank + ".xml")]))
"""


def test_names(test_file: Path, cls: str = "TorchTests") -> list[str]:
    """The ``test_*`` methods of ``cls``, in file order (read, not imported)."""
    tree = ast.parse(test_file.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return [f.name for f in node.body
                    if isinstance(f, ast.FunctionDef) and f.name.startswith("test_")]
    raise SystemExit(f"{test_file}: no class {cls}")


def prepare(test_file: Path, module: str, workdir: Path) -> Path:
    """Copy the suite (test file + ../utils/common.py) with only the import line changed."""
    text = test_file.read_text()
    if text.count(IMPORT_LINE) != 1:
        raise SystemExit(f"{test_file}: expected exactly one line '{IMPORT_LINE}'")
    (workdir / "parallel").mkdir(parents=True)
    target = workdir / "parallel" / test_file.name
    target.write_text(text.replace(IMPORT_LINE, f"import {module} as hvd"))
    utils = test_file.parent.parent / "utils"
    if utils.is_dir():
        shutil.copytree(utils, workdir / "utils")
    (workdir / "driver.py").write_text(DRIVER)
    return target


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(launcher: str, np: int, driver: Path, test_id: str, reports: Path) -> list[str]:
    if launcher == "horovodrun":
        return [str(BIN / "horovodrun"), "-np", str(np), "-H", f"localhost:{np}", "--gloo",
                "--gloo-timeout-seconds", "60", sys.executable, str(driver), test_id, str(reports)]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(np), "--master_addr",
            "127.0.0.1", "--master_port", str(free_port()), str(driver), test_id, str(reports)]


def run_one(launcher: str, np: int, target: Path, name: str, timeout: float) -> dict:
    """One test in its own job; returns {outcome, seconds, detail}."""
    reports = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=target.parent.parent))
    test_id = f"{target}::TorchTests::{name}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    t0 = time.time()
    proc = subprocess.Popen(command(launcher, np, target.parent.parent / "driver.py", test_id, reports),
                            cwd=target.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return {"outcome": "hung", "seconds": round(time.time() - t0, 1), "detail": _tail(out)}
    outcome, detail = combine([_rank_result(reports / f"rank{r}.xml") for r in range(np)], proc.returncode)
    return {"outcome": outcome, "seconds": round(time.time() - t0, 1), "detail": detail or _tail(out)}


def _rank_result(report: Path) -> tuple[str, str]:
    """(passed|failed|skipped|missing, message) of one rank's JUnit report."""
    if not report.is_file():
        return "missing", f"no report from {report.stem}"
    case = ET.parse(report).getroot().find(".//testcase")
    if case is None:
        return "missing", f"{report.stem}: no test ran"
    for tag, outcome in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
        node = case.find(tag)
        if node is not None:
            message = (node.get("message") or tag).splitlines()[0][:300]
            return outcome, f"{report.stem}: {message}"
    return "passed", ""


def combine(results: list[tuple[str, str]], returncode: int) -> tuple[str, str]:
    """The job's outcome from every rank's: all passed -> passed, all skipped -> skipped, else failed."""
    outcomes = {o for o, _ in results}
    details = "; ".join(d for _, d in results if d)
    if outcomes == {"passed"} and returncode == 0:
        return "passed", ""
    if outcomes == {"skipped"} and returncode == 0:
        return "skipped", details
    if outcomes <= {"passed", "skipped"} and returncode == 0:
        return "passed", details
    return "failed", details or f"exit code {returncode}"


def _tail(out: str, lines: int = 6) -> str:
    keep = [ln for ln in (out or "").splitlines() if ln.strip()]
    return " | ".join(keep[-lines:])[-800:]


def summarize(results: dict[str, dict]) -> dict[str, int]:
    counts = {"passed": 0, "failed": 0, "skipped": 0, "hung": 0}
    for r in results.values():
        counts[r["outcome"]] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tests", required=True, type=Path, help="Horovod's test/parallel/test_torch.py")
    ap.add_argument("--launcher", required=True, choices=["horovodrun", "torchrun"])
    ap.add_argument("--module", default="clipbert_legacy.compat.hvd",
                    help="what 'hvd' is (horovod.torch: the baseline)")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=300, help="seconds per test job")
    ap.add_argument("--budget_s", type=float, default=0, help="stop starting tests after this many seconds")
    ap.add_argument("-k", dest="only", action="append", default=[], help="run tests whose name contains this")
    ap.add_argument("--json", type=Path, help="write the outcomes here")
    ap.add_argument("--compare", type=Path, help="an earlier --json: list the tests whose outcome differs")
    a = ap.parse_args(argv)
    names = [n for n in test_names(a.tests) if not a.only or any(k in n for k in a.only)]
    workdir = Path(tempfile.mkdtemp(prefix="horovod_suite_"))
    results: dict[str, dict] = {}
    try:
        target = prepare(a.tests, a.module, workdir)
        t0 = time.time()
        for i, name in enumerate(names):
            if a.budget_s and time.time() - t0 > a.budget_s:
                print(f"time budget of {a.budget_s:.0f} s spent: {len(names) - i} tests not run", flush=True)
                break
            results[name] = run_one(a.launcher, a.np, target, name, a.timeout)
            r = results[name]
            print(f"[{i + 1}/{len(names)}] {r['outcome']:7s} {r['seconds']:6.1f}s {name}"
                  + (f"  -- {r['detail'][:200]}" if r["outcome"] not in ("passed",) and r["detail"] else ""),
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(a, results)
    return 0


def report(a: argparse.Namespace, results: dict[str, dict]) -> None:
    counts = summarize(results)
    print(f"\n| run | passed | failed | skipped | hung |\n|---|---|---|---|---|\n"
          f"| `{a.module}` under `{a.launcher} -np {a.np}` | {counts['passed']} | {counts['failed']} | "
          f"{counts['skipped']} | {counts['hung']} |")
    if a.json:
        a.json.write_text(json.dumps({"module": a.module, "launcher": a.launcher, "np": a.np,
                                      "counts": counts, "results": results}, indent=1))
    if a.compare:
        before = json.loads(a.compare.read_text())["results"]
        changed = [(n, before.get(n, {}).get("outcome", "-"), r["outcome"]) for n, r in results.items()
                   if before.get(n, {}).get("outcome") != r["outcome"]]
        print(f"\n{len(changed)} test(s) differ from {a.compare}:")
        for n, was, now in changed:
            print(f"  {n}: {was} -> {now}")


if __name__ == "__main__":
    sys.exit(main())
