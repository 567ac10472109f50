"""detectron2's ResNet backbone, built from the project's ResNet (clipbert_legacy.modeling.backbone): the
same modules and keys (``stem.conv1.weight``, ``res2.0.conv1.norm.running_var``, ...), returning detectron2's
dict of the ``MODEL.RESNETS.OUT_FEATURES`` maps. Bottleneck ResNets (depth 50 / 101 / 152) with FrozenBN or
BN, as ClipBERT's grid features use; anything else is one :class:`NotProvidedError` line."""
from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided
from clipbert_legacy.modeling.backbone import BasicStem as _ProjectStem
from clipbert_legacy.modeling.backbone import BottleneckBlock as _ProjectBottleneck
from clipbert_legacy.modeling.backbone import FrozenBatchNorm2d
from clipbert_legacy.modeling.backbone import ResNet as _ProjectResNet

from ...layers import ShapeSpec
from .backbone import Backbone
from .build import BACKBONE_REGISTRY

__all__ = ["ResNet", "ResNetBlockBase", "BottleneckBlock", "BasicStem", "make_stage", "build_resnet_backbone",
           "DEPTH_BLOCKS"]

DEPTH_BLOCKS = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
"""Blocks per stage (res2..res5) of the bottleneck ResNets."""
_STAGES = ("res2", "res3", "res4", "res5")
_NORMS = ("FrozenBN", "BN")


class ResNetBlockBase(nn.Module):
    """detectron2's block base: ``in_channels``, ``out_channels``, ``stride`` and ``freeze()``."""

    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride

    def freeze(self):
        """No gradients, BatchNorm turned into FrozenBatchNorm2d (detectron2's FREEZE_AT)."""
        for p in self.parameters():
            p.requires_grad = False
        FrozenBatchNorm2d.convert_frozen_batchnorm(self)
        return self


class BottleneckBlock(_ProjectBottleneck):
    """detectron2's signature over the project's block (1x1 -> 3x3 -> 1x1, projection shortcut)."""

    def __init__(self, in_channels, out_channels, *, bottleneck_channels, stride=1, num_groups=1, norm="BN",
                 stride_in_1x1=False, dilation=1):
        if num_groups != 1 or dilation != 1:
            raise not_provided("detectron2.modeling.backbone.resnet.BottleneckBlock",
                               f"num_groups={num_groups}, dilation={dilation}: grouped or dilated blocks")
        _check_norm(norm, "BottleneckBlock norm")
        super().__init__(in_channels, out_channels, bottleneck_channels, stride, norm, stride_in_1x1)
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride

    freeze = ResNetBlockBase.freeze


class BasicStem(_ProjectStem):
    """The project's stem (7x7/2 conv + norm + ReLU + 3x3/2 max-pool) with detectron2's defaults."""

    def __init__(self, in_channels=3, out_channels=64, norm="BN"):
        _check_norm(norm, "BasicStem norm")
        super().__init__(in_channels, out_channels, norm)

    @property
    def stride(self):
        return 4


def make_stage(block_class, num_blocks, first_stride, **kwargs):
    """``num_blocks`` blocks, the first with ``first_stride``, the rest stride 1 and ``in = out`` channels."""
    blocks = []
    for i in range(num_blocks):
        blocks.append(block_class(stride=first_stride if i == 0 else 1, **kwargs))
        kwargs["in_channels"] = kwargs["out_channels"]
    return blocks


def _check_norm(norm, key):
    if norm not in _NORMS:
        raise not_provided(f"detectron2 ResNet norm {norm!r}", f"{key}; provided: {', '.join(_NORMS)}")


