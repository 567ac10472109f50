"""A task is one registered object: adding one touches only its own file plus one registration.

tests/toy_count_task.py is a new task written as docs/adding_a_task.md says: its spec (options,
post-parse rule) beside its class. As a built-in task it is one line in
``clipbert_legacy.tasks.registry.BUILTIN_TASKS``
(the product's entry, ``python -m clipbert_legacy.tasks NAME``, then runs it); as a plugin, one ``register``
call. Everything that used to need a hand-edited list (parser, config reference, model_keys() at inference,
runtime_keys() of the rerun policy, the schema test, the model's head) must pick it up.
"""
import inspect
import json
import re
from pathlib import Path

import pytest
import torch

import clipbert_legacy.config as config
from clipbert_legacy.config import apply_stored_model_config, config_reference_markdown, parse_args
from clipbert_legacy.config.tasks import task_spec
from clipbert_legacy.tasks import registry
from clipbert_legacy.tasks.entry import main
from clipbert_legacy.training.metrics_log import read_metrics
from clipbert_legacy.training.run_dir import setting_differences
from tests.test_architecture import schema_keys
from tests.toy_count_task import TOY_COUNT, ToyCountTask

REPO = Path(__file__).resolve().parents[1]
TINY = str(REPO / "configs" / "model" / "tiny_model.json")


@pytest.fixture
def toy_registered(monkeypatch):
    """The toy task registered with one call, in registries that are restored afterwards."""
    import clipbert_legacy.config.tasks as config_registry
    monkeypatch.setattr(config_registry, "_SPECS", dict(config_registry._SPECS))
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    registry.register(ToyCountTask)


def toy_argv(out, **kw):
    args = {"model_config": TINY, "cnn_type": "tiny", "cnn_weights_path": "", "output_dir": str(out),
            "train_batch_size": 4, "num_train_epochs": 2, "num_valid": 2, "min_valid_steps": 1,
            "train_n_clips": 1, "num_frm": 3, "n_workers": 0, "learning_rate": 1e-3, **kw}
    return [x for k, v in args.items() for x in (f"--{k}", str(v))]


def test_one_registration_feeds_every_generated_list(toy_registered):
    assert registry.get_task("toy_count") is ToyCountTask and "toy_count" in registry.runnable_tasks()
    assert "toy_count" in config.documented_tasks()
    assert "toy_frames" in config.model_keys() and "toy_eval_batches" in config.runtime_keys()
    assert "toy_examples" not in config.model_keys() and "toy_examples" not in config.runtime_keys()
    assert {o.name for o in TOY_COUNT.options} <= schema_keys()  # the schema test covers its keys
    md = config_reference_markdown()
    assert ("| `toy_frames` | int | `3` | >= 1 | toy_count | frames per synthetic clip; the label is the "
            "number of bright ones |") in md
    cfg = parse_args("toy_count", ["--num_frm", "3", "--toy_frames", "3"])
    assert cfg.num_labels == 4 and cfg.task_type == "toy_count" and cfg.learning_rate == 5e-5
    with pytest.raises(config.ConfigError, match="num_frm=1 must equal toy_frames=3"):
        parse_args("toy_count", ["--num_frm", "1"])


def test_the_model_gets_the_task_head(toy_registered):
    """Its task_type is unknown to make_head: a model without the task's head could not be built (no
    silent video_qa defaults)."""
    cfg = parse_args("toy_count", toy_argv("/tmp/unused", toy_frames=2, num_frm=2))
    model = ToyCountTask().build_model(cfg)
    assert type(model.head).__name__ == "QAHead" and model.head.num_outputs == 3
    assert model.transformer.classifier[2].out_features == 3
    with pytest.raises(ValueError, match="task_type='toy_count' is not supported"):
        from clipbert_legacy.modeling.build import build_model
        build_model(cfg)


