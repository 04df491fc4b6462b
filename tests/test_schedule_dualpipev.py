"""The pipeline schedules' in-flight counts and bubbles against independent event-by-event walks.

DualPipeV: the order of operations is that of ``DualPipeV.step`` in DeepSeek's DualPipe
(github.com/deepseek-ai/DualPipe, ``dualpipe/dualpipev.py``; read here from the copy in the fork
jamescon1-bit/DualPipe, the upstream file not being in the stored index), for rank ``r`` of ``p`` ranks
and ``m >= 2 p`` micro-batches (the step asserts ``num_chunks >= num_ranks * 2``):

1. ``nF0``: ``2 (p - r - 1)`` forwards of chunk 0;
2. ``nF0F1``: ``r + 1`` times a forward of chunk 0 then one of chunk 1;
3. ``nB1W1F1``: ``p - r - 1`` times a zero-bubble backward of chunk 1, its weight pass, a chunk 1 forward;
4. main loop ``nF0B1F1B0``: ``m - 2 p + r + 1`` times (forward 0 with backward 1), then (forward 1 with
   backward 0); each pair is one overlapped call, or forward then backward without the overlap;
5. ``nB1F1B0``: ``p - r - 1`` times a chunk 1 backward, then (forward 1 with backward 0);
6. ``nB1B0``: ``r + 1`` times a chunk 1 backward then a chunk 0 backward, the second half zero-bubble;
7. ``nWB0``: ``p - r - 1`` times a weight pass then a zero-bubble chunk 0 backward;
8. ``nW``: the ``r + 1`` weight passes left.

Chunk 0 of rank r is stage r, chunk 1 is stage 2p - 1 - r (the V); the last rank's chunk 0 feeds its own
chunk 1, and rank 0's chunk 1 computes the loss.

What frees a (micro-batch, chunk)'s activations: its backward, which in the zero-bubble split is the
backward for the inputs (``run_backward`` with ``WeightGradStore.enabled``); the weight pass queued for
later keeps only what the weight gradients need (the matmuls' inputs). The walk counts the activation as
freed at that backward, and checks that freeing it only at its weight pass changes no peak. An overlapped
(forward, backward) pair counts its forward first, as the source runs them without the overlap; that is
what makes the peak DeepSeek's ``PP + 1`` on every rank (the other way round it would be ``PP`` on all but
the last rank, whose first pair is not overlapped).

Bubble: DeepSeek's README table (deepseek-ai/DualPipe ``README.md``): DualPipeV idles
``(PP / 2 - 1)(F&B + B - 3 W)`` with ``PP = 2 p`` stages and F, B, W the times of a chunk's forward, full
backward and backward-for-weights. A critical-path walk of the same order of operations reproduces it when the
forward, the backward-for-inputs and the weight pass take equal times (B = 2F, W = F), the assumption
behind the plugin's ``(p - 1) / 3``.

Interleaved: Megatron's interleaved 1F1B (``forward_backward_pipelining_with_interleaving``): rank r runs
``(p - r - 1) * 2 + (v - 1) * p`` warm-up forwards, then one forward and one backward a step, then the
remaining backwards; virtual micro-batch k runs chunk ``(k // p) % v`` forward and ``v - 1 - (k // p) % v``
backward (m a multiple of p, as Megatron requires). tests/test_memory.py walks the warm-up only; the walk
here runs the whole schedule, steady state and cool-down included.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np
import pytest

from ndcost import manager
from ndcost.values import Strategy

# (p, m) pairs, m >= 2 p, m not always a multiple of p
DUALPIPEV_CASES = [(1, 2), (1, 5), (2, 4), (2, 7), (3, 6), (3, 11), (4, 8), (4, 10), (4, 13), (6, 12),
                   (8, 16), (8, 20), (8, 37)]


def _schedule(name):
    return manager.registry().get(f"schedule/{name}")


def _plugin_counts(name, p, v, m, rank) -> List[int]:
    plugin = _schedule(name)
    return [int(plugin.in_flight(np.int64(p), np.int64(v), np.int64(m), np.int64(rank), np.int64(c)))
            for c in range(v)]


# ---------------------------------------------------------------------------
# DualPipeV: the order of operations of DualPipeV.step
# ---------------------------------------------------------------------------
# an op: ("F", chunk) | ("B", chunk, zero_bubble) | ("W",); a slot: the ops of one call (an overlapped pair
# is one slot of two ops, the forward listed first)
Op = Tuple
Slot = List[Op]


def dualpipev_slots(r: int, p: int, m: int) -> List[Slot]:
    """Rank r's calls in the order ``DualPipeV.step`` makes them."""
    assert m >= 2 * p
    slots: List[Slot] = []
    slots += [[("F", 0)]] * (2 * (p - r - 1))                                  # 1: nF0
    slots += [[("F", 0)], [("F", 1)]] * (r + 1)                                 # 2: nF0F1
    slots += [[("B", 1, True)], [("W",)], [("F", 1)]] * (p - r - 1)             # 3: nB1W1F1
    for i in range(m - 2 * p + r + 1):                                          # 4: nF0B1F1B0
        if i == 0 and r == p - 1:  # the last rank does not overlap its first pair
            slots += [[("F", 0)], [("B", 1, False)]]
        else:
            slots += [[("F", 0), ("B", 1, False)]]
        slots += [[("F", 1), ("B", 0, False)]]
    slots += [[("B", 1, False)], [("F", 1), ("B", 0, False)]] * (p - r - 1)    # 5: nB1F1B0
    zero_bubble = False                                                         # 6: nB1B0
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            zero_bubble = True
        slots.append([("B", 1, zero_bubble)])
        if i == (r + 1) // 2 and r % 2 == 0:
            zero_bubble = True
        slots.append([("B", 0, zero_bubble)])
    slots += [[("W",)], [("B", 0, True)]] * (p - r - 1)                         # 7: nWB0
    slots += [[("W",)]] * (r + 1)                                               # 8: nW
    return slots


