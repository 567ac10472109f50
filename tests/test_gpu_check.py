"""The GPU check's driver (tools/gpu_check.py) on its own, in seconds: what it keeps when a part
fails or runs out of time, the overall budget, the bundle install that replaces nothing, the summary of
partial files, and which tests count as GPU tests. The whole check on a stand-in node:
tests/test_gpu_check_node.py."""
import ast
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def driver(monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))  # its helpers sit beside it, as when run as a script
    return _load("gpu_check", TOOLS / "gpu_check.py")


@pytest.fixture
def cuda_tests(monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS / "gpu_check_parts"))
    return _load("cuda_tests_part", TOOLS / "gpu_check_parts" / "cuda_tests_part.py")


def test_a_part_that_times_out_keeps_its_figures_and_records_the_error(driver, tmp_path):
    result = tmp_path / "2_amp_o2.json"
    script = ("import json, sys, time; json.dump({'part': 'amp_o2', 'status': 'running', 'modes': "
              "{'fp32': {'step_s': 0.5}}}, open(sys.argv[1], 'w')); print('measured fp32', flush=True); "
              "time.sleep(60)")
    r = driver.run_part("amp_o2", str(result), [sys.executable, "-c", script, str(result)], 3, str(tmp_path))
    on_disk = json.loads(result.read_text())
    assert r == on_disk and on_disk["status"] == "error" and on_disk["error"] == "timeout: killed after 3 s"
    assert on_disk["modes"] == {"fp32": {"step_s": 0.5}} and "measured fp32" in on_disk["log_tail"]


def test_a_crashing_part_without_a_file_gets_one(driver, tmp_path):
    result = tmp_path / "6_loader.json"
    r = driver.run_part("loader", str(result), [sys.executable, "-c", "raise SystemExit('no skvideo')"], 30,
                        str(tmp_path))
    assert r["status"] == "error" and r["error"] == "exit 1" and "no skvideo" in r["log_tail"]
    assert json.loads(result.read_text()) == r


def test_no_time_left_skips_every_part_and_each_file_says_so(driver, tmp_path, capsys):
    rc = driver.main(["--cpu-dry-run", "--out", str(tmp_path / "out"), "--bundle", str(tmp_path / "none"),
                      "--budget-s", "10", "--work", str(tmp_path / "work")])
    assert rc == 0
    names = [p[1] for p in driver.PARTS]
    assert sorted(f.name for f in (tmp_path / "out").iterdir()) == sorted([*names, "summary.md"])
    for name in names:
        r = json.loads((tmp_path / "out" / name).read_text())
        assert r["status"] == "skipped" and r["reason"] == "no time left in the 10 s budget"
    assert not (tmp_path / "work" / "horovod_build.started").exists()  # no build without time for it
    rec = json.loads((tmp_path / "work" / "bundle_install.json").read_text())
    assert "run_scripts/gpu_bundle.sh" in rec["error"] and rec["installed"] == []


def _wheel(path: Path, dist: str, version: str) -> None:
    with zipfile.ZipFile(path / f"{dist}-{version}-py3-none-any.whl", "w") as z:
        z.writestr(f"{dist}-{version}.dist-info/METADATA", f"Name: {dist}\nVersion: {version}\n")


def test_the_bundle_never_replaces_an_installed_package(driver, tmp_path):
    import _gpu_check_setup as setup
    bundle = tmp_path / "bundle"
    (bundle / "wheels").mkdir(parents=True)
    _wheel(bundle / "wheels", "pytest", "0.0.1")  # installed here at another version: must be kept
    (bundle / "bundle.json").write_text(json.dumps({"python": "{}.{}".format(*sys.version_info[:2])}))
    rec = setup.install_bundle(str(bundle), str(tmp_path), 60)
    assert rec["kept"] == [f"pytest {pytest.__version__}"] and rec["installed"] == [] and "error" not in rec
    (bundle / "bundle.json").write_text(json.dumps({"python": "2.7"}))
    rec = setup.install_bundle(str(bundle), str(tmp_path), 60)
    assert "made for Python 2.7" in rec["error"] and "BUNDLE_PYTHON_VERSION=" in rec["error"]


