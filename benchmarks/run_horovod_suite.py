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

``--one_job N`` runs the whole file in one job instead, as Horovod's CI does (``pytest test_torch.py``
under ``horovodrun -np 2``: every test calls ``hvd.init()``, and under horovodrun the test's ``tearDown``
calls ``hvd.barrier(); hvd.shutdown()``, so one job initialises Horovod about 115 times), ``N`` times one
after another, each with ``--timeout`` for the whole job. Each job is counted as clean (it ended by
itself, nothing aborted, every test's outcome the expected one: the baseline's from ``--compare``, an
earlier ``--one_job`` ``--json`` of real Horovod, else only passed or skipped), failed (it ended, some
outcome differs), aborted (``terminate called``, SIGABRT, SIGSEGV, ``Fatal Python error``) or hung;
the per-test outcomes come from every rank's JUnit report. ``--pmi_vars`` sets ``PMI_RANK``/``PMI_SIZE``
in torchrun's workers (the suite's ``test_horovod_rank``/``size`` read them without ``HOROVOD_RANK``).

    nice -n 10 .venv/bin/python benchmarks/run_horovod_suite.py \\
        --tests /tmp/horovod/test/parallel/test_torch.py --launcher horovodrun --module horovod.torch \\
        --one_job 5 --timeout 1200 --json real_onejob.json
    nice -n 10 .venv/bin/python benchmarks/run_horovod_suite.py \\
        --tests /tmp/horovod/test/parallel/test_torch.py --launcher torchrun --pmi_vars \\
        --one_job 5 --timeout 1200 --compare real_onejob.json --json ours_onejob.json

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
import importlib.util
import json
import os
import re
import resource
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
if os.environ.get("SUITE_PMI_VARS") and "RANK" in os.environ:
    os.environ["PMI_RANK"], os.environ["PMI_SIZE"] = os.environ["RANK"], os.environ["WORLD_SIZE"]
