"""``--zero_stage 1|2``: optimizer state sharded over ranks (ZeRO, FairScale's ShardedDDP, Lightning's
``deepspeed_stage_2``), with the step's numbers unchanged. Stage 1 runs on both backends; stage 2 needs
the torch.distributed one (:func:`check_backend`).

Each trainable parameter has one owner rank (``clipbert_legacy.optimization.sharding.partition``, balanced by
size). A rank's optimizer holds only its own parameters, so the Adam moments and, under amp O2, the
fp32 masters (``amp.initialize`` makes masters for the optimizer's parameters) exist on the owner only:
about 1/N of the optimizer state per rank. The engine's step is the same for every stage; it calls:

* ``clip_grad_norm``: the global norm ``clip_grad_norm_`` takes, built from every owner's per-parameter
  norms put at their places in one vector (a sum with zeros: exact), so it is bit-equal to the
  unsharded norm and every rank clips with the same coefficient;
* ``after_step``: each owner broadcasts its updated parameters (the fp16 model copy under O2), so all
  ranks run the same weights; gradients of parameters a rank does not own are dropped.

Stage 1 reduces gradients as today (the step's single allreduce; every rank holds them all until the
step). Stage 2 sums each gradient onto its owner only (``hvd.DistributedOptimizer(reduce_to=...)``,
``dist.reduce``) and the other ranks drop it at ``synchronize()``. With 2 ranks a sum of two values is
the same whatever the order, so both stages give bit-equal weights to the unsharded run; with more
ranks gloo/NCCL may add in another order for a reduce than for an allreduce (last-bit differences).

amp O2's overflow flag is already all-reduced (``clipbert_legacy.compat.amp._overflow``); every parameter has
one owner, so every rank sees the same decision as an unsharded run and the loss scales stay equal.

The restore file keeps the unsharded layout: the optimizer state and the O2 masters are gathered on
save (``full_state_dict``, ``full_masters``) and cut to this rank's shard on load, so a restore file
from a sharded run is the one an unsharded run writes, and resumes on any number of processes. The
gather sends the tensors' bytes as one flat tensor
(``clipbert_legacy.utils.distributed.allgather_with_tensors``),
not through Horovod's ``allgather_object``, whose byte-by-byte copy of the pickle made each restore file
of a horovodrun job cost seconds (benchmarks/bench_restore_save.py).
"""
from __future__ import annotations

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.compat.hvd import Compression
from clipbert_legacy.config.schema import ConfigError
from clipbert_legacy.optimization.param_groups import build_optimizer, embedding_tables
from clipbert_legacy.optimization.sharding import (
    ShardLayout,
    merge_state_dicts,
    shard_param_groups,
    shard_state_dict,
)
from clipbert_legacy.training.checkpoint_files import fp32_state_dict
from clipbert_legacy.training.elastic import horovod_elastic
from clipbert_legacy.utils.distributed import allgather_with_tensors


class Unsharded:
    """``zero_stage 0``: every rank holds the whole optimizer state (the default, ClipBERT's layout)."""

    stage = 0

    def broadcast_state(self, optimizer) -> None:
        """Every rank takes rank 0's optimizer state (set-up, before training)."""
        # no zero-gradient step: it would move restored weights (docs/horovod.md)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0, zero_grad_step=False)

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """torch's ``clip_grad_norm_`` on the master params; returns the norm before clipping."""
        return float(torch.nn.utils.clip_grad_norm_(params, max_norm))

    def after_step(self) -> None:
        """Nothing: every rank stepped every parameter."""

    def drop_foreign_grads(self) -> None:
        """Nothing: ``optimizer.zero_grad()`` reaches every parameter."""

    def full_state_dict(self, optimizer) -> dict:
        """The optimizer state dict in the unsharded layout (what the restore file holds)."""
        return optimizer.state_dict()

    def load_full_state_dict(self, optimizer, state: dict) -> None:
        """Load an unsharded-layout optimizer state dict (a restore file's)."""
        optimizer.load_state_dict(state)

    def full_masters(self, masters: dict | None) -> dict | None:
        """amp O2's fp32 masters of every parameter by name (None without masters)."""
        return masters

    def gathered_weights(self, model: torch.nn.Module, masters: dict | None,
                         everywhere: bool = True) -> dict | None:
        """The model's fp32 CPU weights (amp O2: its fp32 masters, :meth:`full_masters`) on every rank, or
        with ``everywhere=False`` on rank 0 only (None elsewhere). Collective exactly when the masters
        are sharded; callers need not know which (the ``Evaluation`` hook, the restore file)."""
        full = self.full_masters(masters)
        if not everywhere and hvd.rank() != 0:
            return None
        return fp32_state_dict(model, masters_by_name=full)


