"""Stand-in for torchvision where the installed one cannot load next to this torch (PyPI's CUDA build dies at
import beside the CPU torch: ``operator torchvision::nms does not exist``): transforms, ops, io and the
names video-and-language forks and transformers use, on torch, PIL and PyAV. docs/legacy_forks_detectron2.md
lists each name."""
from . import io, models, ops, transforms, utils

__version__ = "0.0.0+clipbert_legacy"  # not a torchvision release: version checks must not take it for one
LEGACY_STAND_IN = True

__all__ = ["io", "models", "ops", "transforms", "utils", "get_image_backend", "set_image_backend",
           "get_video_backend", "set_video_backend"]

_BACKENDS = {"image": "PIL", "video": "pyav"}


def get_image_backend():
    return _BACKENDS["image"]


def set_image_backend(backend):
    if backend != "PIL":
        raise ValueError(f"image backend {backend!r}: the legacy layer's torchvision reads "
                         "images with PIL only")


def get_video_backend():
    return _BACKENDS["video"]


def set_video_backend(backend):
    if backend != "pyav":
        raise ValueError(f"video backend {backend!r}: the legacy layer's torchvision reads "
                         "video with PyAV only")
