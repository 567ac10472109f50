"""detectron2's ``ROIPooler``: constructed as the ROI heads construct it (it has no weights); pooling boxes
is detector use and is one clear error."""
from typing import NoReturn

from torch import nn

from clipbert_legacy.legacy.shims._unsupported import not_provided

__all__ = ["ROIPooler"]

_TYPES = ("ROIAlign", "ROIAlignV2", "ROIPool", "ROIAlignRotated")


class ROIPooler(nn.Module):
    def __init__(self, output_size, scales, sampling_ratio, pooler_type, canonical_box_size=224,
                 canonical_level=4):
        super().__init__()
        if pooler_type not in _TYPES:
            raise ValueError(f"ROIPooler pooler_type={pooler_type!r}: one of {', '.join(_TYPES)}")
        self.output_size = (output_size, output_size) if isinstance(output_size, int) else tuple(output_size)
        self.scales, self.sampling_ratio, self.pooler_type = tuple(scales), sampling_ratio, pooler_type
        self.canonical_box_size, self.canonical_level = canonical_box_size, canonical_level

    def forward(self, x, box_lists) -> NoReturn:
        raise not_provided("detectron2.modeling.poolers.ROIPooler.forward", f"{self.pooler_type} over boxes")
