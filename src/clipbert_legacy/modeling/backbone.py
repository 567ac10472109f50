"""Grid-feature CNN of ClipBERT: a detectron2-style ResNet in plain torch plus the grid encoder.

ClipBERT built a whole detectron2 ``GeneralizedRCNN`` only to call its ResNet backbone (res5 output,
stride 32, RES5_DILATION forced to 1). Here the ResNet is written directly, with detectron2's module
names (``stem.conv1.weight``, ``stem.conv1.norm.running_var``, ``res2.0.shortcut.norm.bias``, ...),
nested as ``feature.backbone.*`` so ClipBERT / grid-feats checkpoints load key for key. The detector's
RPN / ROI heads are not built (ClipBERT never ran them); their checkpoint keys are ignored with a notice
by :func:`clipbert_legacy.utils.load_save.load_state_dict_with_mismatch`.
"""
import logging
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.checkpoint import checkpoint

logger = logging.getLogger(__name__)

__all__ = ["FrozenBatchNorm2d", "Conv2dNorm", "BasicStem", "BottleneckBlock", "ResNet",
           "RESNET_PRESETS", "build_resnet", "GridFeatBackbone", "is_c2_state_dict", "convert_c2_names"]


class FrozenBatchNorm2d(_BatchNorm):
    """detectron2's FrozenBatchNorm2d: fixed affine transform from buffers weight/bias/running_*.

    It subclasses ``_BatchNorm`` (affine=True) on purpose: apex-style O2 casting
    (``keep_batchnorm_fp32=True``) skips ``_BatchNorm`` modules, so the statistics stay fp32 instead
    of being rounded to fp16 as in ClipBERT (detectron2's class was a plain Module). All four tensors are
    buffers (never trained), and there is no ``num_batches_tracked`` key, as in detectron2.
    """

    def __init__(self, num_features, eps=1e-5):
        super().__init__(num_features, eps=eps, affine=True, track_running_stats=True)
        del self.weight, self.bias  # parameters -> buffers
        self._buffers.pop("num_batches_tracked", None)
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.running_mean.zero_()
        self.running_var.fill_(1.0)

    def reset_parameters(self):  # called by _BatchNorm.__init__ before the buffers exist
        if "weight" in self._buffers:
            self.weight.fill_(1.0)
            self.bias.zero_()
            self.running_mean.zero_()
            self.running_var.fill_(1.0)

    def reset_running_stats(self):
        if "running_mean" in self._buffers:
            self.running_mean.zero_()
            self.running_var.fill_(1.0)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # bypass _NormBase's hook, which would inject a num_batches_tracked key we do not have
        nn.Module._load_from_state_dict(self, state_dict, prefix, *args, **kwargs)

    def forward(self, x):
        # fold in fp32, apply in the activation dtype (fp16 under O2)
        scale = self.weight.float() * (self.running_var.float() + self.eps).rsqrt()
        shift = self.bias.float() - self.running_mean.float() * scale
        return x * scale.to(x.dtype).view(1, -1, 1, 1) + shift.to(x.dtype).view(1, -1, 1, 1)

    def extra_repr(self):
        return f"{self.num_features}, eps={self.eps}"

    @classmethod
    def convert_frozen_batchnorm(cls, module):
        """detectron2's converter: ``module`` with every BatchNorm2d / SyncBatchNorm in it replaced by a
        FrozenBatchNorm2d holding its statistics and affine (the module itself when it is one)."""
        if isinstance(module, (nn.BatchNorm2d, nn.SyncBatchNorm)) and not isinstance(module, cls):
            frozen = cls(module.num_features, eps=module.eps)
            with torch.no_grad():
                if module.affine:
                    frozen.weight.copy_(module.weight.detach())
                    frozen.bias.copy_(module.bias.detach())
                if module.running_mean is not None:
                    frozen.running_mean.copy_(module.running_mean)
                    frozen.running_var.copy_(module.running_var)
            return frozen
        for name, child in module.named_children():
            new_child = cls.convert_frozen_batchnorm(child)
            if new_child is not child:
                module.add_module(name, new_child)
        return module


def _make_norm(norm, channels):
    if norm == "FrozenBN":
        return FrozenBatchNorm2d(channels)
    if norm == "BN":
        return nn.BatchNorm2d(channels)
    raise ValueError(f"cnn_norm={norm!r} is not supported; use 'FrozenBN' (ClipBERT) or 'BN'")


class Conv2dNorm(nn.Conv2d):
    """detectron2's Conv2d with an attached ``norm`` submodule (keys ``<name>.weight``, ``<name>.norm.*``)."""

    def __init__(self, *args, norm=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.norm = norm

    def forward(self, x):
        x = super().forward(x)
        return self.norm(x) if self.norm is not None else x


def _msra_fill(conv):
    """detectron2's c2_msra_fill: kaiming normal (fan_out, relu), zero bias."""
    nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)


