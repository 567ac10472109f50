"""What a training run is at a step, and how it is saved, restored and shared between processes.

:class:`TrainerState` is mixed into ``src.training.engine.Trainer``. One description of the run's
state serves three uses:

* ``ckpt/restore.pt`` (:meth:`save_restore` / :meth:`_load_restore_state`): exact resume after a crash
  or ``kill -9``, bit-exact when the number of processes and the batch size are unchanged; under
  ``zero_stage`` 1/2 it holds the gathered, unsharded optimizer state (``src.training.zero``);
* Horovod elastic commits (:meth:`snapshot` / :meth:`load_snapshot`, ``src.training.elastic``): the
  same state held in host memory, restored when a worker fails;
* the elastic sync (:meth:`sync_from_rank0`): rank 0's state broadcast to every process after the set
  of workers changed (a new worker starts from it).

The data position is global: ``examples_in_epoch`` counts the examples of the epoch's permutation all
ranks together have consumed, so a continuation with another number of processes reads every
remaining example of the epoch once and nothing already read (``ResumableDistributedSampler``).
"""
from __future__ import annotations

import copy
import logging

import torch

import src.compat.hvd as hvd
from src.training.checkpoint import all_finite, fp32_state_dict
from src.training.plan import RunPlan
from src.training.run_state import RunState
from src.utils.misc import get_rng_states, set_random_seed, set_rng_states

logger = logging.getLogger(__name__)

