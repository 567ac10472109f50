"""Grid-feature ResNet: detectron2 key layout, FrozenBN maths, stride 32, BGR flip, freezing, grad ckpt."""
import pytest
import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from clipbert_legacy.modeling.backbone import (
    RESNET_PRESETS,
    FrozenBatchNorm2d,
    GridFeatBackbone,
    build_resnet,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def resnet50():
    return build_resnet("resnet50")


def test_resnet50_has_detectron2_keys_and_shapes(resnet50):
    sd = resnet50.state_dict()
    # stem 5 keys; 16 bottlenecks x 3 convs x 5 keys; 4 projection shortcuts x 5 keys
    assert len(sd) == 5 + 16 * 15 + 4 * 5
    assert not any("num_batches_tracked" in k for k in sd)
    expect = {
        "stem.conv1.weight": (64, 3, 7, 7),
        "stem.conv1.norm.weight": (64,), "stem.conv1.norm.bias": (64,),
        "stem.conv1.norm.running_mean": (64,), "stem.conv1.norm.running_var": (64,),
        "res2.0.shortcut.weight": (256, 64, 1, 1), "res2.0.shortcut.norm.running_var": (256,),
        "res2.0.conv1.weight": (64, 64, 1, 1), "res2.0.conv2.weight": (64, 64, 3, 3),
        "res2.2.conv3.weight": (256, 64, 1, 1),
        "res3.0.conv1.weight": (128, 256, 1, 1), "res3.3.conv3.norm.bias": (512,),
        "res4.5.conv2.weight": (256, 256, 3, 3), "res4.0.shortcut.weight": (1024, 512, 1, 1),
        "res5.0.shortcut.weight": (2048, 1024, 1, 1), "res5.2.conv3.norm.running_mean": (2048,),
    }
    for k, shape in expect.items():
        assert tuple(sd[k].shape) == shape, k
    assert "res2.1.shortcut.weight" not in sd and "res5.3.conv1.weight" not in sd
    # FrozenBN tensors are buffers, not parameters; 53 convs are the only parameters
    assert sum(1 for _ in resnet50.parameters()) == 53
    assert resnet50.out_channels == 2048


def test_resnet50_stride32_grid_and_stride_in_1x1(resnet50):
    assert resnet50.res3[0].conv1.stride == (2, 2) and resnet50.res3[0].conv2.stride == (1, 1)
    with torch.no_grad():
        out = resnet50.eval()(torch.randn(1, 3, 64, 96))
    assert out.shape == (1, 2048, 2, 3)


def test_resnet50_freeze_at_2_like_clipbert(resnet50):
    assert not any(p.requires_grad for p in resnet50.stem.parameters())
    assert not any(p.requires_grad for p in resnet50.res2.parameters())
    assert all(p.requires_grad for p in resnet50.res3.parameters())


def test_frozen_bn_matches_eval_batchnorm_and_is_kept_by_amp():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(6).eval()
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.normal_()
        bn.running_mean.normal_()
        bn.running_var.uniform_(0.5, 2.0)
    frozen = FrozenBatchNorm2d(6)
    sd = {k: v for k, v in bn.state_dict().items() if k != "num_batches_tracked"}
    frozen.load_state_dict(sd, strict=True)  # detectron2-style keys, no num_batches_tracked
    x = torch.randn(2, 6, 5, 5)
    torch.testing.assert_close(frozen(x), bn(x), atol=1e-6, rtol=1e-5)
    assert list(frozen.parameters()) == []
    assert sorted(frozen.state_dict()) == ["bias", "running_mean", "running_var", "weight"]
    # apex-style O2 keeps `_BatchNorm` with affine=True in fp32
    assert isinstance(frozen, _BatchNorm) and frozen.affine
    y = frozen(x.half())
    assert y.dtype == torch.float16
    torch.testing.assert_close(y.float(), bn(x.half().float()), atol=2e-2, rtol=1e-2)
    # frozen even in train mode
    torch.testing.assert_close(frozen.train()(x), bn(x), atol=1e-6, rtol=1e-5)


def test_tiny_grid_encoder_layout_and_shapes():
    cnn = GridFeatBackbone(build_resnet("tiny"), hidden_size=32)
    sd = cnn.state_dict()
    assert tuple(sd["grid_encoder.0.weight"].shape) == (32, 128, 3, 3)
    assert "grid_encoder.0.bias" not in sd
    assert "feature.backbone.stem.conv1.weight" in sd
    assert "feature.backbone.res5.0.shortcut.norm.running_var" in sd
    out = cnn(torch.randn(2, 3, 3, 128, 192))  # grid 4x6 -> max-pool -> 2x3
    assert out.shape == (2, 3, 2, 3, 32)
    assert (out >= 0).all()  # ReLU is last
    assert RESNET_PRESETS["tiny"][0] == (1, 1, 1, 1)


def test_bgr_flip_follows_img_input_format():
    torch.manual_seed(0)
    bgr = GridFeatBackbone(build_resnet("tiny"), hidden_size=16, input_format="BGR").eval()
    rgb = GridFeatBackbone(build_resnet("tiny"), hidden_size=16, input_format="RGB").eval()
    rgb.load_state_dict(bgr.state_dict())
    x = torch.randn(1, 2, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(bgr(x), rgb(x[:, :, [2, 1, 0]]))
        assert not torch.allclose(bgr(x), rgb(x))
    with pytest.raises(ValueError, match="img_input_format"):
        GridFeatBackbone(build_resnet("tiny"), 16, input_format="YUV")


def test_freeze_backbone_only_feature():
    cnn = GridFeatBackbone(build_resnet("tiny"), hidden_size=16)
    cnn.freeze_backbone()
    assert not any(p.requires_grad for p in cnn.feature.parameters())
    assert all(p.requires_grad for p in cnn.grid_encoder.parameters())


def test_cnn_grad_ckpt_same_gradients():
    torch.manual_seed(0)
    ref = GridFeatBackbone(build_resnet("tiny", grad_ckpt=False), hidden_size=16).train()
    ckpt = GridFeatBackbone(build_resnet("tiny", grad_ckpt=True), hidden_size=16).train()
    ckpt.load_state_dict(ref.state_dict())
    x = torch.randn(2, 2, 3, 64, 64)
    for m in (ref, ckpt):
        (m(x) ** 2).sum().backward()
    grads = {n: p.grad for n, p in ref.named_parameters()}
    for n, p in ckpt.named_parameters():
        torch.testing.assert_close(p.grad, grads[n], atol=1e-5, rtol=1e-5, msg=n)


def test_bad_options_fail_clearly():
    with pytest.raises(ValueError, match="cnn_type='resnet18'"):
        build_resnet("resnet18")
    with pytest.raises(ValueError, match="cnn_norm='GN'"):
        build_resnet("tiny", norm="GN")
    with pytest.raises(ValueError, match=r"\(B, T, 3, H, W\)"):
        GridFeatBackbone(build_resnet("tiny"), 16)(torch.randn(2, 3, 64, 64))


def test_bn_norm_variant_trains_running_stats():
    net = build_resnet("tiny", norm="BN").train()
    before = net.stem.conv1.norm.running_mean.clone()
    net(torch.randn(2, 3, 64, 64))
    assert isinstance(net.stem.conv1.norm, nn.BatchNorm2d)
    assert not torch.equal(before, net.stem.conv1.norm.running_mean)
