"""Where a group of ranks sits on the network: the level it spans, its bus bandwidth and latency.

Ranks are numbered with tensor parallelism innermost, then context
parallelism, then data parallelism (FSDP's shard dimension inside the
replicate dimension), then pipeline parallelism outermost; expert layers
re-split the ``dp * fsdp * cp * tp`` ranks as ``etp`` innermost, then ``ep``,
then expert data parallelism (Megatron-LM's ``RankGenerator`` order in
``megatron/core/parallel_state.py``). A group whose members are ``stride``
ranks apart and that has ``size`` members spans ``stride * size``
consecutive ranks: it stays on NVLink when that is at most the NVLink domain
(``Hardware.nvlink_domain_devices``: a node, or a GB200 NVL72 rack), and otherwise crosses domains.

Across domains (NCCL's ``nNodes``: the domains a group spans) a ring is hierarchical, as NCCL builds it: it
crosses each domain's boundary once a channel, its channels spread over the NICs its members own (rail-optimised:
a GPU's traffic leaves through its own NIC, ``src/graph/search.cc``), so its bus bandwidth is the slower of two
legs: NVLink within the domain, and ``m * nics_per_node / devices_per_node`` NICs at the ``across_nodes``
bandwidth, ``m`` the group's members in one domain -- the NICs of a node shared alike by the node's concurrent
groups of that kind (every rank is in one). A group with one member a domain has no NVLink leg. Where a node's
devices are joined point to point (``Hardware.node_fabric: mesh``: AMD's Infinity Fabric, Huawei's HCCS), the
within-node leg is the group's share of a device's links, ``m - 1`` of ``devices_per_node - 1``. Left out:
traffic of different kinds of group (a TP and a DP group) sharing a link at once, and switch oversubscription.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

import numpy as np

from ndcost.errors import Unpriced

__all__ = ["spans_nodes", "group_link", "nvls_efficiency", "worst_node_total"]

# NCCL's nvlsEfficiency by architecture (src/graph/tuning.cc), NVIDIA/nccl at 5067397c
NVLS_EFFICIENCY = {"hopper": 0.85, "blackwell": 0.74}


def nvls_efficiency(architecture, members) -> Any:
    """The NVLS bus bandwidth's fraction of the link for a group of *members* GPUs of one NVLink domain on
    *architecture* (``Hardware.nvls_architecture``), 0 without NVLS (vectorized over *members*).

    NCCL's tuner prices NVLS at ``nChannels x bwIntra x nvlsEfficiency x (nChannels - 1) / nChannels`` (twice
    that for an all-reduce, src/graph/tuning.cc). Within a domain the NVLS graph opens one channel a GPU
    (src/graph/search.cc: "NVLS channels correspond to GPUs pulling from NVLS", minChannels = maxChannels = the
    GPUs), and each channel's head carries twice its bandwidth through the switch and every other GPU once
    (``ncclTopoSearchTryNvls``), so ``m`` channels fit ``link / (m + 1)`` each: ``nvlsEfficiency (m - 1) /
    (m + 1)`` of the link in all. On eight H100s that is 476 GB/s of all-reduce bus bandwidth on 360 (0.85 x 7 /
    9 x 2). Left out: the search's speed steps, which round each channel's share down."""
    if architecture is None:
        return 0.0
    m = np.asarray(members, dtype=np.float64)
    return np.where(m > 1, NVLS_EFFICIENCY[architecture] * (m - 1.0) / (m + 1.0), 0.0)


def spans_nodes(stride, size, devices_per_node):
    """Whether a group of *size* members *stride* ranks apart crosses a boundary of *devices_per_node* devices
    (a node's, or an NVLink domain's: :func:`group_link` passes the domain) (vectorized)."""
    stride = np.asarray(stride, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    return (size > 1) & (stride * size > int(devices_per_node))


def group_link(hardware, stride, size, efficiency: Mapping[str, float], *, ring: bool = True):
    """``(bytes_per_second, latency_seconds, link)`` of a group (vectorized): its bus bandwidth (the slower leg,
    efficiency applied), the latency of the slowest level it spans, and the collectives' keywords (``nodes``:
    the NVLink domains it spans; ``nvls_efficiency``: NVLS's bus factor within a domain that has it, else 0).

    ``ring=False`` prices point-to-point traffic (all-to-all, sends): across domains each device's own share of
    its node's NICs, ``nics_per_node / devices_per_node`` of one, since each member sends its own bytes.

    A hardware with a single network level uses it for both; one with none
    cannot price communication, which is refused naming the fix.
    """
    stride = np.asarray(stride, dtype=np.int64)
    size = np.asarray(size, dtype=np.int64)
    if stride.size != 1 or size.size != 1:
        return _group_link(hardware, stride, size, efficiency, ring)
    # one group (a batch of one strategy): kept by its figures, the arrays read-only
    key = (id(hardware), stride.shape, size.shape, stride.item(), size.item(), bool(ring),
           efficiency["collective_within_node"], efficiency["collective_across_nodes"])
    hit = _ONE_GROUP.get(key)
    if hit is None or hit[0] is not hardware:
        bandwidth, latency, link = _group_link(hardware, stride, size, efficiency, ring)
        for array in (bandwidth, latency, *link.values()):
            array.setflags(write=False)
        if len(_ONE_GROUP) >= _ONE_GROUP_KEPT:
            _ONE_GROUP.clear()
        hit = _ONE_GROUP[key] = (hardware, (bandwidth, latency, link))
    bandwidth, latency, link = hit[1]
    return bandwidth, latency, dict(link)


_ONE_GROUP: Dict[Tuple[Any, ...], Tuple[Any, Any]] = {}
_ONE_GROUP_KEPT = 4096  # groups of one row kept (hardware x stride x size x kind: a search's few hundred)


def _group_link(hardware, stride: np.ndarray, size: np.ndarray, efficiency: Mapping[str, float], ring: bool):
    levels = {level.name: level for level in hardware.network}
    if not levels:
        raise Unpriced(f"hardware {hardware.name!r} states no network levels, so no collective can be priced; "
                       f"add 'network: {{within_node: {{bytes_per_second: ...}}, across_nodes: {{...}}}}' to its YAML")
    inner = levels.get("within_node") or next(iter(levels.values()))
    outer = levels.get("across_nodes") or inner
    domain = int(hardware.nvlink_domain_devices)
    across = spans_nodes(stride, size, domain)
    nvlink = inner.bytes_per_second * efficiency["collective_within_node"]
    if not across.any():  # every group on NVLink: the common batch, skipping the NIC arithmetic
        nvls = nvls_efficiency(hardware.nvls_architecture, size) * np.ones(np.shape(across))
        return np.broadcast_to(nvlink * _mesh_share(hardware, size), np.shape(across)).astype(np.float64), \
            np.full(np.shape(across), inner.latency_seconds), \
            {"nodes": np.ones(np.shape(across)), "nvls_efficiency": nvls}
    per_domain = np.where(across, np.clip(domain // np.maximum(stride, 1), 1, np.maximum(size, 1)), size)
    nvlink = nvlink * _mesh_share(hardware, per_domain)
    nodes = np.where(across, -(-size // per_domain), 1).astype(np.float64)
    nics = (per_domain if ring else 1) * (int(hardware.nics_per_node) / int(hardware.devices_per_node))
    network = outer.bytes_per_second * efficiency["collective_across_nodes"] * nics
    bandwidth = np.where(across, np.where(ring & (per_domain > 1), np.minimum(nvlink, network), network), nvlink)
    latency = np.where(across, outer.latency_seconds, inner.latency_seconds)
    nvls = np.where(~across, nvls_efficiency(hardware.nvls_architecture, size), 0.0)
    return bandwidth, latency, {"nodes": nodes, "nvls_efficiency": nvls}


def _mesh_share(hardware, members) -> Any:
    """The share of a device's node links a group with *members* on its node uses: all of them through a switch,
    ``(members - 1) / (devices_per_node - 1)`` on a point-to-point mesh (``Hardware.node_fabric``; 1 for a
    group of one, which moves nothing). XLA's measured RCCL collectives on MI300X and MI355X nodes hold 42 to 48
    and 54 to 66 GB/s of bus bandwidth a link whether 2, 4 or 8 devices take part
    (benchmarks/validate_collectives.py)."""
    if hardware.node_fabric != "mesh" or hardware.devices_per_node < 2:
        return 1.0
    members = np.asarray(members, dtype=np.float64)
    return np.where(members > 1, np.minimum(1.0, (members - 1.0) / (hardware.devices_per_node - 1.0)), 1.0)


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
