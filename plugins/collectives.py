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

Which network level a group spans (and so ``B`` and the latency) is
:func:`ndcost.compose.topology.group_link`'s rule; what each use of a
collective hides behind compute is the time model's
(:data:`ndcost.compose.time.OVERLAP_RULES`).

Known limitations: no contention between groups sharing a link (a TP group and
a DP group on the same NVLink both get the full bandwidth), no hierarchical
(intra-node then inter-node) algorithms, and the expert TP (``etp``)
collectives inside expert layers are not priced.
"""
from __future__ import annotations

from typing import Any, Callable

import attrs
import numpy as np

from ndcost.hookspecs import hookimpl


def _n(group_size):
    return np.maximum(np.asarray(group_size, dtype=np.float64), 1.0)


def _zero_where_alone(n, seconds):
    """*seconds* where the group (*n*, as :func:`_n` makes it) has a peer, else 0."""
    return np.where(n > 1.0, seconds, 0.0)


def _alone(n, *operands):
    """Zeros of the collective's shape where no group (*n*, as :func:`_n` makes it) has a peer, else None:
    a batch of one strategy then skips the arithmetic whose every figure would be zeroed."""
    if (n > 1.0).any():
        return None
    return np.zeros(np.broadcast(n, *operands).shape)


def all_reduce_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """The faster of a ring and a double binary tree all-reduce of *message_bytes* on each member."""
    n = _n(group_size)
    alone = _alone(n, message_bytes, bytes_per_second, latency_seconds)
    if alone is not None:
        return alone
    s = np.asarray(message_bytes, dtype=np.float64)
    ring = 2.0 * (n - 1.0) / n * s / bytes_per_second + 2.0 * (n - 1.0) * latency_seconds
    tree = 2.0 * s / bytes_per_second + 2.0 * np.ceil(np.log2(n)) * latency_seconds
    return _zero_where_alone(n, np.minimum(ring, tree))


def all_gather_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """A ring all-gather ending with *message_bytes* (the full tensor) on each member."""
    n = _n(group_size)
    alone = _alone(n, message_bytes, bytes_per_second, latency_seconds)
    if alone is not None:
        return alone
    s = np.asarray(message_bytes, dtype=np.float64)
    return _zero_where_alone(n, (n - 1.0) / n * s / bytes_per_second + (n - 1.0) * latency_seconds)


def reduce_scatter_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """A ring reduce-scatter of *message_bytes* (the full tensor) each member starts with."""
    return all_gather_seconds(message_bytes, group_size, bytes_per_second, latency_seconds)


def all_to_all_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """A pairwise all-to-all of the *message_bytes* each member holds (it keeps 1/n of them)."""
    n = _n(group_size)
    alone = _alone(n, message_bytes, bytes_per_second, latency_seconds)
    if alone is not None:
        return alone
    s = np.asarray(message_bytes, dtype=np.float64)
    return _zero_where_alone(n, (n - 1.0) / n * s / bytes_per_second + (n - 1.0) * latency_seconds)


def send_recv_seconds(message_bytes, group_size, bytes_per_second, latency_seconds):
    """One point-to-point message (``group_size`` 1 means no peer, no time)."""
    n = _n(group_size)
    alone = _alone(n, message_bytes, bytes_per_second, latency_seconds)
    if alone is not None:
        return alone
    s = np.asarray(message_bytes, dtype=np.float64)
    return _zero_where_alone(n, s / bytes_per_second + latency_seconds)


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

@hookimpl
def ndcost_register(register):
    for collective in BUILTIN:
        register(f"collective/{collective.name}", collective)