class ResNet(_ProjectResNet, Backbone):
    """The project's ResNet (stem + res2..resN) returning ``{name: map}`` for ``out_features``."""

    def __init__(self, stage_blocks, stem_channels, bottleneck_channels, res2_out_channels, out_features,
                 norm="FrozenBN", stride_in_1x1=True, freeze_at=0):
        _ProjectResNet.__init__(self, stage_blocks, stem_channels, bottleneck_channels, res2_out_channels,
                                norm=norm, stride_in_1x1=stride_in_1x1, freeze_at=freeze_at)
        self._out_features = list(out_features)
        self._out_feature_strides = {"stem": 4, **{n: 4 * 2 ** i for i, n in enumerate(self.stage_names)}}
        channels = {n: res2_out_channels * 2 ** i for i, n in enumerate(self.stage_names)}
        self._out_feature_channels = {"stem": stem_channels, **channels}
        if norm == "BN":  # detectron2 freezes a BN stage by turning its BatchNorm into FrozenBatchNorm2d
            for module in ([self.stem] + [getattr(self, n) for n in self.stage_names])[:max(0, freeze_at)]:
                FrozenBatchNorm2d.convert_frozen_batchnorm(module)

    def forward(self, x):
        if x.dim() != 4:
            raise ValueError(f"ResNet takes (N, C, H, W) inputs, got shape {tuple(x.shape)}")
        outputs = {}
        x = self.stem(x)
        if "stem" in self._out_features:
            outputs["stem"] = x
        for name in self.stage_names:
            x = getattr(self, name)(x)
            if name in self._out_features:
                outputs[name] = x
        return outputs


def _check_resnet_cfg(cfg, input_shape):
    r = cfg.MODEL.RESNETS
    if r.DEPTH not in DEPTH_BLOCKS:
        raise not_provided(f"detectron2 ResNet MODEL.RESNETS.DEPTH={r.DEPTH}",
                           f"bottleneck depths {sorted(DEPTH_BLOCKS)} are provided")
    if r.NUM_GROUPS != 1:
        raise not_provided("detectron2 ResNeXt", f"MODEL.RESNETS.NUM_GROUPS={r.NUM_GROUPS}")
    if r.RES5_DILATION != 1:
        raise not_provided(f"detectron2 ResNet MODEL.RESNETS.RES5_DILATION={r.RES5_DILATION}",
                           "a dilated res5; ClipBERT sets it to 1 before building")
    if any(r.DEFORM_ON_PER_STAGE):
        raise not_provided("detectron2 deformable ResNet stages", "MODEL.RESNETS.DEFORM_ON_PER_STAGE")
    _check_norm(r.NORM, "MODEL.RESNETS.NORM")
    unknown = [f for f in r.OUT_FEATURES if f not in ("stem",) + _STAGES]
    if unknown or not r.OUT_FEATURES:
        raise ValueError(f"MODEL.RESNETS.OUT_FEATURES={list(r.OUT_FEATURES)}: each must be one of "
                         f"stem, {', '.join(_STAGES)}")
    if input_shape.channels != 3:
        raise ValueError(f"the ResNet stem takes 3 input channels, the config gives {input_shape.channels} "
                         f"(MODEL.PIXEL_MEAN has {len(cfg.MODEL.PIXEL_MEAN)} values)")


@BACKBONE_REGISTRY.register()
def build_resnet_backbone(cfg, input_shape: ShapeSpec):
    """detectron2's ``build_resnet_backbone``: stages up to the last of ``OUT_FEATURES``."""
    _check_resnet_cfg(cfg, input_shape)
    r = cfg.MODEL.RESNETS
    n_stages = max([_STAGES.index(f) + 1 for f in r.OUT_FEATURES if f in _STAGES] or [0])
    return ResNet(DEPTH_BLOCKS[r.DEPTH][:n_stages], r.STEM_OUT_CHANNELS, r.NUM_GROUPS * r.WIDTH_PER_GROUP,
                  r.RES2_OUT_CHANNELS, r.OUT_FEATURES, norm=r.NORM, stride_in_1x1=r.STRIDE_IN_1X1,
                  freeze_at=cfg.MODEL.BACKBONE.FREEZE_AT)
