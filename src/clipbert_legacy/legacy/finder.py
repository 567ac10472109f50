"""The layer's import finders: stand-ins after the real packages, a few overrides before them.

* ``ShimFinder`` is *appended* to ``sys.meta_path``: Python asks it only after every real finder failed,
  so an installed package always wins. It serves ``shims/<a>/<b>.py`` (or ``shims/<a>/<b>/__init__.py``)
  as module ``a.b``, loaded from its file under that requested name, so the relative imports between
  stand-ins resolve to the same module objects. A shim folder with an ``__init__.py`` is a package the
  layer can provide whole (``apex``, ``detectron2``); one without adds modules to a real package
  (``torch/_six.py`` is ``torch._six``). It also serves transformers 3.x's flat module paths
  (``transformers.modeling_bert``) as the installed transformers' module of today
  (``transformers.models.bert.modeling_bert``), only where the old path no longer exists.
* ``FrontFinder`` sits first. For a few names it decides before the real finders: ``use_shim`` names
  (``horovod.torch`` under torchrun, where the real one would silently give ``size() == 1``), ``fallback``
  names whose real package is installed but raises at import (torchvision built for another torch: the
  real import is tried once, then the stand-in is used with one log line), and ``patches``: functions run
  on a real module right after it executes (names that later releases removed).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path

logger = logging.getLogger("clipbert_legacy.legacy")

SHIM_ROOT = Path(__file__).resolve().with_name("shims")


def shim_path(fullname: str, root: Path = SHIM_ROOT) -> tuple[Path, bool] | None:
    """The stand-in file for a dotted name and whether it is a package, or None.

    A top-level name is provided only as a package (a folder with ``__init__.py``); a folder without one
    only extends a real package of that name.
    """
    parts = fullname.split(".")
    base = root.joinpath(*parts)
    init = base / "__init__.py"
    if init.is_file():
        return init, True
    if len(parts) > 1 and base.with_suffix(".py").is_file():
        return base.with_suffix(".py"), False
    return None


def shim_spec(fullname: str, root: Path = SHIM_ROOT):
    """A module spec that loads the stand-in file under the requested name."""
    found = shim_path(fullname, root)
    if found is None:
        return None
    path, is_package = found
    locations = [str(path.parent)] if is_package else None
    return importlib.util.spec_from_file_location(fullname, path, submodule_search_locations=locations)


def is_shim(module) -> bool:
    """True when a loaded module is one of the layer's stand-ins."""
    origin = getattr(getattr(module, "__spec__", None), "origin", None) or ""
    return str(SHIM_ROOT) in origin


# transformers 3.x kept every model in flat modules (transformers.modeling_bert); 4.x moved them to
# transformers.models.<model>.<module>: an old path is served as the current module itself
_FLAT_TRANSFORMERS = re.compile(r"^transformers\.((?:configuration|modeling|modeling_tf|modeling_flax|"
                                r"tokenization)_"
                                r"([a-z0-9_]+?)(?:_fast)?)$")


def moved_module(fullname: str) -> str | None:
    """The current name of a transformers 3.x flat module path, if the installed transformers has it."""
    match = _FLAT_TRANSFORMERS.match(fullname)
    if match is None:
        return None
    for model in (match.group(2), match.group(2).replace("_", "-")):
        target = f"transformers.models.{model}.{match.group(1)}"
        try:
            if importlib.util.find_spec(target) is not None:
                return target
        except ModuleNotFoundError:
            continue
    return None


class _AliasLoader(importlib.abc.Loader):
    """Loads a module under another name: the import system then records the target module itself."""

    def __init__(self, target: str):
        self.target = target

    def create_module(self, spec):  # noqa: ARG002 (Loader's signature)
        return importlib.import_module(self.target)

    def exec_module(self, module):
        pass


