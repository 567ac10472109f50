"""detectron2.data: the catalogs, dataset wrappers and samplers work; detector data (mapper, transforms,
detection loaders) is importable and a clear error when used."""
from . import detection_utils, samplers, transforms
from .build import (
    build_batch_data_loader,
    build_detection_test_loader,
    build_detection_train_loader,
    get_detection_dataset_dicts,
)
from .catalog import DatasetCatalog, Metadata, MetadataCatalog
from .common import AspectRatioGroupedDataset, DatasetFromList, MapDataset
from .dataset_mapper import DatasetMapper

__all__ = ["detection_utils", "samplers", "transforms", "build_batch_data_loader", "build_detection_test_loader",
           "build_detection_train_loader", "get_detection_dataset_dicts", "DatasetCatalog", "Metadata",
           "MetadataCatalog", "AspectRatioGroupedDataset", "DatasetFromList", "MapDataset", "DatasetMapper"]
