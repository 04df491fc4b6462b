"""How many ways each category of a device's bytes is split: one rule, read by memory and time.

Tensor parallelism splits the attention, feed-forward and shared-expert
weights (``TP_PARTS``); norms, router and model-level tensors are replicated
over it; expert parallelism splits the routed experts ``ep * etp`` ways.
Over the data-parallel ranks, ZeRO (Rajbhandari et al., arXiv:1910.02054,
section 5: stage 1 partitions the optimizer states, 2 adds the gradients,
3 the parameters) shards over ``dp * cp`` (context-parallel ranks hold the
same weights); FSDP2 (PyTorch ``torch/distributed/fsdp/_fully_shard``)
shards all of them over ``fsdp * cp`` and replicates over ``dp`` (HSDP).
``shard_mesh`` says whether the context-parallel ranks are in the shard
group: ``dp_cp`` (the default, above), ``dp`` (ZeRO over ``dp``, FSDP over
``fsdp``: the cp ranks replicate), or ``fsdp_cp``: FSDP over ``fsdp * cp``
whenever that is more than one rank, ``fsdp = 1`` included (torchtitan's
``dp_shard_cp`` mesh: ``torchtitan/distributed/parallel_dims.py`` applies
FSDP when ``dp_shard > 1`` or ``cp > 1``). A sharded gradient is
reduce-scattered over the shard group, then all-reduced over the ranks
holding the same shard (``shard_replicas``): every replica takes part.
The master copy is sharded with the optimizer states. Cf. Megatron-LM
``megatron/training/theoretical_memory_usage.py``: 18 bytes a parameter, or
``6 + 12 / dp`` under the distributed optimizer.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Tuple

import attrs
import numpy as np

from ndcost.values import GRADIENT_SYNC, SHARD_MESHES

__all__ = ["TP_PARTS", "REPLICATED_PARTS", "ROUTED_PARTS", "MATMUL_PARTS", "SHARDED_FROM_ZERO", "Sharding",
           "sharding"]

# Parts split by tensor parallelism, replicated over it, and split by ep * etp.
TP_PARTS = ("attention", "ffn", "shared")
REPLICATED_PARTS = ("norm", "router", "other", "mtp", "embedding", "head")
ROUTED_PARTS = ("routed",)
# Parts whose weights a matmul reads (autocast casts and saves a copy of these).
MATMUL_PARTS = ("attention", "ffn", "shared", "router", "other", "mtp", "routed")

# The ZeRO stage from which each category is sharded over the data-parallel ranks (FSDP shards every one):
# optimizer-state bytes under ZeRO-2 are split over dp * cp; gradients too; parameters are whole.
SHARDED_FROM_ZERO: Mapping[str, int] = {"optimizer_states": 1, "master": 1, "gradients": 2, "parameters": 3}
_CATEGORY_INDEX = {category: i for i, category in enumerate(SHARDED_FROM_ZERO)}


@attrs.frozen(kw_only=True, eq=False)
class Sharding:
    """Per row of a batch: the groups a device's bytes are split over, and which categories are split."""

    replicas: np.ndarray         # (N,) dp * fsdp * cp: ranks holding the same dense weights (whole or a shard)
    dense_ways: np.ndarray       # (N,) a sharded dense category's split: the shard group (module docstring)
    routed_ways: np.ndarray      # (N,) the routed experts' split: the dense group times tp re-cut by ep * etp
    expert_replicas: np.ndarray  # (N,) replicas * tp / (ep * etp): ranks holding the same routed experts
    shard_replicas: np.ndarray   # (N,) replicas / dense_ways: ranks holding the same shard (HSDP's dp, cp under
    #                              shard_mesh=dp), over which a sharded gradient is all-reduced; 1: no such ranks
    shard_stride: np.ndarray     # (N,) ranks apart the shard group's members are (ndcost.compose.topology's order)
    replica_stride: np.ndarray   # (N,) ranks apart a shard's replicas are
    fsdp: np.ndarray             # (N,) bool: FSDP2 shards (fsdp > 1, or shard_mesh=fsdp_cp with cp > 1)
    keeps_gathered: np.ndarray   # (N,) bool: FSDP with reshard_after_forward=false (a layer's gathered
    #                              parameters held from its forward to its backward)
    defers_reduce: np.ndarray    # (N,) bool: FSDP with gradient_sync=last_micro_batch (torch.distributed.pipelining's
    #                              stage backward: gradients whole and layers gathered to one reduce-scatter a step)
    ddp: np.ndarray              # (N,) bool: whole gradients all-reduced over the replicas (more than one, no
    #                              FSDP, zero < 2): a DDP engine's (``ddp_engine``)
    sharded: Mapping[str, np.ndarray]  # category -> (N,) bool: the ZeRO stage or FSDP shards it

    def ways(self, category: str) -> np.ndarray:
        """The ways *category*'s dense bytes are split over the data-parallel ranks (1 where whole)."""
        return self.category_ways[0][_CATEGORY_INDEX[category]]

    def routed_ways_of(self, category: str) -> np.ndarray:
        """The ways *category*'s routed-expert bytes are split over the expert-data-parallel ranks."""
        return self.category_ways[1][_CATEGORY_INDEX[category]]

    @functools.cached_property
    def category_ways(self) -> Tuple[np.ndarray, np.ndarray]:
        """(C, N) int64 twice, C the categories of ``SHARDED_FROM_ZERO`` in its order: :meth:`ways` and
        :meth:`routed_ways_of` of each (made once, read-only: memory and time read them often)."""
        sharded = np.array([self.sharded[category] for category in SHARDED_FROM_ZERO])
        out = (np.where(sharded, self.dense_ways, 1), np.where(sharded, self.routed_ways, 1))
        for array in out:
            array.setflags(write=False)
        return out

    @functools.cached_property
    def whole_gradients(self) -> np.ndarray:
        """(N,) bool: the backward holds each gradient whole: not sharded, or FSDP deferring its reduce-scatter
        (made once, read-only)."""
        out = ~self.sharded["gradients"] | self.defers_reduce
        out.setflags(write=False)
        return out

    def expert_ways(self, category: str) -> np.ndarray:
        """As :meth:`routed_ways_of`, over every expert replica (the time model's optimizer step)."""
        return np.where(self.sharded[category], self.expert_replicas, 1.0)


