"""torch backend: ``hvd.DistributedOptimizer`` (Horovod 0.28.1's arguments and behaviour).

Dense gradients go through the fused buckets (``hvd.torch_backend.buckets``). Sparse gradients
(``nn.Embedding(sparse=True)``) are reduced as Horovod does: their indices and values allgathered
(``sparse_allreduce_async``), averaged for op=Average, and handed back as a sparse gradient; with
``sparse_as_dense=True`` they are densified, reduced in the buckets and turned back into sparse tensors
before the update. ``groups`` / ``num_groups`` only choose how Horovod batches its allreduces; the
buckets already fuse them, so they change nothing here (the results are the same).
Not Horovod's: ``row_sparse`` and ``reduce_to`` (see ``clipbert_legacy.compat.hvd.functions``).
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any

import torch

from clipbert_legacy.compat.hvd.compression import Compression
from clipbert_legacy.compat.hvd.process_sets import global_process_set
from clipbert_legacy.compat.hvd.row_sparse import average_rows
from clipbert_legacy.compat.hvd.torch_backend import ops as ops
from clipbert_legacy.compat.hvd.torch_backend.autograd import allreduce
from clipbert_legacy.compat.hvd.torch_backend.buckets import Buckets
from clipbert_legacy.compat.hvd.torch_backend.objects import allgather_object
from clipbert_legacy.compat.hvd.torch_backend.sets import device, lookup
from clipbert_legacy.compat.hvd.torch_backend.state import STATE

_OPTIMIZERS: list[weakref.ref] = STATE.optimizers  # global-set optimizers in creation order (every rank's)


def registered(index: int) -> Any:
    """The buckets of the index-th global-set optimizer of this process (``hvd.join`` mirrors its steps)."""
    opt = _OPTIMIZERS[index]() if index < len(_OPTIMIZERS) else None
    if opt is None:
        raise RuntimeError(f"hvd.join(): another rank steps DistributedOptimizer #{index}, which this rank "
                           "does not have; create the same optimizers on every rank")
    return opt._buckets


class _DistributedOptimizer(torch.optim.Optimizer):
    """Mixed into a dynamic subclass of the user's optimizer class (as Horovod does)."""

    def __init__(self, params, named_parameters, compression, backward_passes_per_step, op,
                 gradient_predivide_factor, sparse_as_dense, process_set, row_sparse, reduce_to):
        super(self.__class__, self).__init__(params)
        self._parameter_names = _names(self.param_groups, named_parameters)
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op, self.gradient_predivide_factor = op, gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._should_synchronize, self._synchronized = True, False
        self._sparse_handles: dict = {}
        self._owner = dict(reduce_to or {})  # ZeRO stage 2 (ours): param -> the rank its gradient goes to
        if self._owner and op != "average":
            raise ValueError("DistributedOptimizer: reduce_to needs op=average")
        all_params = [p for g in self.param_groups for p in g["params"]]
        sparse_ids = {id(q) for q in row_sparse}
        self._row_sparse = [p for p in all_params if p.requires_grad and id(p) in sparse_ids]
        if self._row_sparse and op != "average":
            raise ValueError("DistributedOptimizer: row_sparse parameters need op=average")
        self._tset = lookup(process_set)
        self._buckets = None
        if self._tset.member and self._tset.size > 1:
            dense = [p for p in all_params if p.requires_grad and id(p) not in sparse_ids]
            _check_same_layout(self._parameter_names, dense, process_set)
            header = None
            if process_set.process_set_id == 0:
                header = len(_OPTIMIZERS)
                _OPTIMIZERS.append(weakref.ref(self))
            self._buckets = Buckets(dense, self._tset.fused_group, self._tset.size, self._tset.place.index,
                                    device(), op, gradient_predivide_factor, compression, self._owner,
                                    header)
            self._buckets.reset(backward_passes_per_step)
            self._hooks = [p.register_post_accumulate_grad_hook(self._hook) for p in dense]

    def _hook(self, p):
        if p.grad is not None and p.grad.is_sparse and not self.sparse_as_dense:
            if self._buckets.delay[p] == 1:  # its last pass this round: reduce indices and values
                self._buckets.sparse.add(p)
                self._sparse_handles[p] = ops.sparse_allreduce_async(
                    p.grad, name=f"{self._parameter_names[p]}.sparse", op=self.op,
                    process_set=self.process_set)
        self._buckets.count(p, lambda: _too_many_passes(self, p))

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        if self._buckets is not None:
            self._buckets.reset(passes)

    def load_state_dict(self, *args, **kwargs):
        self._synchronized, self._should_synchronize = False, True
        if self._buckets is not None:
            self._buckets.reset(self.backward_passes_per_step)
        return super(self.__class__, self).load_state_dict(*args, **kwargs)

    def _average_packed(self, packed, ctx):
        """A row-sparse table's rows, averaged as Horovod averages a compressed tensor (in its dtype)."""
        reduced = allreduce(packed, op="average", process_set=self.process_set)
        return self._compression.decompress(reduced, ctx)

    def synchronize(self):
        """Finish every gradient reduction (launching those not yet started), then reset the counts."""
        if self._buckets is not None:
            b = self._buckets
            for p in b.bucket_of:  # unused parameters / fewer backward passes: zeros
                if p.grad is None and p not in b.sparse:
                    p.grad = torch.zeros_like(p)
            b.launch_rest()
            b.finish()
            for p, handle in self._sparse_handles.items():
                p.grad = handle()
            self._sparse_handles.clear()
            self._reduce_row_sparse()
            b.reset(self.backward_passes_per_step)
        self._synchronized = True

    def _gather_rows(self, rows):
        return ops.synchronize(ops.allgather_async(rows, process_set=self.process_set, join_ok=True))

    def _reduce_row_sparse(self):
        for p in self._row_sparse:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            average_rows(p.grad, self._gather_rows, self._average_packed, self._compression)
            if self._owner.get(p, self._tset.rank) != self._tset.rank:
                p.grad = None

    class _SkipSync:
        def __init__(self, opt):
            self.opt = opt

        def __enter__(self):
            self.opt._should_synchronize = False

        def __exit__(self, *exc):
            self.opt._should_synchronize = True

    def skip_synchronize(self):
        """Inside this block `step()` does not allreduce (call `synchronize()` yourself before)."""
        return _DistributedOptimizer._SkipSync(self)

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                # stacklevel 3: the caller's step() line (torch wraps Optimizer.step in a profiling hook)
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context "
                              "after optimizer.synchronize(). This can cause training slowdown. You may "
                              "want to consider using optimizer.skip_synchronize() context if you use "
                              "optimizer.synchronize() in your code.", stacklevel=3)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def _in_flight(self):
        """Gradients are being reduced (amp's O2 ``zero_grad`` keeps this guard too)."""
        return self._buckets is not None and self._buckets.in_flight(self.backward_passes_per_step)

    def zero_grad(self, set_to_none=True):
        if self._in_flight():
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(); this would drop gradients "
                                 "already being reduced. Call step()/synchronize() first.")
        return super(self.__class__, self).zero_grad(set_to_none=set_to_none)