sys.exit(pytest.main([sys.argv[1], "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                      "--junitxml=" + os.path.join(sys.argv[2], "rank" + rank + ".xml")]))
"""
ABORTS = re.compile(r"terminate called|core dumped|Segmentation fault|Fatal Python error|"
                    r"SIGABRT|SIGSEGV|exitcode\s*:\s*-(6|11)\b|[Ss]ignal 6\b|[Ss]ignal 11\b|"
                    r"status code (-6|-11|134|139)\b")


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


def launch(launcher: str, np: int, target: Path, test_id: str, reports: Path, timeout: float,
           pmi_vars: bool = False) -> tuple:
    """One job of ``np`` ranks running pytest on ``test_id``: (returncode or None if it hung, output, s)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    if pmi_vars:
        env["SUITE_PMI_VARS"] = "1"
    t0 = time.time()
    proc = subprocess.Popen(command(launcher, np, target.parent.parent / "driver.py", test_id, reports),
                            cwd=target.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out, round(time.time() - t0, 1)
    return proc.returncode, out, round(time.time() - t0, 1)


def run_one(launcher: str, np: int, target: Path, name: str, timeout: float, pmi_vars: bool = False) -> dict:
    """One test in its own job; returns {outcome, seconds, detail}."""
    reports = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=target.parent.parent))
    test_id = f"{target}::TorchTests::{name}"
    rc, out, seconds = launch(launcher, np, target, test_id, reports, timeout, pmi_vars)
    if rc is None:
        return {"outcome": "hung", "seconds": seconds, "detail": _tail(out)}
    outcome, detail = combine([_rank_result(reports / f"rank{r}.xml") for r in range(np)], rc)
    return {"outcome": outcome, "seconds": seconds, "detail": detail or _tail(out)}


def _case_result(case: ET.Element, rank: str) -> tuple[str, str]:
    for tag, outcome in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
        node = case.find(tag)
        if node is not None:
            message = (node.get("message") or tag).splitlines()[0][:300] if node.get("message") else tag
            return outcome, f"{rank}: {message}"
    return "passed", ""


def _rank_result(report: Path) -> tuple[str, str]:
    """(passed|failed|skipped|missing, message) of one rank's JUnit report."""
    if not report.is_file():
        return "missing", f"no report from {report.stem}"
    case = ET.parse(report).getroot().find(".//testcase")
    if case is None:
        return "missing", f"{report.stem}: no test ran"
    return _case_result(case, report.stem)


def _rank_cases(report: Path) -> dict[str, tuple[str, str]]:
    """{test name: (outcome, message)} of one rank's JUnit report of a whole-file job ({} if none)."""
    if not report.is_file():
        return {}
    try:
        root = ET.parse(report).getroot()
    except ET.ParseError:
        return {}
    return {case.get("name"): _case_result(case, report.stem) for case in root.iter("testcase")}


def run_file(launcher: str, np: int, target: Path, names: list[str], timeout: float, pmi_vars: bool) -> dict:
    """The whole file in one job: {job: passed-by-itself|aborted|hung|exit N, seconds, results, detail}."""
    reports = Path(tempfile.mkdtemp(prefix="onejob-", dir=target.parent.parent))
    rc, out, seconds = launch(launcher, np, target, str(target), reports, timeout, pmi_vars)
    ranks = [_rank_cases(reports / f"rank{r}.xml") for r in range(np)]
    results = {}
    for name in names:
        per_rank = [rk.get(name, ("missing", f"rank{r}: not reported")) for r, rk in enumerate(ranks)]
        outcome, detail = combine(per_rank, 0)
        results[name] = {"outcome": outcome if any(rk for rk in ranks) else "no report", "seconds": 0,
                         "detail": detail}
    job = "hung" if rc is None else "aborted" if ABORTS.search(out) else f"exit {rc}"
    return {"job": job, "seconds": seconds, "results": results, "detail": _tail(out, 12), "output": out}


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
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return counts


def suite_imports(test_file: Path) -> set[str]:
    """The top-level packages the test file imports at module level, and the suite's own modules it imports
    (``../utils/common.py``), not the standard library or Horovod (``IMPORT_LINE`` replaces it)."""
    local = {f.stem: f for d in (test_file.parent.parent / "utils", test_file.parent) for f in d.glob("*.py")}
    todo, seen, names = [test_file], set(), set()
    while todo:
        f = todo.pop()
        seen.add(f)
        for node in ast.parse(f.read_text()).body:
            if isinstance(node, ast.Import):
                found = {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found = {node.module.split(".")[0]}
            else:
                continue
            todo += [local[n] for n in found if n in local and local[n] not in seen]
            names |= found - set(local)
    return names - set(sys.stdlib_module_names) - {"horovod"}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


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
    ap.add_argument("--one_job", type=int, default=0, metavar="N",
                    help="run the whole file in one job (as Horovod's CI), N times; --timeout is per job")
    ap.add_argument("--pmi_vars", action="store_true", help="torchrun: PMI_RANK/PMI_SIZE in the workers")
    ap.add_argument("--log_dir", type=Path,
                    help="--one_job: keep each job's output here, and the core file of a rank that aborts")
    a = ap.parse_args(argv)
    if not a.tests.is_file():
        ap.error(f"--tests {a.tests}: no such file (Horovod v0.28.1's test/parallel/test_torch.py)")
    missing = [m for m in sorted(suite_imports(a.tests)) if not _importable(m)]
    if missing:  # else every test "fails" with no report (Horovod's utils/common.py imports mock)
        ap.error(f"{a.tests} (or its ../utils/) imports {', '.join(missing)}, not installed in "
                 f"{sys.executable}: {sys.executable} -m pip install {' '.join(missing)}")
    names = [n for n in test_names(a.tests) if not a.only or any(k in n for k in a.only)]
    workdir = Path(tempfile.mkdtemp(prefix="horovod_suite_"))
    results: dict[str, dict] = {}
    if a.one_job:
        try:
            return one_job(a, prepare(a.tests, a.module, workdir), names)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    try:
        target = prepare(a.tests, a.module, workdir)
        t0 = time.time()
        for i, name in enumerate(names):
            if a.budget_s and time.time() - t0 > a.budget_s:
                print(f"time budget of {a.budget_s:.0f} s spent: {len(names) - i} tests not run", flush=True)
                break
            results[name] = run_one(a.launcher, a.np, target, name, a.timeout, a.pmi_vars)
            r = results[name]
            print(f"[{i + 1}/{len(names)}] {r['outcome']:7s} {r['seconds']:6.1f}s {name}"
                  + (f"  -- {r['detail'][:200]}" if r["outcome"] not in ("passed",) and r["detail"] else ""),
                  flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report(a, results)
    return 0


def one_job(a: argparse.Namespace, target: Path, names: list[str]) -> int:
    """``--one_job N``: the whole file N times, one job each; prints each job's verdict and the tally."""
    expected = ({n: r["outcome"] for n, r in json.loads(a.compare.read_text())["results"].items()
                 if r["outcome"] in ("passed", "failed", "skipped")} if a.compare else {})
    jobs, tally = [], {"clean": 0, "failed": 0, "aborted": 0, "hung": 0}
    for i in range(a.one_job):
        if a.log_dir:  # a rank that aborts leaves a core file (core_pattern "core": in the job's cwd)
            hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
            resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
        job = run_file(a.launcher, a.np, target, names, a.timeout, a.pmi_vars)
        output = job.pop("output")
        if a.log_dir:
            a.log_dir.mkdir(parents=True, exist_ok=True)
            (a.log_dir / f"job{i + 1}.log").write_text(output)
            for n, core in enumerate(sorted(target.parent.glob("core*"))):
                shutil.move(str(core), a.log_dir / f"job{i + 1}.core{n}")
        counts = summarize(job["results"])
        differ = {n: r for n, r in job["results"].items()
                  if r["outcome"] != expected.get(n, r["outcome"] if r["outcome"] in ("passed", "skipped")
                                                  else "passed")}
        verdict = ("hung" if job["job"] == "hung" else "aborted" if job["job"] == "aborted"
                   else "failed" if differ else "clean")
        if verdict in ("hung", "aborted"):  # without the reports, the list of tests says nothing
            differ = {n: r for n, r in job["results"].items() if r["outcome"] not in ("no report", "hung")}
        tally[verdict] += 1
        job.update(verdict=verdict, counts=counts, differ=sorted(differ))
        jobs.append(job)
        print(f"job {i + 1}/{a.one_job}: {verdict} ({job['job']}, {job['seconds']:.0f} s): "
              + ", ".join(f"{k} {v}" for k, v in counts.items())
              + "".join(f"\n    {n}: {r['outcome']} (expected {expected.get(n, 'passed')}) "
                        f"{r['detail'][:200]}" for n, r in sorted(differ.items()))
              + (f"\n    output: {job['detail']}" if verdict in ("hung", "aborted") else ""), flush=True)
    print(f"\n`{a.module}` under `{a.launcher}`, the whole file in one job: "
          f"{tally['clean']}/{a.one_job} clean, "
          f"{tally['failed']} failed, {tally['aborted']} aborted, {tally['hung']} hung")
    if a.json:
        last = jobs[-1]["results"] if jobs else {}
        a.json.write_text(json.dumps({"module": a.module, "launcher": a.launcher, "np": a.np, "tally": tally,
                                      "results": last, "jobs": jobs}, indent=1))
    return 0 if tally["clean"] == a.one_job else 1


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
