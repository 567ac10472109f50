"""``apex.parallel``: apex's data-parallel wrappers over torch's.

* ``DistributedDataParallel(module, ...)``: ``torch.nn.parallel.DistributedDataParallel`` (gradients
  averaged over the process group, as apex's default ``gradient_average=True``); apex's tuning arguments
  (``message_size``, ``delay_allreduce``, streams) are accepted and have no effect.
* ``SyncBatchNorm``: ``torch.nn.SyncBatchNorm`` with apex's constructor (``channel_last`` and
  ``fuse_relu`` are apex kernel options, refused when set).
* ``convert_syncbn_model(module, process_group=None, channel_last=False)``:
  ``torch.nn.SyncBatchNorm.convert_sync_batchnorm``.
"""
import torch

__all__ = ["DistributedDataParallel", "SyncBatchNorm", "convert_syncbn_model"]


class DistributedDataParallel(torch.nn.parallel.DistributedDataParallel):
    def __init__(self, module, message_size=10000000, delay_allreduce=False,
                 shared_param=None, allreduce_trigger_params=None, retain_allreduce_buffers=False,
                 allreduce_always_fp32=False, num_allreduce_streams=1, allreduce_communicators=None,
                 gradient_average=True, gradient_predivide_factor=1.0, gradient_average_split_factor=None,
                 prof=False):
        if not gradient_average:
            raise ValueError("apex.parallel.DistributedDataParallel(gradient_average=False) is not "
                             "provided by the legacy layer (torch's DDP averages); use the default")
        super().__init__(module)


class SyncBatchNorm(torch.nn.SyncBatchNorm):
    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, channel_last=False, fuse_relu=False):
        if channel_last or fuse_relu:
            raise ValueError("apex.parallel.SyncBatchNorm(channel_last/fuse_relu) are apex kernel options "
                             "the legacy layer's stand-in does not provide")
        super().__init__(num_features, eps=eps, momentum=momentum, affine=affine,
                         track_running_stats=track_running_stats, process_group=process_group)


def convert_syncbn_model(module, process_group=None, channel_last=False):
    """Every BatchNorm of ``module`` made a synchronised one (apex's function, torch's conversion)."""
    if channel_last:
        raise ValueError("convert_syncbn_model(channel_last=True) is an apex kernel option "
                         "the legacy layer's stand-in does not provide")
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)
