"""Stand-in for the ``horovod`` package where Horovod is not installed: only ``horovod.torch`` is provided
(the project's ``clipbert_legacy.compat.hvd`` over torch.distributed; a single process without a launcher
is a world of one, as with Horovod)."""