def walk_held(slots: List[Slot], chunks: int, free_at_weight_pass: bool = False):
    """Activations alive per chunk after every op: (per-chunk maxima, the counts when the total first peaks)."""
    alive = [0] * chunks
    waiting: List[int] = []  # chunks of zero-bubble backwards whose weight pass is still queued (FIFO)
    peak_total, at_peak, maxima = 0, list(alive), list(alive)
    forwards, backwards = [0] * chunks, [0] * chunks
    for slot in slots:
        for op in slot:
            if op[0] == "F":
                alive[op[1]] += 1
                forwards[op[1]] += 1
            elif op[0] == "B":
                backwards[op[1]] += 1
                if free_at_weight_pass and op[2]:
                    waiting.append(op[1])
                else:
                    alive[op[1]] -= 1
            else:
                if waiting:
                    alive[waiting.pop(0)] -= 1
            assert min(alive) >= 0
            maxima = [max(a, b) for a, b in zip(maxima, alive)]
            if sum(alive) > peak_total:
                peak_total, at_peak = sum(alive), list(alive)
    assert alive == [0] * chunks and not waiting
    return maxima, at_peak, forwards, backwards


@pytest.mark.parametrize("p,m", DUALPIPEV_CASES)
def test_dualpipev_in_flight_matches_the_walk(p, m):
    for r in range(p):
        slots = dualpipev_slots(r, p, m)
        maxima, at_peak, forwards, backwards = walk_held(slots, 2)
        assert forwards == [m, m] and backwards == [m, m]  # every micro-batch through both chunks
        # DeepSeek's table: PP + 1 = 2p + 1 stage-micro-batches a device
        assert sum(at_peak) == 2 * p + 1
        # the per-chunk maxima coincide at that one moment (the main loop's first forward of chunk 0)
        assert maxima == at_peak == [2 * p - r, r + 1]
        assert _plugin_counts("dualpipev", p, 2, m, r) == at_peak
        # freeing a zero-bubble backward's activations only at its weight pass moves no peak
        assert walk_held(slots, 2, free_at_weight_pass=True)[:2] == (maxima, at_peak)


def test_dualpipev_plugin_was_p_plus_one_and_p_before():
    """Pinned: rank 0 keeps one micro-batch of its last stage (the loss's), not p; the first stage's 2p."""
    assert _plugin_counts("dualpipev", 4, 2, 8, 0) == [8, 1]
    assert _plugin_counts("dualpipev", 4, 2, 8, 3) == [5, 4]