def test_summary_shows_partial_and_failed_parts(driver, tmp_path):
    import _gpu_check_report as report
    files = {name: str(tmp_path / fname) for name, fname, _ in driver.PARTS}
    fp32 = {"precision": "fp32", "tf32": {"matmul_allow_tf32": False}, "step_s": 0.25, "clips_per_s": 64.0,
            "peak_mem_bytes": 8 * 2 ** 30}
    Path(files["amp_o2"]).write_text(json.dumps({
        "part": "amp_o2", "status": "error", "error": "timeout: killed after 180 s", "modes": {"fp32": fp32},
        "ratios": {"fp32": {"speedup": 1.0, "memory": 1.0}}, "seconds": 180,
        "setup": {"model": "m.json", "cnn": "resnet50", "videos": 16, "texts": 2, "frames": 2, "img": 448,
                  "steps": 20, "warmup": 5}}))
    Path(files["env"]).write_text(json.dumps({"part": "env", "status": "running"}))  # killed mid-way
    report.write_summary(str(tmp_path), files, dry=False)
    md = (tmp_path / "summary.md").read_text()
    assert "| amp_o2 | error | 180 | timeout: killed after 180 s |" in md
    assert "| env | running |" in md and "(incomplete: KeyError" in md
    assert "| bf16 | not run | | |" in md
    assert "| fp32 | False | 250.0 | 64.0 | 1.00x | 8192 | 1.00x |" in md


def test_gpu_only_tests_are_found_by_marker_or_skipif(cuda_tests):
    def needs(src):
        return cuda_tests.needs_cuda(ast.parse(src, mode="eval").body)
    assert needs("pytest.mark.cuda")
    assert needs('pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")')
    assert not needs("pytest.mark.multiprocess")
    assert not needs('pytest.mark.skipif(sys.platform == "win32", reason="x")')
    ids = cuda_tests.cuda_test_ids()
    assert "tests/test_amp_model.py::test_o2_and_o1_on_cuda" in ids
    for node_id in ids:
        path, name = node_id.split("::")
        assert f"def {name}(" in (REPO / path).read_text()


def test_gpu_mode_refuses_a_machine_without_cuda(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    p = subprocess.run([str(REPO / "run_scripts/gpu_check.sh"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "no CUDA device" in p.stderr and "--cpu-dry-run" in p.stderr
    assert list(tmp_path.iterdir()) == []


def test_gpu_mode_commands_the_dry_run_cannot_reach(driver, tmp_path, monkeypatch):
    """On a GPU: the oracle runs 300 steps at O2 then O1 with the bundle's apex wheel, and the Horovod
    build is build_horovod_cuda.sh for this python, from the bundle's sdist, for the local GPU's arch only."""
    import _gpu_check_setup as setup
    bundle = tmp_path / "bundle"
    (bundle / "apex").mkdir(parents=True)
    _wheel(bundle / "apex", "apex", "0.1")
    (bundle / "horovod-0.28.1.tar.gz").write_bytes(b"")
    a = driver.parse_args(["--out", str(tmp_path / "out"), "--bundle", str(bundle), "--work", str(tmp_path)])
    files = {name: str(tmp_path / f) for name, f, _ in driver.PARTS}
    cmd = driver.part_command("amp_oracle", a, files, 170.0)
    assert cmd[-5:] == ["--steps", "300", "--levels", "O2", "O1"] and "--cpu-dry-run" not in cmd
    assert cmd[cmd.index("--apex-wheel") + 1] == str(bundle / "apex" / "apex-0.1-py3-none-any.whl")
    assert cmd[cmd.index("--timeout") + 1] == "170" and "skipped: no apex wheel in the bundle" in cmd
    Path(files["env"]).write_text(json.dumps({"gpu": {"capability": "9.0"}}))
    seen = {}
    monkeypatch.setattr(setup.subprocess, "Popen", lambda cmd, **kw: seen.update(cmd=cmd, **kw))
    monkeypatch.setenv("VENV_DIR", "/somewhere/else")
    setup.start_horovod_build(a, files["env"])
    env = seen["env"]
    assert seen["cmd"][3].endswith("run_scripts/build_horovod_cuda.sh") and "nice -n 10" in seen["cmd"][2]
    assert env["HOROVOD_BUILD_CUDA_CC_LIST"] == "90" and env["PYTHON"] == sys.executable
    assert env["HOROVOD_SDIST"] == str(bundle / "horovod-0.28.1.tar.gz") and "VENV_DIR" not in env
    assert env["ALLOW_CUDA_MISMATCH"] == "1" and env["MAKEFLAGS"].startswith("-j")
    assert "sm_90 only" in (tmp_path / "horovod_build.started").read_text()
