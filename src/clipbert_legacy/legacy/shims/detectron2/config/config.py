"""detectron2's ``CfgNode`` (fvcore's yacs node + ``_BASE_`` files), ``get_cfg``, ``global_cfg`` and
``configurable``, reading YAML safely.

detectron2 reads config files with ``allow_unsafe=True`` (PyYAML's full loader on a parse failure, which
can build arbitrary Python objects). Here every file is read with ``yaml.safe_load``, whatever
``allow_unsafe`` says; a ``_BASE_`` chain that loops, a file over :data:`MAX_CONFIG_BYTES` and a key the
config does not have are each one line naming the file.
"""
import functools
import inspect
import logging
import os

import yaml

from clipbert_legacy.utils.errors import UserError

try:
    from fvcore.common.config import CfgNode as _FvcoreCfgNode
except ImportError as e:  # fvcore is a plain package: the legacy extra installs it
    raise ImportError("the legacy layer's detectron2.config needs fvcore (as detectron2 does): "
                      "pip install 'clipbert-legacy[legacy]' (or pip install fvcore)") from e

__all__ = ["CfgNode", "get_cfg", "global_cfg", "set_global_cfg", "configurable", "ConfigFileError",
           "ConfigKeyError", "MAX_CONFIG_BYTES", "BASE_KEY"]

logger = logging.getLogger(__name__)

BASE_KEY = "_BASE_"
MAX_CONFIG_BYTES = 16 * 2 ** 20
"""detectron2 config files are a few KB; anything this large is not one (and is read whole)."""
_MAX_BASE_DEPTH = 32


class ConfigFileError(UserError, ValueError):
    """A config file that cannot be read as a detectron2 config."""


