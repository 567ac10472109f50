"""What a training run is at a step, and how it is saved, restored and shared between processes.

:class:`Checkpointer` is one of the built components (``clipbert_legacy.training.build``): it holds the model,
optimizer, precision and sharding it saves, and the trainer gives it the run's counters
(``Trainer.state_dict``: the run state, every hook's own state, the plan, the loss scale). One
description of the run serves three uses:

* ``ckpt/restore.pt`` (:meth:`Checkpointer.save_restore` / :meth:`Checkpointer.resume`): exact resume
  after a crash or ``kill -9``, bit-exact when the number of processes and the batch size are
  unchanged; under ``zero_stage`` 1/2 it holds the gathered, unsharded optimizer state
  (``clipbert_legacy.training.zero``);
* Horovod elastic commits (:meth:`Checkpointer.snapshot` / :meth:`Checkpointer.load_snapshot`,
  ``clipbert_legacy.training.elastic``): the same state held in host memory, restored when a worker fails;
* the elastic sync (:meth:`Checkpointer.sync_from_rank0`): rank 0's state broadcast to every process
  after the set of workers changed (a new worker starts from it).

The data position is global: ``examples_in_epoch`` counts the examples of the epoch's permutation all
ranks together have consumed, so a continuation with another number of processes reads every
remaining example of the epoch once and nothing already read (``ResumableDistributedSampler``).
Restore files of earlier versions load: :func:`migrate_counters` turns their keys into today's.
"""
from __future__ import annotations

import copy
import logging

import torch

import clipbert_legacy.compat.hvd as hvd
from clipbert_legacy.training.checkpoint_files import all_finite, fp32_state_dict
from clipbert_legacy.utils.misc import get_rng_states, set_random_seed, set_rng_states

logger = logging.getLogger(__name__)


def migrate_counters(state: dict) -> dict:
    """The counters of a restore file written by an earlier version, under today's keys: the data
    position in examples (it was batches per rank), early stopping's patience as that hook's own state
    (it was part of ``best``)."""
    state = dict(state)
    if "examples_in_epoch" not in state:  # written before the position was global: batches per rank
        state["examples_in_epoch"] = (state["batches_in_epoch"] * state["train_batch_size"]
                                      * state["world_size"])
    best = state.get("best") or {}
    if "hooks" not in state and "bad_validations" in best:  # patience lived in RunState.best
        ref = best.get("patience_ref", best.get("value"))  # older than min_delta: patience ran from the best
        state["hooks"] = {"EarlyStopping": {"bad_validations": best["bad_validations"], "patience_ref": ref}}
    state.setdefault("finished", False)
    return state


