"""torch backend: the differentiable collectives, with Horovod 0.28.1's gradients (``mpi_ops.py``).

A loss built on ``hvd.allgather`` (a cross-rank contrastive loss) must send gradients back to every
rank's part; these functions do what Horovod's autograd functions do, including its choices:

* allreduce: the gradient is the same allreduce (op, scale factors, process set) of the output gradient;
* allgather: the output gradient is *averaged* over the set, and each rank takes its own rows;
* broadcast: the output gradient is averaged over the set; it reaches the root only (zero elsewhere);
* alltoall: the output gradient goes back along the received splits;
* reducescatter: the output gradient is allgathered, times the set size for Sum, times the scale factors.

The averaging in allgather's and broadcast's gradients is Horovod's definition, not the sum a single
process computing the same loss on the whole batch would get: see docs/horovod.md ("Gradients through
collectives") for what that means for a loss computed on gathered tensors.
"""
from __future__ import annotations

import torch

from clipbert_legacy.compat.hvd.compression import Compression
from clipbert_legacy.compat.hvd.process_sets import global_process_set
from clipbert_legacy.compat.hvd.torch_backend import ops as ops
from clipbert_legacy.compat.hvd.torch_backend.sets import member


class HorovodAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor, process_set):
        ctx.op, ctx.pre, ctx.post, ctx.ps = op, prescale_factor, postscale_factor, process_set
        return ops.synchronize(ops.allreduce_async(tensor, name, op, prescale_factor, postscale_factor,
                                                   process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op=ctx.op, prescale_factor=ctx.pre, postscale_factor=ctx.post,
                         process_set=ctx.ps)
        return grad, None, None, None, None, None


def allreduce(tensor, name=None, compression=Compression.none, op="average", prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    compressed, ctx = compression.compress(tensor)
    out = HorovodAllreduce.apply(compressed, name, op, prescale_factor, postscale_factor, process_set)
    return compression.decompress(out, ctx)


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.op, ctx.pre, ctx.post, ctx.ps = op, prescale_factor, postscale_factor, process_set
        return tuple(ops.synchronize(ops.grouped_allreduce_async(
            list(tensors), name, op, prescale_factor, postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce(list(grad_output), op=ctx.op, prescale_factor=ctx.pre,
                                  postscale_factor=ctx.post, process_set=ctx.ps)
        return (None, None, None, None, None, *grads)


def grouped_allreduce(tensors, name=None, compression=Compression.none, op="average", prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    outs = HorovodGroupedAllreduce.apply(name, op, prescale_factor, postscale_factor, process_set,
                                         *compressed)
    return [compression.decompress(t, c) for t, c in zip(outs, ctxs)]


class HorovodAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        handle = ops.allgather_async(tensor, name, process_set)
        req = ops.request(handle)
        out = ops.synchronize(handle)
        index = member(process_set).place.index
        rows = req.extra["rows"][0]
        ctx.offset, ctx.dim, ctx.ps = sum(rows[:index]), rows[index], process_set
        return out

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op="average", process_set=ctx.ps)
        return grad.narrow(0, ctx.offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    return HorovodAllgather.apply(tensor, name, process_set)


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        handle = ops.grouped_allgather_async(list(tensors), name, process_set)
        req = ops.request(handle)
        outs = ops.synchronize(handle)
        index = member(process_set).place.index
        ctx.parts = [(sum(r[:index]), r[index]) for r in req.extra["rows"]]
        ctx.ps = process_set
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_output):
        grads = grouped_allreduce(list(grad_output), op="average", process_set=ctx.ps)
        return (None, None, *[g.narrow(0, off, n) for g, (off, n) in zip(grads, ctx.parts)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))


class HorovodBroadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.ps = root_rank, process_set
        return ops.synchronize(ops.broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad = allreduce(grad_output, op="average", process_set=ctx.ps)
        if member(ctx.ps).rank != ctx.root:
            grad = grad * 0
        return grad, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    return HorovodBroadcast.apply(tensor, root_rank, name, process_set)


class HorovodAlltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received_splits = ops.synchronize(ops.alltoall_async(tensor, splits, name, process_set))
        ctx.ps, ctx.recvsplits = process_set, received_splits
        if splits is None:
            return output
        ctx.mark_non_differentiable(received_splits)
        return output, received_splits

    @staticmethod
    def backward(ctx, grad_output, *_dead_gradients):
        grad, _ = alltoall(grad_output, splits=ctx.recvsplits, process_set=ctx.ps)
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    return HorovodAlltoall.apply(tensor, splits, name, process_set)


def _reducescatter_grad(grads, ctx):
    if ctx.op == "sum":
        grads = [g * member(ctx.ps).size for g in grads]
    if ctx.pre != 1.0:
        grads = [g * ctx.pre for g in grads]
    if ctx.post != 1.0:
        grads = [g * ctx.post for g in grads]
    return grads


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.ps, ctx.pre, ctx.post = op, process_set, prescale_factor, postscale_factor
        return ops.synchronize(ops.reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                                       postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = _reducescatter_grad([grad_output], ctx)
        return allgather(grad, process_set=ctx.ps), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op="average",
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed, ctx = compression.compress(tensor)
    out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(out, ctx)


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.ps, ctx.pre, ctx.post = op, process_set, prescale_factor, postscale_factor
        return tuple(ops.synchronize(ops.grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_output):
        grads = _reducescatter_grad(list(grad_output), ctx)
        return (None, None, None, None, None, *grouped_allgather(grads, process_set=ctx.ps))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op="average",
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors])
    outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                             *compressed)
    return [compression.decompress(t, c) for t, c in zip(outs, ctxs)]
