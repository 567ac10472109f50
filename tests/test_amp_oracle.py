"""tools/amp_oracle.py (real apex.amp vs ours on a GPU) cannot rot: its CPU dry run runs here as a
subprocess and its JSON is checked, and the comparison and scaler-rule checks are shown to catch
a wrong trajectory, a different skip and weights outside the tolerance."""
import copy
import importlib.util
import json
import os
import subprocess
import sys
import zipfile

import pytest
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tools", "amp_oracle.py")
_spec = importlib.util.spec_from_file_location("amp_oracle", SCRIPT)  # a script, not a package module
amp_oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(amp_oracle)

# apex's rules for 10 steps, window 3, overflows injected at steps 2, 6 and 7
DRY_SCALES = [65536.0, 32768.0, 32768.0, 32768.0, 65536.0, 32768.0, 16384.0, 16384.0, 16384.0, 32768.0]
DRY_UNSKIPPED = [1, 0, 1, 2, 0, 0, 0, 1, 2, 0]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("oracle")
    proc = subprocess.run([sys.executable, SCRIPT, "--cpu-dry-run",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(out / "amp_oracle.json") as f:
        return json.load(f), proc.stdout


def test_dry_run_reports_apex_skipped_and_our_scaler_follows_apex_rules(dry_run):
    report, stdout = dry_run
    assert "apex side skipped" in stdout and "needs CUDA" in report["apex"]
    assert report["pass"] is True and report["inject"] == [2, 6, 7] and report["window"] == 3
    assert set(report["levels"]) == {"O1", "O2"}
    for level, r in report["levels"].items():
        assert all(r["checks"].values()) and r["rule_violations"] == [], level
        recs = r["records"]
        assert [x["loss_scale"] for x in recs] == DRY_SCALES
        assert [x["unskipped"] for x in recs] == DRY_UNSKIPPED
        assert r["skipped_steps"] == [2, 6, 7] and recs[-1]["skipped_total"] == 3
        assert r["amp_state_dict"] == {"loss_scaler0": {"loss_scale": 32768.0, "unskipped": 0}}
        assert [x["weights_changed"] for x in recs] == [s not in (2, 6, 7) for s in range(1, 11)]
        for x in recs:  # an injected step's loss is inflated by 2**40; the others are ~ln 2
            assert (x["loss"] > 1e11) if x["skipped"] else (0.6 < x["loss"] < 0.8 and 0 < x["grad_norm"] < 1)
    assert "O2_batchnorm_fp32" in report["levels"]["O2"]["checks"]
    assert report["seconds"] < 120


def _records(skips, window=3):
    """A trajectory that follows apex's rules for the given skipped steps."""
    recs, scale, uns = [], 2.0 ** 16, 0
    for i, s in enumerate(skips, 1):
        if s:
            scale, uns = scale / 2, 0
        else:
            uns += 1
            if uns == window:
                scale, uns = scale * 2, 0
        recs.append({"step": i, "loss": 0.7, "loss_scale": scale, "unskipped": uns, "skipped": s,
                     "skipped_total": sum(skips[:i]), "grad_norm": 0.1 if not s else float("nan"),
                     "weights_changed": not s})
    return recs


def test_scaler_rules_catch_a_missed_halving_and_a_late_growth():
    recs = _records([False, True, False, False, False, False])
    assert amp_oracle.check_scaler_rules(recs, window=3) == []
    bad = copy.deepcopy(recs)
    bad[1]["loss_scale"] = 65536.0  # overflow without halving
    assert amp_oracle.check_scaler_rules(bad, window=3)[0].startswith("step 2: scale 65536.0")
    assert amp_oracle.check_scaler_rules(recs, window=4) != []  # growth after 3 clean steps, not 4


def _side(skips, w=0.5):
    recs = _records(skips)
    sd = {"loss_scale": recs[-1]["loss_scale"], "unskipped": recs[-1]["unskipped"]}
    return {"records": recs, "opt_level": "O2", "amp_state_dict": {"loss_scaler0": sd},
            "masters": {"a": torch.full((3,), w)}, "model": {"a": torch.full((3,), w).half()}}


def test_compare_passes_equal_runs_and_fails_a_skip_or_weight_difference():
    skips = [False, True, False, False]
    c = amp_oracle.compare(_side(skips), _side(skips))
    assert c["pass"] and c["bitwise"] == {"masters": True, "model": True, "losses": True}
    assert c["masters_max_abs_diff"] == 0.0 and c["loss_max_rel_diff"] == 0.0
    near = amp_oracle.compare(_side(skips), _side(skips, w=0.5 + 2 ** -11))  # in 1e-3: passes, not bitwise
    assert near["pass"] and not near["bitwise"]["masters"] and near["masters_max_abs_diff"] == 2 ** -11
    far = amp_oracle.compare(_side(skips), _side(skips, w=0.502))
    assert not far["pass"] and far["masters_max_abs_diff"] == pytest.approx(0.002, abs=1e-6)
    other = amp_oracle.compare(_side(skips), _side([False, False, True, False]))
    assert not other["pass"] and not other["skip_decisions_equal"]
    assert not other["loss_scale_trajectory_equal"]


def test_default_inject_spreads_overflows_with_two_in_a_row():
    assert amp_oracle.default_inject(300) == [30, 31, 100, 151, 225]
    assert amp_oracle.default_inject(10) == [2, 3, 6, 7]


def test_find_apex_unpacks_the_wheel_for_the_apex_side_only(tmp_path, monkeypatch):
    wheel = tmp_path / "apex-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("apex/__init__.py", "")
        z.writestr("apex/amp/__init__.py", "def initialize(): pass\ndef scale_loss(): pass\n")
    monkeypatch.delenv("AMP_ORACLE_APEX_WHEEL", raising=False)
    a = amp_oracle.parse_args(["--apex-wheel", str(wheel)])
    env, src = amp_oracle.find_apex(a, str(tmp_path / "out"))
    if src == "installed apex":  # this environment has a legacy apex.amp: nothing to unpack
        assert env == {}
        return
    assert src == str(wheel) and os.path.isfile(os.path.join(env["PYTHONPATH"], "apex", "amp", "__init__.py"))
