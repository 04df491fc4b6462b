"""Collectives: their time on a group of devices, priced as NCCL's tuner prices them, and overlap rules.

Each collective primitive is registered as ``collective/<name>`` (``all_reduce``,
``all_gather``, ``reduce_scatter``, ``all_to_all``, ``send_recv``); the time
model looks them up once per batch, so a plugin may override one (for a
hierarchical all-reduce, say) with ``override=True``. Every ``seconds``
function is vectorized: numpy arrays in, numpy arrays out. Its signature is
``seconds(message_bytes, group_size, bytes_per_second, latency_seconds, *, nodes=1, nvls_efficiency=0.0)``;
a plugin without the two keywords is called with the first four only.

Volumes (``message_bytes``) are what one device of the group holds:
- all-reduce: the tensor every member holds and every member ends with;
- all-gather: the gathered (full) tensor; reduce-scatter: the full tensor
  before it is scattered (NCCL's tuner sizes both by it: ``ncclFuncMaxSendRecvCount``, src/include/enqueue.h);
- all-to-all: the bytes a member holds before the exchange; it keeps ``1 / n`` and sends the rest;
- send/recv: the message.

The model is NCCL's own (``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime`` in ``src/graph/tuning.cc``,
NVIDIA/nccl at commit 5067397c2676d5aed50042fc39e5c8ee96eb0027): each (algorithm, protocol) has a base latency
and a latency a step (``hwLatencies``: NVLink within a domain, NET across), its bus bandwidth is the link's
times the protocol's factor, and the tuner takes the fastest ``latency + bytes / algorithm bandwidth``:
- ring (every collective NCCL tunes): ``nsteps`` steps, ``2 (n - 1)`` for all-reduce and ``n - 1`` for
  all-gather / reduce-scatter, of which ``2 (nodes - 1)`` (``nodes - 1``) cross nodes; the data term is
  ``nsteps / n * S / (B * factor)``, factor 0.5 for LL (8-byte lines, 4 bytes data), 0.92 for LL128 (the code's
  figure; its comment says 120/128), 1.0 for Simple. Across nodes a step within the node costs at least the
  network's post overhead (1 us, 3 us for Simple: an Intel host's, ``getNetOverhead``), and with one member a
  node the steps across take the tree's NET latency;
- tree (all-reduce only; a double binary tree across nodes, a chain within): ``2 ((ppn - 1) intra + floor(log2
  nodes) inter)`` latency, data ``2 S / (B * 0.92 * factor)`` with factor 1/3.8 for LL, 7/9 for LL128 on one
  node (120/128 across), 1.0 for Simple, times NCCL's size correction (``treeCorrectionFactor``);
- NVLS (all-reduce within one NVLink domain that has NVLink SHARP: in-switch reduction): 25 us
  (``hwLatencies[NVLINK][NVLS][Simple]``, no base), data ``(n - 1) / n * S / (B * nvls_efficiency)``, where
  ``nvls_efficiency`` is :func:`ndcost.compose.topology.nvls_efficiency`'s (``nvlsEfficiency (n - 1) / (n + 1)``:
  the NVLS graph opens a channel a GPU, each head carrying twice its share through the switch). NCCL prices NVLS
  all-gather / reduce-scatter as ``S / (B * nvls_efficiency * (n - 1) / n)`` (no algorithm-bandwidth ratio),
  which never beats the ring, so they are not priced; nor is NVLS across nodes (it
  needs CollNet/SHARP switches, off by default) or NVLS-tree.
``B`` is the group's bus bandwidth, :func:`ndcost.compose.topology.group_link`'s: the slower of its legs
(NVLink within its domain, its share of the NICs across), efficiency applied; ``latency_seconds`` is the link's
own latency beyond NCCL's constants (NCCL's ``latencyInter``, the network device's stated latency, which it
adds to each step across nodes and again for Simple's flush): added to each step that crosses that level.

All-to-all and send/recv are point-to-point in NCCL, outside its tuner: a send costs a Simple ring step
(``baseLatencies`` + ``hwLatencies``, NVLink or NET) and ``S / B``; an all-to-all ``n - 1`` rounds of pairs
(``p2pSchedule``, src/init.cc) after one base latency, and ``(n - 1) / n * S / B``. Its rounds go to the device
in batches of ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH`` (8, src/include/device.h: ``addWorkBatchToPlan`` in
src/enqueue.cc opens a new batch past 8 ops or another group of 8 rounds), whose ops run at once, so the
rounds' latency is a Simple step a batch, ``ceil((n - 1) / 8)`` of them. On a GB200 NVL72 rack XLA measured
small all-to-alls at 11 to 13 us for 8 to 18 ranks and 21 to 34 us for 32 to 36
(``benchmarks/validate_collectives.py``), where a step a round priced them at 32 to 127 us.

Left out: NCCL's channel counts and their per-channel caps (``llMaxBws``, ``perChMax*Bws``), the Simple ring's
plateau factor across nodes, PAT, CollNet, the expert TP (``etp``) collectives inside expert layers. Which
network level a group spans is :mod:`ndcost.compose.topology`'s rule; what each use of a collective hides
behind compute is the time model's (:data:`ndcost.compose.time.OVERLAP_RULES`).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Tuple

import attrs
import numpy as np

from ndcost.hookspecs import hookimpl

_US = 1e-6
# tuning.cc ncclTunerConstantsDefaults, microseconds, by protocol (LL, LL128, Simple)
BASE_LATENCY_US = {"tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4)}
NVLINK_LATENCY_US = {"tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "nvls": 25.0}
NET_LATENCY_US = {"tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0)}
P2P_PER_BATCH = 8  # NCCL_MAX_DEV_WORK_P2P_PER_BATCH (src/include/device.h): point-to-point ops a device batch runs
NET_OVERHEAD_US = (1.0, 1.0, 3.0)  # getNetOverhead (x86 Intel and the default: 1 us), three times for Simple
RING_BANDWIDTH_FACTOR = (0.5, 0.92, 1.0)
TREE_BANDWIDTH = 0.92  # every tree all-reduce's busBw * .92
TREE_PROTOCOL_FACTOR_ONE_NODE = (1.0 / 3.8, 7.0 / 9.0, 1.0)
TREE_PROTOCOL_FACTOR_NODES = (1.0 / 3.8, 120.0 / 128.0, 1.0)
# treeCorrectionFactor[protocol][log2(bytes / 64)], 64 B to 256 MB; applied below 2**23 (logSize < 23)
TREE_CORRECTION = np.array([
    [1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0, 1.0, 1.0],
    [1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0, 1.0],
    [.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9],
])
TREE_CORRECTION.setflags(write=False)


def _n(group_size):
    return np.maximum(np.asarray(group_size, dtype=np.float64), 1.0)


def _zero_where_alone(n, seconds, message_bytes):
    """*seconds* where the group (*n*, as :func:`_n` makes it) has a peer and there is something to move, else 0
    (NCCL returns at once from a collective of no bytes)."""
    return np.where((n > 1.0) & (message_bytes > 0), seconds, 0.0)


def _alone(n, s, *operands):
    """Zeros of the collective's shape where no group (*n*, as :func:`_n` makes it) has a peer or no message
    (*s*, float64) has a byte (a dense model's expert collectives), else None: the arithmetic whose every figure
    would be zeroed is skipped; and whether every group has a peer and every message a byte (nothing to zero)."""
    peers, moved = _count_above(n, 1.0), _count_above(s, 0.0)
    if peers and moved:
        return None, peers == n.size and moved == s.size
    return np.zeros(np.broadcast(n, s, *operands).shape), False


def _count_above(values: np.ndarray, floor: float) -> int:
    """``np.count_nonzero(values > floor)`` of a float64 array, one element compared as a Python float (np.any's
    and the comparison's wrappers weigh on one row)."""
    return int(values.item() > floor) if values.size == 1 else np.count_nonzero(values > floor)


def _zeroed(n, seconds, s, every: bool):
    """:func:`_zero_where_alone`, skipped where *every* group has a peer and every message a byte (a batch of one
    strategy's, mostly) and *seconds* spans the groups' and messages' shape: its ``np.where`` would give them back."""
    if every and isinstance(seconds, np.ndarray) and _spans(seconds.shape, n) and _spans(seconds.shape, s):
        return seconds
    return _zero_where_alone(n, seconds, s)


def _spans(shape, array) -> bool:
    """Whether *array* broadcast against *shape* leaves it *shape* (a cheap, sufficient test)."""
    return array.shape == shape or (array.size == 1 and array.ndim <= len(shape))


@functools.lru_cache(maxsize=None)
def _by_protocol(values: Tuple[float, float, float], ndim: int) -> np.ndarray:
    """Per-protocol constants (LL, LL128, Simple) as a ``(3, 1, ..., 1)`` array of *ndim* + 1 axes (read-only):
    the protocols priced at once along a leading axis (one numpy call a term rather than three)."""
    out = np.array(values, dtype=np.float64).reshape((3,) + (1,) * ndim)
    out.setflags(write=False)
    return out


_RING_INTRA_ACROSS_S = tuple(max(a, b) * _US for a, b in zip(NVLINK_LATENCY_US["ring"], NET_OVERHEAD_US, strict=True))
_RING_INTRA_S = tuple(v * _US for v in NVLINK_LATENCY_US["ring"])
_RING_BASE_S = tuple(v * _US for v in BASE_LATENCY_US["ring"])
_TREE_BASE_S = tuple(v * _US for v in BASE_LATENCY_US["tree"])
_TREE_INTRA_S = tuple(v * _US for v in NVLINK_LATENCY_US["tree"])
_TREE_NET_S = tuple(v * _US for v in NET_LATENCY_US["tree"])
_RING_NET_S = tuple(v * _US for v in NET_LATENCY_US["ring"])
_LINK_LATENCY_TIMES = (1.0, 1.0, 2.0)  # Simple adds the link's latency again for its flush
_RING_DATA_TIMES = (1.0 / RING_BANDWIDTH_FACTOR[0], 1.0 / RING_BANDWIDTH_FACTOR[1], 1.0)  # Simple's data as it is


def _ring_latencies(n, nodes, latency, all_reduce: bool):
    """NCCL's ring latency by protocol (LL, LL128, Simple) on the group's shape, ``(3, ...)``: ``nsteps`` steps,
    those across nodes at NET's (the tree's with one member a node), those within at least the network's post
    overhead."""
    ndim = max(np.ndim(n), np.ndim(nodes), latency.ndim)
    steps = (2.0 if all_reduce else 1.0) * (n - 1.0)
    across = nodes > 1.0
    inter = (2.0 if all_reduce else 1.0) * (nodes - 1.0)
    one_a_node = n <= nodes
    intra = np.where(across, _by_protocol(_RING_INTRA_ACROSS_S, ndim), _by_protocol(_RING_INTRA_S, ndim) + latency)
    cross = (np.where(one_a_node, _by_protocol(_TREE_NET_S, ndim), _by_protocol(_RING_NET_S, ndim))
             + _by_protocol(_LINK_LATENCY_TIMES, ndim) * latency)
    return _by_protocol(_RING_BASE_S, ndim) + (steps - inter) * intra + inter * cross


def _ring(s, latencies, per_byte):
    """The fastest protocol's ring: *latencies* (:func:`_ring_latencies`) and the data over the protocol's bus
    (Simple's seconds a byte, *per_byte*: :func:`_group`'s)."""
    data = np.asarray(s * per_byte)  # Simple's data term; a protocol divides it by its factor
    ndim = max(data.ndim, latencies.ndim - 1)
    fixed = latencies.reshape((3,) + (1,) * (ndim - latencies.ndim + 1) + latencies.shape[1:])
    return np.asarray(np.minimum.reduce(data * _by_protocol(_RING_DATA_TIMES, ndim) + fixed, axis=0))


def _tree_latencies(n, nodes, latency):
    """NCCL's tree all-reduce latency by protocol on the group's shape, ``(3, ...)``, and the least of them."""
    across = nodes > 1.0
    per_node = np.floor(n / nodes)
    log_nodes = np.floor(np.log2(nodes))
    ndim = max(np.ndim(n), np.ndim(nodes), latency.ndim)
    intra = _by_protocol(_TREE_INTRA_S, ndim) + np.where(across, 0.0, latency)
    cross = _by_protocol(_TREE_NET_S, ndim) + _by_protocol(_LINK_LATENCY_TIMES, ndim) * latency
    latencies = _by_protocol(_TREE_BASE_S, ndim) + 2.0 * ((per_node - 1.0) * intra + log_nodes * cross)
    return latencies, latencies.min(axis=0)


_ONE_GROUP: Dict[Tuple[Any, ...], Tuple[Any, ...]] = {}
_ONE_GROUP_KEPT = 4096  # groups of one row kept (a search's few hundred shapes and links)


def _group(all_reduce: bool, n, nodes, latency, bandwidth, nvls=None):
    """What of a collective's seconds depends on its group alone (:func:`_group_terms`); where the group is one
    row's (a batch of one strategy), kept by its figures, read-only."""
    arrays = (n, nodes, np.asarray(latency, dtype=np.float64), np.asarray(bandwidth, dtype=np.float64)) + (
        () if nvls is None else (nvls,))
    if any(array.size != 1 for array in arrays):
        return _group_terms(all_reduce, *arrays)
    key = (all_reduce, *(array.shape for array in arrays), *(array.item() for array in arrays))
    hit = _ONE_GROUP.get(key)
    if hit is None:
        hit = _group_terms(all_reduce, *arrays)
        for array in (hit[0], hit[1], *(hit[2] or ()), *(hit[3] or ())):
            if isinstance(array, np.ndarray):
                array.setflags(write=False)
        if len(_ONE_GROUP) >= _ONE_GROUP_KEPT:
            _ONE_GROUP.clear()
        _ONE_GROUP[key] = hit
    return hit


def _group_terms(all_reduce: bool, n, nodes, latency, bandwidth, nvls=None):
    """A group's ring latencies by protocol (:func:`_ring_latencies`) and Simple's data seconds a byte; for an
    all-reduce the tree's latencies, the least of them and the message size below which the tree may win
    (:func:`_tree`), and, given *nvls* (its NVLS efficiency), NVLS's terms (:func:`all_reduce_seconds`), else
    None."""
    ring = _ring_latencies(n, nodes, latency, all_reduce)
    steps = 2.0 * (n - 1.0) if all_reduce else n - 1.0
    per_byte = steps / (n * bandwidth)
    if not all_reduce:
        return ring, per_byte, None, None
    latencies, least = _tree_latencies(n, nodes, latency)
    # tree >= least latency + 2 S / (0.92 B) (no protocol or correction moves it faster); the Simple ring is
    # latency + 2 (n - 1) / n * S / B: past this S (on the group's shape) the tree never wins
    slope = 2.0 / (bandwidth * TREE_BANDWIDTH) - 2.0 * (n - 1.0) / (n * bandwidth)
    tree = (latencies, least, (ring[2] - least) / slope)
    if nvls is None:
        return ring, per_byte, tree, None
    usable = (nvls > 0.0) & (nodes <= 1.0)
    within = np.count_nonzero(usable)
    if not within:
        return ring, per_byte, tree, None
    every = within == usable.size and usable.shape == nvls.shape  # every group within a domain with NVLS
    bus = bandwidth * (nvls if every else np.where(usable, nvls, 1.0))
    # in-switch seconds: base + share * S / bus
    return ring, per_byte, tree, (usable, every, NVLINK_LATENCY_US["nvls"] * _US + latency, (n - 1.0) / n, bus)


def _tree(s, nodes, bandwidth, tree, ring):
    """The fastest protocol's tree all-reduce (a chain within a node, a double binary tree across) where it beats
    *ring*, else *ring*; priced only on messages below the size past which even its least latency and
    uncorrected Simple data lose to the Simple ring. *tree*: :func:`_group_terms`' (the latencies by protocol,
    the least, that size)."""
    latencies, _, past = tree
    candidate = s < past
    if not np.count_nonzero(candidate):
        return ring
    across = nodes > 1.0
    shape = np.broadcast(s, ring).shape
    latencies = latencies.reshape((3,) + (1,) * (len(shape) - latencies.ndim + 1) + latencies.shape[1:])
    if np.count_nonzero(candidate) == np.size(candidate):  # every message a candidate (one strategy's): no picks
        return np.minimum(np.broadcast_to(ring, shape), _tree_best(s, bandwidth, across, latencies))
    where = np.broadcast_to(candidate, shape)
    s, bandwidth, across = (np.broadcast_to(a, shape)[where] for a in (s, bandwidth, across))
    out = np.array(np.broadcast_to(ring, shape), dtype=np.float64)
    out[where] = np.minimum(out[where], _tree_best(s, bandwidth, across,
                                                   np.broadcast_to(latencies, (3,) + shape)[:, where]))
    return out


def _tree_best(s, bandwidth, across, latencies):
    """The fastest protocol's tree all-reduce seconds of messages *s*, its protocols along *latencies*' first axis
    (:func:`_tree_latencies`', as many axes beside it as the messages' broadcast shape)."""
    ndim = latencies.ndim - 1
    data = 2.0 * s / (bandwidth * TREE_BANDWIDTH)
    size = np.floor(np.log2(np.maximum(s, 1.0) / 64.0))  # log2i(nBytes >> 6), -1 below 64 bytes
    corrected = (size >= 0) & (size < TREE_CORRECTION.shape[1])
    column = np.minimum(np.maximum(size, 0), TREE_CORRECTION.shape[1] - 1).astype(np.int64)
    correction = TREE_CORRECTION[:, column].reshape((3,) + (1,) * (ndim - column.ndim) + column.shape)
    factor = np.where(across, _by_protocol(TREE_PROTOCOL_FACTOR_NODES, ndim),
                      _by_protocol(TREE_PROTOCOL_FACTOR_ONE_NODE, ndim))
    return (latencies + data / (factor * np.where(corrected, correction, 1.0))).min(axis=0)


_ONE_ROW: Dict[Tuple[Any, ...], Any] = {}
_ONE_ROW_KEPT = 4096  # one group's collectives kept (a search's few thousand messages and groups)
_ONE_ROW_MESSAGES = 64  # the most message elements a kept call holds (one strategy's ranks or kinds)


def _kept_one_row(seconds: Callable[..., Any]) -> Callable[..., Any]:
    """*seconds*, kept for a call on one group (every figure but the message one element, the message a few
    elements, all of them numbers): a batch of one strategy prices the same collectives strategy after
    strategy, each priced once by its operands' bits (the key: dtypes, shapes and bytes, so that only the very
    same operands share a figure), a fresh copy each call."""
    @functools.wraps(seconds)
    def kept(message_bytes, group_size, bytes_per_second, latency_seconds, *, nodes=1, nvls_efficiency=0.0):
        operands = [np.asarray(value) for value in (message_bytes, group_size, bytes_per_second, latency_seconds,
                                                     nodes, nvls_efficiency)]
        key = [seconds]
        for i, operand in enumerate(operands):
            if operand.size > (1 if i else _ONE_ROW_MESSAGES) or operand.dtype.kind not in "biuf":
                return seconds(message_bytes, group_size, bytes_per_second, latency_seconds, nodes=nodes,
                               nvls_efficiency=nvls_efficiency)
            key += (operand.dtype.char, operand.shape, operand.tobytes())
        hit = _ONE_ROW.get(tuple(key))
        if hit is None:
            hit = seconds(message_bytes, group_size, bytes_per_second, latency_seconds, nodes=nodes,
                          nvls_efficiency=nvls_efficiency)
            if len(_ONE_ROW) >= _ONE_ROW_KEPT:
                _ONE_ROW.clear()
            _ONE_ROW[tuple(key)] = hit
        return hit.copy() if isinstance(hit, np.ndarray) else hit

    return kept


@_kept_one_row
def all_reduce_seconds(message_bytes, group_size, bytes_per_second, latency_seconds, *, nodes=1, nvls_efficiency=0.0):
    """The fastest of NCCL's ring, tree and (within one NVLink domain with ``nvls_efficiency > 0``) NVLS
    all-reduce of *message_bytes* on each member, each at its fastest protocol; *nodes*: the NVLink domains
    the group spans (NCCL's ``nNodes``)."""
    n, s = _n(group_size), np.asarray(message_bytes, dtype=np.float64)
    alone, every = _alone(n, s, bytes_per_second, latency_seconds, nodes, nvls_efficiency)
    if alone is not None:
        return alone
    nodes = np.asarray(nodes, dtype=np.float64)
    latencies, per_byte, tree, nvls = _group(True, n, nodes, latency_seconds, bytes_per_second,
                                             np.asarray(nvls_efficiency, dtype=np.float64))
    best = _tree(s, nodes, bytes_per_second, tree, _ring(s, latencies, per_byte))
    if nvls is not None:  # within a domain with NVLS: its in-switch reduction where faster
        usable, every_usable, base, share, bus = nvls
        in_switch = base + share * s / bus
        best = np.minimum(best, in_switch) if every_usable else np.where(usable, np.minimum(best, in_switch), best)
    return _zeroed(n, best, s, every)


@_kept_one_row
def all_gather_seconds(message_bytes, group_size, bytes_per_second, latency_seconds, *, nodes=1, nvls_efficiency=0.0):
    """NCCL's ring all-gather ending with *message_bytes* (the full tensor) on each member, fastest protocol; as
    ``reduce_scatter_seconds``, the reduce-scatter of the full tensor each member starts with."""
    n, s = _n(group_size), np.asarray(message_bytes, dtype=np.float64)
    alone, every = _alone(n, s, bytes_per_second, latency_seconds, nodes)
    if alone is not None:
        return alone
    latencies, per_byte, _, _ = _group(False, n, np.asarray(nodes, dtype=np.float64), latency_seconds,
                                       bytes_per_second)
    return _zeroed(n, _ring(s, latencies, per_byte), s, every)


# NCCL's ring prices a reduce-scatter as the all-gather of the same bytes: one function, so the time model,
# seeing the two registered alike, prices the pair once where their bytes agree
reduce_scatter_seconds = all_gather_seconds


def _p2p_step_seconds(nodes, latency_seconds):
    """One point-to-point round: a Simple ring step's latency over NVLink, or NET across nodes, and the link's."""
    hop = np.where(np.asarray(nodes) > 1, NET_LATENCY_US["ring"][2], NVLINK_LATENCY_US["ring"][2]) * _US
    return hop + latency_seconds


@_kept_one_row
def all_to_all_seconds(message_bytes, group_size, bytes_per_second, latency_seconds, *, nodes=1, nvls_efficiency=0.0):
    """A pairwise all-to-all of the *message_bytes* each member holds (it keeps 1/n of them): n - 1 rounds, run
    :data:`P2P_PER_BATCH` at once."""
    n, s = _n(group_size), np.asarray(message_bytes, dtype=np.float64)
    alone, every = _alone(n, s, bytes_per_second, latency_seconds, nodes)
    if alone is not None:
        return alone
    batches = np.ceil((n - 1.0) / P2P_PER_BATCH)
    seconds = (BASE_LATENCY_US["ring"][2] * _US + batches * _p2p_step_seconds(nodes, latency_seconds)
               + (n - 1.0) / n * s / bytes_per_second)
    return _zeroed(n, seconds, s, every)


@_kept_one_row
def send_recv_seconds(message_bytes, group_size, bytes_per_second, latency_seconds, *, nodes=1, nvls_efficiency=0.0):
    """One point-to-point message (``group_size`` 1 means no peer, no time); *nodes* > 1: it crosses nodes."""
    n, s = _n(group_size), np.asarray(message_bytes, dtype=np.float64)
    alone, every = _alone(n, s, bytes_per_second, latency_seconds, nodes)
    if alone is not None:
        return alone
    seconds = BASE_LATENCY_US["ring"][2] * _US + _p2p_step_seconds(nodes, latency_seconds) + s / bytes_per_second
    return _zeroed(n, seconds, s, every)


@attrs.frozen(kw_only=True)
class Collective:
    """A collective primitive: ``seconds(message_bytes, group_size, bytes_per_second, latency_seconds, *, nodes=1,
    nvls_efficiency=0.0)`` (a third party's may take the first four only)."""

    name: str
    seconds: Callable[..., Any] = attrs.field(repr=False)
    description: str = ""


BUILTIN = (
    Collective(name="all_reduce", seconds=all_reduce_seconds,
               description="NCCL's ring, tree or NVLS, whichever its tuner finds fastest, at the fastest protocol"),
    Collective(name="all_gather", seconds=all_gather_seconds,
               description="NCCL's ring at the fastest protocol; message is the gathered tensor"),
    Collective(name="reduce_scatter", seconds=reduce_scatter_seconds,
               description="NCCL's ring at the fastest protocol; message is the full tensor before the scatter"),
    Collective(name="all_to_all", seconds=all_to_all_seconds,
               description="pairwise exchange, n - 1 rounds; message is what a member holds"),
    Collective(name="send_recv", seconds=send_recv_seconds,
               description="point to point"),
)

@hookimpl
def ndcost_register(register):
    for collective in BUILTIN:
        register(f"collective/{collective.name}", collective)
