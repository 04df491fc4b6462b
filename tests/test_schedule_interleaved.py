"""The interleaved schedule's idle time with fewer micro-batches than pipeline ranks, or a count not a multiple of
them.

With ``m <= p`` every rank runs its forwards chunk by chunk, then its backwards (Megatron-LM's warm-up covers
them all; torch's Interleaved1F1B runs one round of ``m``); other counts run in torch's rounds. Each op waits for
its micro-batch's neighbouring virtual stage. The walk below times that order op by op, independently of the
closed form the schedule states.
"""
from __future__ import annotations

import numpy as np
import pytest

import ndcost
from ndcost.manager import registry


def makespan(p, v, m):
    """The step of ``m`` micro-batches over ``p`` ranks of ``v`` chunks each, all forwards chunk by chunk then
    all backwards (:func:`walk`: each chunk a ``1 / v`` share of a rank's forward and backward of a micro-batch)."""
    order = {r: [("f", c * p + r, i) for c in range(v) for i in range(m)]
             + [("b", c * p + r, i) for c in reversed(range(v)) for i in range(m)] for r in range(p)}
    step = walk(order, p, v)
    assert step is not None
    return step


def torch_order(p, v, m, rank):
    """Rank *rank*'s ops in torch's ScheduleInterleaved1F1B (torch/distributed/pipelining/schedules.py,
    ``_calculate_single_rank_operations``): ``max(1, m // p)`` rounds of ``g = m // rounds`` micro-batches, a warm-up
    of ``(v - 1) g + 2 (p - 1 - rank)`` forwards, then a forward and a backward each step, then the backwards;
    forward ``k`` on chunk ``(k // g) % v``, backward ``k`` on chunk ``v - 1 - (k // g) % v``."""
    group = m // max(1, m // p)
    warmup = min((v - 1) * group + 2 * (p - 1 - rank), m * v)

    def op(kind, k):
        chunk = (k // group) % v
        return kind, (chunk if kind == "f" else v - 1 - chunk) * p + rank, (k // (group * v)) * group + k % group
    steady = m * v - warmup
    return ([op("f", k) for k in range(warmup)] + [x for j in range(steady) for x in (op("f", warmup + j), op("b", j))]
            + [op("b", k) for k in range(steady, m * v)])


def walk(order, p, v, forward=1.0, backward=2.0):
    """Each rank's ops in *order* timed one after another, each waiting for its micro-batch's neighbouring virtual
    stage; the step, or None where the order deadlocks."""
    last = p * v - 1
    done = {}
    free, at = dict.fromkeys(range(p), 0.0), dict.fromkeys(range(p), 0)
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while at[r] < len(order[r]):
                kind, stage, i = order[r][at[r]]
                if kind == "f":
                    ready = 0.0 if stage == 0 else done.get(("f", stage - 1, i))
                else:
                    ready = done.get(("f", last, i)) if stage == last else done.get(("b", stage + 1, i))
                if ready is None:
                    break
                free[r] = done[kind, stage, i] = max(free[r], ready) + (forward if kind == "f" else backward) / v
                at[r] += 1
                moved = True
    return max(free.values()) if all(at[r] == len(order[r]) for r in range(p)) else None


@pytest.mark.parametrize("p, v, m", [(4, 2, 3), (4, 2, 6), (4, 2, 10), (8, 2, 12), (4, 3, 6), (2, 2, 3), (4, 4, 16)])
def test_interleaved_idle_time_is_torchs_order(p, v, m):
    # micro-batch counts not a multiple of the ranks run in torch's rounds: the same idle time as the closed form
    step = walk({r: torch_order(p, v, m, r) for r in range(p)}, p, v)
    got = float(registry().get("schedule/interleaved").bubble_stage_steps(np.float64(p), np.float64(v),
                                                                          np.float64(m)))
    assert got == pytest.approx((step - m * 3.0) / 3.0)


def test_a_count_torchs_rounds_cannot_run_is_refused():
    # 5 micro-batches over 2 ranks: 2 rounds of 2, one left over; torch refuses it, and its order deadlocks
    assert walk({r: torch_order(2, 2, 5, r) for r in range(2)}, 2, 2) is None
    model = ndcost.resolve("llama-3.1-8b", hardware="h200", census="off")
    with pytest.raises(ndcost.InvalidStrategy, match="num_micro_batches=5 is not a multiple of its rounds"):
        model.evaluate("pp=2,vpp=2,schedule=interleaved,num_micro_batches=5,seq=4096")


@pytest.mark.parametrize("p, v, m", [(4, 2, 1), (4, 2, 2), (4, 2, 3), (4, 2, 4), (8, 4, 2), (8, 4, 5), (8, 2, 8)])
def test_interleaved_idle_time_is_the_walks(p, v, m):
    idle = (makespan(p, v, m) - m * 3.0) / 3.0  # in a rank's forward and backward of one micro-batch
    for name in ("interleaved", "interleaved-a2a-overlap"):
        got = float(registry().get(f"schedule/{name}").bubble_stage_steps(np.float64(p), np.float64(v),
                                                                          np.float64(m)))
        assert got == pytest.approx(idle)


def test_one_micro_batch_interleaved_idles_as_1f1b():
    """One micro-batch is a chain through every layer: no schedule hides it."""
    model = ndcost.resolve("llama-3.1-8b", hardware="h200", census="off")
    plain = model.evaluate("pp=8,seq=4096").time
    chunks = model.evaluate("pp=8,vpp=4,schedule=interleaved,seq=4096").time
    assert chunks.bubble_seconds == pytest.approx(plain.bubble_seconds, rel=1e-9)


@pytest.mark.parametrize("schedule, layout", [("1f1b-a2a-overlap", ""), ("interleaved-a2a-overlap", "pp=2,vpp=2,")])
def test_the_all_to_all_overlap_refuses_full_recompute(schedule, layout):
    model = ndcost.resolve("qwen3-30b-a3b", hardware="h200", census="off")
    strategy = f"dp=8,ep=8,{layout}schedule={schedule},num_micro_batches=4,seq=4096"
    assert model.evaluate(strategy + ",recompute=selective").valid
    with pytest.raises(ndcost.InvalidStrategy, match=rf"schedule {schedule} with recompute=full: its trainer "
                                                     r"refuses the two together"):
        model.evaluate(strategy + ",recompute=full")