_DP_ONLY, _FSDP_CP = SHARD_MESHES.index("dp"), SHARD_MESHES.index("fsdp_cp")
_LAST_MICRO_BATCH = GRADIENT_SYNC.index("last_micro_batch")


def sharding(cols: Mapping[str, Any]) -> Sharding:
    """The :class:`Sharding` of a batch's columns (``dp``, ``fsdp``, ``cp``, ``tp``, ``ep``, ``etp``, ``zero``,
    ``shard_mesh``, ``reshard_after_forward``, ``gradient_sync``).

    Known limitation: where the shard group is not every replica (HSDP,
    ``shard_mesh=dp`` with ``cp > 1``) the memory model splits the routed
    experts over the shard group (``routed_ways``) while the time model's
    optimizer step and expert gathers run over every expert replica
    (``expert_replicas``); elsewhere the two agree.
    """
    if np.shape(cols["tp"]) == (1,):  # one strategy (memory, time and the resolver's checks ask): kept by its fields
        key = tuple(np.asarray(cols[name]).item() for name in READ)
        hit = _ONE_ROW.get(key)
        if hit is None:
            hit = _sharding(cols)
            for field in attrs.fields(Sharding):
                for array in getattr(hit, field.name).values() if field.name == "sharded" else \
                        (getattr(hit, field.name),):
                    array.setflags(write=False)
            if len(_ONE_ROW) >= _ONE_ROW_KEPT:
                _ONE_ROW.clear()
            _ONE_ROW[key] = hit
        return hit
    return _sharding(cols)


def runs_ddp(strategy: Any) -> bool:
    """Whether one :class:`ndcost.Strategy`'s replicas all-reduce whole gradients (``Sharding.ddp``'s rule)."""
    cols = {name: np.asarray([getattr(strategy, name)]) for name in READ}
    cols["shard_mesh"] = np.asarray([SHARD_MESHES.index(strategy.shard_mesh)])
    cols["gradient_sync"] = np.asarray([GRADIENT_SYNC.index(strategy.gradient_sync)])
    return bool(_sharding(cols).ddp[0])


# every column _sharding reads: a one-row key missing one would hand a strategy another's sharding
READ = ("dp", "fsdp", "cp", "tp", "zero", "shard_mesh", "ep", "etp", "reshard_after_forward", "gradient_sync")
_ONE_ROW: Dict[Tuple[Any, ...], Sharding] = {}
_ONE_ROW_KEPT = 4096


def _sharding(cols: Mapping[str, Any]) -> Sharding:
    dp, fsdp, cp = (np.asarray(cols[k]).astype(np.int64) for k in ("dp", "fsdp", "cp"))
    tp = np.asarray(cols["tp"]).astype(np.int64)
    zero = np.asarray(cols["zero"]).astype(np.int64)
    mesh = np.asarray(cols["shard_mesh"])
    ep_etp = (np.asarray(cols["ep"]) * np.asarray(cols["etp"])).astype(np.int64)
    replicas = dp * fsdp * cp
    fsdp_on = (fsdp > 1) | ((mesh == _FSDP_CP) & (cp > 1))
    cp_ways = np.where(mesh == _DP_ONLY, 1, cp)  # the cp ranks in the shard group, or replicating
    dense_ways = np.where(fsdp_on, fsdp, dp) * cp_ways
    group = dense_ways * tp
    routed_ways = np.where(group % ep_etp == 0, np.maximum(group // ep_etp, 1), 1)
    sharded = {category: (zero >= stage) | fsdp_on for category, stage in SHARDED_FROM_ZERO.items()}
    # ranks: tp innermost, then cp, fsdp, dp (ndcost.compose.topology); the replicas of an FSDP shard under
    # shard_mesh=dp, cp and dp ranks, get the stride spanning the same ranks (tp * fsdp, cp * dp of them)
    replica_stride = np.where(fsdp_on, tp * fsdp * cp_ways, np.where(mesh == _DP_ONLY, tp, tp * cp * fsdp))
    return Sharding(replicas=replicas, dense_ways=dense_ways, routed_ways=routed_ways,
                    expert_replicas=replicas * tp / ep_etp, shard_replicas=replicas // dense_ways,
                    shard_stride=tp * cp // cp_ways, replica_stride=replica_stride, fsdp=fsdp_on,
                    keeps_gathered=fsdp_on & ~np.asarray(cols["reshard_after_forward"]).astype(bool),
                    defers_reduce=fsdp_on & (np.asarray(cols["gradient_sync"]) == _LAST_MICRO_BATCH),
                    ddp=(replicas > 1) & ~sharded["gradients"], sharded=sharded)
