"""Hooks: the order the trainer calls them in, what a step reports, task hooks, and that a hook
raising on one rank ends a multi-process job instead of hanging it."""
import math
import time

import pytest

from clipbert_legacy.training.contracts import Hook, StepResult
from clipbert_legacy.training.engine import Trainer
from clipbert_legacy.training.events import LogLines, MetricsJsonl, ProgressBar, TensorBoard
from clipbert_legacy.training.hooks import BestCheckpoint, EarlyStopping, Evaluation, StepCheckpoints
from tests import mp_utils
from tests.run_files import assert_same_run_files
from tests.toy_task import ToyTask, toy_cfg


class Recorder(Hook):
    def __init__(self, name, calls):
        self.name, self.calls = name, calls
        self.results = []

    def before_train(self, trainer):
        self.calls.append((self.name, "before_train", trainer.global_step))

    def after_step(self, trainer, result):
        self.results.append(result)
        self.calls.append((self.name, "after_step", trainer.global_step))

    def after_validation(self, trainer, metrics):
        self.calls.append((self.name, "after_validation", trainer.global_step))

    def after_train(self, trainer, summary):
        self.calls.append((self.name, "after_train", summary["global_step"]))


class HookedTask(ToyTask):
    def __init__(self, calls, **kw):
        super().__init__(**kw)
        self.calls = calls

    def build_hooks(self, cfg):
        return [Recorder("task", self.calls)]


def test_default_hooks_then_task_then_user_hooks_in_order(tmp_path):
    calls = []
    user = Recorder("user", calls)
    trainer = Trainer(toy_cfg(tmp_path, num_valid=2, min_valid_steps=1), HookedTask(calls), hooks=[user])
    summary = trainer.train()
    assert [type(h) for h in trainer.hooks[:4]] == [Evaluation, StepCheckpoints, BestCheckpoint,
                                                     EarlyStopping]
    assert [h.name for h in trainer.hooks[4:]] == ["task", "user"]
    writers = [TensorBoard, LogLines, MetricsJsonl, ProgressBar]
    assert [type(w) for w in trainer.parts.outputs.writers] == writers
    T = summary["global_step"]
    assert T == 16 and trainer.plan.valid_steps == 8
    user_calls = [(what, step) for name, what, step in calls if name == "user"]
    expected = [("before_train", 0)]
    for s in range(1, T + 1):
        if s % 8 == 0:  # validation runs inside Evaluation.after_step, before the later hooks' after_step
            expected.append(("after_validation", s))
        expected.append(("after_step", s))
    expected.append(("after_train", T))
    assert user_calls == expected
    # the task's hook runs before the user's at every call
    assert [c[1:] for c in calls if c[0] == "task"] == user_calls
    assert calls.index(("task", "after_step", 5)) < calls.index(("user", "after_step", 5))


class ReversedHooks(Trainer):
    """The default hooks in the opposite order: hooks exchange results through ``trainer.state``, put what
    is to be written into the event record, and the engine writes the restore files after every hook,
    so the order must not change anything."""

    def default_hooks(self):
        return super().default_hooks()[::-1]


def test_default_hooks_do_not_depend_on_their_order(tmp_path):
    """Early stopping at step 5, keep_last_k 1, a restore file every 2 steps: the same best, and every
    file the two runs write is the same, restore_backup.pt included (tensor by tensor; text files but
    for times and durations). Reversed, the restore file of validation step 4 was once written before
    early stopping had counted that validation."""
    import torch

    curve = {1: 1.0, 2: 2.0, 3: 3.0, 4: 2.5, 5: 2.9, 6: 9.0}
    runs = {}
    for trainer_class in (Trainer, ReversedHooks):
        out = tmp_path / trainer_class.__name__
        cfg = toy_cfg(out, num_valid=16, min_valid_steps=1, best_metric="score", early_stop_patience=2,
                      keep_last_k=1, save_steps_ratio=0.125)
        trainer = trainer_class(cfg, ToyTask(metric_curve=curve.get))
        s = trainer.train()
        assert s["global_step"] == 5 and s["stopped_early"]
        assert s["best"] == {"metric": "score", "value": 3.0, "step": 3}
        assert [type(h).__name__ for h in trainer.hooks][0] == ("Evaluation" if trainer_class is Trainer
                                                               else "EarlyStopping")
        assert sorted(p.name for p in (out / "ckpt").iterdir()) == [
            "model_best.pt", "model_step_3.pt", "model_step_5.pt", "restore.pt", "restore_backup.pt"]
        restore = torch.load(out / "ckpt" / "restore.pt", weights_only=True)
        assert restore["global_step"] == 5 and restore["finished"]
        assert restore["hooks"]["EarlyStopping"]["bad_validations"] == 2
        backup = torch.load(out / "ckpt" / "restore_backup.pt", weights_only=True)
        assert backup["global_step"] == 4 and backup["hooks"]["EarlyStopping"]["bad_validations"] == 1
        again = trainer_class(cfg, ToyTask(metric_curve=curve.get)).train()  # nothing left to do
        assert again["global_step"] == 5 and again["stopped_early"]
        runs[trainer_class] = out
    assert_same_run_files(runs[Trainer], runs[ReversedHooks])