def test_toy_task_trains_resumes_and_infers_through_the_generated_keys(toy_registered, tmp_path, capsys):
    out = tmp_path / "run"
    torch.manual_seed(0)
    assert main(ToyCountTask, argv=toy_argv(out)) == 0
    valid = read_metrics(str(out / "log" / "metrics.jsonl"), "valid")
    assert [r["step"] for r in valid] == [2, 4] and all(0 <= r["acc"] <= 100 for r in valid)
    assert (out / "ckpt" / "model_step_4.pt").is_file() and (out / "ckpt" / "model_best.pt").is_file()
    stored = json.loads((out / "log" / "args.json").read_text())
    # a runtime option may change between the runs of a directory; a model option may not
    assert main(ToyCountTask, argv=toy_argv(out, toy_eval_batches=2)) == 0
    assert setting_differences(stored, {**stored, "toy_eval_batches": 2}) == {}
    capsys.readouterr()
    assert main(ToyCountTask, argv=toy_argv(out, toy_frames=2, num_frm=2)) == 1
    err = capsys.readouterr().err
    assert "holds a run with other settings" in err and "toy_frames 3 -> 2" in err and "toy_eval" not in err
    # inference takes the model-defining option from the trained run, keeps the runtime one as given
    cfg = parse_args("toy_count", ["--do_inference", "1", "--toy_eval_batches", "3"])
    apply_stored_model_config(cfg, {**stored, "toy_frames": 5})
    assert cfg.toy_frames == 5 and cfg.toy_eval_batches == 3 and cfg.num_labels == 4


def test_every_builtin_task_is_one_object():
    """Each built-in task's class declares its spec and name, the registry's one line names the class,
    and its script path runs ``main(TheClass)``."""
    names = registry.runnable_tasks()
    assert names[:5] == ["retrieval", "msrvtt_mc", "video_qa", "vqa", "pretrain"]
    for name in registry.BUILTIN_TASKS:
        cls = registry.get_task(name)
        assert cls.name == name and cls.spec is task_spec(name), name
        assert registry.BUILTIN_TASKS[name] == f"{cls.__module__}:{cls.__qualname__}"
        source = inspect.getsource(inspect.getmodule(cls))
        assert re.search(rf"sys\.exit\(main\({cls.__qualname__}\)\)", source), name
        assert "build_model" in vars(cls) or "build_head" in vars(cls), f"{name}: no build_head"


def test_a_new_builtin_task_is_one_file_plus_one_registration_line(monkeypatch, tmp_path, capsys):
    """tests/toy_count_task.py as a built-in task: the one line in BUILTIN_TASKS (nothing registered by
    hand) and ``python -m clipbert_legacy.tasks toy_count ...`` trains it; the config reference documents
    it."""
    import clipbert_legacy.config.tasks as config_registry
    from clipbert_legacy.config.reference import config_reference_markdown
    from clipbert_legacy.tasks.__main__ import main as tasks_main
    monkeypatch.setattr(config_registry, "_SPECS", dict(config_registry._SPECS))
    monkeypatch.setattr(registry, "_CLASSES", dict(registry._CLASSES))
    monkeypatch.setitem(registry.BUILTIN_TASKS, "toy_count", "tests.toy_count_task:ToyCountTask")  # the line
    assert "toy_count" in registry.runnable_tasks() and "toy_count" not in config.task_names()
    out = tmp_path / "run"
    torch.manual_seed(0)
    assert tasks_main(["toy_count", *toy_argv(out)]) == 0
    assert registry.get_task("toy_count") is ToyCountTask and "toy_frames" in config.model_keys()
    assert [r["step"] for r in read_metrics(str(out / "log" / "metrics.jsonl"), "valid")] == [2, 4]
    registry.load_builtin_tasks()  # what python -m clipbert_legacy.config does before it writes the reference
    assert "| `toy_frames` | int | `3` | >= 1 | toy_count |" in config_reference_markdown()
    capsys.readouterr()
    assert tasks_main(["toy_countt"]) == 2
    assert "task 'toy_countt' is not a task; known: retrieval|" in capsys.readouterr().err


