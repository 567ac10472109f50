"""Lists that used to be written twice have one owner; every other module imports the owner's object.

Each pair below was a hand copy that could drift (a schedule added to the option but not to the
scheduler, a QA answer type added to a converter but not to the scores). The owner is the lowest
layer that needs the list; the others hold the very same object, and each still means what it did.
"""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def test_lr_schedules_are_the_decay_options_choices():
    from clipbert_legacy.config.options import DECAYS, SHARED_OPTIONS
    from clipbert_legacy.optimization import sched
    assert sched.SCHEDULES is DECAYS
    opts = {o.name: o for o in SHARED_OPTIONS}
    assert opts["decay"].choices is DECAYS and opts["cnn_lr_decay"].choices is DECAYS
    for name in DECAYS:  # every choice is a schedule the scheduler computes
        kw = {"decay_epochs": [1], "multi_step_epoch": 0} if name == "multi_step" else {}
        assert sched.get_lr_sched(5, name, 1e-4, 100, 0.1, **kw) > 0
    with pytest.raises(ValueError, match="expected one of linear|invsqrt"):
        sched.get_lr_sched(5, "step", 1e-4, 100)


def test_frame_sampling_strategies_are_the_options_choices():
    from clipbert_legacy.config.options import FRAME_SAMPLING_STRATEGIES, SHARED_OPTIONS
    from clipbert_legacy.datasets import dataset_base, decoder
    assert decoder.SAMPLING_STRATEGIES is FRAME_SAMPLING_STRATEGIES
    assert dataset_base.SAMPLING_STRATEGIES is FRAME_SAMPLING_STRATEGIES
    assert {o.name: o for o in SHARED_OPTIONS}["frm_sampling_strategy"].choices is FRAME_SAMPLING_STRATEGIES


def test_video_qa_tasks_are_the_task_options_choices():
    from clipbert_legacy.config.options import MC_QA, OPEN_ENDED_QA, QA_TASKS, VIDEO_QA_OPTIONS
    from clipbert_legacy.datasets import build, dataset_video_qa
    assert dataset_video_qa.QA_TASKS is QA_TASKS and build.QA_TASKS is QA_TASKS
    assert dataset_video_qa.MC_QA is MC_QA and dataset_video_qa.OPEN_ENDED_QA is OPEN_ENDED_QA
    task = {o.name: o for o in VIDEO_QA_OPTIONS}["task"]
    assert set(task.choices) == set(QA_TASKS) and len(task.choices) == 4


def test_qa_answer_types_are_the_scores_types():
    from clipbert_legacy.evaluation.qa import QA_ANSWER_TYPES
    from clipbert_legacy.preprocessing.converters import msrvtt_qa, tgif_qa
    assert tgif_qa.FRAMEQA_TYPES is QA_ANSWER_TYPES["frameqa"]
    assert msrvtt_qa.ANSWER_TYPES is QA_ANSWER_TYPES["msrvtt_qa"]
    assert tgif_qa.FRAMEQA_TYPES == ("object", "number", "color", "location")  # csv type 0..3, in order


def test_args_json_derived_keys_and_found_keys_have_one_owner():
    from clipbert_legacy.training import batch_size_finder, plan, run_dir
    p = plan.RunPlan(n_examples=10, world_size=2, train_batch_size=1, gradient_accumulation_steps=1,
                     num_train_steps=5, stop_step=5, valid_steps=5, save_steps=1)
    assert tuple(p.clipbert_args()) == plan.CLIPBERT_DERIVED_KEYS
    stored = {"lr": 1, **p.clipbert_args(), "train_batch_size": 4, "gradient_accumulation_steps": 1}
    current = {"lr": 1, "num_train_steps": 9, "valid_steps": 1, "save_steps": 2, "n_gpu": 8,
               "train_batch_size": 2, "gradient_accumulation_steps": 3}
    # the derived keys never count as a changed setting; the found ones only under find_batch_size
    assert set(run_dir.setting_differences(stored, current)) == set(batch_size_finder.FOUND_KEYS)
    assert run_dir.setting_differences(stored, {**current, "find_batch_size": "power"}) == {}


def _string_tuples(path):
    """Every tuple literal of two or more strings in ``path``: ``(value, line)``."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Tuple) and len(node.elts) > 1 and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts):
            yield tuple(e.value for e in node.elts), node.lineno


def test_no_other_module_spells_an_owned_list_again():
    """Each owned list is written once in src/ (its owner's line); a second literal copy is the drift
    this file is about."""
    from clipbert_legacy.config.options import (
        DECAYS,
        FRAME_SAMPLING_STRATEGIES,
        IMG_RESIZE_MODES,
        MC_QA,
        OPEN_ENDED_QA,
    )
    from clipbert_legacy.evaluation.qa import QA_ANSWER_TYPES
    from clipbert_legacy.training.batch_size_finder import FOUND_KEYS
    from clipbert_legacy.training.plan import CLIPBERT_DERIVED_KEYS
    pkg, options = "src/clipbert_legacy", "src/clipbert_legacy/config/options.py"
    owned = {DECAYS: options, FRAME_SAMPLING_STRATEGIES: options, MC_QA: options, OPEN_ENDED_QA: options,
             IMG_RESIZE_MODES: options,
             FOUND_KEYS: f"{pkg}/training/batch_size_finder.py",
             CLIPBERT_DERIVED_KEYS: f"{pkg}/training/plan.py",
             **dict.fromkeys(QA_ANSWER_TYPES.values(), f"{pkg}/evaluation/qa.py")}
    written = {}
    for f in sorted((REPO / "src").rglob("*.py")):
        for value, line in _string_tuples(f):
            if value in owned:
                written.setdefault(value, []).append(f"{f.relative_to(REPO)}:{line}")
    for value, owner in owned.items():
        assert len(written[value]) == 1 and written[value][0].startswith(owner + ":"), (value, written[value])


def test_the_plot_draws_the_curves_the_tasks_name():
    """tools/plot.py's default validation curves are the tasks' (no list of task metrics of its own)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("plot", REPO / "tools" / "plot.py")
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    from clipbert_legacy.tasks.registry import load_builtin_tasks
    names = plot.default_metrics()
    assert names[:3] == ["text2video_r1", "video2text_r1", "rsum"]  # RetrievalTask.curve_metrics
    assert {cls.main_metric for cls in load_builtin_tasks()} <= set(names)
    assert set(names) == {"text2video_r1", "video2text_r1", "rsum", "mc_accuracy", "overall_acc", "loss"}
    assert not [v for v, _ in _string_tuples(REPO / "tools" / "plot.py") if "overall_acc" in v]


def test_the_frame_pixel_limit_is_written_once():
    """``max_frame_pixels``' default (8K UHD) has one owner, config.options; the decoder, the datasets and
    the option read it from there."""
    from clipbert_legacy.config.options import MAX_FRAME_PIXELS
    from clipbert_legacy.datasets import dataset_base, dataset_vqa, decoder
    written = [f"{f.relative_to(REPO)}" for f in sorted((REPO / "src").rglob("*.py"))
               if "7680 * 4320" in f.read_text() or "33177600" in f.read_text()]
    assert written == ["src/clipbert_legacy/config/options.py"], written
    assert decoder.MAX_FRAME_PIXELS is dataset_base.MAX_FRAME_PIXELS is dataset_vqa.MAX_FRAME_PIXELS
    assert MAX_FRAME_PIXELS == 7680 * 4320
