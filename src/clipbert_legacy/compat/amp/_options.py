"""Opt levels O0-O3 and the validated option set (``Properties``), with apex's override rules."""
from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn

import torch


def _warn_or_err(msg: str) -> NoReturn:
    # apex: hard_override (never set by any argument) would turn this into a warning.
    raise RuntimeError(msg)


def _check_keep_batchnorm_fp32(level, value):
    """Validate keep_batchnorm_fp32 for ``level`` and parse the strings 'True'/'False'."""
    if level == "O1" and value is not None:
        _warn_or_err("With opt_level O1, batchnorm functions are automatically run in FP32, so "
                     f"keep_batchnorm_fp32 should be None. keep_batchnorm_fp32 was {value}")
    if value == "False":
        return False
    if value == "True":
        return True
    assert value is True or value is False or value is None, (
        "keep_batchnorm_fp32 must be a boolean, the string 'True' or 'False', or None, found "
        f"keep_batchnorm_fp32={value}")
    return value


def _checked(level, name, value):
    """The value to store for option ``name`` under opt level ``level`` (raises on apex's rejects)."""
    if name == "cast_model_type":
        if level == "O1" and value not in (None, False) and value is not torch.float32:
            _warn_or_err("O1 inserts casts around Torch functions rather than model weights, so with "
                         "O1 the model weights themselves should remain FP32. To cast the model to "
                         f"another type use opt_level='O2' or 'O3'. cast_model_type was {value}")
    elif name == "patch_torch_functions":
        if level != "O1" and value:
            _warn_or_err("patch_torch_functions=True should only be set by selecting opt_level='O1'.")
    elif name == "keep_batchnorm_fp32":
        return _check_keep_batchnorm_fp32(level, value)
    elif name == "master_weights":
        if level == "O1" and value is not None:
            _warn_or_err("It doesn't make sense to use master_weights with O1. With O1, your model "
                         "weights themselves should be FP32.")
    elif name == "loss_scale":
        return value if value == "dynamic" else float(value)
    return value


class Properties:
    """The option set of one opt_level; assignments are validated against the level (apex rules)."""

    def __init__(self) -> None:
        self.__dict__["options"] = {"enabled": False, "opt_level": None, "cast_model_type": None,
                                    "patch_torch_functions": False, "keep_batchnorm_fp32": None,
                                    "master_weights": None, "loss_scale": 1.0}

    def __getattr__(self, name):
        options = self.__dict__.get("options", {})
        if name in options:
            return options[name]
        raise AttributeError(f"'Properties' object has no attribute {name!r}")

    def __setattr__(self, name, value):
        if name not in self.options:
            self.__dict__[name] = value
            return
        self.options[name] = _checked(self.options["opt_level"], name, value)


def _o3(p: Properties) -> Properties:
    p.enabled, p.opt_level = True, "O3"
    p.cast_model_type, p.patch_torch_functions = torch.float16, False
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = False, False, 1.0
    return p


def _o2(p: Properties) -> Properties:
    p.enabled, p.opt_level = True, "O2"
    p.cast_model_type, p.patch_torch_functions = torch.float16, False
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = True, True, "dynamic"
    return p


def _o1(p: Properties) -> Properties:
    p.enabled, p.opt_level = True, "O1"
    p.cast_model_type, p.patch_torch_functions = None, True
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = None, None, "dynamic"
    return p


def _o0(p: Properties) -> Properties:
    p.enabled, p.opt_level = True, "O0"
    p.cast_model_type, p.patch_torch_functions = torch.float32, False
    p.keep_batchnorm_fp32, p.master_weights, p.loss_scale = None, False, 1.0
    return p


opt_levels: dict[str, Callable[[Properties], Properties]] = {"O3": _o3, "O2": _o2, "O1": _o1, "O0": _o0}
