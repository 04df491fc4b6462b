"""The interleaved schedule's idle time with fewer micro-batches than pipeline ranks.

With ``m <= p`` every rank runs its forwards chunk by chunk, then its backwards (Megatron-LM's warm-up covers
them all; torch's Interleaved1F1B runs one round of ``m``), and each op waits for its micro-batch's previous
virtual stage. The walk below times that order op by op, independently of the closed form the schedule states.
"""
from __future__ import annotations

import numpy as np
import pytest

import ndcost
from ndcost.manager import registry


def makespan(p, v, m, forward=1.0, backward=2.0):
    """The step of ``m`` micro-batches over ``p`` ranks of ``v`` chunks each, all forwards chunk by chunk then
    all backwards, each chunk a ``1 / v`` share of a rank's forward and backward of a micro-batch."""
    last = p * v - 1
    done = {}
    order = {r: [("f", c * p + r, i) for c in range(v) for i in range(m)]
             + [("b", c * p + r, i) for c in reversed(range(v)) for i in range(m)] for r in range(p)}
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
    assert all(at[r] == len(order[r]) for r in range(p))
    return max(free.values())


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
