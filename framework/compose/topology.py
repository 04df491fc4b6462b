"""Where a group of ranks sits on the network: the level it spans, its bandwidth and latency.

Ranks are numbered with tensor parallelism innermost, then context
parallelism, then data parallelism (FSDP's shard dimension inside the
replicate dimension), then pipeline parallelism outermost; expert layers
re-split the ``dp * fsdp * cp * tp`` ranks as ``etp`` innermost, then ``ep``,
then expert data parallelism (Megatron-LM's ``RankGenerator`` order in
``megatron/core/parallel_state.py``). A group whose members are ``stride``
ranks apart and that has ``size`` members spans ``stride * size``
consecutive ranks: it stays within a node when that is at most
``devices_per_node``, and otherwise crosses nodes, where every member's
traffic goes through its own network interface at the ``across_nodes``
bandwidth (a ring's slowest link).
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ndcost.errors import Unpriced

__all__ = ["spans_nodes", "group_link", "worst_node_total"]


def spans_nodes(stride, size, devices_per_node):
    """Whether a group of *size* members *stride* ranks apart crosses a node boundary (vectorized)."""
    stride = np.asarray(stride, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    return (size > 1) & (stride * size > int(devices_per_node))


def group_link(hardware, stride, size, efficiency: Mapping[str, float]):
    """Bandwidth (bytes/s, efficiency applied) and latency of the slowest level a group spans (vectorized).

    A hardware with a single network level uses it for both; one with none
    cannot price communication, which is refused naming the fix.
    """
    levels = {level.name: level for level in hardware.network}
    if not levels:
        raise Unpriced(f"hardware {hardware.name!r} states no network levels, so no collective can be priced; "
                       f"add 'network: {{within_node: {{bytes_per_second: ...}}, across_nodes: {{...}}}}' to its YAML")
    inner = levels.get("within_node") or next(iter(levels.values()))
    outer = levels.get("across_nodes") or inner
    across = spans_nodes(stride, size, hardware.devices_per_node)
    bandwidth = np.where(across, outer.bytes_per_second * efficiency["collective_across_nodes"],
                         inner.bytes_per_second * efficiency["collective_within_node"])
    latency = np.where(across, outer.latency_seconds, inner.latency_seconds)
    return bandwidth, latency


def worst_node_total(per_stage, stage_devices, stages, devices_per_node):
    """``(N,)`` float64: the most the devices of one node hold together of a figure each device of a pipeline
    stage holds alike (``per_stage``, ``(N, R)``, 0 past a row's ``stages``).

    Stage ``s`` holds ranks ``[s S, (s + 1) S)`` (``S = stage_devices``: pipeline parallelism is outermost),
    node ``n`` ranks ``[n D, (n + 1) D)``. A node holds a stage's first or last rank, or lies within one stage
    (``D`` times its figure): those are the candidates, each summed over its overlap with every stage. Exact
    below ``2 ** 53``; a total at or past it is at least ``2 ** 53`` (the caller refuses it).
    """
    per_stage = np.asarray(per_stage, dtype=np.float64)
    ranks = per_stage.shape[1]
    size = np.asarray(stage_devices, dtype=np.int64)[:, None]                      # (N, 1)
    total = size * np.asarray(stages, dtype=np.int64)[:, None]
    node = int(devices_per_node)
    lo = np.arange(ranks, dtype=np.int64)[None, :] * size                          # (N, R): each stage's first rank
    hi = lo + size
    start = np.concatenate([lo // node, (hi - 1) // node], axis=1) * node         # (N, 2R): candidate nodes
    end = np.minimum(start + node, total)
    overlap = np.minimum(end[:, :, None], hi[:, None, :]) - np.maximum(start[:, :, None], lo[:, None, :])
    sums = np.einsum("ncr,nr->nc", np.maximum(overlap, 0).astype(np.float64), per_stage)
    inside = ((-(-lo // node) + 1) * node <= hi) & (lo < total)                    # a whole node within the stage
    return np.maximum(sums.max(axis=1, initial=0.0), np.where(inside, node * per_stage, 0.0).max(axis=1, initial=0.0))
