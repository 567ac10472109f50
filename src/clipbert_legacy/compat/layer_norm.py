"""apex.normalization.FusedLayerNorm without requiring apex.

ClipBERT's BERT builds its LayerNorms as ``FusedLayerNorm`` and its checkpoints carry the keys
``weight`` / ``bias``. This module keeps that name and those keys:

* When apex's fused CUDA kernel is importable *and* the input is on CUDA (and we are not being
  traced / scripted / compiled), the fused kernel is used, exactly as apex did.
* Otherwise the maths is ``torch.nn.functional.layer_norm`` — which is what apex itself fell back to
  for CPU inputs (apex ``d130ec1f``) and is numerically the same algorithm as the kernel (biased
  variance, eps inside the rsqrt, fp32 statistics for fp16/bf16 inputs).

Deviations from apex, and why:

* apex's constructor imported ``fused_layer_norm_cuda`` and so failed without the CUDA extension,
  even for CPU use. Here construction never needs apex.
* ``FusedLayerNorm`` subclasses ``nn.LayerNorm`` (apex's subclassed ``nn.Module``), so code that
  tests ``isinstance(m, nn.LayerNorm)`` (e.g. no-weight-decay parameter grouping) treats it as one.
  Under ``torch.autocast`` the fallback returns whatever ``F.layer_norm`` returns under autocast (fp32 on
  CUDA, the autocast dtype on CPU); apex's kernel returned the autocast dtype (fp16/bf16) on CUDA.
* An fp32 input into an fp16/bf16 layer (after O2 casting) is cast to the layer's dtype instead of
  raising a dtype error; an fp16 input with fp32 weights is passed to ``F.layer_norm`` as is (its output
  dtype is the input dtype, as ``nn.LayerNorm``).
* ``MixedFusedLayerNorm`` returns the parameter dtype on every device (apex: on CUDA only).
"""
import logging
import numbers
import warnings

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

__all__ = ["FusedLayerNorm", "MixedFusedLayerNorm", "fused_kernel_available"]

try:  # pragma: no cover - apex is not installable on this project's machines
    import fused_layer_norm_cuda  # noqa: F401
    from apex.normalization.fused_layer_norm import FusedLayerNormAffineFunction as _ApexAffineFn
    from apex.normalization.fused_layer_norm import FusedLayerNormFunction as _ApexFn
except Exception:  # ImportError, or apex built against another torch
    _ApexAffineFn = _ApexFn = None


def fused_kernel_available():
    """True when apex's fused layer-norm CUDA kernel can be used."""
    return _ApexAffineFn is not None and torch.cuda.is_available()


def _tracing_or_compiling():
    if torch.jit.is_scripting() or torch.jit.is_tracing():
        return True
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def _as_shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return torch.Size((int(normalized_shape),))
    return torch.Size(tuple(normalized_shape))


class FusedLayerNorm(nn.LayerNorm):
    """LayerNorm with apex's constructor signature and state_dict keys (``weight``, ``bias``)."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(_as_shape(normalized_shape), eps=eps, elementwise_affine=elementwise_affine)
        self.normalized_shape = _as_shape(normalized_shape)
        self.memory_efficient = bool(memory_efficient)

    def _use_fused(self, x):
        return _ApexAffineFn is not None and x.is_cuda and not _tracing_or_compiling()

    def forward(self, input):
        if self._use_fused(input):  # pragma: no cover - needs apex + CUDA
            if self.elementwise_affine:
                return _ApexAffineFn.apply(input, self.weight, self.bias, self.normalized_shape,
                                           self.eps, self.memory_efficient)
            return _ApexFn.apply(input, self.normalized_shape, self.eps, self.memory_efficient)
        if (self.weight is not None and input.dtype == torch.float32
                and self.weight.dtype != torch.float32
                and not torch.is_autocast_enabled(input.device.type)):
            input = input.to(self.weight.dtype)  # F.layer_norm rejects fp32 input + fp16 weight
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self):
        return "{normalized_shape}, eps={eps}, elementwise_affine={elementwise_affine}".format(
            **self.__dict__)


class MixedFusedLayerNorm(FusedLayerNorm):
    """apex's MixedFusedLayerNorm: always affine; output dtype follows the parameter dtype.

    This is the "fp16/bf16 activations, fp32 LayerNorm parameters" variant: the input is normalised
    with fp32 statistics and the result comes back in the parameters' dtype.
    """

    def __init__(self, normalized_shape, eps=1e-5, *, memory_efficient=False, **kwargs):
        if "elementwise_affine" in kwargs:
            affine = kwargs.pop("elementwise_affine")
            warnings.warn("MixedFusedLayerNorm does not support `elementwise_affine` argument", stacklevel=2)
            if not affine:
                raise RuntimeError("MixedFusedLayerNorm does not support `elementwise_affine = False`")
        if kwargs:
            raise TypeError(f"MixedFusedLayerNorm got unexpected keyword argument(s) {sorted(kwargs)}")
        super().__init__(normalized_shape, eps=eps, elementwise_affine=True,
                         memory_efficient=memory_efficient)

    def forward(self, input):
        if input.dtype != self.weight.dtype:
            input = input.to(self.weight.dtype)
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