def test_the_product_entry_runs_a_task_by_name(tmp_path):
    """``python -m clipbert_legacy.tasks NAME --help`` beside ClipBERT's script path: the same parser. The
    product entry answers ``--help`` and refuses a typo before importing torch (a built-in task's options are
    the config layer's)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = ("import sys\nfrom clipbert_legacy.tasks.__main__ import main\ntry:\n"
             "    rc = main(sys.argv[1:])\nexcept SystemExit as e:\n    rc = e.code\n"
             "print('rc', rc, 'torch', 'torch' in sys.modules)")

    def run(*argv):
        return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
    help_, typo = run("-c", probe, "video_qa", "--help"), run("-c", probe, "retrieval", "--learnig_rate", "1")
    script = run(str(REPO / "src" / "tasks" / "run_video_qa.py"), "--help")
    for p in (help_, script):
        assert "--ans2label_path" in p.stdout, p.stderr[-2000:]
    assert script.returncode == 0 and help_.stdout.strip().endswith("rc 0 torch False"), help_.stdout[-500:]
    assert typo.stdout.strip() == "rc 2 torch False", typo.stdout + typo.stderr[-2000:]
    assert typo.stderr.strip() == ("config error: command line: unknown option '--learnig_rate'; did you "
                                   "mean 'learning_rate'?"), typo.stderr
    usage = run("-m", "clipbert_legacy.tasks")
    assert usage.returncode == 2 and "NAME: retrieval|msrvtt_mc|video_qa|vqa|pretrain" in usage.stderr


def test_register_refuses_a_class_without_name_or_matching_spec():
    class NoName(ToyCountTask):
        name = ""
    with pytest.raises(config.ConfigError, match="NoName: set spec"):
        registry.register(NoName)
    with pytest.raises(config.ConfigError, match="task 'nope' is not a task"):
        registry.get_task("nope")
    with pytest.raises(config.ConfigError, match="task 'shared' has options but no task class"):
        registry.get_task("shared")


RECIPE = REPO / "docs" / "adding_a_task.md"
PKG = "src/clipbert_legacy"


def test_recipe_cites_only_what_exists():
    """docs/adding_a_task.md: every existing file it cites is there, its names are in those files, and
    the task it says to copy can train (its class has a dataset builder)."""
    text = RECIPE.read_text()
    cited = set(re.findall(r"`((?:src|tests)/[\w/]+\.py)`", text))
    new = {f"{PKG}/tasks/run_captioning.py", f"{PKG}/datasets/build_captioning.py"}  # the example's
    missing = sorted(p for p in cited - new if not (REPO / p).is_file())
    assert not missing, f"the recipe cites files that do not exist: {missing}"
    assert not any((REPO / p).exists() for p in new), "the recipe's example files must stay hypothetical"
    base, inference = f"{PKG}/tasks/base.py", f"{PKG}/tasks/inference_io.py"
    registry_py = f"{PKG}/tasks/registry.py"
    for name, where in [("BUILTIN_TASKS", registry_py), ("ClipBertTask", base),
                        ("def build_head", base), ("def val_data", base),
                        ("def prepare_inference", inference), ("def write_inference_outputs", inference),
                        ("spec:", f"{PKG}/training/task.py"),
                        ("class TaskSpec", f"{PKG}/config/task_spec.py"),
                        ("def register", registry_py), ("def get_task", registry_py),
                        ("def all_gather_list", f"{PKG}/utils/distributed.py")]:
        assert name in (REPO / where).read_text(), (name, where)
    copy = re.search(r"Copy \*\*`(src/clipbert_legacy/tasks/\w+\.py)`\*\* \(`(\w+)`\)", text)
    assert copy, "the recipe names the task to copy as **`src/clipbert_legacy/tasks/x.py`** (`Class`)"
    cls = next(c for c in map(registry.get_task, registry.runnable_tasks()) if c.__qualname__ == copy[2])
    assert inspect.getsourcefile(cls) == str(REPO / copy[1])
    data = inspect.getsource(cls.build_train_data)
    assert "raise" not in data and "return build_" in data, "the task to copy must train"
    assert "python -m clipbert_legacy.config" in text and (REPO / PKG / "config" / "__main__.py").is_file()
