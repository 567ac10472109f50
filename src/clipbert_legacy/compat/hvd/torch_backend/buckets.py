"""torch backend: ``DistributedOptimizer``'s fused gradient reduction (the training step's hot path).

Gradients are reduced in fixed-order buckets of about ``DIST_BUCKET_MB`` (25 MB) over the process set's
fused group, directly (no negotiation: the bucket layout is the same on every rank by construction,
checked once when the optimizer is made). A bucket's async allreduce starts from the gradient hooks as
soon as all its parameters have had ``backward_passes_per_step`` backward passes and every earlier bucket
has started, so every rank issues the collectives in the same order even when ranks leave different
parameters unused (those get zero gradients at ``synchronize()``).

Each round of bucket reductions of an optimizer over the global set is preceded by a 3-integer async
allreduce, the *step header* ([1, optimizer index + 1, 0] from a training rank). A rank inside
``hvd.join()`` posts [0, 0, 1] instead: from the sum it learns that optimizer k is stepping and takes
part in its bucket reductions with zeros (Horovod's uneven-input join), or that every rank has joined.

The arithmetic is Horovod's ``DistributedOptimizer``'s, element for element: compress (fp16), pre-scale
by ``1 / gradient_predivide_factor``, sum, post-scale by ``gradient_predivide_factor / size`` (Average),
decompress; both scalings on the compressed tensor in Horovod's ``ScaleBuffer`` arithmetic
(``execute.scale``). So an fp16-compressed gradient is averaged in fp16, subnormals rounded as Horovod
rounds them, and only then widened.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from clipbert_legacy.compat.hvd.compression import Compression
from clipbert_legacy.compat.hvd.errors import HorovodInternalError
from clipbert_legacy.compat.hvd.torch_backend.execute import scale

BUCKET_BYTES = int(os.environ.get("DIST_BUCKET_MB", "25")) * 2 ** 20


def build_buckets(params: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Reverse order (the last layers' gradients are ready first), split by size, dtype and device."""
    buckets, cur, cur_bytes = [], [], 0
    for p in reversed(params):
        if cur and (cur_bytes + p.numel() * p.element_size() > BUCKET_BYTES
                    or cur[0].dtype != p.dtype or cur[0].device != p.device):
            buckets.append(cur)
            cur, cur_bytes = [], 0
        cur.append(p)
        cur_bytes += p.numel() * p.element_size()
    if cur:
        buckets.append(cur)
    return buckets


