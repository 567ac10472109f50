"""FusedLayerNorm: apex's signature and keys, nn.LayerNorm's numbers when apex's kernel is absent."""
import pytest
import torch
from torch import nn

from clipbert_legacy.compat import amp
from clipbert_legacy.compat.layer_norm import FusedLayerNorm, MixedFusedLayerNorm, fused_kernel_available


def test_cpu_output_bitwise_equals_nn_layernorm_and_same_keys():
    torch.manual_seed(0)
    ours, ref = FusedLayerNorm(16, eps=1e-12), nn.LayerNorm(16, eps=1e-12)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    ref.load_state_dict(ours.state_dict())
    x = torch.randn(3, 5, 16, requires_grad=True)
    y = ours(x)
    assert torch.equal(y, ref(x))
    assert list(ours.state_dict()) == list(ref.state_dict()) == ["weight", "bias"]
    y.sum().backward()
    assert x.grad is not None and ours.weight.grad is not None


def test_int_shape_becomes_size_tuple_and_non_affine_has_none():
    m = FusedLayerNorm(7)
    assert m.normalized_shape == torch.Size((7,))
    assert torch.equal(m.weight, torch.ones(7)) and torch.equal(m.bias, torch.zeros(7))
    na = FusedLayerNorm([2, 7], elementwise_affine=False)
    assert na.weight is None and na.bias is None and na.normalized_shape == torch.Size((2, 7))
    assert list(na.state_dict()) == []
    x = torch.randn(4, 2, 7)
    assert torch.equal(na(x), torch.nn.functional.layer_norm(x, (2, 7)))


def test_loads_nn_layernorm_checkpoint_and_is_a_layernorm():
    ref = nn.LayerNorm(5)
    with torch.no_grad():
        ref.weight.fill_(2.0)
    m = FusedLayerNorm(5)
    m.load_state_dict(ref.state_dict())
    assert isinstance(m, nn.LayerNorm) and torch.equal(m.weight, ref.weight)


def test_fp16_matches_fp32_loosely_and_keeps_input_dtype():
    torch.manual_seed(1)
    m = FusedLayerNorm(32)
    x = torch.randn(8, 32)
    y32 = m(x)
    y16 = m.half()(x.half())
    assert y16.dtype == torch.float16
    assert torch.allclose(y16.float(), y32, atol=1e-2)
    assert m(x).dtype == torch.float16  # fp32 input into an fp16 layer (after O2) is cast, not rejected


@pytest.mark.filterwarnings("ignore:amp. fp16 on CPU")
def test_o2_casts_fused_layer_norm_to_fp16():
    model = nn.Sequential(nn.Linear(4, 4), FusedLayerNorm(4), nn.BatchNorm1d(4))
    model = amp.initialize(model, opt_level="O2", verbosity=0)
    assert model[1].weight.dtype == torch.float16 and model[2].weight.dtype == torch.float32
    assert model(torch.randn(3, 4)).dtype == torch.float32


def test_mixed_fused_layer_norm_always_affine():
    m = MixedFusedLayerNorm(6)
    assert m.elementwise_affine and m.weight.shape == (6,)
    with pytest.warns(UserWarning):
        MixedFusedLayerNorm(6, elementwise_affine=True)
    with pytest.warns(UserWarning), pytest.raises(RuntimeError, match="elementwise_affine = False"):
        MixedFusedLayerNorm(6, elementwise_affine=False)
    y = m(torch.randn(2, 6).half())  # fp16 activations, fp32 params: output in the param dtype
    assert y.dtype == torch.float32


def test_fused_kernel_not_claimed_without_apex():
    assert fused_kernel_available() is False  # no apex on this project's machines


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_fp16_close_to_fp32_and_autocast_dtype():
    torch.manual_seed(2)
    m = FusedLayerNorm(64).cuda()
    x = torch.randn(16, 64, device="cuda")
    y32 = m(x)
    assert torch.allclose(m.half()(x.half()).float(), y32, atol=1e-2)
    m.float()
    with torch.autocast("cuda", dtype=torch.float16):
        y = m(x)
    # apex's kernel returns the autocast dtype; the torch fallback returns fp32 like nn.LayerNorm
    assert y.dtype == (torch.float16 if fused_kernel_available() else torch.float32)
