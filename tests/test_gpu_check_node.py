"""CI's stand-in for the first run on a GPU node: a python holding only the node's package set (CPU torch),
the bundle run_scripts/gpu_bundle.sh makes for this Python, installed by gpu_check.sh from its folder with
no index, and ``gpu_check.sh --cpu-dry-run``: every part's file is written with its fields. Then the same
with one part forced to fail (``GPU_CHECK_FAIL_PART``): the other parts' files are still written and the
failed part's file records the error. The Horovod part installs the Gloo wheel install_horovod.sh cached
(setup_env.sh builds it) instead of compiling; a GPU node compiles with NCCL.
"""
import json
import math
import os
import subprocess

import pytest

from tests import gpu_node

PARTS = ["1_env.json", "2_amp_o2.json", "3_bf16.json", "4_amp_oracle.json", "5_cuda_tests.json",
         "6_loader.json", "7_horovod.json"]
# torchrun and horovodrun jobs; not marked cuda: CI (./run_scripts/test.sh) runs it on every submission
# pytest's own limit (600 s a test) would end the fixture's venv and pip install first on a busy machine
# (it did at 600 s): the limit is the sum of the steps' own limits (venv 300 s, pip 1500 s, the bundle
# 600 s, the node's run 300 s), each of which names what it waited for
pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(300 + 1500 + 600 + 300)]
NOT_ON_THE_NODE = {"av", "lmdb", "ujson", "tensorboardx", "scikit_video", "cloudpickle"}


def _run(python, bundle, out, *args, **env):
    drop = ("PYTHONPATH", "VENV_DIR", "GPU_CHECK_FAIL_PART")
    clean = {k: v for k, v in os.environ.items() if k not in drop}
    clean.update(PYTHON=str(python), OMP_NUM_THREADS="1", **env)
    cmd = [str(gpu_node.REPO / "run_scripts" / "gpu_check.sh"), "--cpu-dry-run", "--out", str(out),
           "--bundle", str(bundle), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=clean, timeout=300)


def _part(out, name):
    return json.loads((out / name).read_text())


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    python = gpu_node.node_python(tmp_path_factory.mktemp("node") / "python")
    if gpu_node.cached_horovod_wheel(python) is None:  # setup_env.sh builds it (CI: always there)
        why = "no cached Horovod Gloo wheel for this torch and Python: run ./run_scripts/setup_env.sh first"
        pytest.fail(why) if os.environ.get("CI") == "true" else pytest.skip(why)
    return python, gpu_node.bundle()


def _check_first_run(out, p):
    assert sorted(f.name for f in out.iterdir()) == sorted([*PARTS, "summary.md"]), p.stdout[-3000:]
    env = _part(out, "1_env.json")
    installed = {w.split("-")[0].lower() for w in env["bundle"]["installed"]}
    assert NOT_ON_THE_NODE <= installed and env["torch"] == "2.13.0+cpu"  # the node's torch, untouched
    assert env["tf32_defaults"]["matmul_allow_tf32"] is False and env["gpu"] == {"cuda_available": False}
    o2 = _part(out, "2_amp_o2.json")
    assert list(o2["modes"]) == ["fp32", "amp_O2"]
    assert o2["modes"]["amp_O2"]["param_dtype"] == "torch.float16"
    assert o2["modes"]["fp32"]["tf32"] == {"matmul_allow_tf32": False, "cudnn_allow_tf32": False}
    assert o2["ratios"]["fp32"]["speedup"] == 1.0 and o2["modes"]["fp32"]["layer_norm"]["modules"] > 0
    bf16 = _part(out, "3_bf16.json")
    assert list(bf16["modes"]) == ["bf16", "fp32_tf32"]
    assert bf16["modes"]["fp32_tf32"]["tf32"]["matmul_allow_tf32"] is True
    assert set(bf16["ratios"]) == {"bf16", "fp32_tf32"}  # against part 2's fp32
    oracle = _part(out, "4_amp_oracle.json")
    assert oracle["mode"] == "cpu-dry-run" and set(oracle["levels"]) == {"O1", "O2"} and oracle["pass"]
    if not oracle["apex_import"]["found"]:
        assert oracle["apex_import"]["reason"] == "skipped: no apex wheel in the bundle"
    tests = _part(out, "5_cuda_tests.json")
    assert tests["counts"]["skipped"] == len(tests["tests"]) >= 2
    loader = _part(out, "6_loader.json")
    assert loader["clips"] > 0 and loader["batch_shape"][1:] == [2, 3, 64, 64]
    assert loader["exact_resize_bit_equal"] is True
    assert {m: (v["worker_batch_dtype"], v["batch_dtype"]) for m, v in loader["per_worker"].items()} == {
        "exact": ("torch.float32", "torch.float32"), "uint8": ("torch.uint8", "torch.float32")}
    o2_cps = o2["modes"]["amp_O2"]["clips_per_s"]
    for mode, cps in loader["per_worker_clips_per_s"].items():
        assert cps > 0 and loader["workers_needed"][mode] == math.ceil(o2_cps / cps)
    assert loader["amp_O2_clips_per_s"] == o2["modes"]["amp_O2"]["clips_per_s"]
    hv = _part(out, "7_horovod.json")
    assert hv["torchrun"]["ok"] and hv["torchrun"]["backend"] == "gloo"
    assert hv["build"]["exit"] == 0 and any("using cached wheel" in ln for ln in hv["build"]["log_tail"])
    run = hv["horovodrun"]
    assert run["backend"] == "horovod" and run["gloo_built"] and run["allreduce"]["ok"]
    assert "GLOO_ALLREDUCE" in run["timeline_allreduce_ops"]
    assert run["precision"] == "fp16 (amp O2)" and len(run["steps"]) == 6 and run["losses_finite"]
    for name in PARTS:
        assert _part(out, name)["status"] == "ok", name
    assert (out / "summary.md").read_text().count("| ok |") == 7


def test_dry_run_on_the_node_stand_in_then_one_part_forced_to_fail(node, tmp_path):
    python, bundle = node
    p = _run(python, bundle, tmp_path / "first")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    _check_first_run(tmp_path / "first", p)

    # the same node again (the bundle and Horovod are installed now), the oracle part forced to fail; the
    # parts around it only (the first run checked all seven): the part after a failed one still runs
    out = tmp_path / "forced"
    p = _run(python, bundle, out, "--parts", "env,amp_oracle,cuda_tests", GPU_CHECK_FAIL_PART="amp_oracle")
    assert p.returncode == 1, p.stdout[-3000:]
    failed = _part(out, "4_amp_oracle.json")
    assert failed["status"] == "error" and failed["error"] == "exit 1"
    assert "forced failure of part 'amp_oracle'" in failed["log_tail"]
    assert sorted(f.name for f in out.iterdir()) == ["1_env.json", "4_amp_oracle.json", "5_cuda_tests.json",
                                                     "summary.md"], p.stdout[-3000:]
    for name in ("1_env.json", "5_cuda_tests.json"):
        assert _part(out, name)["status"] == "ok", name
    env = _part(out, "1_env.json")
    kept = {k.split()[0].lower().replace("-", "_") for k in env["bundle"]["kept"]}
    assert env["bundle"]["installed"] == [] and NOT_ON_THE_NODE <= kept  # installed once, then kept
    assert "| amp_oracle | error |" in (out / "summary.md").read_text()
