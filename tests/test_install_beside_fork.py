"""The project installs beside a ClipBERT-lineage fork: both are importable and runnable in one venv.

Every fork of the lineage (ClipBERT, ALPRO, CLIP-ViP, hd-vila) is a top-level package named ``src``. The
project's wheel must carry ``clipbert_legacy`` only, so a fork's ``src`` and the project never shadow each
other. A fresh venv gets the project's wheel (built from this checkout, not editable) and a small fork;
its third-party packages (torch, transformers, ...) come from the project's env through a ``.pth`` line.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

FORK_FILES = {  # a fork's layout: a top-level `src` package with a task script, as in ClipBERT
    "src/__init__.py": "",
    "src/modeling/__init__.py": "",
    "src/modeling/modeling.py": "def fork_model_name():\n    return 'ClipBert (fork)'\n",
    "src/tasks/run_fork.py": (
        "import sys\n"
        "from src.modeling.modeling import fork_model_name\n"
        "from clipbert_legacy.optimization.sched import get_lr_sched\n"
        "import clipbert_legacy.compat.hvd as hvd\n"
        "hvd.init()\n"
        "lr = get_lr_sched(5, 'linear', 1e-4, 100, warmup_ratio=0.1)\n"
        "print(fork_model_name(), hvd.size(), f'{lr:.3e}')\n"),
}


def _run(cmd, cwd, timeout=600, pythonpath=None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    if pythonpath:
        env["PYTHONPATH"] = str(pythonpath)
    p = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, f"{cmd}: rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    return p.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The project's wheel, built without build isolation (setuptools of the env) from a copy of what the
    build reads, so the checkout gets no build/ or egg-info folder."""
    out, tree = tmp_path_factory.mktemp("wheel"), tmp_path_factory.mktemp("tree")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "src" / "clipbert_legacy", tree / "src" / "clipbert_legacy",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--disable-pip-version-check", "-q", "-w", out, tree], cwd=out)
    (whl,) = out.glob("clipbert_legacy-*.whl")
    return whl


def test_the_wheel_installs_no_package_named_src(wheel):
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert "src" not in tops
    assert {t for t in tops if not t.endswith(".dist-info")} == {"clipbert_legacy"}, tops


def test_a_fork_and_the_project_import_and_run_in_one_fresh_venv(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([py, "-c", purelib], tmp_path).strip())
    # the project env's third-party packages, after the fresh venv's own (a plain path line: its editable
    # finder for this checkout is not loaded, so clipbert_legacy can only come from the wheel)
    (site / "project_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
          "-q", "--target", site, wheel], cwd=tmp_path)
    fork = tmp_path / "my_fork"
    for rel, text in FORK_FILES.items():
        (fork / rel).parent.mkdir(parents=True, exist_ok=True)
        (fork / rel).write_text(text)

    where = _run([py, "-c", "import clipbert_legacy; print(clipbert_legacy.__file__)"], tmp_path).strip()
    assert where.startswith(str(site)), where  # the installed wheel, not this checkout
    # the fork's own script, run from its root as ClipBERT's README says (`source setup.sh` puts the root on
    # PYTHONPATH, then `python src/tasks/run_x.py`): its `src` and the project's package in one process
    out = _run([py, "src/tasks/run_fork.py"], fork, pythonpath=fork)
    assert out.split() == ["ClipBert", "(fork)", "1", "5.000e-05"], out
    # from the fork's root (python -c / -m put it first), both still resolve to their owners
    out = _run([py, "-c", "import src, clipbert_legacy.config; print(src.__file__); "
                "print(clipbert_legacy.config.__file__)"], fork)
    fork_src, project_config = out.split()
    assert fork_src == str(fork / "src" / "__init__.py") and project_config.startswith(str(site))
    # and the project's own entry point runs from the installed wheel
    assert "usage:" in _run([py, "-m", "clipbert_legacy.tasks.run_video_retrieval", "--help"], tmp_path)


def test_the_project_env_exposes_no_src_tasks_or_preprocessing(tmp_path):
    """The editable install maps the one name ``clipbert_legacy`` (pyproject's package-dir): the folder
    ``src/`` is not put on sys.path, so neither ``src`` nor the script folders become importable."""
    code = ("import importlib.util as u; import clipbert_legacy; "
            "print([n for n in ('src', 'tasks', 'preprocessing') if u.find_spec(n)])")
    assert _run([sys.executable, "-c", code], tmp_path).strip() == "[]"