class BasicStem(nn.Module):
    """7x7/2 conv + norm + ReLU + 3x3/2 max-pool (stride 4)."""

    def __init__(self, in_channels, out_channels, norm):
        super().__init__()
        self.out_channels = out_channels
        self.conv1 = Conv2dNorm(in_channels, out_channels, kernel_size=7, stride=2, padding=3,
                                bias=False, norm=_make_norm(norm, out_channels))
        _msra_fill(self.conv1)

    def forward(self, x):
        x = F.relu_(self.conv1(x))
        return F.max_pool2d(x, kernel_size=3, stride=2, padding=1)


class BottleneckBlock(nn.Module):
    """detectron2's BottleneckBlock (1x1 -> 3x3 -> 1x1, projection shortcut when channels change)."""

    def __init__(self, in_channels, out_channels, bottleneck_channels, stride, norm,
                 stride_in_1x1=True):
        super().__init__()
        if in_channels != out_channels:
            self.shortcut = Conv2dNorm(in_channels, out_channels, kernel_size=1, stride=stride,
                                       bias=False, norm=_make_norm(norm, out_channels))
            _msra_fill(self.shortcut)
        else:
            self.shortcut = None
        s1, s3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = Conv2dNorm(in_channels, bottleneck_channels, kernel_size=1, stride=s1,
                                bias=False, norm=_make_norm(norm, bottleneck_channels))
        self.conv2 = Conv2dNorm(bottleneck_channels, bottleneck_channels, kernel_size=3, stride=s3,
                                padding=1, bias=False, norm=_make_norm(norm, bottleneck_channels))
        self.conv3 = Conv2dNorm(bottleneck_channels, out_channels, kernel_size=1, bias=False,
                                norm=_make_norm(norm, out_channels))
        for conv in (self.conv1, self.conv2, self.conv3):
            _msra_fill(conv)

    def forward(self, x):
        out = F.relu_(self.conv1(x))
        out = F.relu_(self.conv2(out))
        out = self.conv3(out)
        out = out + (self.shortcut(x) if self.shortcut is not None else x)
        return F.relu_(out)


# name -> (blocks per stage res2..res5, stem channels, res2 bottleneck channels, res2 out channels)
RESNET_PRESETS = {
    "resnet50": ((3, 4, 6, 3), 64, 64, 256),
    "resnet101": ((3, 4, 23, 3), 64, 64, 256),
    "tiny": ((1, 1, 1, 1), 8, 4, 16),  # CPU tests / demo: 128 output channels
}


class ResNet(nn.Module):
    """Stem + res2..res5, returning only the stride-32 res5 map (ClipBERT's OUT_FEATURES=['res5'])."""

    def __init__(self, stage_blocks, stem_channels, bottleneck_channels, res2_out_channels,
                 norm="FrozenBN", stride_in_1x1=True, freeze_at=0, grad_ckpt=False):
        super().__init__()
        self.stem = BasicStem(3, stem_channels, norm)
        self.stage_names = []
        in_ch, bott, out_ch = stem_channels, bottleneck_channels, res2_out_channels
        for idx, n_blocks in enumerate(stage_blocks):
            blocks = []
            for b in range(n_blocks):
                stride = 2 if (b == 0 and idx > 0) else 1
                blocks.append(BottleneckBlock(in_ch, out_ch, bott, stride, norm, stride_in_1x1))
                in_ch = out_ch
            name = f"res{idx + 2}"
            self.add_module(name, nn.Sequential(*blocks))
            self.stage_names.append(name)
            bott, out_ch = bott * 2, out_ch * 2
        self.out_channels = in_ch
        self.norm = norm
        self.grad_ckpt = bool(grad_ckpt)
        self.freeze(freeze_at)

    def freeze(self, freeze_at):
        """detectron2's FREEZE_AT: 1 freezes the stem, 2 also res2, ... (ClipBERT used 2)."""
        stages = [self.stem] + [getattr(self, n) for n in self.stage_names]
        for module in stages[:max(0, int(freeze_at))]:
            for p in module.parameters():
                p.requires_grad_(False)

    def forward(self, x):
        use_ckpt = self.grad_ckpt and self.training and torch.is_grad_enabled()
        for module in [self.stem] + [getattr(self, n) for n in self.stage_names]:
            if use_ckpt:
                x = checkpoint(module, x, use_reentrant=False)
            else:
                x = module(x)
        return x


