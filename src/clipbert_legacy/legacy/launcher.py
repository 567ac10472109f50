"""``python -m clipbert_legacy.legacy [--cpu] [--uint8-masks] SCRIPT ARGS...``: run a fork's script as is.

It installs the layer (``layer.install``), puts the fork's repository root first on the import path (so
the fork's own ``src`` package wins), and runs SCRIPT as ``__main__`` with ``sys.argv = [SCRIPT, ARGS...]``,
exactly as ``python SCRIPT ARGS`` would. The same command runs under ``horovodrun -np N python -m
clipbert_legacy.legacy ...`` and ``torchrun --nproc_per_node N -m clipbert_legacy.legacy ...``.

A script that imports a module or name that is neither installed nor provided by the layer stops with
one line naming it, where the fork asked for it, and what to do (exit status 1), not a traceback.
"""
from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
import traceback
from pathlib import Path

from clipbert_legacy.legacy import layer

logger = logging.getLogger("clipbert_legacy.legacy")

ROOT_MARKERS = (".git", "setup.py", "pyproject.toml", "setup.cfg")


def repository_root(script: Path) -> Path:
    """The folder a fork's imports are relative to.

    The folder above the nearest ``src`` folder holding the script (the lineage's layout:
    ``ROOT/src/tasks/run_x.py`` imports ``src.*``); else the nearest folder with ``.git``, ``setup.py`` or
    ``pyproject.toml``; else the script's own folder (what ``python SCRIPT`` puts first).
    """
    script = script.resolve()
    for parent in script.parents:
        if parent.name == "src":
            return parent.parent
    for parent in script.parents:
        if any((parent / marker).exists() for marker in ROOT_MARKERS):
            return parent
    return script.parent


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m clipbert_legacy.legacy",
        description="Run a ClipBERT-lineage script (Horovod + apex + transformers 3.x era) unmodified.")
    parser.add_argument("--cpu", action="store_true",
                        help="run a CUDA-only script on the CPU (device calls, streams, .cuda())")
    parser.add_argument("--uint8-masks", action="store_true",
                        help="accept uint8 masks in masked_fill/masked_select (torch 1.x behaviour)")
    parser.add_argument("--root", type=Path, default=None,
                        help="the fork's repository root (default: the folder above the script's src/)")
    parser.add_argument("script", type=Path, help="the fork's script, e.g. src/tasks/run_video_retrieval.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the script's own arguments")
    return parser.parse_args(argv)


def _fork_frame(exc: BaseException, root: Path) -> str:
    """'file:line' of the innermost traceback frame inside the fork (where it asked for the name)."""
    where = ""
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.is_absolute() and root in path.parents:
            where = f"{path.relative_to(root)}:{frame.lineno}"
    return where


def missing_name_message(exc: BaseException, root: Path) -> str | None:
    """One line for an import the layer cannot satisfy, or None when ``exc`` is something else."""
    where = _fork_frame(exc, root)
    at = f" (at {where})" if where else ""
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        top = exc.name.split(".")[0]
        return (f"error: the script needs module '{exc.name}'{at}, which is neither installed nor "
                f"provided by the legacy layer: install it (pip install {top}), or see docs/legacy_forks.md "
                f"for what the layer provides")
    if isinstance(exc, ImportError) and "cannot import name" in str(exc):
        name = str(exc).split("'")[1] if str(exc).count("'") >= 2 else str(exc)
        return (f"error: the script imports '{name}' from '{exc.name}'{at}, which neither the installed "
                f"{exc.name} nor the legacy layer provides: install a version that has it, or see "
                f"docs/legacy_forks.md")
    obj = getattr(exc, "obj", None)
    if isinstance(exc, AttributeError) and type(obj).__name__ == "module" and exc.name:
        return (f"error: the script uses '{obj.__name__}.{exc.name}'{at}, which neither the installed "
                f"{obj.__name__} nor the legacy layer provides: install a version that has it, or see "
                f"docs/legacy_forks.md")
    return None


def run(script: Path, args: list[str], root: Path) -> None:
    """Run ``script`` as ``__main__`` with the fork's root first on the import path."""
    root_str = str(root)
    # the fork's own packages (its ``src``) win over anything of the same name elsewhere
    for name in [m for m in sys.modules if m == "src" or m.startswith("src.")]:
        del sys.modules[name]
    sys.path[:] = [root_str, str(script.resolve().parent)] + [p for p in sys.path if p not in ("", root_str)]
    sys.argv = [str(script), *args]
    runpy.run_path(str(script), run_name="__main__")


def main(argv=None) -> int:
    opts = parse_args(sys.argv[1:] if argv is None else argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(name)s - %(message)s")
    script = opts.script
    if not script.is_file():
        print(f"error: script {script} does not exist (give the fork's script, e.g. "
              f"path/to/fork/src/tasks/run_video_retrieval.py)", file=sys.stderr)
        return 2
    root = (opts.root or repository_root(script)).resolve()
    cpu = opts.cpu or os.environ.get("CLIPBERT_LEGACY_CPU") == "1"
    layer.install(cpu=cpu, uint8_masks=opts.uint8_masks)
    try:
        run(script, opts.args, root)
    except (ImportError, AttributeError) as exc:
        message = missing_name_message(exc, root)
        if message is None:
            raise
        print(message, file=sys.stderr)
        return 1
    return 0
