"""Every environment variable the package reads is in docs/environment.md, and the launchers' variables
are read in one module only (``clipbert_legacy.compat.launcher_env``)."""
import ast
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "src" / "clipbert_legacy"
DOC = REPO / "docs" / "environment.md"
LAUNCHER_MODULE = PKG / "compat" / "launcher_env.py"
NAME = re.compile(r"^[A-Z][A-Z0-9_]{2,}$")


def _is_environ(node):
    """``os.environ``."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ" and isinstance(node.value, ast.Name)
            and node.value.id == "os")


def env_reads(tree):
    """Names of the variables a module reads: ``os.environ[...]`` (not assigned), ``os.environ.get(...)``
    / ``setdefault``, ``os.getenv(...)``, ``... in os.environ``, and the string constants of module-level
    names ending in ``_ENV`` / ``_VARS`` (the variables read through a constant)."""
    found = set()
    consts = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name.endswith(("_ENV", "_VARS")):
                values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
                consts[name] = {v.value for v in values if isinstance(v, ast.Constant)}
                found |= consts[name]

    def key(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Name):
            return consts.get(node.id, set())
        return set()

    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value) and isinstance(node.ctx, ast.Load):
            found |= key(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args and (
                (_is_environ(node.func.value) and node.func.attr in ("get", "setdefault"))
                or (node.func.attr == "getenv" and getattr(node.func.value, "id", "") == "os")):
            found |= key(node.args[0])
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            found |= key(node.left)
    return {n for n in found if NAME.match(n)}


def _reads_by_module():
    return {f: env_reads(ast.parse(f.read_text())) for f in sorted(PKG.rglob("*.py"))}


def test_every_variable_the_package_reads_is_documented():
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]{2,})`", DOC.read_text()))
    reads = _reads_by_module()
    assert len(set().union(*reads.values())) >= 30  # the walk finds what is there
    missing = {f"{f.relative_to(REPO)}: {n}" for f, names in reads.items() for n in names - documented}
    assert not missing, f"read but not in docs/environment.md: {sorted(missing)}"


def test_launcher_variables_are_read_only_by_launcher_env():
    launcher = env_reads(ast.parse(LAUNCHER_MODULE.read_text()))
    assert {"HOROVOD_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT"} <= launcher
    elsewhere = {f"{f.relative_to(REPO)}: {sorted(names & launcher)}"
                 for f, names in _reads_by_module().items() if f != LAUNCHER_MODULE and names & launcher}
    assert not elsewhere, f"launcher variables read outside launcher_env: {sorted(elsewhere)}"


@pytest.mark.parametrize("source, expected", [
    ("import os\nx = os.environ['A_B']\n", {"A_B"}),
    ("import os\nos.environ['A_B'] = '1'\n", set()),
    ("import os\nx = os.environ.get('A_B', 1) or os.getenv('C_D')\n", {"A_B", "C_D"}),
    ("import os\nx = 'A_B' in os.environ\n", {"A_B"}),
    ("import os\nK_ENV = 'A_B'\nx = os.environ.get(K_ENV)\n", {"A_B"}),
])
def test_the_walk_finds_each_kind_of_read(source, expected):
    assert env_reads(ast.parse(source)) == expected


def test_launcher_env_answers_like_each_launcher(monkeypatch):
    from clipbert_legacy.compat import launcher_env as le
    for k in list(os.environ):
        if k.startswith(("HOROVOD_", "TORCHELASTIC_", "OMPI_", "PMI_", "SLURM_")) or k in (
                "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(k)
    assert not le.launched() and not le.under_torchrun() and le.local_size() == 1
    assert le.store_address() is None and le.torchrun_process() == le.TorchrunProcess(0, 1, 0, 1)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert le.under_torchrun() and not le.under_horovodrun() and le.launched() and le.local_size() == 2
    assert le.torchrun_process() == le.TorchrunProcess(3, 4, 1, 2) and le.launcher_rank() == 3
    assert le.store_address() == ("127.0.0.1", 29500)
    monkeypatch.setenv("HOROVOD_RANK", "1")
    monkeypatch.setenv("HOROVOD_LOCAL_SIZE", "8")
    assert le.under_horovodrun() and not le.under_torchrun() and le.launcher_rank() == 1
    assert le.local_size() == 8  # horovodrun's own name wins