def test_hooks_are_closed_when_a_hook_raises(tmp_path):
    closed = []

    class Closing(Hook):
        def close(self):
            closed.append(True)

    class Boom(Hook):
        def after_step(self, trainer, result):
            if trainer.global_step == 2:
                raise RuntimeError("boom")

    trainer = Trainer(toy_cfg(tmp_path), ToyTask(), hooks=[Closing(), Boom()])
    with pytest.raises(RuntimeError, match="boom"):
        trainer.train()
    assert closed == [True] and trainer.global_step == 2
    bars = [w for w in trainer.parts.outputs.writers if isinstance(w, ProgressBar)]
    assert len(bars) == 1 and bars[0]._bar is None  # the progress bar (a writer) was closed too


def test_step_result_reports_the_step(tmp_path):
    calls = []
    rec = Recorder("r", calls)
    Trainer(toy_cfg(tmp_path, gradient_accumulation_steps=2, train_batch_size=4, grad_norm=1.0), ToyTask(),
            hooks=[rec]).train()
    r = rec.results
    assert [x.step for x in r] == list(range(1, 9))
    assert all(isinstance(x, StepResult) for x in r)
    assert all(x.n_examples == 8 and x.n_nonfinite == 0 and not x.skipped and x.skipped_total == 0 for x in r)
    assert all(math.isfinite(x.loss) and x.loss > 0 for x in r)
    assert all(x.grad_norm is not None and x.grad_norm > 0 for x in r) and r[0].loss_scale is None
    assert all(x.seconds > 0 and 0 <= x.data_wait <= x.seconds for x in r)
    # warm-up then linear decay (warmup_ratio 0.1 of 8 steps -> no warm-up step: int(0.8) = 0)
    assert r[0].lr_transformer == pytest.approx(1e-2 * (8 - 1) / 8)
    assert r[-1].lr_transformer == 1e-8  # ClipBERT's floor at the end of a linear decay
    assert r[0].lr_cnn == pytest.approx(2e-2 * (8 - 1) / 8)


def test_fp16_overflow_steps_are_reported_and_skipped(tmp_path):
    """amp O2: an overflowing step is skipped and the scale halved; StepResult says so, the log line
    shows the count, and the run goes on (the streak is below the stop threshold). The first steps
    overflow in the gradients (scale 2**16 is too much for this model); steps 6 and 7 get NaN losses."""
    calls = []
    rec = Recorder("r", calls)
    task = ToyTask()
    task.forward_train = _nan_window(task, first=11, last=14)  # 2 forwards per step: steps 6 and 7
    cfg = toy_cfg(tmp_path, fp16=1, gradient_accumulation_steps=2, log_interval=1)
    Trainer(cfg, task, hooks=[rec]).train()
    r = {x.step: x for x in rec.results}
    assert r[1].skipped and r[1].n_nonfinite == 0 and r[1].loss_scale == 2.0 ** 15  # gradient overflow
    assert not r[4].skipped and r[4].n_nonfinite == 0 and math.isfinite(r[4].grad_norm)
    assert r[6].skipped and r[7].skipped and r[6].n_nonfinite == 2 and r[7].n_nonfinite == 2
    assert r[7].skipped_total == r[6].skipped_total + 1 == r[5].skipped_total + 2
    assert r[7].loss_scale == r[6].loss_scale / 2 == r[5].loss_scale / 4
    assert not r[8].skipped and r[8].skipped_total == r[7].skipped_total
    log = (tmp_path / "log" / "log.txt").read_text()
    assert "step 7/8 epoch 1: loss " in log
    assert f"loss_scale {r[7].loss_scale:g} skipped {r[7].skipped_total}" in log


def _nan_window(task, first, last):
    inner = ToyTask.forward_train.__get__(task)

    def forward(model, batch, cfg):
        loss = inner(model, batch, cfg)
        return loss * float("nan") if first <= task.n_forward <= last else loss
    return forward


