"""The trainer is assembled once (``clipbert_legacy.training.build``) and never rewritten: few attributes, the
built components the same objects from set-up to the end, the config as given, and no code outside the
builder that assigns a trainer attribute or a config value."""
import ast
import copy
from pathlib import Path

import pytest

from clipbert_legacy.training import batch_size_finder
from clipbert_legacy.training.contracts import Hook
from clipbert_legacy.training.engine import Trainer
from tests.toy_task import ToyTask, toy_cfg

REPO = Path(__file__).resolve().parents[1]
COMPONENTS = ("cfg", "process", "plan", "model", "optimizer", "precision", "sharding", "dataset", "sampler",
              "loader", "checkpointer")


class Watch(Hook):
    """The components as the hooks first see them and as they are at the end."""

    def before_train(self, trainer):
        self.first = trainer.parts

    def after_train(self, trainer, _summary):
        self.last = trainer.parts


def test_a_run_keeps_its_components_and_the_given_config(tmp_path, monkeypatch):
    """find_batch_size (its trials on the CPU standing in for a GPU) picks batch 5 for the toy task:
    the run's config says so, the config given is untouched, and nothing built is replaced."""
    from tests.test_batch_size_finder import OomToy
    monkeypatch.setattr(batch_size_finder, "check_device", lambda device, world: None)
    cfg = toy_cfg(tmp_path, train_batch_size=2, gradient_accumulation_steps=2, find_batch_size="binsearch",
                  find_batch_size_keep_effective=1)
    given = copy.deepcopy(cfg)
    watch = Watch()
    trainer = Trainer(cfg, OomToy(), hooks=[watch])
    trainer.train()
    assert trainer.given_cfg is cfg and cfg == given  # not one value changed
    assert (trainer.cfg.train_batch_size, trainer.cfg.gradient_accumulation_steps) == (5, 1)
    assert trainer.plan.train_batch_size == 5 and trainer.plan.gradient_accumulation_steps == 1
    for name in COMPONENTS:
        assert getattr(watch.first, name) is getattr(watch.last, name) is getattr(trainer.parts, name), name
    assert trainer.optimizer.backward_passes_per_step == 1  # the found accumulation, not the given 2
    assert len(vars(trainer)) <= 12, sorted(vars(trainer))


def test_the_trainer_is_a_handful_of_attributes(tmp_path):
    trainer = Trainer(toy_cfg(tmp_path, debug=1), ToyTask())
    trainer.train()
    assert sorted(vars(trainer)) == ["events", "given_cfg", "hooks", "parts", "signals", "state", "task"]



def test_close_outputs_closes_every_writer_last_opened_first_and_raises_the_first_error(tmp_path, caplog):
    """W&B (opened last) finishes its run before TensorBoard and the others close, as before the writers;
    a writer that fails to close does not keep the others (or the lock) open."""
    from clipbert_legacy.training.build import Outputs, close_outputs
    from clipbert_legacy.training.checkpoint_files import TrainingRestorer
    from clipbert_legacy.training.events import Writer
    from clipbert_legacy.training.run_dir import RunDirectory
    from clipbert_legacy.utils.errors import UserError

    closed = []

    class Closing(Writer):
        def __init__(self, name, fails=False):
            self.name, self.fails = name, fails

        def close(self):
            closed.append(self.name)
            if self.fails:
                raise UserError(f"{self.name} could not close")

    def outputs(*writers):
        run_dir = RunDirectory(str(tmp_path / "out"), "restart")
        run_dir.acquire({})
        return Outputs(str(tmp_path / "out"), str(tmp_path / "out" / "log"), str(tmp_path / "out" / "ckpt"),
                       "new", TrainingRestorer(str(tmp_path / "out" / "ckpt")), run_dir, writers=writers)

    first = outputs(Closing("tb"), Closing("log", fails=True), Closing("wandb", fails=True))
    with pytest.raises(UserError, match="wandb could not close"):
        close_outputs(first, raise_errors=True)
    assert closed == ["wandb", "log", "tb"]
    closed.clear()
    second = outputs(Closing("tb", fails=True), Closing("wandb"))  # the lock was released
    close_outputs(second, raise_errors=False)  # after a failure: logged, the first error is reported
    assert closed == ["wandb", "tb"] and "tb could not close" in caplog.text
    outputs().run_dir.release()


# ---------------------------------------------------------------------------------------------------
# the source: who assigns what
PKG = REPO / "src" / "clipbert_legacy"
BUILDER = PKG / "training" / "build.py"
ENGINE = PKG / "training" / "engine.py"
# inference prepares its config (the trained run's model keys) before it builds a model; it never trains
EXEMPT_FUNCTIONS = {(PKG / "training" / "inference.py", "prepare_inference_config")}


