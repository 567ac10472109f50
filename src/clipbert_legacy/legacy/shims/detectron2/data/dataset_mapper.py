"""detectron2's ``DatasetMapper``: a class a fork can subclass at import (ClipBERT's AttributeDatasetMapper);
constructing one is a clear error (detector data)."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_class

__all__ = ["DatasetMapper"]

DatasetMapper = unsupported_class("detectron2.data.DatasetMapper", "detector data mapping")
