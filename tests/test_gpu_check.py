"""run_scripts/gpu_check.sh --cpu-dry-run: the prepared GPU check runs every part on CPU, so it cannot rot
before a GPU machine runs it."""
import ast
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks/gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def test_cpu_dry_run_runs_every_part(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS="1")
    p = subprocess.run([str(REPO / "run_scripts/gpu_check.sh"), "--cpu-dry-run", "--out", str(tmp_path)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert "1/3 GPU-only tests" in p.stdout and "needs a CUDA device" in p.stdout  # collected, skipped on CPU
    rep = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rep["dry_run"] is True and list(rep["modes"]) == list(gpu_check.MODES)
    names = {m: r["precision"] for m, r in rep["modes"].items()}
    assert names == {"fp32": "fp32", "amp_O2": "fp16 (amp O2)", "amp_O1": "fp16 (amp O1)", "bf16": "bf16"}
    assert all(r["loss_finite"] and r["step_s"] > 0 for r in rep["modes"].values())
    assert rep["modes"]["amp_O2"]["param_dtype"] == "torch.float16"  # O2 really ran: an fp16 model
    assert rep["modes"]["amp_O1"]["param_dtype"] == "torch.float32"  # O1 keeps fp32 weights
    assert rep["ratios"]["fp32"]["speedup"] == 1.0
    assert rep["modes"]["fp32"]["layer_norm"]["modules"] > 0
    assert rep["loader"]["clips"] > 0 and rep["loader"]["batch_dtype"] == "torch.float32"
    assert rep["loader"]["batch_shape"][1:] == [2, 3, 64, 64]
    assert rep["torchrun"]["ok"] and rep["torchrun"]["backend"] == "gloo"
    md = (tmp_path / "gpu_check.md").read_text()
    for row in ("| fp32 |", "| fp16 (amp O2) |", "| fp16 (amp O1) |", "| bf16 |"):
        assert row in md
    if (REPO / "benchmarks/amp_oracle.py").exists():
        assert "3/3 apex.amp oracle" in p.stdout and "skipped:" not in p.stdout


def test_gpu_only_tests_are_found_by_marker_or_skipif():
    def needs(src):
        return gpu_check._needs_cuda(ast.parse(src, mode="eval").body)
    assert needs("pytest.mark.cuda")
    assert needs('pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")')
    assert not needs("pytest.mark.multiprocess")
    assert not needs('pytest.mark.skipif(sys.platform == "win32", reason="x")')
    for node_id in gpu_check.cuda_test_ids():
        path, name = node_id.split("::")
        assert f"def {name}(" in (REPO / path).read_text()


def test_gpu_mode_refuses_a_machine_without_cuda(tmp_path):
    if gpu_check.torch.cuda.is_available():
        return
    p = subprocess.run([sys.executable, str(REPO / "benchmarks/gpu_check.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "no CUDA device" in p.stderr and "--cpu-dry-run" in p.stderr
