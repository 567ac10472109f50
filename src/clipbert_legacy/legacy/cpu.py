"""``--cpu``: a CUDA-only legacy script runs on the CPU, for development and tests.

ClipBERT-lineage scripts hard-code CUDA: ``torch.cuda.set_device(hvd.local_rank())``,
``model.to(torch.device("cuda", rank))``, a prefetching loader with ``torch.cuda.Stream`` and
``record_stream``, ``tensor.cuda(non_blocking=True)``, ``torch.cuda.ByteTensor(n)`` buffers. With
``--cpu`` these run on the CPU:

* ``Tensor.cuda`` / ``Module.cuda`` return CPU tensors/modules; ``Tensor.to`` / ``Module.to`` map a CUDA
  device (``torch.device("cuda", i)``, ``"cuda:0"``) to ``cpu``;
* ``torch.cuda.set_device`` / ``synchronize`` do nothing; ``torch.cuda.Stream``, ``stream()``,
  ``current_stream()``, ``default_stream()`` are streams that do nothing (CPU work is in order);
  ``Tensor.record_stream`` on a CPU tensor does nothing;
* ``torch.cuda.{Byte,Char,Short,Int,Long,Half,Float,Double,Bool}Tensor`` build CPU tensors;
* ``torch.cuda.memory_allocated`` and its kin report 0.

``torch.cuda.is_available()`` keeps answering truthfully (False on a CPU machine), so code that
chooses a device by it still chooses the CPU. Factory calls given ``device="cuda"`` directly
(``torch.zeros(n, device="cuda")``) are not rewritten (docs/legacy_forks.md, known limits).
"""
from __future__ import annotations

import contextlib
import logging

import torch
from torch import nn

logger = logging.getLogger("clipbert_legacy.legacy")

_TYPED = ("ByteTensor", "CharTensor", "ShortTensor", "IntTensor", "LongTensor", "HalfTensor", "FloatTensor",
          "DoubleTensor", "BoolTensor", "BFloat16Tensor")
_MEMORY_QUERIES = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                   "memory_cached", "max_memory_cached")
_ENABLED: list[bool] = []


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return isinstance(device, str) and device.split(":")[0] == "cuda"


def _cpu_args(args, kwargs):
    args = tuple(torch.device("cpu") if _is_cuda(a) else a for a in args)
    if _is_cuda(kwargs.get("device")):
        kwargs = {**kwargs, "device": torch.device("cpu")}
    return args, kwargs


class CpuStream:
    """A stand-in for ``torch.cuda.Stream``: CPU work runs in order, so every method does nothing."""

    def __init__(self, device=None, priority=0, **_kwargs):  # noqa: ARG002 (torch.cuda.Stream's)
        self.device = torch.device("cpu")
        self.priority = priority

    def wait_stream(self, _stream):
        pass

    def wait_event(self, _event):
        pass

    def record_event(self, event=None):
        return event

    def synchronize(self):
        pass

    def query(self):
        return True


def _wrap_to(original):
    def to(self, *args, **kwargs):
        args, kwargs = _cpu_args(args, kwargs)
        return original(self, *args, **kwargs)
    to.__wrapped__ = original
    return to


def _patch_tensor_and_module():
    tensor_record_stream = torch.Tensor.record_stream

    def record_stream(self, stream):
        if self.is_cuda:
            return tensor_record_stream(self, stream)
        return None

    def tensor_cuda(self, device=None, non_blocking=False, **_kwargs):  # noqa: ARG001 (Tensor.cuda's)
        return self if self.device.type == "cpu" else self.to("cpu", non_blocking=non_blocking)

    def module_cuda(self, device=None):  # noqa: ARG001 (Module.cuda's signature)
        return self.to("cpu")

    torch.Tensor.record_stream = record_stream
    torch.Tensor.cuda = tensor_cuda
    torch.Tensor.to = _wrap_to(torch.Tensor.to)
    nn.Module.cuda = module_cuda
    nn.Module.to = _wrap_to(nn.Module.to)


def _patch_torch_cuda():
    cuda = torch.cuda
    cuda.set_device = lambda _device: None
    cuda.synchronize = lambda _device=None: None
    cuda.current_device = lambda: 0
    cuda.Stream = CpuStream
    default = CpuStream()
    cuda.current_stream = lambda _device=None: default
    cuda.default_stream = lambda _device=None: default
    cuda.stream = lambda _stream=None: contextlib.nullcontext()
    for name in _TYPED:
        if hasattr(torch, name):
            setattr(cuda, name, getattr(torch, name))
    for name in _MEMORY_QUERIES:
        setattr(cuda, name, lambda _device=None: 0)
    cuda.reset_peak_memory_stats = lambda _device=None: None
    cuda.empty_cache = lambda: None


def enable() -> None:
    """Install the CPU mode once (process-wide) and say so in one log line."""
    if _ENABLED:
        return
    _patch_tensor_and_module()
    _patch_torch_cuda()
    _ENABLED.append(True)
    logger.warning("legacy layer: --cpu: CUDA calls run on the CPU (torch.cuda.set_device, streams, "
                   "record_stream, .cuda(), .to('cuda'), torch.cuda.*Tensor)")
