"""Collectives: their time on a group of devices, the group's place on the topology, and overlap rules.

Each collective primitive is registered as ``collective/<name>`` (``all_reduce``,
``all_gather``, ``reduce_scatter``, ``all_to_all``, ``send_recv``); the time
model looks them up once per batch, so a plugin may override one (for a
hierarchical all-reduce, say) with ``override=True``. Every ``seconds``
function is vectorized: numpy arrays in, numpy arrays out.

Volumes (``message_bytes``) are what one device of the group holds:
- all-reduce: the tensor every member holds and every member ends with
  (each member sends and receives ``2 (n - 1) / n`` of it on a ring);
- all-gather: the gathered (full) tensor; reduce-scatter: the full tensor
  before it is scattered (each member sends ``(n - 1) / n`` of it);
- all-to-all: the bytes a member holds before the exchange; it keeps
  ``1 / n`` and sends the rest;
- send/recv: the message.

Algorithms (the bus-bandwidth factors are NCCL's, ``nccl-tests/doc/PERFORMANCE.md``):
- ring all-reduce ``2 (n - 1) / n * S / B + 2 (n - 1) * latency``; tree (double
  binary tree) all-reduce ``2 * S / B + 2 * ceil(log2 n) * latency``; the
  faster of the two is taken, as the library's tuner picks;
- ring all-gather / reduce-scatter ``(n - 1) / n * S / B + (n - 1) * latency``;
- all-to-all (pairwise exchange) ``(n - 1) / n * S / B + (n - 1) * latency``;
- send/recv ``S / B + latency``.
``B`` is the bandwidth per device of the slowest network level the group
spans, times that level's efficiency (``collective_within_node`` or
``collective_across_nodes`` in the hardware's ``efficiency``).

Placement. Ranks are numbered with tensor parallelism innermost, then context
parallelism, then data parallelism (FSDP's shard dimension inside the
replicate dimension), then pipeline parallelism outermost; expert layers
re-split the ``dp * fsdp * cp * tp`` ranks as ``etp`` innermost, then ``ep``,
then expert data parallelism. A group whose members are ``stride`` ranks apart
and that has ``size`` members spans ``stride * size`` consecutive ranks: it
stays within a node when that is at most ``devices_per_node``, and otherwise
crosses nodes, where every member's traffic goes through its own network
interface at the ``across_nodes`` bandwidth (a ring's slowest link).

Overlap rules (what the time model counts as exposed, i.e. added to the step):
- ``tp``: TP all-reduces (or all-gathers and reduce-scatters under sequence
  parallelism), two a layer each pass: exposed, none overlapped (no TP comm
  overlap is assumed).
- ``cp_ring``: context-parallel ring passing of K/V blocks (forward) and of
  K/V and their gradients (backward): overlapped with that layer's attention
  kernel of the same pass; exposed is what exceeds it.
- ``cp_ulysses``: the all-to-alls of queries, keys and values in and of the
  output back (forward), and of their gradients the other way (backward, the
  same bytes): exposed, none overlapped.
- ``ep``: expert dispatch and combine all-to-alls, forward and backward:
  exposed, none overlapped, except under the DualPipeV schedule, which
  overlaps them with the other micro-batch's compute of the same layer
  (exposed is what exceeds that layer's compute of the pass).
- ``dp_grad``: data-parallel gradient all-reduce (or reduce-scatter under
  ZeRO >= 1) over ``dp * fsdp * cp`` (context-parallel ranks hold the same
  weights; the routed experts over expert data parallelism), once a step,
  HSDP's replicas reducing their shards: overlapped with the last micro-batch's backward on
  that rank (bucketed reduction); exposed is what exceeds it.
- ``dp_param``: the all-gather of updated parameters under ZeRO 1/2
  (distributed optimizer), once a step: overlapped with the next step's first
  forward; exposed is what exceeds it.
- ``fsdp``: parameter all-gathers (forward and backward) and gradient
  reduce-scatters a micro-batch under FSDP or ZeRO-3: prefetched, overlapped
  with the same micro-batch's forward (the gathers for it) and backward (the
  gathers and the reduce-scatter); exposed is what exceeds each.
- ``pp``: point-to-point activation (forward) and gradient (backward) sends:
  overlapped in the steady state; exposed on the fill and drain path,
  ``2 (p * v - 1)`` sends a step.

Known limitations: no contention between groups sharing a link (a TP group and
a DP group on the same NVLink both get the full bandwidth), no hierarchical
(intra-node then inter-node) algorithms, and the expert TP (``etp``)
collectives inside expert layers are not priced.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import attrs
import numpy as np

from ndcost.hookspecs import hookimpl


def _n(group_size):
    return np.maximum(np.asarray(group_size, dtype=np.float64), 1.0)


def _zero_where_alone(group_size, seconds):
    return np.where(_n(group_size) > 1.0, seconds, 0.0)


def all_reduce_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """The faster of a ring and a double binary tree all-reduce of *message_bytes* on each member."""
    n = _n(group_size)
    s = np.asarray(message_bytes, dtype=np.float64)
    ring = 2.0 * (n - 1.0) / n * s / bytes_per_second + 2.0 * (n - 1.0) * latency_seconds
    tree = 2.0 * s / bytes_per_second + 2.0 * np.ceil(np.log2(n)) * latency_seconds
    return _zero_where_alone(n, np.minimum(ring, tree))


def all_gather_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """A ring all-gather ending with *message_bytes* (the full tensor) on each member."""
    n = _n(group_size)
    s = np.asarray(message_bytes, dtype=np.float64)
    return _zero_where_alone(n, (n - 1.0) / n * s / bytes_per_second + (n - 1.0) * latency_seconds)


def reduce_scatter_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """A ring reduce-scatter of *message_bytes* (the full tensor) each member starts with."""
    return all_gather_seconds(message_bytes, group_size, bytes_per_second, latency_seconds)


def all_to_all_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """A pairwise all-to-all of the *message_bytes* each member holds (it keeps 1/n of them)."""
    n = _n(group_size)
    s = np.asarray(message_bytes, dtype=np.float64)
    return _zero_where_alone(n, (n - 1.0) / n * s / bytes_per_second + (n - 1.0) * latency_seconds)


def send_recv_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """One point-to-point message (``group_size`` 1 means no peer, no time)."""
    s = np.asarray(message_bytes, dtype=np.float64)
    return _zero_where_alone(group_size, s / bytes_per_second + latency_seconds)


@attrs.frozen(kw_only=True)
class Collective:
    """A collective primitive: ``seconds(message_bytes, group_size, bytes_per_second, latency_seconds)``."""

    name: str
    seconds: Callable[..., Any] = attrs.field(repr=False)
    description: str = ""


BUILTIN = (
    Collective(name="all_reduce", seconds=all_reduce_seconds,
               description="ring or double binary tree, whichever is faster"),
    Collective(name="all_gather", seconds=all_gather_seconds,
               description="ring; message is the gathered tensor"),
    Collective(name="reduce_scatter", seconds=reduce_scatter_seconds,
               description="ring; message is the full tensor before the scatter"),
    Collective(name="all_to_all", seconds=all_to_all_seconds,
               description="pairwise exchange; message is what a member holds"),
    Collective(name="send_recv", seconds=send_recv_seconds,
               description="point to point"),
)

# Each use of a collective and its overlap rule (the module docstring says why), in the time model's provenance.
OVERLAP_RULES: Mapping[str, str] = {
    "tp": "exposed: none overlapped",
    "cp_ring": "overlapped with the layer's attention kernel of the same pass; the excess is exposed",
    "cp_ulysses": "exposed: none overlapped",
    "ep": "exposed, except under dualpipev: overlapped with the layer's compute of the pass",
    "dp_grad": "overlapped with the last micro-batch's backward; the excess is exposed",
    "dp_param": "overlapped with the next step's first forward; the excess is exposed",
    "fsdp": "prefetched: overlapped with the micro-batch's forward / backward; the excess is exposed",
    "pp": "overlapped in the steady state; 2 (p * v - 1) sends on the fill and drain path are exposed",
}


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
    from ndcost.errors import Unpriced

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


@hookimpl
def ndcost_register(register):
    for collective in BUILTIN:
        register(f"collective/{collective.name}", collective)
