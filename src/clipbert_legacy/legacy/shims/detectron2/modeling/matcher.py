"""detectron2's ``Matcher`` (proposal-to-ground-truth assignment): built from the config, as detector heads
build it; matching boxes is detector training and is one clear error."""
from typing import NoReturn

from clipbert_legacy.legacy.shims._unsupported import not_provided

__all__ = ["Matcher"]


class Matcher:
    """Holds ``thresholds`` / ``labels`` (detectron2 inserts -inf and +inf around the thresholds)."""

    def __init__(self, thresholds, labels, allow_low_quality_matches=False):
        thresholds = list(thresholds)
        if len(labels) != len(thresholds) + 1:
            raise ValueError(f"Matcher: {len(labels)} labels for {len(thresholds)} thresholds "
                             "(needs one more)")
        self.thresholds = [float("-inf")] + thresholds + [float("inf")]
        self.labels = list(labels)
        self.allow_low_quality_matches = allow_low_quality_matches

    def __call__(self, match_quality_matrix) -> NoReturn:
        raise not_provided("detectron2.modeling.matcher.Matcher.__call__", "matching proposals to boxes")
