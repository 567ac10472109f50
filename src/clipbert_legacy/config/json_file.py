"""The ``--config`` JSON file, read within limits: a bounded size, a bounded nesting depth and no
duplicate key, each refused in one line naming the file.

ClipBERT read it with ``json.load``: a file nested 10,000 levels deep ended in a ``RecursionError``
traceback, and of two values of one key the last was kept without a word (``learning_rate`` twice: which
one did the run use?). A config is a few KB and four levels deep (``train_datasets`` -> entry -> ``txt`` ->
path); the limits are far above that.
"""
import json
import os

from clipbert_legacy.config.schema import ConfigError
from clipbert_legacy.utils.errors import clip, shown

MAX_CONFIG_BYTES = 4 * 2 ** 20
MAX_DEPTH = 32
MAX_INT_DIGITS = 30
"""Digits an integer of a config may have (step counts and seeds have at most 20): a 4,000-digit one
overflowed the float conversion of a check, a 5,000-digit one Python's int parser (both tracebacks)."""


def load_json_object(path: str, what: str = "--config") -> dict:
    """The JSON object in ``path``; ConfigError (one line) for a missing, too large, unparsable, too
    deeply nested file, a duplicate key, or anything but an object at the top."""
    name = f"{what} {clip(repr(path))}"
    if not os.path.isfile(path):
        raise ConfigError(f"{name}: file not found")
    with open(path, "rb") as f:
        raw = f.read(MAX_CONFIG_BYTES + 1)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{name}: {os.path.getsize(path)} bytes, more than a config file may have "
                          f"({MAX_CONFIG_BYTES} bytes); is it the right file?")
    try:
        text = raw.decode("utf-8-sig")  # a BOM is not part of the JSON
        data = json.loads(text, object_pairs_hook=lambda pairs: _unique(pairs, name),
                          parse_int=lambda digits: _int(digits, name))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"{name}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}") from None
    except RecursionError:
        raise ConfigError(f"{name}: nested too deeply to parse; a config needs at most a few levels "
                          f"(this project reads up to {MAX_DEPTH})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: expected a JSON object of options, got {type(data).__name__}")
    _check_depth(data, name)
    return data


def _int(digits: str, name: str) -> int:
    """``parse_int``: a JSON integer of at most MAX_INT_DIGITS digits."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ConfigError(f"{name}: an integer of {len(digits.lstrip('-'))} digits ({clip(digits, 20)}); a "
                          f"config value has at most {MAX_INT_DIGITS}")
    return int(digits)


def _unique(pairs: list, name: str) -> dict:
    """``object_pairs_hook``: a JSON object as a dict, refusing a key given twice."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"{name}: key {shown(key)} is given twice ({shown(out[key])} and then "
                              f"{shown(value)}); keep one")
        out[key] = value
    return out


def _check_depth(data, name: str) -> None:
    """Refuse nesting deeper than MAX_DEPTH (the checks and messages downstream recurse into values)."""
    level, depth = [data], 1
    while level:
        if depth > MAX_DEPTH:
            raise ConfigError(f"{name}: nested more than {MAX_DEPTH} levels deep; a config needs at most a "
                              f"few levels")
        level = [v for x in level for v in (x.values() if isinstance(x, dict) else x)
                 if isinstance(v, (dict, list))]
        depth += 1