class ShimFinder(importlib.abc.MetaPathFinder):
    """Serves a stand-in only where the real import already failed (it is appended to sys.meta_path)."""

    def __init__(self, root: Path = SHIM_ROOT):
        self.root = root
        self._announced: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):  # noqa: ARG002 (MetaPathFinder's signature)
        spec = shim_spec(fullname, self.root)
        if spec is None:
            target = moved_module(fullname)
            if target is not None:
                return importlib.util.spec_from_loader(fullname, _AliasLoader(target))
        if spec is not None:
            top = fullname.split(".")[0]
            if top not in self._announced and "." not in fullname:
                self._announced.add(top)
                logger.info("legacy layer: %s is not installed; using the layer's stand-in", top)
        return spec


class _AlreadyLoaded(importlib.abc.Loader):
    """Hands the import system a module that a finder already imported (no second execution)."""

    def __init__(self, module):
        self.module = module

    def create_module(self, spec):  # noqa: ARG002 (Loader's signature)
        return self.module

    def exec_module(self, module):
        pass


class _PatchingLoader(importlib.abc.Loader):
    """Runs the real loader, then the patches registered for that module name."""

    def __init__(self, real, patches):
        self.real = real
        self.patches = patches

    def create_module(self, spec):
        return self.real.create_module(spec)

    def exec_module(self, module):
        self.real.exec_module(module)
        for patch in self.patches:
            patch(module)

    def __getattr__(self, name):  # get_source, get_data, is_package ... of the real loader
        return getattr(self.real, name)


class FrontFinder(importlib.abc.MetaPathFinder):
    """Decides before the real finders for the names registered on it (see the module docstring)."""

    def __init__(self):
        self.use_shim: dict[str, Callable[[], bool]] = {}
        self.fallback: set[str] = set()
        self.patches: dict[str, list[Callable]] = {}
        self._busy: set[str] = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self._busy:
            return None
        rule = self.use_shim.get(fullname)
        if rule is not None and rule():
            return shim_spec(fullname)
        if fullname in self.fallback:
            return self._real_or_shim(fullname)
        if fullname in self.patches:
            return self._patched_spec(fullname, path, target)
        return None

    def _other_finders_spec(self, fullname, path, target):
        self._busy.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or isinstance(finder, ShimFinder) or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    return spec
            return None
        finally:
            self._busy.discard(fullname)

    def _patched_spec(self, fullname, path, target):
        spec = self._other_finders_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _PatchingLoader(spec.loader, self.patches[fullname])
        return spec

    def _real_or_shim(self, fullname):
        """Try the installed package once; if importing it raises, purge it and serve the stand-in."""
        if importlib.machinery.PathFinder.find_spec(fullname) is None:
            return None  # not installed: the ShimFinder at the end serves it
        before = set(sys.modules)
        self._busy.add(fullname)
        try:
            module = importlib.import_module(fullname)
        except Exception as exc:  # the real package raised while importing (e.g. a missing torch operator)
            for name in set(sys.modules) - before:
                if name == fullname or name.startswith(fullname + "."):
                    del sys.modules[name]
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            logger.warning("legacy layer: the installed %s does not import next to torch %s (%s); "
                           "using the layer's stand-in", fullname, _torch_version(), first[:200])
            self.fallback.discard(fullname)
            self.use_shim[fullname] = _always  # from now on: the stand-in, before the broken package
            return shim_spec(fullname)
        finally:
            self._busy.discard(fullname)
        self.fallback.discard(fullname)
        return importlib.util.spec_from_loader(fullname, _AlreadyLoaded(module),
                                               origin=module.__spec__.origin,
                                               is_package=hasattr(module, "__path__"))


def _always() -> bool:
    return True


def _torch_version():
    torch = sys.modules.get("torch")
    return getattr(torch, "__version__", "?")


def apply_now_or_on_import(front: FrontFinder, module_name: str, patch: Callable) -> None:
    """Run ``patch(module)`` now if the module is loaded, else right after it is imported."""
    module = sys.modules.get(module_name)
    if module is not None:
        patch(module)
    else:
        front.patches.setdefault(module_name, []).append(patch)