@pytest.mark.multiprocess
@pytest.mark.parametrize("launcher", ["horovod", "torch"])
def test_hook_raising_on_one_rank_ends_the_job(tmp_path, launcher):
    """Rank 1's hook raises after step 3 while rank 0 enters step 4's allreduce: the launcher must stop
    the job with a failure (in seconds, not at a collective timeout) and show the error."""
    if launcher == "horovod" and not mp_utils.horovodrun_available():
        pytest.skip("Horovod not installed (run ./run_scripts/setup_env.sh)")
    run = mp_utils.run_horovod if launcher == "horovod" else mp_utils.run_torchrun
    p = run(["tests/workers/hook_raise.py", tmp_path / "out", 1, 3], timeout=300,
            env={"DIST_BACKEND": launcher})
    out = p.stdout + p.stderr
    elapsed = mp_utils.seconds_since_failure(out, time.time())
    assert p.returncode != 0, out[-3000:]
    assert "hook failed on rank 1 at step 3" in out
    assert "finished training" not in out
    assert elapsed < mp_utils.ENDED_WITHIN_S, f"the job ended {elapsed:.0f}s after the hook raised"


def test_a_user_hook_stops_the_run_through_the_state(tmp_path):
    """docs/architecture.md's StopAtScore: request_stop in after_validation ends the run after that step,
    with its restore file marked finished (a rerun has nothing to do)."""
    import torch

    class StopAtStep3(Hook):
        def after_validation(self, trainer, metrics):
            if trainer.global_step == 3:
                trainer.state.request_stop("enough")

    cfg = toy_cfg(tmp_path, num_valid=16, min_valid_steps=1)
    s = Trainer(cfg, ToyTask(), hooks=[StopAtStep3()]).train()
    assert s["global_step"] == 3 and s["stopped_early"]
    restore = torch.load(tmp_path / "ckpt" / "restore.pt", weights_only=True)
    assert restore["global_step"] == 3 and restore["finished"] and restore["stop_reason"] == "enough"
    assert Trainer(cfg, ToyTask(), hooks=[StopAtStep3()]).train()["global_step"] == 3


def test_a_restore_file_of_an_earlier_version_keeps_early_stoppings_patience(tmp_path):
    """Restore files once kept patience in ``best`` (no ``hooks`` key): loading one migrates it into
    EarlyStopping's own state, so a resume at step 4 (one bad validation) stops at step 5 as before."""
    import torch

    curve = {1: 1.0, 2: 2.0, 3: 3.0, 4: 2.5, 5: 2.9, 6: 9.0}
    cfg = toy_cfg(tmp_path, num_valid=16, min_valid_steps=1, best_metric="score", early_stop_patience=2,
                  save_steps_ratio=0.125)
    assert Trainer(cfg, ToyTask(metric_curve=curve.get)).train()["global_step"] == 5
    ckpt = tmp_path / "ckpt"
    old = torch.load(ckpt / "restore_backup.pt", weights_only=True)  # step 4
    assert old["global_step"] == 4 and old["hooks"]["EarlyStopping"] == {"bad_validations": 1,
                                                                          "patience_ref": 3.0}
    old["best"].update(bad_validations=1, patience_ref=3.0)  # the earlier layout
    del old["hooks"]
    torch.save(old, ckpt / "restore.pt")
    (ckpt / "restore_backup.pt").unlink()
    s = Trainer(cfg, ToyTask(metric_curve=curve.get)).train()
    assert s["global_step"] == 5 and s["stopped_early"] and s["best"]["step"] == 3
    restore = torch.load(ckpt / "restore.pt", weights_only=True)
    assert restore["hooks"]["EarlyStopping"]["bad_validations"] == 2


def test_the_elastic_commit_comes_after_the_end_of_the_step(tmp_path):
    """Horovod's commit may raise HostsUpdatedInterrupt after saving: it runs in the next step's
    before_step, when the writers have written the step's record and its restore file (when due) is on
    disk, so an interrupt loses nothing of the step. The run's last step is not committed."""
    import json

    import torch

    from clipbert_legacy.training.elastic import ElasticCommit

    out = tmp_path / "run"
    commits = []

    class RecordingState:
        def commit(self):
            step = trainer.global_step
            lines = [json.loads(x) for x in (out / "log" / "metrics.jsonl").read_text().splitlines()]
            restore = torch.load(out / "ckpt" / "restore.pt", weights_only=True)
            commits.append((step, max(r["step"] for r in lines), restore["global_step"]))

    hook = ElasticCommit(2)
    hook.attach(RecordingState())
    trainer = Trainer(toy_cfg(out, num_train_epochs=1, log_interval=1), ToyTask(), hooks=[hook])
    trainer.train()
    assert trainer.global_step == 8 and trainer.checkpointer.restore_every == (2,)
    assert commits == [(2, 2, 2), (4, 4, 4), (6, 6, 6)]


# ------------------------------------------------------------------------ the trainer's surface for hooks
def _hook_classes_and_trainer_reads():
    """Every Hook subclass of the project (src/) with the ``trainer.X`` names its methods read."""
    import ast
    from pathlib import Path
    pkg = Path(__file__).resolve().parents[1] / "src" / "clipbert_legacy"
    found = {}
    for f in sorted(pkg.rglob("*.py")):
        for cls in (n for n in ast.walk(ast.parse(f.read_text())) if isinstance(n, ast.ClassDef)):
            if not any(getattr(b, "id", getattr(b, "attr", None)) == "Hook" for b in cls.bases):
                continue
            reads = {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)
                     and isinstance(n.value, ast.Name) and n.value.id == "trainer"}
            found[f"{f.relative_to(pkg)}:{cls.name}"] = reads
    return found


