"""The config schema: :class:`Option` (one key: type, default, choices, range, help), the
:class:`Config` mapping a parse produces, :class:`ConfigError`, and the checks/coercion that turn a
JSON or command-line value into the option's type (or a one-line error naming key, value and the fix).
"""
import difflib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Optional, Union

from clipbert_legacy.utils.errors import clip, shown


class ConfigError(ValueError):
    """A bad configuration value; the message is a single line naming key, value and the fix."""


class Config(dict):
    """Attribute-access dict; nested dicts (also inside lists) are Configs too (EasyDict-like)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        for k, v in dict(*args, **kwargs).items():
            self[k] = v

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, _wrap(value))

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"config has no option {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict:
        """A plain ``dict`` copy (nested Configs become dicts, tuples lists), ready for JSON."""
        return _unwrap(self)


def _wrap(v):
    if isinstance(v, Config):
        return v
    if isinstance(v, dict):
        return Config(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_wrap(x) for x in v)
    return v


def _unwrap(v):
    if isinstance(v, dict):
        return {k: _unwrap(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_unwrap(x) for x in v]
    return v


@dataclass
class Option:
    """One config key. ``type`` is int|float|str|bool (bool: 0/1/true/false, stored as bool).

    ``nargs``: None for a scalar, an int for a fixed-length list, "+" for a non-empty list.
    ``unused``: accepted for ClipBERT compatibility but has no effect (a notice is logged when set).
    ``derived``: computed after parsing; a given value is replaced (with a notice if it differs).
    ``model``: the key defines the trained model; inference takes it from the training run's
    ``log/args.json`` (``clipbert_legacy.config.model_keys()`` is generated from these flags).
    ``runtime``: the key says how a run runs, not what it trains, so it may differ between the runs of
    one output directory (``clipbert_legacy.config.runtime_keys()``; the rerun policy ignores it).
    """
    name: str
    type: type
    default: Any = None
    help: str = ""
    choices: Optional[tuple] = None
    nargs: Union[None, int, str] = None
    min: Optional[float] = None
    max: Optional[float] = None
    min_exclusive: bool = False
    nullable: Optional[bool] = None  # default: nullable iff default is None
    unused: Optional[str] = None  # the notice text
    derived: bool = False
    json_only: bool = False
    group: str = "shared"
    model: bool = False
    runtime: bool = False

    def __post_init__(self) -> None:
        if self.nullable is None:
            self.nullable = self.default is None
        if self.model and self.runtime:
            raise ValueError(f"option {self.name!r}: model=True and runtime=True contradict each other (a "
                             "model-defining key cannot change between the runs of one directory)")

    def type_name(self) -> str:
        """How the value is written in help and errors: ``int``, ``0|1``, ``2 x float``, ``list of int``."""
        t = {int: "int", float: "float", str: "str", bool: "0|1"}.get(self.type, "json")
        if self.nargs is None:
            return t
        return f"{self.nargs} x {t}" if isinstance(self.nargs, int) else f"list of {t}"


_BOOL_TRUE, _BOOL_FALSE = ("1", "true", "True", "yes"), ("0", "false", "False", "no")


# value checking
def _fmt(v):
    """A value as an error quotes it (clipped: a 50 MB value is named, not repeated)."""
    return shown(v)


def _allowed(o):
    if o.choices:
        return "one of " + "|".join(str(c) for c in o.choices)
    rng = []
    if o.min is not None:
        rng.append((">" if o.min_exclusive else ">=") + f" {o.min:g}")
    if o.max is not None:
        rng.append(f"<= {o.max:g}")
    s = o.type_name() + (" " + " and ".join(rng) if rng else "")
    return s + (" or null" if o.nullable else "")


def _bad(o, value, source, why=None):
    why = why or f"expected {_allowed(o)}"
    if source == "command line":  # show what was typed
        typed = clip(" ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value))
    else:
        typed = _fmt(value)
    return ConfigError(f"{o.name}={typed} ({source}) is invalid: {why}")


def _scalar(o, v, source, from_cli):
    t = o.type
    if t is bool:
        if from_cli:
            if v in _BOOL_TRUE:
                return True
            if v in _BOOL_FALSE:
                return False
        elif isinstance(v, bool) or (isinstance(v, int) and v in (0, 1)):
            return bool(v)
        raise _bad(o, v, source, "expected 0|1 (or true|false)")
    if t in (int, float):
        if from_cli:
            try:
                v = t(v)
            except ValueError:
                raise _bad(o, v, source) from None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _bad(o, v, source)
        if not math.isfinite(v):  # nan passes every range check, inf passes every lower bound
            raise _bad(o, v, source, f"expected a finite {t.__name__}")
        if t is float:
            return float(v)
        if isinstance(v, int) or v.is_integer():
            return int(v)
        raise _bad(o, v, source)
    if t is str:
        if isinstance(v, str):
            return v
        raise _bad(o, v, source)
    return v


def _check_range(o, v, source, shown):
    if o.choices is not None and v not in o.choices:
        raise _bad(o, shown, source)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if o.min is not None and (v < o.min or (o.min_exclusive and v == o.min)):
            raise _bad(o, shown, source)
        if o.max is not None and v > o.max:
            raise _bad(o, shown, source)


def coerce(o: Option, value: Any, source: str, from_cli: bool = False) -> Any:
    """Check/convert one value for option ``o``; raises ConfigError naming key, value, allowed."""
    if value is None or (from_cli and value in ("None", "null") and o.nullable):
        if o.nullable:
            return None
        raise _bad(o, value, source, f"a value is required ({_allowed(o)})")
    if o.json_only:
        return _check_datasets(o, value, source)
    if o.nargs is None:
        if isinstance(value, (list, dict)):
            raise _bad(o, value, source)
        v = _scalar(o, value, source, from_cli)
        _check_range(o, v, source, value)
        return v
    if not isinstance(value, (list, tuple)):
        raise _bad(o, value, source, f"expected a list ({_allowed(o)})")
    if isinstance(o.nargs, int) and len(value) != o.nargs:
        raise _bad(o, value, source, f"expected exactly {o.nargs} values")
    if o.nargs == "+" and not value:
        raise _bad(o, value, source, "expected at least one value")
    out = []
    for x in value:
        if isinstance(x, (list, dict)):
            raise _bad(o, value, source)
        try:
            y = _scalar(o, x, source, from_cli)
            _check_range(o, y, source, x)
        except ConfigError:
            raise _bad(o, value, source) from None
        out.append(y)
    return out


_DS_KEYS = {"name": str, "txt": (str, list, dict), "img": str, "vis_format": str, "ratio": (int, float)}


def _check_datasets(o, value, source):
    if not isinstance(value, list) or not value:
        raise _bad(o, value, source, "expected a non-empty list of {name, txt, img} objects")
    for i, d in enumerate(value):
        where = f"{o.name}[{i}]"
        if not isinstance(d, dict):
            raise ConfigError(f"{where}={_fmt(d)} ({source}) is invalid: expected an object "
                              "{name, txt, img}")
        for k in d:
            if k not in _DS_KEYS:
                raise ConfigError(f"{where} ({source}) has unknown key {_fmt(k)}{suggest(k, _DS_KEYS)}; "
                                  f"allowed: {', '.join(_DS_KEYS)}")
        for k in ("name", "txt", "img"):
            if k not in d:
                raise ConfigError(f"{where} ({source}) is missing required key {k!r} "
                                  "(each dataset needs name, txt, img)")
        for k, t in _DS_KEYS.items():
            if k in d and not isinstance(d[k], t):
                raise ConfigError(f"{where}.{k}={_fmt(d[k])} ({source}) is invalid: expected "
                                  f"{'a string' if t is str else 'a string, list or object'}")
        txt = d["txt"]
        vals = txt if isinstance(txt, list) else list(txt.values()) if isinstance(txt, dict) else [txt]
        if not vals or not all(isinstance(x, str) for x in vals):
            raise ConfigError(f"{where}.txt={_fmt(txt)} ({source}) is invalid: expected a path, a list "
                              "of paths or {task: path}")
    return value


def suggest(name: str, names: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``names``, or ``""`` (also for a name far longer
    than any option: difflib would index all of it)."""
    if len(name) > 100:
        return ""
    m = difflib.get_close_matches(name, list(names), n=1, cutoff=0.6)
    return f"; did you mean {m[0]!r}?" if m else ""