def build_resnet(cnn_type, norm="FrozenBN", freeze_at=None, grad_ckpt=False):
    """ResNet preset by name; ``freeze_at`` defaults to 2 for the pretrained sizes, 0 for ``tiny``."""
    if cnn_type not in RESNET_PRESETS:
        raise ValueError(f"cnn_type={cnn_type!r} is not supported; choose one of {sorted(RESNET_PRESETS)}")
    blocks, stem, bott, out = RESNET_PRESETS[cnn_type]
    if freeze_at is None:
        freeze_at = 0 if cnn_type == "tiny" else 2
    if grad_ckpt and norm == "BN":
        logger.warning("grad_ckpt with cnn_norm='BN' would update BN running stats twice per step; "
                       "CNN checkpointing is disabled (BERT layers are still checkpointed)")
        grad_ckpt = False
    return ResNet(blocks, stem, bott, out, norm=norm, freeze_at=freeze_at, grad_ckpt=grad_ckpt)


class _DetectorShell(nn.Module):
    """Holds the backbone under ``feature.backbone`` so keys match ClipBERT's GeneralizedRCNN."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone


class GridFeatBackbone(nn.Module):
    """(B, T, 3, H, W) normalised RGB frames -> (B, T, h, w, hidden) grid features.

    ``grid_encoder`` = conv3x3 (no bias) -> MaxPool 2x2 -> ReLU, key ``grid_encoder.0.weight``.
    """

    def __init__(self, backbone, hidden_size, input_format="BGR"):
        super().__init__()
        if input_format not in ("BGR", "RGB"):
            raise ValueError(f"img_input_format={input_format!r} is not supported; use 'BGR' "
                             "(detectron2 / ClipBERT weights) or 'RGB'")
        self.feature = _DetectorShell(backbone)
        self.grid_encoder = nn.Sequential(
            nn.Conv2d(backbone.out_channels, hidden_size, kernel_size=3, padding=1, bias=False),
            nn.MaxPool2d(kernel_size=2, stride=2),
            nn.ReLU(inplace=True),
        )
        self.input_format = input_format

    def forward(self, x):
        if x.dim() != 5:
            raise ValueError(f"visual_inputs must be (B, T, 3, H, W), got shape {tuple(x.shape)}")
        bsz, n_frm, c, h, w = x.shape
        x = x.reshape(bsz * n_frm, c, h, w)
        if self.input_format == "BGR":  # frames arrive RGB; detectron2 weights expect BGR
            x = x[:, [2, 1, 0], :, :]
        grid = self.grid_encoder(self.feature.backbone(x))  # (B*T, C, h, w)
        new_c, new_h, new_w = grid.shape[-3:]
        return grid.view(bsz, n_frm, new_c, new_h, new_w).permute(0, 1, 3, 4, 2)

    def freeze_backbone(self):
        """ClipBERT's freeze_cnn: stop gradients for ``cnn.feature.*`` (the grid encoder still trains)."""
        for p in self.feature.parameters():
            p.requires_grad_(False)


_C2_BLOCK = re.compile(r"^res(\d)_(\d+)_branch(1|2a|2b|2c)_(w|b|bn_s|bn_b|bn_rm|bn_riv)$")
_C2_BRANCH = {"1": "shortcut", "2a": "conv1", "2b": "conv2", "2c": "conv3"}
_C2_KIND = {"w": "weight", "b": "bias", "bn_s": "norm.weight", "bn_b": "norm.bias",
            "bn_rm": "norm.running_mean", "bn_riv": "norm.running_var"}


def is_c2_state_dict(state_dict):
    """True for Caffe2-named ResNet weights (detectron2's ImageNetPretrained/MSRA/R-50.pkl)."""
    return "conv1_w" in state_dict or any(_C2_BLOCK.match(k) for k in state_dict)


def convert_c2_names(state_dict):
    """Caffe2 ResNet names -> our detectron2 names (stem.conv1.*, resX.Y.{shortcut,conv1..3}.*).

    MSRA weights store BN as a fixed affine (scale ``_bn_s``, shift ``_bn_b``) without statistics;
    running_mean 0 and running_var 1 - eps are filled in so FrozenBatchNorm2d computes exactly s*x + b.
    Returns (converted, unused_c2_keys) — unused are e.g. the ImageNet classifier ``pred_*``.
    """
    out, unused = {}, []
    for k, v in state_dict.items():
        if k == "conv1_w":
            out["stem.conv1.weight"] = v
        elif k.startswith("res_conv1_bn_") and k[len("res_conv1_"):] in _C2_KIND:
            out["stem.conv1." + _C2_KIND[k[len("res_conv1_"):]]] = v
        elif _C2_BLOCK.match(k):
            stage, block, branch, kind = _C2_BLOCK.match(k).groups()
            out[f"res{stage}.{block}.{_C2_BRANCH[branch]}.{_C2_KIND[kind]}"] = v
        else:
            unused.append(k)
    for k in [k for k in out if k.endswith(".norm.weight")]:
        base = k[:-len("weight")]
        if base + "running_mean" not in out:
            out[base + "running_mean"] = torch.zeros_like(torch.as_tensor(out[k]))
        if base + "running_var" not in out:
            out[base + "running_var"] = torch.full_like(torch.as_tensor(out[k]), 1.0 - 1e-5)
    return out, unused
