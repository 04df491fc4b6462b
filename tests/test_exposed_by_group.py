"""The exposed communication by group (``exposed_{tp,cp,ep,fsdp,dp,pp}_seconds``): its parts add up to
``exposed_communication_seconds`` on every strategy of a random grid, and a group a strategy does not form
exposes nothing (a group of one rank runs no collective)."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import ndcost
from ndcost.values import EXPOSED_GROUPS

FIELDS = [f"exposed_{g}_seconds" for g in EXPOSED_GROUPS]


def _grid(n: int, moe: bool, seed: int = 0) -> dict:
    """A random grid of strategies over the fields that form groups and hide or expose their collectives."""
    rng = np.random.default_rng(seed)
    pp = rng.choice([1, 2, 4], n)
    interleaved = (pp > 1) & (rng.random(n) < 0.3)
    fsdp = np.where(rng.random(n) < 0.3, rng.choice([2, 4, 8], n), 1)
    return {"tp": rng.choice([1, 2, 4, 8], n), "pp": pp, "vpp": np.where(interleaved, 2, 1),
            "schedule": np.where(interleaved, "interleaved", "1f1b"), "dp": rng.choice([1, 2, 4], n),
            "fsdp": fsdp, "zero": np.where(fsdp > 1, 0, rng.choice([0, 1, 2, 3], n)), "cp": rng.choice([1, 2], n),
            "ep": rng.choice([1, 2, 4], n) if moe else np.ones(n, dtype=np.int64), "sp": rng.random(n) < 0.5,
            "seq": np.full(n, 4096), "num_micro_batches": rng.choice([1, 4, 8], n),
            "recompute": rng.choice(["none", "full", "selective"], n),
            "gradient_sync": rng.choice(["auto", "every_micro_batch"], n)}


@pytest.mark.parametrize("name", ["llama-3.1-8b", "deepseek-v3", "qwen3-30b-a3b"])
def test_the_groups_add_up_to_the_exposed_communication(name):
    model = ndcost.resolve(name, census="off")
    grid = _grid(3000, bool(model.tables.num_experts))
    batch = model.evaluate_many(grid)
    valid = batch.valid
    assert np.count_nonzero(valid) > 100
    parts = np.array([batch.time[f][valid] for f in FIELDS])
    assert (parts >= 0).all()
    np.testing.assert_allclose(parts.sum(axis=0), batch.time["exposed_communication_seconds"][valid],
                               rtol=1e-9, atol=1e-12)
    # a group exposes something on some row of the grid that forms it (DeepSeek-V3's 61 layers take no even
    # pipeline: no row of it has one)
    g = {k: np.asarray(v)[valid] for k, v in grid.items()}
    formed = [g["tp"] > 1, g["cp"] > 1, g["ep"] > 1, (g["fsdp"] > 1) | (g["zero"] == 3),
              g["dp"] * g["fsdp"] * g["cp"] > 1, g["pp"] > 1]
    assert [bool(np.count_nonzero(p)) for p in parts] == [bool(f.any()) for f in formed]


@pytest.mark.parametrize("strategy, only", [
    ("dp=8,seq=4096", "dp"),                                  # DDP: the gradients' all-reduce alone
    ("tp=8,seq=4096", "tp"),                                  # one replica: TP's all-reduces alone
    ("fsdp=8,seq=4096", "fsdp"),                              # FSDP's gathers and reduce-scatters
    ("pp=4,num_micro_batches=8,seq=4096", "pp"),              # the pipeline's sends
    ("cp=8,seq=32768", "cp"),                                 # ring attention's K/V exchanges
])
def test_a_strategy_of_one_group_exposes_only_its_own(strategy, only):
    time = ndcost.resolve("llama-3.1-8b", census="off").evaluate(strategy).time
    by_group = {g: getattr(time, f"exposed_{g}_seconds") for g in EXPOSED_GROUPS}
    assert {g for g, seconds in by_group.items() if seconds != 0.0} <= {only}
    assert by_group[only] == pytest.approx(time.exposed_communication_seconds, rel=1e-12)


def test_estimate_names_the_groups_the_step_waits_for():
    done = subprocess.run([sys.executable, "-m", "ndcost", "estimate", "deepseek-v3", "--census", "off",
                           "--strategy", "tp=8,ep=32,dp=4,pp=8,pp_layers=7/8/8/8/8/8/8/6,num_micro_batches=16,"
                                         "seq=4096"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if "exposed communication by group:" in line)
    assert all(f"{g} " in line for g in ("tp", "ep", "dp", "pp")) and "fsdp" not in line and "cp " not in line


@pytest.mark.parametrize("seconds, most", [
    ({"tp": 0.1, "ep": 0.3, "fsdp": 0.2}, "ep"),
    ({"dp": 0.2, "pp": 0.2}, "dp"),                 # the first of equals, in EXPOSED_GROUPS' order
    ({"tp": 0.0, "cp": None}, ""),                  # none exposes any
    ({}, ""),
])
def test_the_group_exposing_the_most(seconds, most):
    from ndcost.values import most_exposed
    assert most_exposed(seconds) == most