def _too_many_passes(opt, p):
    return (f"Gradients were computed more than backward_passes_per_step={opt.backward_passes_per_step} "
            f"times before call to step() (parameter {opt._parameter_names.get(p, '?')}). Increase "
            "backward_passes_per_step to accumulate gradients locally, or call "
            "optimizer.synchronize()/step() after every backward_passes_per_step backward passes.")


def _names(param_groups, named_parameters):
    """Horovod's parameter names: the given ones (unique, covering every parameter) or generated ones."""
    if named_parameters is None:
        return {v: f"allreduce.noname.{i}.{j}"
                for i, g in enumerate(param_groups) for j, v in enumerate(g["params"])}
    named_parameters = list(named_parameters)
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually "
                         "produced by model.named_parameters().")
    names = [n for n, _ in named_parameters]
    dups = sorted({n for n in names if names.count(n) > 1})
    if dups:
        raise ValueError("Parameter names in named_parameters must be unique. Found duplicates: "
                         f"{', '.join(dups)}")
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = [p for g in param_groups for p in g["params"] if id(p) not in named_ids]
    if unnamed:
        raise ValueError(f"named_parameters was specified, but {len(unnamed)} optimizer parameter(s) are "
                         "not in it; pass model.named_parameters() of the model whose parameters the "
                         "optimizer holds")
    return {v: k for k, v in sorted(named_parameters, key=lambda kv: kv[0])}


def _check_same_layout(names, params, process_set):
    """Once, at construction: every rank's bucketed parameters agree (else the fused reductions would
    mix mismatched buffers); one negotiated allgather of a short description."""
    mine = [(names.get(p, "?"), list(p.shape), str(p.dtype)) for p in params]
    everyone = allgather_object(mine, name=f"DistributedOptimizer.layout.{len(_OPTIMIZERS)}",
                                process_set=process_set)
    for r, theirs in enumerate(everyone):
        if theirs != mine:
            diff = next(((a, b) for a, b in zip(mine, theirs) if a != b), (len(mine), len(theirs)))
            raise ValueError(f"DistributedOptimizer: the ranks' parameters differ (this rank vs set rank "
                             f"{r}: {diff[0]} vs {diff[1]}); every rank must wrap the same model's "
                             "parameters")


def DistributedOptimizer(optimizer, named_parameters=None, compression=None, backward_passes_per_step=1,
                         op="average", gradient_predivide_factor=1.0, num_groups=0, groups=None,  # noqa: ARG001 (Horovod's signature: the buckets fuse already)
                         sparse_as_dense=False, process_set=global_process_set, row_sparse=(),
                         reduce_to=None):
    if op not in ("average", "sum"):
        raise ValueError(f"DistributedOptimizer op {op!r}: the torch backend reduces gradients with Average "
                         "or Sum; Adasum needs real Horovod built with MPI")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression or Compression.none,
               backward_passes_per_step, op, gradient_predivide_factor, sparse_as_dense, process_set,
               row_sparse, reduce_to)
