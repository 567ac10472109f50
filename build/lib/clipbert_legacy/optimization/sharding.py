"""ZeRO-style sharding of an optimizer over ranks: who owns which parameter, and the optimizer state
dict between its full layout (what an unsharded run saves) and one rank's shard.

Pure bookkeeping, no communication (``clipbert_legacy.training.zero`` does that), so the restore file of a
sharded run is the very dict an unsharded run writes and loads on any number of processes.

The *full layout* numbers the optimizer's parameters 0..N-1 over its param groups in order, as
``torch.optim.Optimizer.state_dict`` does. A rank's optimizer keeps every group (names, LR multipliers,
weight decay: per-group LR schedules still apply) but only the parameters it owns, in the same order,
so its local index ``i`` is the ``i``-th of its owned global indices.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass


def partition(numels: list[int], world: int) -> list[int]:
    """Owner rank of each parameter, balanced by element count: largest first (ties: the earlier one)
    to the rank holding the fewest elements so far (ties: the lower rank). Deterministic for a given
    model and world size, so every rank computes the same answer without talking."""
    if world < 1:
        raise ValueError(f"partition: world size must be >= 1, got {world}")
    load, owners = [0] * world, [0] * len(numels)
    for i in sorted(range(len(numels)), key=lambda j: (-numels[j], j)):
        r = min(range(world), key=lambda k: (load[k], k))
        owners[i] = r
        load[r] += numels[i]
    return owners


@dataclass(frozen=True)
class ShardLayout:
    """The full layout (group sizes, parameter names, owners) as seen from ``rank``."""

    group_sizes: tuple[int, ...]
    names: tuple[str, ...]
    owners: tuple[int, ...]
    rank: int

    @classmethod
    def of(cls, param_groups: list[dict], world: int, rank: int) -> ShardLayout:
        """The layout of an optimizer's (still unsharded) ``param_groups``."""
        params = [p for g in param_groups for p in g["params"]]
        names = [n for g in param_groups for n in g.get("param_names", [])]
        if len(names) != len(params):
            names = [f"param.{i}" for i in range(len(params))]
        return cls(tuple(len(g["params"]) for g in param_groups), tuple(names),
                   tuple(partition([p.numel() for p in params], world)), rank)

    def group_ranges(self) -> list[range]:
        """Global indices of each group."""
        out, start = [], 0
        for n in self.group_sizes:
            out.append(range(start, start + n))
            start += n
        return out

    def owned(self, rank: int | None = None) -> list[int]:
        """Global indices owned by ``rank`` (default: this layout's rank), ascending."""
        r = self.rank if rank is None else rank
        return [i for i, o in enumerate(self.owners) if o == r]


def shard_param_groups(param_groups: list[dict], layout: ShardLayout) -> None:
    """Keep only this rank's parameters (and their ``param_names``) in each group, in place."""
    for g, rng in zip(param_groups, layout.group_ranges()):
        keep = [j for j, i in enumerate(rng) if layout.owners[i] == layout.rank]
        g["params"] = [g["params"][j] for j in keep]
        if "param_names" in g:
            g["param_names"] = [g["param_names"][j] for j in keep]


def shard_state_dict(full: dict, layout: ShardLayout) -> dict:
    """This rank's optimizer state dict cut from a full-layout one (a restore file's)."""
    sizes = tuple(len(g["params"]) for g in full["param_groups"])
    if sizes != layout.group_sizes:
        raise ValueError(f"optimizer state has param groups of {list(sizes)} parameters, the model's "
                         f"optimizer {list(layout.group_sizes)}; the restore file is from another model")
    local_of = {i: j for j, i in enumerate(layout.owned())}
    groups = []
    for g, rng in zip(full["param_groups"], layout.group_ranges()):
        owned = [i for i in rng if i in local_of]
        ng = dict(g)
        ng["params"] = [local_of[i] for i in owned]
        if "param_names" in g:
            ng["param_names"] = [g["param_names"][i - rng.start] for i in owned]
        groups.append(ng)
    state = {local_of[int(i)]: s for i, s in full["state"].items() if int(i) in local_of}
    return {"state": dict(sorted(state.items())), "param_groups": groups}


def merge_state_dicts(shards: list[dict], layout: ShardLayout) -> dict:
    """The full-layout optimizer state dict from every rank's shard (``shards[r]``: rank ``r``'s)."""
    state = {}
    for r, sd in enumerate(shards):
        owned = layout.owned(r)
        for j, s in sd["state"].items():
            state[owned[int(j)]] = s
    groups = []
    for g, rng in zip(shards[0]["param_groups"], layout.group_ranges()):
        ng = copy.copy(g)
        ng["params"] = list(rng)
        if "param_names" in g:
            ng["param_names"] = [layout.names[i] for i in rng]
        groups.append(ng)
    return {"state": dict(sorted(state.items())), "param_groups": groups}