class Checkpointer:
    """Saving, restoring and sharing the weights, optimizer, precision and RNGs of one run, with the
    counters the trainer passes in. ``restore_every``: the steps whose restore file is due
    (``save_steps``, and ``elastic_commit_steps`` under torchrun restarts)."""

    def __init__(self, model, optimizer, precision, sharding, process, restorer, cfg, restore_every):
        self.model, self.optimizer, self.precision, self.sharding = model, optimizer, precision, sharding
        self.process, self.restorer, self.cfg = process, restorer, cfg
        self.restore_every = tuple(n for n in restore_every if n)
        self._saved_restore: tuple[int, bool] | None = None  # (step, finished) of the file last written

    @property
    def path(self) -> str:
        return self.restorer.path

    def due(self, step: int) -> bool:
        """Whether ``step``'s restore file is due by the cadence (the engine adds the step that ends a
        run and a stop signal's step)."""
        return any(step % n == 0 for n in self.restore_every)

    # ------------------------------------------------------------------------------- weights
    def weights_finite(self, state: dict | None = None) -> bool:
        """The fp32 weights (``state``, default :meth:`model_state_dict`) and those the model runs with
        (fp16 under amp O2, which overflow to inf long before the fp32 masters do) are all finite."""
        state = self.model_state_dict() if state is None else state
        running = dict(self.model.named_parameters())  # not state_dict(): under O2 that holds the masters
        return all_finite(state) and all_finite(running)

    def model_state_dict(self) -> dict:
        """fp32 CPU copy of the model's weights (the fp32 masters under amp O2) on every rank; collective
        when the sharding holds the masters in shards (``clipbert_legacy.training.zero``)."""
        return self.sharding.gathered_weights(self.model, self.precision.masters_by_name(self.optimizer))

    def gathered_weights(self) -> dict | None:
        """:meth:`model_state_dict` on rank 0, None elsewhere (what a checkpoint file needs); every rank
        must call it (it may be collective)."""
        return self.sharding.gathered_weights(self.model, self.precision.masters_by_name(self.optimizer),
                                              everywhere=False)

    def _local_weights(self) -> dict:
        """:meth:`model_state_dict` from this rank alone (not collective): under ``zero_stage`` with amp
        O2 the parameters it does not own are their fp16 values, which is all :meth:`put_weights` of
        this same process needs."""
        return fp32_state_dict(self.model, masters_by_name=self.precision.masters_by_name(self.optimizer))

    def put_weights(self, weights: dict) -> None:
        """Load fp32 ``weights`` (a :meth:`model_state_dict`) into the running model, its buffers and,
        under amp O2, the fp32 masters."""
        with torch.no_grad():
            for name, t in list(self.model.named_parameters()) + list(self.model.named_buffers()):
                if name in weights:
                    t.copy_(weights[name])
        self.precision.restore_weights(self.model, self.optimizer, weights)

    # ------------------------------------------------------------------------------- restore file
    def save_restore(self, counters: dict) -> bool:
        """Write ``ckpt/restore.pt`` with ``counters`` (``Trainer.state_dict``), unless it already holds
        this step in this state (finished or not). Collective: every rank must call it (RNG states are
        gathered). Weights that are no longer finite are not saved: the file keeps the last state worth
        resuming. Returns whether the file now holds this step."""
        now = (counters["global_step"], counters["finished"])
        if self._saved_restore == now:
            return True
        state = self._restore_state(counters)
        if not self.weights_finite(state["model"]):
            logger.warning("step %d: the weights are not finite (nan/inf); %s keeps the last finite state",
                           now[0], self.restorer.path)
            return False
        if self.process.is_main:
            self.restorer.save(state)
        self._saved_restore = now
        return True

    def _restore_state(self, counters: dict) -> dict:
        rngs = hvd.allgather_object(get_rng_states())
        return {**counters, "model": self.model_state_dict(),
                "optimizer": self.sharding.full_state_dict(self.optimizer), "rng": rngs}

    def resume(self, state: dict) -> None:
        """A restore file's optimizer state (this rank's shard), fp32 masters and RNGs (the model's weights
        were loaded before the broadcast; the counters are the trainer's: ``Trainer.load_state_dict``)."""
        self.sharding.load_full_state_dict(self.optimizer, state["optimizer"])
        self.precision.restore_weights(self.model, self.optimizer, state["model"])
        self._restore_rngs(state)
        self._saved_restore = (state["global_step"], state["finished"])

    def _restore_rngs(self, state: dict) -> None:
        """Same processes and batch size: every rank's RNGs come back (bit-exact continuation). Else the
        data position still continues exactly (global), and the RNGs are reseeded."""
        world, batch = self.process.world, self.cfg.train_batch_size
        if state["world_size"] == world and state["train_batch_size"] == batch:
            set_rng_states(state["rng"][self.process.rank])
            return
        self.reseed(state["global_step"])
        logger.warning("resume: saved with %d processes x batch %d, now %d x %d; the epoch continues after "
                       "its %d consumed examples (none repeated or dropped), RNGs are reseeded, so the "
                       "continuation is not bit-exact", state["world_size"], state["train_batch_size"],
                       world, batch, state["examples_in_epoch"])

    def reseed(self, step: int) -> None:
        """Per-rank RNG seeds for a continuation on a changed set of processes."""
        set_random_seed(self.cfg.seed + 1000 * self.process.rank + step)

    # ------------------------------------------------------------------------------- elastic
    def snapshot(self, counters: dict) -> dict:
        """This process's state in host memory (an elastic commit). Not collective."""
        return {**copy.deepcopy(counters), "model": self._local_weights(),
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_snapshot(self, snap: dict) -> dict:
        """Back to a :meth:`snapshot` (a worker failed after it); returns its counters for the trainer.
        Not collective; ``snap`` is not aliased (a second failure before the next commit returns to the
        same state)."""
        self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
        self.put_weights(snap["model"])
        self._saved_restore = None  # the steps after the commit are redone: their restore file too
        self.optimizer.zero_grad()
        self.sharding.drop_foreign_grads()  # zero_stage: what zero_grad of this rank's shard leaves
        return copy.deepcopy({k: v for k, v in snap.items() if k not in ("model", "optimizer")})

    def sync_from_rank0(self, counters: dict | None) -> dict:
        """Every rank takes rank 0's weights, optimizer state and ``counters`` (given on rank 0).
        Collective. Returns the counters (with rank 0's ``plan``)."""
        counters = hvd.broadcast_object(counters if self.process.is_main else None, root_rank=0,
                                        name="elastic.counters")
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0, zero_grad_step=False)  # rank 0's, no step
        weights = self.model_state_dict()
        hvd.broadcast_parameters(weights, root_rank=0)
        if not self.process.is_main:
            self.put_weights(weights)
        self._saved_restore = None
        self.optimizer.zero_grad()
        return counters
