"""detectron2's data helpers that are not detector-specific: ``get_detection_dataset_dicts`` (registered
datasets concatenated, images without annotations dropped), ``trivial_batch_collator``,
``worker_init_reset_seed``. The detection loaders need detectron2's mapper and are one clear error."""
import numpy as np

from clipbert_legacy.legacy.shims._unsupported import not_provided, unsupported_function

from ..utils.env import seed_all_rng
from .catalog import DatasetCatalog

__all__ = ["get_detection_dataset_dicts", "trivial_batch_collator", "worker_init_reset_seed",
           "build_detection_train_loader", "build_detection_test_loader", "build_batch_data_loader"]

_WHERE = "detectron2.data.build"
build_detection_train_loader = unsupported_function(f"{_WHERE}.build_detection_train_loader", "detector data")
build_detection_test_loader = unsupported_function(f"{_WHERE}.build_detection_test_loader", "detector data")
build_batch_data_loader = unsupported_function(f"{_WHERE}.build_batch_data_loader", "detector data")


def get_detection_dataset_dicts(dataset_names, filter_empty=True, min_keypoints=0, proposal_files=None):
    """The dicts of the registered datasets ``dataset_names``, concatenated; with ``filter_empty``, images
    whose annotations are all crowd (or absent) are dropped."""
    if isinstance(dataset_names, str):
        dataset_names = [dataset_names]
    if proposal_files:
        raise not_provided(f"{_WHERE}.get_detection_dataset_dicts", "precomputed proposal files")
    if min_keypoints > 0:
        raise not_provided(f"{_WHERE}.get_detection_dataset_dicts", "keypoint filtering (min_keypoints)")
    dicts = []
    for name in dataset_names:
        got = DatasetCatalog.get(name)
        if not got:
            raise ValueError(f"Dataset '{name}' is empty!")
        dicts.extend(got)
    if filter_empty and dicts and "annotations" in dicts[0]:
        dicts = [d for d in dicts if any(a.get("iscrowd", 0) == 0 for a in d.get("annotations", []))]
    return dicts


def trivial_batch_collator(batch):
    """The batch as the list it is."""
    return batch


def worker_init_reset_seed(worker_id):
    """Seed each DataLoader worker differently (numpy's draw + the worker id)."""
    seed_all_rng(np.random.randint(2 ** 31) + worker_id)
