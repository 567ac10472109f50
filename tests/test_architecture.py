"""The shape of the code base, checked so it cannot drift: layering, no import cycles, size limits,
no path shims, defaults owned by the config schema.

Layers (an arrow may only point down or sideways where listed; docs/architecture.md):

    (every package's ``__main__``: ``python -m clipbert_legacy.x``, an entry point above all layers)
    tasks, preprocessing          entry points
    training                      the engine: step, hooks, checkpoints, run plan
    datasets | modeling | optimization | evaluation      (independent of each other)
    config, utils
    compat                        legacy APIs (amp, hvd, FusedLayerNorm) over modern torch
"""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "clipbert_legacy"  # the package; src/tasks/run_*.py are ClipBERT's script paths
MAX_FUNCTION_LINES = 60
MAX_FILE_LINES = 500

ALLOWED = {
    "compat": set(),
    "utils": {"compat"},
    "config": {"utils"},
    "datasets": {"compat", "utils", "config"},
    "modeling": {"compat", "utils", "config"},
    "optimization": {"compat", "utils", "config"},
    "evaluation": {"compat", "utils", "config"},
    "training": {"compat", "utils", "config", "optimization", "evaluation"},
    "preprocessing": {"compat", "utils", "config", "datasets", "modeling", "evaluation"},
    "tasks": {"compat", "utils", "config", "datasets", "modeling", "optimization", "evaluation",
              "training"},
}
# the legacy layer (ClipBERT-lineage forks) may use everything; nothing uses it
ALLOWED["legacy"] = set(ALLOWED)
# ``__main__`` modules: python -m <pkg>.x
ALLOWED["entry"] = set(ALLOWED) | {"tasks", "preprocessing"}


def _modules():
    out = {}
    for f in sorted(SRC.rglob("*.py")):
        parts = f.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


MODULES = _modules()


def _imports(path):
    """Every ``clipbert_legacy`` module a file imports, at module level, inside functions or under ``if
    TYPE_CHECKING:`` (a type-only import is a dependency too: it makes the same cycle for a reader)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "clipbert_legacy")
        elif (isinstance(node, ast.ImportFrom) and node.level == 0
              and (node.module or "").split(".")[0] == "clipbert_legacy"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in MODULES else node.module)
    return found


GRAPH = {m: {t for t in _imports(f) if t in MODULES and t != m} for m, f in MODULES.items()}


def _layer(module):
    parts = module.split(".")
    if parts[-1] == "__main__":  # ``python -m clipbert_legacy.x``: an entry point, above every layer
        return "entry"
    return parts[1] if len(parts) > 1 else "clipbert_legacy"


def test_layering():
    bad = []
    for m, targets in GRAPH.items():
        a = _layer(m)
        if a not in ALLOWED:
            continue
        bad += [f"{m} -> {t}" for t in sorted(targets) if _layer(t) != a and _layer(t) not in ALLOWED[a]
                and _layer(t) != "clipbert_legacy"]
    assert not bad, "imports against the layering (see this file's docstring):\n" + "\n".join(bad)
    assert set(ALLOWED) >= {_layer(m) for m in MODULES} - {"clipbert_legacy"}, "a new package needs a layer"


def test_no_import_cycles():
    """Tarjan's strongly connected components over the module graph; any component > 1 is a cycle."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(comp)

    for v in GRAPH:
        if v not in index:
            visit(v)
    cycles = [sorted(c) for c in comps if len(c) > 1]
    assert not cycles, f"import cycles: {cycles}"


def _functions(tree):
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_function_and_file_sizes():
    long_functions, long_files = [], []
    for f in MODULES.values():
        text = f.read_text()
        n = len(text.splitlines())
        if n > MAX_FILE_LINES:
            long_files.append(f"{f.relative_to(REPO)}: {n} lines")
        for fn in _functions(ast.parse(text)):
            length = fn.end_lineno - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                long_functions.append(f"{f.relative_to(REPO)}:{fn.lineno} {fn.name}: {length} lines")
    assert not long_files, f"files over {MAX_FILE_LINES} lines: {long_files}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


