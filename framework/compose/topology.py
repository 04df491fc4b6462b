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

__all__ = ["spans_nodes", "group_link"]


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
