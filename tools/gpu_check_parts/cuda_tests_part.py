"""Part 5 of the GPU check: the project's tests that need a GPU (marked ``cuda`` or skipped when
``torch.cuda.is_available()`` is False), run with pytest; per test: passed / failed / skipped and why.

pytest runs with the repository's ini options except ``addopts`` (its ``--timeout`` needs pytest-timeout,
which a GPU node may lack; the driver's timeout bounds the run instead).
"""
import ast
import glob
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import _common


def cuda_test_ids() -> list:
    """Tests that need a GPU: marked ``cuda`` or skipped when ``torch.cuda.is_available()`` is False."""
    ids = []
    for path in sorted(glob.glob(os.path.join(_common.REPO, "tests", "test_*.py"))):
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_") and any(
                    needs_cuda(d) for d in node.decorator_list):
                ids.append(f"{os.path.relpath(path, _common.REPO)}::{node.name}")
    return ids


def needs_cuda(dec) -> bool:
    src = ast.unparse(dec)
    return src == "pytest.mark.cuda" or ("skipif" in src and "cuda.is_available" in src)


def outcomes(junit_xml: str) -> dict:
    """test id -> {"outcome", "message"} from pytest's JUnit XML."""
    out = {}
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/") + ".py"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                message = (el.get("message") or el.text or "")[:500]
        out[f"{path}::{case.get('name')}"] = {"outcome": outcome, "message": message,
                                              "seconds": float(case.get("time", 0))}
    return out


def main() -> int:
    a = _common.parse(__doc__.split("\n")[0])
    res = _common.Result("cuda_tests", a.result, a.cpu_dry_run)
    ids = cuda_test_ids()
    res.save(tests=ids)
    if not ids:
        return res.finish(True, counts={}, results={}, note="no test in tests/ needs a GPU")
    work = a.work or os.path.dirname(os.path.abspath(a.result))
    xml = os.path.join(work, "cuda_tests.xml")
    cmd = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={xml}", *ids]
    p = subprocess.run(cmd, cwd=_common.REPO, capture_output=True, text=True)
    print(p.stdout[-3000:], flush=True)
    if not os.path.isfile(xml):
        raise RuntimeError(f"pytest wrote no report (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    results = outcomes(xml)
    counts = {k: sum(r["outcome"] == k for r in results.values())
              for k in ("passed", "failed", "error", "skipped")}
    ok = p.returncode == 0 and counts["failed"] == counts["error"] == 0 and len(results) == len(ids)
    return res.finish(ok, pytest_exit=p.returncode, counts=counts, results=results)


if __name__ == "__main__":
    sys.exit(main())