@pytest.mark.parametrize("top", ["src", "tests", "benchmarks", "tools"])
def test_no_sys_path_shims(top):
    """The project is installed (pip install -e .): nothing edits sys.path to find it. The one exception is
    the legacy launcher, whose job is to put a user's *fork* first on the path, as ``python SCRIPT`` would."""
    offenders = []
    for f in (REPO / top).rglob("*.py"):
        if f == SRC / "legacy" / "launcher.py":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                offenders.append(str(f.relative_to(REPO)))
                break
    assert not offenders, f"sys.path manipulation in {offenders}"


def schema_keys():
    """Every option name of every registered task: a new task's options are covered without an edit."""
    from clipbert_legacy.config import task_names, task_options
    return {name for task in task_names() for name in task_options(task)}


def test_schema_owns_defaults():
    """``cfg.get("key", default)`` for a schema key would restate (and could contradict) the schema."""
    keys = schema_keys()
    offenders = []
    for m, f in MODULES.items():
        if _layer(m) == "config":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "cfg"
                    and node.args and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys):
                offenders.append(f"{f.relative_to(REPO)}:{node.lineno} cfg.get({node.args[0].value!r})")
    assert not offenders, f"schema keys read with a local default: {offenders}"


def test_docstrings_cite_nothing_outside_the_repository():
    """No docstring points at spec files that ship elsewhere ("reference spec §6", "apex_amp_legacy.md")."""
    needles = ("reference spec", "apex_amp_legacy", "clipbert_reference", "field_notes", "shared/specs")
    offenders = []
    for top in ("src", "tests", "benchmarks", "tools"):
        for f in (REPO / top).rglob("*.py"):
            if f == Path(__file__).resolve():
                continue
            text = f.read_text()
            offenders += [f"{f.relative_to(REPO)}: {n!r}" for n in needles if n in text]
    assert not offenders, offenders


def test_entry_points_run_as_file_and_as_module(tmp_path):
    """ClipBERT users run ``python src/tasks/run_x.py``; ``python -m clipbert_legacy.tasks.run_x`` works
    too; both from outside the repository (the installed package is found, no PYTHONPATH)."""
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for argv in ([str(REPO / "src" / "tasks" / "run_video_retrieval.py"), "--help"],
                 ["-m", "clipbert_legacy.tasks.run_video_qa", "--help"],
                 [str(REPO / "src" / "preprocessing" / "file2lmdb.py"), "--help"]):
        p = subprocess.run([sys.executable, *argv], cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=120)
        assert p.returncode == 0, (argv, p.stderr[-2000:])
        assert "usage:" in p.stdout, argv


def test_type_only_imports_count(tmp_path):
    """An import under ``if TYPE_CHECKING:`` is an edge of the graph (the old engine -> elastic -> hooks
    -> engine circle was one), as are imports inside functions."""
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                 "    from clipbert_legacy.training.engine import Trainer\n"
                 "def g():\n    import clipbert_legacy.training.hooks\n")
    assert _imports(f) == {"clipbert_legacy.training.engine", "clipbert_legacy.training.hooks"}


def test_functions_that_always_raise_say_so():
    """A function whose every path raises (no return, no yield, a raise at the end: a refusal, an
    error helper) is annotated ``NoReturn``, so a reader and a type checker know the call does not come
    back. Abstract stubs (``raise NotImplementedError``) are overridden, not called."""
    offenders = []
    for m, f in MODULES.items():
        for fn in ast.walk(ast.parse(f.read_text())):
            is_function = isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
            if not (is_function and isinstance(fn.body[-1], ast.Raise)):
                continue
            if any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Return)) for n in ast.walk(fn)):
                continue
            exc = fn.body[-1].exc
            called = exc.func if isinstance(exc, ast.Call) else exc
            if getattr(called, "id", None) == "NotImplementedError":
                continue
            if fn.returns is None or "NoReturn" not in ast.unparse(fn.returns):
                offenders.append(f"{m}:{fn.lineno} {fn.name}")
    assert not offenders, f"always raise but are not annotated NoReturn: {offenders}"
