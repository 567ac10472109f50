"""ClipBERT's container paths (``/txt``, ``/img``, ``/pretrain``, ``/storage``) mapped to your folders.

ClipBERT's configs name every file under the four mounts of its ``launch_container.sh``. On a cluster
without that container, ``--path_prefix DIR`` (or ``$CLIPBERT_PATH_PREFIX``) makes ``/txt/x`` mean
``DIR/txt/x`` (likewise ``/img``, ``/pretrain``, ``/storage``) for every path in the JSON config and
on the command line, so the shipped configs run unchanged. ``txt=D1,img=D2,...`` maps roots one by
one (a root not named stays as it is). Paths outside the four roots are never touched.
"""
import os
from typing import Any, Optional

from clipbert_legacy.config.schema import ConfigError
from clipbert_legacy.utils.errors import shown

ROOTS = ("txt", "img", "pretrain", "storage")
PREFIX_ENV = "CLIPBERT_PATH_PREFIX"


def parse_prefix(spec: Optional[str], source: str = "path_prefix") -> dict[str, str]:
    """``"DIR"`` -> every root under DIR; ``"txt=D1,img=D2"`` -> those roots; ``None``/"" -> {}."""
    spec = (spec or "").strip()
    if not spec:
        return {}
    if "=" not in spec:
        return {r: os.path.join(spec, r) for r in ROOTS}
    out = {}
    for part in spec.split(","):
        root, sep, folder = part.strip().partition("=")
        root = root.strip().lstrip("/")
        if not sep or root not in ROOTS or not folder.strip():
            raise ConfigError(f"{source}={shown(spec)} is invalid: expected a folder, or root=folder pairs "
                              f"separated by commas with root one of {', '.join(ROOTS)} "
                              f"(e.g. txt=/data/txt_db,img=/data/vis_db)")
        out[root] = folder.strip()
    return out


def map_path(value: str, mapping: dict[str, str]) -> str:
    """``/txt/a/b`` -> ``mapping['txt']/a/b`` when ``txt`` is mapped; anything else unchanged."""
    for root, folder in mapping.items():
        mount = "/" + root
        if value == mount or value.startswith(mount + "/"):
            return folder.rstrip("/") + value[len(mount):]
    return value


def map_paths(value: Any, mapping: dict[str, str], key: Optional[str] = None) -> Any:
    """:func:`map_path` on every string inside ``value`` (dataset entries, txt dicts and lists); the
    value of option ``path_prefix`` itself is never mapped (``--path_prefix /storage/me`` is a folder)."""
    if not mapping or key == "path_prefix":
        return value
    if isinstance(value, str):
        return map_path(value, mapping)
    if isinstance(value, list):
        return [map_paths(v, mapping) for v in value]
    if isinstance(value, dict):
        return {k: map_paths(v, mapping) for k, v in value.items()}
    return value


def prefix_spec(cli: dict, json_values: dict) -> Optional[str]:
    """The prefix in force: the command line's, else the JSON file's, else ``$CLIPBERT_PATH_PREFIX``."""
    for source in (cli, json_values):
        if source.get("path_prefix"):
            return source["path_prefix"]
    return os.environ.get(PREFIX_ENV) or None