def _functions_and_nodes(tree):
    """(enclosing function name or None, node) for every node."""
    def walk(node, fn):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            yield inner, child
            yield from walk(child, inner)
    yield from walk(tree, None)


def _assigned(node):
    """The targets a node assigns (plain, augmented, annotated assignments; setattr calls)."""
    if isinstance(node, ast.Assign):
        return [t for target in node.targets
                for t in (target.elts if isinstance(target, ast.Tuple) else [target])]
    if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        return [node.target]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr"
            and node.args):
        return [ast.Attribute(value=node.args[0], attr="<setattr>")]
    return []


def _owner(target) -> str | None:
    """``trainer``/``cfg`` for ``trainer.x = ``, ``cfg.x = ``, ``cfg[k] = ``, also when reached through an
    attribute (``self.trainer.x = ``, ``parts.cfg[k] = ``) (else None)."""
    base = target.value if isinstance(target, (ast.Attribute, ast.Subscript)) else None
    if isinstance(base, ast.Name) and base.id in ("trainer", "cfg"):
        return base.id
    if isinstance(base, ast.Attribute) and base.attr in ("trainer", "cfg"):
        return base.attr
    return None


def offending_assignments(path: Path) -> list[str]:
    out = []
    for fn, node in _functions_and_nodes(ast.parse(path.read_text())):
        if (path, fn) in EXEMPT_FUNCTIONS:
            continue
        for target in _assigned(node):
            owner = _owner(target)
            if owner is not None:
                out.append(f"{path.relative_to(REPO)}:{node.lineno} assigns {owner}")
    return out


def test_nothing_outside_the_builder_assigns_a_trainer_attribute_or_a_config_value():
    """Every module but the config layer (parsing derives keys there, before anything is built) and the
    builder, and the benchmarks, tools and test workers that run a trainer: no ``trainer.x = ...``,
    ``cfg.x = ...``, ``cfg[k] = ...`` or ``setattr`` on them."""
    offenders = []
    for f in sorted((REPO / "src").rglob("*.py")):
        if f == BUILDER or f.relative_to(REPO).parts[1:3] == ("clipbert_legacy", "config"):
            continue
        offenders += offending_assignments(f)
    for folder in ("benchmarks", "tools", "tests/workers"):  # what drives a Trainer from outside src/
        for f in sorted((REPO / folder).rglob("*.py")):
            offenders += offending_assignments(f)
    assert not offenders, offenders


def test_the_engine_assigns_its_attributes_in_init_and_takes_parts_only_from_the_builder():
    bad = []
    for fn, node in _functions_and_nodes(ast.parse(ENGINE.read_text())):
        for target in _assigned(node):
            if not (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                    and target.value.id == "self"):
                continue
            from_builder = (target.attr == "parts" and isinstance(node.value, ast.Call)
                            and isinstance(node.value.func, ast.Attribute)
                            and isinstance(node.value.func.value, ast.Name)
                            and node.value.func.value.id == "build")
            if fn != "__init__" and not from_builder:
                bad.append(f"engine.py:{node.lineno} {fn} assigns self.{target.attr}")
    assert not bad, bad


@pytest.mark.parametrize("source, expected", [
    ("def f(trainer):\n    trainer.plan = 1\n", 1),
    ("def f(cfg):\n    cfg['train_batch_size'] = 2\n", 1),
    ("def f(cfg):\n    cfg.x, y = 1, 2\n", 1),
    ("def f(trainer):\n    setattr(trainer, 'plan', 3)\n", 1),
    ("def f(self):\n    self.trainer.parts = 4\n", 1),
    ("def f(parts):\n    parts.cfg['seed'] = 5\n", 1),
    ("def f(trainer):\n    trainer.state.request_stop('x')\n", 0),
])
def test_the_source_walk_finds_assignments(tmp_path, source, expected):
    f = REPO / "tests" / f"_walk_probe_{tmp_path.name}.py"
    try:
        f.write_text(source)
        assert len(offending_assignments(f)) == expected
    finally:
        f.unlink()


def test_only_the_engine_writes_the_restore_file():
    """No hook (default, task, elastic) calls ``save_restore``: the engine writes the restore file at the
    end of the step, after every hook, so a hook's place in the list cannot change what it holds."""
    callers = []
    for f in sorted((REPO / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "save_restore"):
                callers.append(f"{f.relative_to(REPO)}:{node.lineno}")
    assert [c.split(":")[0] for c in callers] == ["src/clipbert_legacy/training/engine.py"] * 2, callers