class Buckets:
    """The bucket schedule of one optimizer on this rank."""

    def __init__(self, params: list[torch.Tensor], group: Any, size: int, rank: int, device: str, op: str,
                 predivide: float, compression: Any, owners: dict, header_index: int | None) -> None:
        self.buckets = build_buckets(params)
        self.bucket_of = {p: i for i, b in enumerate(self.buckets) for p in b}
        self.group, self.size, self.rank, self.device = group, size, rank, device
        self.op, self.predivide, self.compression, self.owners = op, predivide, compression, owners
        self.header_index = header_index  # None: no join support (an optimizer over a process set)
        self.sparse: set = set()           # params whose gradients came sparse this round
        self.flat: dict = {}               # (bucket, dtype, owner): the buffer its gradients are packed into
        self.reset(0)

    def reset(self, passes: int) -> None:
        self.delay = dict.fromkeys(self.bucket_of, passes)
        self.ready = [0] * len(self.buckets)
        self.pending: dict[int, list] = {}
        self.next = 0
        self.header = None
        self.sparse = set()

    def in_flight(self, passes: int) -> bool:
        return bool(self.pending) or any(d != passes for d in self.delay.values())

    def count(self, p: torch.Tensor, describe: Callable[[], str]) -> None:
        """A backward pass reached ``p``: launch every bucket that is complete, in order."""
        if self.delay[p] <= 0:
            raise AssertionError(describe())
        self.delay[p] -= 1
        if self.delay[p] == 0:
            self.ready[self.bucket_of[p]] += 1
            while self.next < len(self.buckets) and self.ready[self.next] == len(self.buckets[self.next]):
                self.launch(self.next)
                self.next += 1

    def launch_rest(self) -> None:
        while self.next < len(self.buckets):
            self.launch(self.next)
            self.next += 1

    def _post_header(self) -> None:
        if self.header is None and self.header_index is not None:
            hdr = torch.tensor([1, self.header_index + 1, 0], dtype=torch.int64, device=self.device)
            self.header = dist.all_reduce(hdr, group=self.group, async_op=True)

    def launch(self, i: int) -> None:
        # Buckets are formed at wrap time (before amp may cast some params to fp16): reduce each dtype of
        # the bucket separately, in a fixed order, so fp16 grads travel as fp16. With reduce_to, also per
        # owner: a dist.reduce onto it instead of an allreduce.
        self._post_header()
        by_key: dict = {}
        for p in self.buckets[i]:
            if p in self.sparse:
                continue  # reduced by the sparse path (indices and values)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            by_key.setdefault((str(p.grad.dtype), self.owners.get(p, -1)), []).append(p)
        works = []
        for key in sorted(by_key):
            params, owner = by_key[key], key[1]
            flat = torch.cat([_dense(p.grad).reshape(-1) for p in params], out=self._buffer(i, key, params))
            works.append((*self._reduce(flat, owner), params, owner))
        self.pending[i] = works

    def _buffer(self, i: int, key: tuple, params: list[torch.Tensor]) -> torch.Tensor:
        """The bucket's packing buffer. On the CPU kept from step to step: a fresh 25 MB tensor every step
        costs its page faults (45 ms a step for the demo model's 94 MB of gradients, 15 ms reused); free
        again once :meth:`finish` has written the result into the gradients. On a GPU a fresh one each
        step, as before: the caching allocator makes it cheap, and GPU memory is kept for the model."""
        numel, grad = sum(p.numel() for p in params), params[0].grad
        if grad.device.type != "cpu":
            return torch.empty(numel, dtype=grad.dtype, device=grad.device)
        buf = self.flat.get((i, key))
        if buf is None or buf.numel() != numel or buf.dtype != grad.dtype or buf.device != grad.device:
            buf = self.flat[(i, key)] = torch.empty(numel, dtype=grad.dtype, device=grad.device)
        return buf

    def _scales(self) -> tuple[float, float]:
        """Horovod's split of Average into pre- and post-scale (``horovod/torch/optimizer.py``; the 1/size
        is Horovod's C++ side, ``postscale /= size``); Sum scales nothing."""
        if self.op != "average":
            return 1.0, 1.0
        return 1.0 / self.predivide, self.predivide / self.size

    def _reduce(self, flat: torch.Tensor, owner: int) -> tuple:
        comp, ctx = self.compression.compress(flat)
        comp = scale(comp, self._scales()[0])
        comp = comp if comp.device.type == self.device.split(":")[0] else comp.to(self.device)
        try:
            if owner < 0:
                work = dist.all_reduce(comp, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
            else:
                work = dist.reduce(comp, dst=owner, op=dist.ReduceOp.SUM, group=self.group, async_op=True)
        except RuntimeError as e:
            raise HorovodInternalError(f"gradient allreduce failed: {e}") from e
        return work, comp, ctx

    def finish(self) -> None:
        """Wait for every bucket and write the averaged gradients back."""
        for i in sorted(self.pending):
            for work, comp, ctx, params, owner in self.pending.pop(i):
                _wait(work)
                if owner >= 0 and owner != self.rank:  # reduced onto its owner: this rank drops it
                    for p in params:
                        p.grad = None
                    continue
                post = self._scales()[1]
                if not self._write_back_scaled(comp, post, params):
                    self._write_back(self.compression.decompress(scale(comp, post), ctx), params)
        if self.header is not None:
            _wait(self.header)

    def _write_back_scaled(self, flat: torch.Tensor, post: float, params: list[torch.Tensor]) -> bool:
        """The common case in one pass per gradient: float32, uncompressed, dense, on the bucket's device:
        ``torch.mul(slice, post, out=grad)`` is ``scale()``'s float32 product written straight into the
        gradient (no scaled copy of the whole bucket first). False (nothing written) otherwise."""
        if (self.compression is not Compression.none or flat.dtype != torch.float32
                or any(p.grad.is_sparse or p.grad.dtype != flat.dtype or p.grad.device != flat.device
                       for p in params)):
            return False
        offset = 0
        for p in params:
            n = p.numel()
            view = flat[offset:offset + n].view(p.shape)
            if post == 1.0:
                p.grad.detach().copy_(view)
            else:
                torch.mul(view, post, out=p.grad.detach())
            offset += n
        return True

    def _write_back(self, flat: torch.Tensor, params: list[torch.Tensor]) -> None:
        offset = 0
        for p in params:
            n = p.numel()
            value = flat[offset:offset + n].view(p.shape).to(p.device, p.dtype)
            if p.grad.is_sparse:  # sparse_as_dense: reduced densely, handed back sparse (as Horovod)
                p.grad = value.to_sparse(sparse_dim=p.grad.sparse_dim())
            else:
                p.grad.detach().copy_(value)
            offset += n

    def mirror(self) -> None:
        """On a joined rank: take part in one round of this optimizer's reductions with zeros."""
        if self.owners:
            raise HorovodInternalError("hvd.join(): a rank that has joined cannot serve a ZeRO stage-2 "
                                       "optimizer (reduce_to): the gradient shards it owns would never be "
                                       "stepped; give every rank the same number of batches")
        works = []
        for bucket in self.buckets:
            by_dtype: dict = {}
            for p in bucket:
                if p not in self.sparse:
                    by_dtype.setdefault(str(p.dtype), []).append(p)
            for key in sorted(by_dtype):
                numel = sum(p.numel() for p in by_dtype[key])
                zeros = torch.zeros(numel, dtype=by_dtype[key][0].dtype, device=self.device)
                works.append(self._reduce(zeros, -1)[0])
        for work in works:
            _wait(work)


def _dense(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_dense() if grad.is_sparse else grad.detach()


def _wait(work: Any) -> None:
    try:
        work.wait()
    except RuntimeError as e:
        raise HorovodInternalError(f"gradient allreduce failed: {e}") from e


def serve_joined(group: Any, size: int, device: str, optimizers: Callable[[int], Any]) -> None:
    """``hvd.join()``'s half on the fused path: answer step headers until every rank has joined."""
    while True:
        hdr = torch.tensor([0, 0, 1], dtype=torch.int64, device=device)
        try:
            dist.all_reduce(hdr, group=group)
        except RuntimeError as e:
            raise HorovodInternalError(f"hvd.join() failed: {e}") from e
        stepping, index_sum, joined = (int(x) for x in hdr.tolist())
        if joined == size:
            return
        if stepping:
            optimizers(index_sum // stepping - 1).mirror()
