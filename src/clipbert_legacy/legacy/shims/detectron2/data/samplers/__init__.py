"""detectron2.data.samplers: TrainingSampler, InferenceSampler; grouped / repeat-factor samplers are clear errors."""
from clipbert_legacy.legacy.shims._unsupported import unsupported_class

from .distributed_sampler import InferenceSampler, RepeatFactorTrainingSampler, TrainingSampler

__all__ = ["TrainingSampler", "InferenceSampler", "RepeatFactorTrainingSampler", "GroupedBatchSampler"]

GroupedBatchSampler = unsupported_class("detectron2.data.samplers.GroupedBatchSampler",
                                        "aspect-ratio grouped batches of detector data")