def test_hooks_read_the_trainer_only_through_the_trainer_view(tmp_path):
    """TrainerView is the real surface: each name a project hook reads on the trainer is declared there,
    and the Trainer provides each name the view declares."""
    import typing

    from clipbert_legacy.training.contracts import TrainerView
    view = set(typing.get_type_hints(TrainerView, localns={"Config": object, "RunState": object,
                                                           "EventRecord": object})) \
        | {n for n in vars(TrainerView) if not n.startswith("_")}
    hooks = _hook_classes_and_trainer_reads()
    assert len(hooks) >= 7, hooks  # the 4 default hooks, the profiler, elastic commit, the bad-video hook
    outside = {name: sorted(reads - view) for name, reads in hooks.items() if reads - view}
    assert not outside, f"hooks read names TrainerView does not declare: {outside}"
    trainer = Trainer(toy_cfg(tmp_path), ToyTask())  # properties of the parts need a built trainer
    trainer.setup()
    missing = [n for n in sorted(view) if not hasattr(trainer, n)]
    assert not missing, f"TrainerView declares names the Trainer lacks: {missing}"


class _Counting(Hook):
    def __init__(self):
        self.n = 0

    def after_step(self, trainer, result):
        self.n += 1

    def state_dict(self):
        return {"n": self.n}

    def load_state_dict(self, state):
        self.n = state["n"]


def test_two_hooks_keeping_state_under_one_key_are_refused(tmp_path):
    with pytest.raises(ValueError, match="_Counting and _Counting both keep their saved state under "
                                         "state_key '_Counting': override state_key on one"):
        Trainer(toy_cfg(tmp_path), ToyTask(), hooks=[_Counting(), _Counting()])
    renamed = type("_CountingB", (_Counting,), {"state_key": property(lambda self: "second")})()
    Trainer(toy_cfg(tmp_path), ToyTask(), hooks=[_Counting(), renamed])  # the fix the message names
    Trainer(toy_cfg(tmp_path), ToyTask(), hooks=[Recorder("a", []), Recorder("b", [])])  # no state: fine


def test_saved_state_no_hook_claims_is_a_warning_that_names_it(tmp_path, caplog):
    cfg = toy_cfg(tmp_path, num_train_epochs=1)
    counting = _Counting()
    Trainer(cfg, ToyTask(), hooks=[counting]).train()
    assert counting.n == 8
    resumed = toy_cfg(tmp_path, num_train_epochs=2, existing_run="extend")
    with caplog.at_level("WARNING"):
        Trainer(resumed, ToyTask(), hooks=[]).train()
    text = caplog.text
    assert "the saved state of hook(s) _Counting is not claimed by any hook of this run" in text
    assert "it is dropped" in text


def test_step_checkpoints_rank_a_resumed_runs_files_from_their_saved_state(tmp_path):
    """The ranking of keep_top_k is the hook's own saved state: a run that crashed after step 8 and resumes
    with log/metrics.jsonl gone keeps the same files as an uninterrupted run (step 4, the best of the
    first part, survives)."""
    import torch

    curve = {2: 1.0, 4: 9.0, 6: 3.0, 8: 2.0, 10: 4.0, 12: 8.0, 14: 5.0, 16: 6.0}

    class CrashAfterStep8(Hook):
        def before_step(self, trainer):
            if trainer.global_step == 8:
                raise RuntimeError("crash")

    def run(out, hooks=()):
        cfg = toy_cfg(out, num_valid=8, best_metric="score", keep_last_k=2, keep_top_k=2)
        return Trainer(cfg, ToyTask(metric_curve=curve.get), hooks=list(hooks)).train()

    run(tmp_path / "whole")
    with pytest.raises(RuntimeError, match="crash"):
        run(tmp_path / "parts", hooks=[CrashAfterStep8()])
    restore = torch.load(tmp_path / "parts" / "ckpt" / "restore.pt", weights_only=True)
    assert restore["global_step"] == 8
    assert restore["hooks"]["StepCheckpoints"]["history"]["4"]["score"] == 9.0
    (tmp_path / "parts" / "log" / "metrics.jsonl").unlink()
    assert run(tmp_path / "parts")["global_step"] == 16

    def kept(out):
        return sorted(int(p.stem.split("_")[-1]) for p in (out / "ckpt").glob("model_step_*.pt"))
    assert kept(tmp_path / "whole") == kept(tmp_path / "parts") == [4, 12, 14, 16]
