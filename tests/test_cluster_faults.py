"""Cluster faults (issue 29): preemption signals, a full disk, a truncated LMDB store, a frozen rank
under torchrun, a finished run whose restore files were deleted, damaged run files.

Every case uses the real thing (signals sent with ``os.kill``, a real tmpfs filled to the last byte,
a ``data.mdb`` cut short, a rank stopped with SIGSTOP) and is bounded in time.
"""
import signal
from pathlib import Path

import pytest
import torch

from tests import mp_utils

REPO = Path(__file__).resolve().parents[1]
WORKERS = REPO / "tests" / "workers"


def final_weights(run_dir):
    steps = sorted(int(p.stem.split("_")[-1]) for p in (Path(run_dir) / "ckpt").glob("model_step_*.pt"))
    return steps[-1], torch.load(Path(run_dir) / "ckpt" / f"model_step_{steps[-1]}.pt")


def restore_step(run_dir):
    return torch.load(Path(run_dir) / "ckpt" / "restore.pt", weights_only=False)["global_step"]


def assert_same_weights(a, b):
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted single-process toy run (16 steps) the resumed runs must equal bit for bit."""
    out = tmp_path_factory.mktemp("ref") / "run"
    mp_utils.check(mp_utils.run_python([WORKERS / "engine_train.py", out, "{}"], timeout=180))
    return final_weights(out)


# ---------------------------------------------------------------------------------------------
# preemption: SIGTERM / SIGUSR1 / SIGINT
@pytest.mark.parametrize("sig", ["SIGTERM", "SIGUSR1", "SIGINT"])
def test_signal_saves_the_step_and_the_rerun_resumes_bit_exact(tmp_path, reference, sig):
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 6, sig], timeout=120)
    text = p.stdout + p.stderr
    assert p.returncode == 75, text[-3000:]
    # the signal came after step 6's allreduce: all stop at the next step boundary, 7
    assert f"stopped at step 7 of 16 (epoch 0): {sig} received; {out}/ckpt/restore.pt holds this step" in text
    assert "Traceback" not in text and "error:" not in text
    assert restore_step(out) == 7  # between the periodic saves (every 4 steps)
    assert not list((out / "ckpt").glob("*.tmp*"))
    rerun = mp_utils.check(mp_utils.run_python([WORKERS / "engine_train.py", out, "{}"], timeout=180))
    assert "at step 7 (epoch" in rerun.stderr
    step, weights = final_weights(out)
    assert step == reference[0] == 16
    assert_same_weights(weights, reference[1])


def test_second_signal_stops_at_once_without_saving(tmp_path):
    out = tmp_path / "run"
    p = mp_utils.run_python([WORKERS / "signal_stop.py", out, 0, 6, "SIGTERM", 2], timeout=120)
    assert p.returncode == -signal.SIGTERM, (p.stdout + p.stderr)[-3000:]
    assert restore_step(out) == 4  # the last periodic save; nothing written on the way out


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torchrun"])
def test_signal_to_one_rank_stops_every_rank_at_the_same_step(tmp_path, launcher):
    if launcher == "horovod" and not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    run = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
    env = {"TOY_DIST_BACKEND": "horovod" if launcher == "horovod" else "torch"}
    ref = tmp_path / "ref"
    mp_utils.check(run([WORKERS / "signal_stop.py", ref, 1, 99, "SIGUSR1"], timeout=180, env=env))
    out = tmp_path / "run"
    p = run([WORKERS / "signal_stop.py", out, 1, 3, "SIGUSR1"], timeout=180, env=env)
    text = p.stdout + p.stderr
    assert p.returncode != 0 and "rank 1 sends itself SIGUSR1 at step 3" in text, text[-3000:]
    # rank 0 got no signal, writes the restore file of step 4 with rank 1 and names the cause
    assert "stopped at step 4 of 8 (epoch 0): a stop signal reached another rank" in text, text[-3000:]
    # the launcher reports the status (horovodrun: a RuntimeError of its own; torchrun: ChildFailedError)
    assert "Exit code: 75" in text if launcher == "horovod" else "exitcode  : 75" in text, text[-3000:]
    assert f"{REPO}/src/" not in text  # no traceback from the workers themselves
    assert restore_step(out) == 4
    mp_utils.check(run([WORKERS / "signal_stop.py", out, 1, 99, "SIGUSR1"], timeout=180, env=env))
    assert_same_weights(final_weights(out)[1], final_weights(ref)[1])