class ConfigKeyError(UserError, KeyError):
    """A config file (or list) sets a key the config does not have; ``str`` without KeyError's quotes."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


def _read_yaml(filename: str) -> dict:
    if "://" in filename:
        raise ConfigFileError(f"{filename}: config files are read from local paths only (the legacy layer "
                              f"downloads nothing); download it and give its path")
    try:
        size = os.path.getsize(filename)
    except OSError as e:
        raise ConfigFileError(f"{filename}: cannot read the config file ({e.strerror or e})") from e
    if size > MAX_CONFIG_BYTES:
        raise ConfigFileError(f"{filename} is {size} bytes, more than a detectron2 config may be "
                              f"({MAX_CONFIG_BYTES} bytes); give the right file")
    with open(filename, encoding="utf-8") as f:
        try:
            data = yaml.safe_load(f)
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" line {where.line + 1}" if where is not None else ""
            raise ConfigFileError(f"{filename}:{at} not plain YAML ({getattr(e, 'problem', None) or e}); "
                                  f"config files may hold only mappings, lists, strings and numbers") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigFileError(f"{filename}: a config file must be a mapping of keys, got "
                              f"{type(data).__name__}")
    return data


def _merge_into(a: dict, b: dict, filename: str) -> None:
    """``a``'s keys over ``b`` (``b`` the base), recursively, as fvcore's ``merge_a_into_b``."""
    for k, v in a.items():
        if isinstance(v, dict) and k in b:
            if not isinstance(b[k], dict):
                raise ConfigFileError(f"{filename}: {k} is a mapping here but not in its _BASE_ file")
            _merge_into(v, b[k], filename)
        else:
            b[k] = v


class CfgNode(_FvcoreCfgNode):
    """detectron2's config node: yacs semantics (``merge_from_list``, ``freeze``, ``clone``, ``dump``) and
    ``merge_from_file`` with ``_BASE_`` inheritance (a relative base is relative to the including file)."""

    @classmethod
    def load_yaml_with_base(cls, filename: str, allow_unsafe: bool = False, _chain=()):
        """The file's mapping with its ``_BASE_`` files merged under it (always ``yaml.safe_load``)."""
        real = os.path.realpath(filename)
        if real in _chain:
            raise ConfigFileError(f"{filename}: its _BASE_ chain loops ({' -> '.join(_chain + (real,))})")
        if len(_chain) >= _MAX_BASE_DEPTH:
            raise ConfigFileError(f"{filename}: more than {_MAX_BASE_DEPTH} nested _BASE_ files")
        cfg = _read_yaml(filename)
        base = cfg.pop(BASE_KEY, None)
        if base is None:
            return cfg
        if not isinstance(base, str):
            raise ConfigFileError(f"{filename}: _BASE_ must be a file name, got {base!r}")
        base = os.path.expanduser(base)
        if not os.path.isabs(base) and "://" not in base:
            base = os.path.join(os.path.dirname(filename), base)
        merged = cls.load_yaml_with_base(base, _chain=_chain + (real,))
        _merge_into(cfg, merged, filename)
        return merged

    def merge_from_file(self, cfg_filename: str, allow_unsafe: bool = True) -> None:
        """Merge a YAML file (and its ``_BASE_`` files) into this config; VERSION 2 files only."""
        loaded = type(self)(self.load_yaml_with_base(cfg_filename))
        version = loaded.get("VERSION", None)
        if version is None:
            logger.info("%s has no VERSION: read as a VERSION 2 config (detectron2's current format)",
                        cfg_filename)
        elif version != self.VERSION:
            raise ConfigFileError(f"{cfg_filename}: VERSION {version} configs are not read by the legacy "
                                  f"layer (it reads VERSION {self.VERSION}); upgrade the file with "
                                  f"detectron2's "
                                  f"config compat (upgrade_config) once")
        try:
            self.merge_from_other_cfg(loaded)
        except KeyError as e:
            raise ConfigKeyError(f"{cfg_filename}: {e.args[0] if e.args else e} (not a key of this config: "
                                 f"fix the name, or add it before merging, e.g. cfg.MODEL.X = "
                                 f"CfgNode())") from e
        except ValueError as e:
            raise ConfigFileError(f"{cfg_filename}: {e}") from e

    def merge_from_list(self, cfg_list: list) -> None:
        """``["MODEL.WEIGHTS", "x.pth", ...]`` as yacs, with a one-line error for an unknown key."""
        try:
            super().merge_from_list(cfg_list)
        except (KeyError, AssertionError) as e:  # yacs asserts on an unknown key of a list
            detail = e.args[0] if e.args else e
            raise ConfigKeyError(f"config list: {detail} (not a key of this config)") from e



def get_cfg() -> CfgNode:
    """A fresh copy of detectron2's default config."""
    from .defaults import _C
    return _C.clone()


global_cfg = CfgNode()


def set_global_cfg(cfg: CfgNode) -> None:
    """detectron2's process-wide config (``global_cfg``) becomes a copy of ``cfg``."""
    global_cfg.clear()
    global_cfg.update(cfg)


def _called_with_cfg(*args, **kwargs) -> bool:
    first = args[0] if args else kwargs.get("cfg")
    return isinstance(first, _FvcoreCfgNode)


def configurable(init_func):
    """detectron2's ``@configurable`` for ``__init__``: called with a config, the class's ``from_config``
    turns it into the explicit arguments; called with explicit arguments, ``__init__`` runs as written."""
    @functools.wraps(init_func)
    def wrapped(self, *args, **kwargs):
        if not _called_with_cfg(*args, **kwargs):
            return init_func(self, *args, **kwargs)
        from_config = getattr(type(self), "from_config", None)
        if from_config is None:
            raise TypeError(f"{type(self).__name__} is @configurable but has no from_config classmethod")
        params = inspect.signature(from_config).parameters
        takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
        own = kwargs if takes_all else {k: v for k, v in kwargs.items() if k in params}
        rest = {} if takes_all else {k: v for k, v in kwargs.items() if k not in params}
        explicit = from_config(*args, **own)
        explicit.update(rest)
        return init_func(self, **explicit)
    return wrapped