# ---------------------------------------------------------------------------
# DualPipeV's bubble: a critical-path walk of the same order of operations
# ---------------------------------------------------------------------------
def dualpipev_makespan(p: int, m: int, f: float, b: float, w: float):
    """Each rank runs its calls in order as soon as their inputs exist (no communication time).

    A chunk's forward takes f, its full backward b, a zero-bubble backward b - w and its weight pass w; an
    overlapped forward-backward pair takes the sum (the overlap hides communication, not compute). Returns
    (makespan, busy time of one rank).
    """
    # label every op with its micro-batch: the source's per-chunk counters
    labelled = []
    for r in range(p):
        nf, nb, queue, rank_slots = [0, 0], [0, 0], [], []
        for slot in dualpipev_slots(r, p, m):
            out = []
            for op in slot:
                if op[0] == "F":
                    out.append(("F", op[1], nf[op[1]], f))
                    nf[op[1]] += 1
                elif op[0] == "B":
                    out.append(("B", op[1], nb[op[1]], b - w if op[2] else b))
                    if op[2]:
                        queue.append((op[1], nb[op[1]]))
                    nb[op[1]] += 1
                else:
                    chunk, mb = queue.pop(0)
                    out.append(("W", chunk, mb, w))
            rank_slots.append(out)
        labelled.append(rank_slots)

    def inputs(r, kind, chunk, mb):
        if kind == "F" and chunk == 0:
            return [] if r == 0 else [("F", 0, mb, r - 1)]
        if kind == "F":  # chunk 1 runs from rank p - 1 back to rank 0
            return [("F", 0, mb, r)] if r == p - 1 else [("F", 1, mb, r + 1)]
        if kind == "B" and chunk == 1:
            return [("F", 1, mb, 0)] if r == 0 else [("B", 1, mb, r - 1)]
        if kind == "B":
            return [("B", 1, mb, r)] if r == p - 1 else [("B", 0, mb, r + 1)]
        return [("B", chunk, mb, r)]

    done: Dict[Tuple, float] = {}
    clock, busy, pos = [0.0] * p, [0.0] * p, [0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(labelled[r]):
                slot = labelled[r][pos[r]]
                needs = [d for op in slot for d in inputs(r, *op[:3])]
                if not all(d in done for d in needs):
                    break
                length = sum(op[3] for op in slot)
                clock[r] = max([clock[r]] + [done[d] for d in needs]) + length
                busy[r] += length
                for op in slot:
                    done[op[:3] + (r,)] = clock[r]
                pos[r] += 1
                moved = True
    assert all(pos[r] == len(labelled[r]) for r in range(p)), "the order of operations deadlocked"
    assert len(set(busy)) == 1
    return max(clock), busy[0]


@pytest.mark.parametrize("p,m", [(2, 4), (3, 9), (4, 8), (4, 10), (8, 20), (8, 37)])
@pytest.mark.parametrize("f", [1.0, 1.5])
def test_dualpipev_bubble_is_deepseeks_formula(p, m, f):
    """At the zero-bubble paper's equal times (forward, backward-for-inputs and weight pass each F) the walk
    idles exactly the README's figure. Away from them the README's formula is an idealisation: the walk
    gives e.g. 3.0 (p - 1) for F = 1, B = 2, W = 0.5 at p = 2 against the formula's 3.5 (p - 1)."""
    b, w = 2 * f, f
    makespan, busy = dualpipev_makespan(p, m, f, b, w)
    assert busy == pytest.approx(2 * m * (f + b))
    fb = f + b  # F&B: the overlapped pair, no faster than its parts in compute
    assert makespan - busy == pytest.approx((2 * p / 2 - 1) * (fb + b - 3 * w))


@pytest.mark.parametrize("p", [1, 2, 4, 8])
def test_dualpipev_bubble_stage_steps(p):
    """The plugin's unit: a rank's forward and backward of one micro-batch (two chunks, 2 (F + B)).

    With B = 2F (the time model's backward) and W = F (the zero-bubble split: the weight pass as long as
    the forward), the walk idles 2 (p - 1) F, a third of (p - 1) of those units; 1F1B idles p - 1.
    """
    m = 2 * max(p, 1) + 3
    makespan, busy = dualpipev_makespan(p, m, 1.0, 2.0, 1.0)
    unit = 2 * (1.0 + 2.0)
    got = float(_schedule("dualpipev").bubble_stage_steps(np.float64(p), np.float64(2), np.float64(m)))
    assert got == pytest.approx((makespan - busy) / unit)
    assert got == pytest.approx((p - 1) / 3)


def test_dualpipev_refuses_fewer_than_2p_micro_batches():
    from ndcost.errors import InvalidStrategy
    from test_memory import cost_model, llama_counts, llama_spec
    s = 1024
    cm = cost_model(llama_spec(), llama_counts(), s)
    with pytest.raises(InvalidStrategy, match=r"num_micro_batches >= 2 \* pp.*num_micro_batches=3 with pp=2"):
        cm.evaluate(Strategy.parse(f"pp=2,vpp=2,schedule=dualpipev,num_micro_batches=3,seq={s}"))
    cm.evaluate(Strategy.parse(f"pp=2,vpp=2,schedule=dualpipev,num_micro_batches=4,seq={s}"))


def test_dualpipev_memory_uses_the_counts_per_chunk():
    """Uneven chunks show the split: 8 layers as 4/1/1/2 over virtual stages 0..3.

    Rank 0 holds stages 0 (4 layers) and 3 (2 layers): 2p - 0 = 4 micro-batches of the first, 1 of the
    second, 4 * 4 + 1 * 2 = 18 layer-micro-batches; rank 1 holds stages 1 and 2 (1 layer each): 3 + 2 = 5.
    Without recompute at tp = 1 a layer keeps ``seq * (SAVED + SAVED_TP)`` bytes.
    """
    from test_memory import SAVED, SAVED_TP, cost_model, llama_counts, llama_spec
    s = 1024
    cm = cost_model(llama_spec(), llama_counts(), s)
    cost = cm.evaluate(Strategy.parse(f"pp=2,vpp=2,schedule=dualpipev,num_micro_batches=4,pp_layers=4/1/1/2,"
                                      f"seq={s}"))
    kept_layer = s * (SAVED + SAVED_TP)
    assert cost.stages[0].bytes_by_category["activations"] == 18 * kept_layer
    assert cost.stages[1].bytes_by_category["activations"] == 5 * kept_layer


# ---------------------------------------------------------------------------
# Megatron's interleaved 1F1B, walked to the end
# ---------------------------------------------------------------------------
def interleaved_slots(r: int, p: int, v: int, m: int) -> List[Slot]:
    total = m * v
    warmup = min((p - r - 1) * 2 + (v - 1) * p, total)

    def chunk(k, forward):
        c = (k // p) % v
        return c if forward else v - 1 - c

    slots: List[Slot] = [[("F", chunk(k, True))] for k in range(warmup)]
    for k in range(total - warmup):  # steady state: the forward, then the backward
        slots.append([("F", chunk(k + warmup, True))])
        slots.append([("B", chunk(k, False), False)])
    slots += [[("B", chunk(k, False), False)] for k in range(total - warmup, total)]
    return slots


@pytest.mark.parametrize("p,v,m", [(2, 2, 4), (2, 2, 8), (4, 2, 8), (4, 2, 16), (4, 3, 12), (8, 2, 16),
                                   (4, 2, 4), (3, 2, 6)])
def test_interleaved_matches_the_whole_walk(p, v, m):
    for r in range(p):
        maxima, at_peak, forwards, backwards = walk_held(interleaved_slots(r, p, v, m), v)
        assert forwards == backwards == [m] * v
        assert _plugin_counts("interleaved", p, v, m, r) == at_peak
        # the peak total is what the warm-up and one more forward leave: rank 0 holds p v + p - 1
        assert sum(at_peak) == min((p - r - 1) * 2 + (v - 1) * p + 1, m * v)
    if m % p == 0 and m * v >= p * v + p - 1:
        assert sum(_plugin_counts("interleaved", p, v, m, 0)) == p * v + p - 1


def test_interleaved_chunk_maxima_do_not_coincide():
    """Pinned limitation: in the steady state the chunks trade micro-batches, the total staying put.

    p = 2, v = 2, m = 4, rank 0: the peak snapshot is [3, 2] (forwards 0, 0, 1, 1, 0), but after the first
    backward (chunk 1) and the next forward (chunk 0) it holds [4, 1]. With equal layers per chunk the
    bytes are the same; with uneven ``pp_layers`` the plugin's snapshot can miss the worse split.
    """
    maxima, at_peak, _, _ = walk_held(interleaved_slots(0, 2, 2, 4), 2)
    assert at_peak == [3, 2] and maxima == [4, 2]
