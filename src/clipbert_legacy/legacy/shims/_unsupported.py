"""The one error a stand-in gives for what it does not provide.

A legacy fork imports many names it never calls (ClipBERT's grid-feature code imports detectron2's detector
heads, samplers and masks at module level). The stand-ins define those names, so the import succeeds, and
make the first *use* fail with one line that names the thing and what to do, never a deep traceback.
"""
import re
from typing import NoReturn

from clipbert_legacy.utils.errors import UserError

__all__ = ["NotProvidedError", "FIXES", "not_provided", "unsupported_function", "unsupported_class"]

FIXES = {
    "detectron2": "the legacy layer's detectron2 covers ClipBERT's grid-feature path only (config, ResNet "
                  "backbone, checkpoints, logger, comm); detector use (proposals, boxes, ROI pooling, "
                  "detector "
                  "data) needs the real detectron2 built for this torch, which the layer then leaves alone",
    "torchvision": "the legacy layer's torchvision covers the transforms, ops and video reading that "
                   "video-and-language forks use; install a torchvision built for this torch (the layer then "
                   "leaves it alone) or replace the call",
}


class NotProvidedError(UserError, NotImplementedError):
    """A legacy name that the stand-in defines but does not implement was used."""


def not_provided(qualname: str, what: str = "") -> NotProvidedError:
    """``qualname`` (``detectron2.modeling.poolers.ROIPooler.forward``) as one line with the package's fix."""
    top = re.match(r"\w*", qualname).group()  # "detectron2" of "detectron2.x.y" and of "detectron2's X"
    detail = f" ({what})" if what else ""
    fix = FIXES.get(top, "install the real package")
    return NotProvidedError(f"{qualname}{detail} is not provided: {fix}")


def unsupported_function(qualname: str, what: str = ""):
    """A function named like ``qualname`` that raises :class:`NotProvidedError` when called."""
    def function(*_args, **_kwargs) -> NoReturn:
        raise not_provided(qualname, what)
    function.__name__ = function.__qualname__ = qualname.rsplit(".", 1)[-1]
    function.__doc__ = f"Not provided by the legacy layer: {qualname}."
    return function


def unsupported_class(qualname: str, what: str = "", bases=(object,)):
    """A class named like ``qualname`` (so a fork can subclass it at import time) whose construction raises
    :class:`NotProvidedError`."""
    def __init__(self, *_args, **_kwargs) -> NoReturn:
        raise not_provided(qualname, what)
    name = qualname.rsplit(".", 1)[-1]
    module = qualname.rsplit(".", 1)[0]
    return type(name, tuple(bases), {"__init__": __init__, "__module__": module,
                                     "__doc__": f"Not provided by the legacy layer: {qualname}."})