class TrainerState:
    """Mixin for ``Trainer``: saving, restoring and sharing its weights, optimizer, precision, run state
    (``self.state``, src.training.run_state) and RNGs. The attributes below are the trainer's, set in
    ``Trainer.__init__`` / ``setup``; this class only reads them, apart from ``state`` and ``plan``."""

    cfg: object
    state: RunState
    model: torch.nn.Module
    optimizer: object  # hvd.DistributedOptimizer, possibly amp-processed
    precision: object  # src.training.precision
    plan: RunPlan
    restorer: object  # src.training.checkpoint.TrainingRestorer
    sharding: object  # src.training.zero: Unsharded, or the zero_stage 1/2 optimizer sharding
    running_loss: object  # src.utils.logger.RunningMeter
    rank: int
    world: int
    is_main: bool
    run_outcome: object
    _saved_restore: tuple[int, bool] | None = None  # (step, finished) of the restore file last written

    # ------------------------------------------------------------------------------- weights
    def weights_finite(self, state: dict | None = None) -> bool:
        """The fp32 weights (``state``, default :meth:`model_state_dict`) and those the model runs with
        (fp16 under amp O2, which overflow to inf long before the fp32 masters do) are all finite."""
        state = self.model_state_dict() if state is None else state
        running = dict(self.model.named_parameters())  # not state_dict(): under O2 that holds the masters
        return all_finite(state) and all_finite(running)

    def model_state_dict(self) -> dict:
        """fp32 CPU copy of the model's weights (the fp32 masters under amp O2). Collective under
        ``zero_stage`` 1/2 with amp O2: the masters are gathered from their owners (src.training.zero)."""
        masters = self.sharding.full_masters(self.precision.masters_by_name(self.optimizer))
        return fp32_state_dict(self.model, masters_by_name=masters)

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

    # ------------------------------------------------------------------------------- counters
    def counters(self) -> dict:
        """The run's position and bookkeeping (no tensors): what every rank must agree on."""
        return {**self.state.counters(), "running_loss": self.running_loss.val, "world_size": self.world,
                "train_batch_size": self.cfg.train_batch_size, "num_train_steps": self.plan.num_train_steps,
                "plan": self.plan.to_dict(), "amp": self.precision.state_dict()}

    def _apply_counters(self, c: dict) -> None:
        self.state.load_counters(c)
        self.running_loss.reset(c.get("running_loss"))
        self.precision.load_state_dict(c.get("amp"))

    # ------------------------------------------------------------------------------- restore file
    def save_restore(self) -> None:
        """Write ``ckpt/restore.pt``, unless it already holds this step in this state (finished or not).
        Collective: every rank must call it (RNG states are gathered). Weights that are no longer finite
        are not saved: the file keeps the last state worth resuming."""
        now = (self.state.global_step, self.state.finished)
        if self._saved_restore == now:
            return
        state = self._restore_state()
        if not self.weights_finite(state["model"]):
            logger.warning("step %d: the weights are not finite (nan/inf); %s keeps the last finite state",
                           self.state.global_step, self.restorer.path)
            return
        if self.is_main:
            self.restorer.save(state)
        self.state.restore_saved_at, self._saved_restore = self.state.global_step, now

    def _restore_state(self) -> dict:
        rngs = hvd.allgather_object(get_rng_states())
        return {**self.counters(), "model": self.model_state_dict(),
                "optimizer": self.sharding.full_state_dict(self.optimizer), "rng": rngs}

    def _load_restore_state(self, state: dict) -> None:
        self.sharding.load_full_state_dict(self.optimizer, state["optimizer"])  # this rank's shard
        self.precision.restore_weights(self.model, self.optimizer, state["model"])
        if "examples_in_epoch" not in state:  # written before the position was global: batches per rank
            state = {**state, "examples_in_epoch": state["batches_in_epoch"] * state["train_batch_size"]
                     * state["world_size"]}
        self._apply_counters({"finished": False, **state})
        self._rescale_stored_plan(state)
        if state["num_train_steps"] != self.plan.num_train_steps:
            logger.warning("resume: the run was planned for %d steps, now %d (config changed?)",
                           state["num_train_steps"], self.plan.num_train_steps)
        self._restore_rngs(state)
        s = self.state
        s.restore_saved_at, self._saved_restore = s.global_step, (s.global_step, s.finished)
        logger.info("resumed from %s at step %d (epoch %d, %d of its examples consumed)", self.restorer.path,
                    s.global_step, s.epoch, s.examples_in_epoch)

    def _rescale_stored_plan(self, state: dict) -> None:
        """A resume on another number of processes (same settings) keeps the stored plan's examples
        still to train on, rather than re-deriving a step count that would train on more or fewer."""
        stored = state.get("plan")
        if (stored is None or stored["world_size"] == self.world or self.run_outcome == "extend"
                or stored["train_batch_size"] != self.cfg.train_batch_size):
            return
        self.plan = RunPlan(**stored).rescaled(self.world, self.state.global_step)
        state["num_train_steps"] = self.plan.num_train_steps  # the new horizon is expected, not a change
        logger.warning("resume: %d processes instead of %d; the run ends at step %d (keeps the examples "
                       "left to train on)", self.world, stored["world_size"], self.plan.num_train_steps)

    def _restore_rngs(self, state: dict) -> None:
        """Same processes and batch size: every rank's RNGs come back (bit-exact continuation). Else the
        data position still continues exactly (global), and the RNGs are reseeded."""
        if state["world_size"] == self.world and state["train_batch_size"] == self.cfg.train_batch_size:
            set_rng_states(state["rng"][self.rank])
            return
        self.reseed()
        logger.warning("resume: saved with %d processes x batch %d, now %d x %d; the epoch continues after "
                       "its %d consumed examples (none repeated or dropped), RNGs are reseeded, so the "
                       "continuation is not bit-exact", state["world_size"], state["train_batch_size"],
                       self.world, self.cfg.train_batch_size, state["examples_in_epoch"])

    def reseed(self) -> None:
        """Per-rank RNG seeds for a continuation on a changed set of processes."""
        set_random_seed(self.cfg.seed + 1000 * self.rank + self.state.global_step)

    # ------------------------------------------------------------------------------- elastic
    def snapshot(self) -> dict:
        """This process's state in host memory (an elastic commit). Not collective."""
        return {**copy.deepcopy(self.counters()), "model": self._local_weights(),
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def load_snapshot(self, snap: dict) -> None:
        """Back to a :meth:`snapshot` (a worker failed after it). Not collective; ``snap`` is not
        aliased (a second failure before the next commit returns to the same state)."""
        self.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
        self.put_weights(snap["model"])
        self._apply_counters(copy.deepcopy(snap))
        self._saved_restore = None  # the steps after the commit are redone: their restore file too
        self.optimizer.zero_grad()
        self.sharding.drop_foreign_grads()  # zero_stage: what zero_grad of this rank's shard leaves

    def sync_from_rank0(self) -> dict:
        """Every rank takes rank 0's weights, optimizer state and counters. Collective. Returns the
        counters (with rank 0's ``plan``)."""
        counters = hvd.broadcast_object(self.counters() if self.is_main else None, root_rank=0,
                                        name="elastic.counters")
        hvd.broadcast_optimizer_state(self.optimizer, root_rank=0)  # every rank loads rank 0's
        weights = self.model_state_dict()
        hvd.broadcast_parameters(weights, root_rank=0)
        if not self.is_main:
            self.put_weights(weights)
            self._apply_counters(counters)
        self._saved_restore = None
        self.optimizer.zero_grad()
        return counters