class ZeroSharding(Unsharded):
    """Stage 1 or 2 over ``layout`` (see the module docstring); ``params``: the optimizer's parameters
    in the full layout's order (the model's parameter objects, also under O2)."""

    def __init__(self, stage: int, layout: ShardLayout, params: list[torch.Tensor], world: int):
        self.stage, self.layout, self.params, self.world = stage, layout, params, world
        self.owned = layout.owned()
        self.not_owned = [p for p, o in zip(params, layout.owners) if o != layout.rank]

    def broadcast_state(self, optimizer) -> None:
        """Nothing to broadcast: each shard is empty at set-up and filled from the restore file, which
        every rank reads."""

    def clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """``clip_grad_norm_`` over all ranks' ``params`` (this rank's masters, in the optimizer's order)."""
        if len(params) != len(self.owned):
            raise RuntimeError(f"zero: {len(params)} master params for {len(self.owned)} owned parameters")
        device = params[0].device if params else torch.device("cpu")
        norms = torch.zeros(2, len(self.params), dtype=torch.float32, device=device)  # norm, has-grad
        with_grad = [(i, p.grad) for i, p in zip(self.owned, params) if p.grad is not None]
        if with_grad:
            idx = torch.tensor([i for i, _ in with_grad], device=device)
            norms[0, idx] = torch.stack(torch._foreach_norm([g for _, g in with_grad], 2.0)).float()
            norms[1, idx] = 1.0
        if self.world > 1:
            norms = hvd.allreduce(norms, op=hvd.Sum, name="zero.grad_norms")
        total = torch.linalg.vector_norm(norms[0][norms[1] > 0], 2.0)
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
        return float(total)

    @torch.no_grad()
    def after_step(self) -> None:
        """Owners broadcast their parameters, one flat tensor per owner and dtype; foreign grads go."""
        if self.world > 1:
            for owner in range(self.world):
                mine = [self.params[i] for i in self.layout.owned(owner)]
                for dtype in sorted({p.dtype for p in mine}, key=str):
                    _broadcast_flat([p for p in mine if p.dtype == dtype], owner, self.layout.rank)
        self.drop_foreign_grads()

    def drop_foreign_grads(self) -> None:
        """Gradients of parameters this rank does not own, which ``optimizer.zero_grad()`` (the shard's
        parameters only) would leave to add into the next step (stage 1 holds them after the allreduce)."""
        for p in self.not_owned:
            p.grad = None

    def full_state_dict(self, optimizer) -> dict:
        """The unsharded optimizer state dict (collective: every rank's shard is gathered)."""
        sd = optimizer.state_dict()
        local = {"state": sd["state"], "param_groups": sd["param_groups"]}
        return merge_state_dicts(allgather_with_tensors(local, "zero.optimizer_state"), self.layout)

    def load_full_state_dict(self, optimizer, state: dict) -> None:
        optimizer.load_state_dict(shard_state_dict(state, self.layout))

    def full_masters(self, masters: dict | None) -> dict | None:
        """Every rank's fp32 masters by name (collective under amp O2; None without masters)."""
        if masters is None:
            return None
        out = {}
        mine = {n: m.detach().float() for n, m in masters.items()}
        for part in allgather_with_tensors(mine, "zero.masters"):
            out.update(part)
        return out


def _broadcast_flat(params: list[torch.Tensor], owner: int, rank: int) -> None:
    flat = torch.cat([p.detach().reshape(-1) for p in params])
    hvd.broadcast_(flat, owner, name=f"zero.params.{owner}.{flat.dtype}")
    if rank != owner:
        offset = 0
        for p in params:
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def check_backend(stage: int, world: int) -> None:
    """Under real Horovod: stage 1 works (its allreduce, broadcast and allgather are all it needs);
    stage 2 does not (Horovod's optimizer hooks allreduce every gradient, there is no reduce onto one
    rank), nor does any stage under Horovod elastic (the owners would change with the workers)."""
    if not stage or hvd.backend_name() == "torch":
        return
    if horovod_elastic():
        raise ConfigError(f"zero_stage={stage} does not work under Horovod elastic (the parameters' "
                          f"owners would change with the workers); use --zero_stage 0, or torchrun "
                          f"--max-restarts with --dist_backend torch (restarts reshard from the restore "
                          f"file)")
    if stage == 2 and world > 1:
        raise ConfigError("zero_stage=2 needs the torch.distributed backend: launch with torchrun "
                          "--nproc_per_node N and --dist_backend torch (real Horovod's DistributedOptimizer "
                          "allreduces every gradient in its own hooks, it cannot sum one onto its owner), "
                          "or use --zero_stage 1 under horovodrun")


def build_distributed_optimizer(model: torch.nn.Module, cfg, accumulation_steps: int):
    """``hvd.DistributedOptimizer`` over the named param groups, sharded by ``cfg.zero_stage``.

    Returns ``(optimizer, sharding)``. The optimizer's gradient hooks cover every trainable parameter
    (stage 1 allreduces them all); for stages 1 and 2 its param groups are then cut to this rank's
    parameters, before ``amp.initialize`` makes masters for them.
    """
    stage, world, rank = int(cfg.zero_stage), hvd.size(), hvd.rank()
    check_backend(stage, world)
    base = build_optimizer(model, cfg)
    layout = ShardLayout.of(base.param_groups, world, rank)
    params = [p for g in base.param_groups for p in g["params"]]
    extra = {"reduce_to": dict(zip(params, layout.owners))} if stage == 2 and world > 1 else {}
    optimizer = hvd.DistributedOptimizer(
        base, compression=Compression.fp16 if cfg.grad_compression == "fp16" else Compression.none,
        named_parameters=model.named_parameters(), backward_passes_per_step=accumulation_steps,
        row_sparse=embedding_tables(model) if cfg.row_sparse_allreduce else (), **extra)
    if not stage:
        return optimizer, Unsharded()
    shard_param_groups(optimizer.param_groups, layout)
    return optimizer, ZeroSharding(stage, layout, params, world)


def optimizer_state_bytes(optimizer, model: torch.nn.Module) -> int:
    """Bytes this rank holds for the optimizer: its per-parameter state (Adam's moments) and the
    parameters it updates that are not the model's own (amp O2's fp32 masters)."""
    n = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
            if torch.is_tensor(t))
    model_ids = {id(p) for p in model.parameters()}
    return n + sum(p.numel() * p.element_size() for g in optimizer.param_groups for p in g["params"]
                   if id(p) not in model_ids)
