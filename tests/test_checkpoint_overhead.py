"""Activation checkpointing's host work on the launch floor (compose/time.py ``_launch_bound``), and the script
that measures it (benchmarks/measure_checkpoint_overhead.py).

The expected floors are derived by hand: the tiny Llama's 38 forward launches (Transformers' eager
LlamaDecoderLayer, counted in tests/test_time_kernels.py) at the 38.1 us dispatch prior, times the ratios
measured on Transformers' layers (benchmarks/data/checkpoint_overhead.json, checked against the constants here):
full checkpoint's forward 1.50 and recompute 1.90 plain forwards, selective's 3.67 and 3.49,
core_attention's 15.3 and 24.7 plain ops a layer.
"""
from __future__ import annotations

import io
import json
import os
import statistics
import sys
from contextlib import redirect_stdout

import attrs
import pytest

from ndcost.compose import time as ct
from ndcost.plugins.estimators import flops as analytic
from ndcost.values import LayerGroup, ModelSpec, Strategy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DISPATCH = 3.81e-5  # ndcost.kernels.PRIOR_DISPATCH_SECONDS, the H200's fitted figure
LAUNCHES = 38       # the tiny Llama layer's forward


@pytest.fixture(scope="module")
def h200(registry):
    return registry.get("hardware/h200")


def tiny_llama(layers=2):
    from ndcost.layer import LayerKind
    return ModelSpec(name="tiny-llama", model_type="llama", family="llama", hidden_size=64, vocab_size=128,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=256, kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")})


def _layer(hardware, **fields):
    work = analytic.model_work(tiny_llama(), 16)
    return ct.layer_seconds(work, ct.strategy_columns([Strategy(**{"seq": 16, **fields})]), hardware)


def test_a_plain_layer_keeps_its_floor(h200):
    plain = _layer(h200)
    assert plain["forward"][0, 0] == plain["checkpointed_forward"][0, 0] == pytest.approx(LAUNCHES * DISPATCH,
                                                                                         rel=1e-12)
    assert plain["backward"][0, 0] == pytest.approx(2 * LAUNCHES * DISPATCH, rel=1e-12)
    assert plain["recompute"][0, 0] == 0.0


@pytest.mark.parametrize("mode, forward, recompute", [
    ("full", LAUNCHES * DISPATCH * 1.50, LAUNCHES * DISPATCH * 1.90),
    ("selective", LAUNCHES * DISPATCH * 3.67, LAUNCHES * DISPATCH * 3.49),
    ("core_attention", (LAUNCHES + 15.3) * DISPATCH, 24.7 * DISPATCH),
])
def test_a_dispatch_bound_checkpointed_layer_pays_checkpoints_host_work(h200, mode, forward, recompute):
    layer = _layer(h200, recompute=mode)
    assert layer["checkpointed_forward"][0, 0] == pytest.approx(forward, rel=1e-12)
    assert layer["recompute"][0, 0] == pytest.approx(recompute, rel=1e-12)
    # the plain passes are the same: only the layers that checkpoint pay (a row's recompute_layers share)
    assert layer["forward"][0, 0] == pytest.approx(LAUNCHES * DISPATCH, rel=1e-12)
    assert layer["backward"][0, 0] == pytest.approx(2 * LAUNCHES * DISPATCH, rel=1e-12)


def test_compiled_checkpoint_runs_no_hooks(h200):
    """Under torch.compile the checkpoint is traced into the graph: a full recompute at the plain forward's floor."""
    layer = _layer(h200, recompute="full", compile=True)
    assert layer["checkpointed_forward"][0, 0] == pytest.approx(LAUNCHES * DISPATCH, rel=1e-12)
    assert layer["recompute"][0, 0] == pytest.approx(LAUNCHES * DISPATCH, rel=1e-12)


def test_a_long_backward_hides_the_recomputes_host_work(h200):
    """A layer of width 2048 at 8192 tokens: the GPU's work outlasts the host's, a full recompute is the forward's
    roofline again."""
    spec = attrs.evolve(tiny_llama(), hidden_size=2048, intermediate_size=8192, num_attention_heads=16,
                        num_key_value_heads=8, head_dim=128)
    work = analytic.model_work(spec, 8192)
    layer = ct.layer_seconds(work, ct.strategy_columns([Strategy(seq=8192, recompute="full")]), h200)
    assert layer["forward"][0, 0] > LAUNCHES * DISPATCH * 1.90
    assert layer["recompute"][0, 0] == pytest.approx(layer["forward"][0, 0], rel=1e-12)
    assert layer["checkpointed_forward"][0, 0] == layer["forward"][0, 0]


def test_only_the_recomputed_layers_pay(h200):
    """Two layers on one rank: recomputing one of them adds one layer's checkpointed forward and recompute, by hand
    (0.50 + 1.90) x 38 x 38.1 us; recomputing both, twice that."""
    work = analytic.model_work(tiny_llama(), 16)
    rows = [Strategy(seq=16), Strategy(seq=16, recompute="full", recompute_layers=1),
            Strategy(seq=16, recompute="full")]
    compute = ct.step_time(work, rows, h200).compute_seconds
    one = (0.50 + 1.90) * LAUNCHES * DISPATCH
    assert compute[1] - compute[0] == pytest.approx(one, rel=1e-9)
    assert compute[2] - compute[0] == pytest.approx(2 * one, rel=1e-9)


def test_the_constants_are_the_measured_layers_mean():
    """CHECKPOINT_HOST_RATIOS and CORE_ATTENTION_HOST_OPS round the CPU rows' mean of the shipped measurement."""
    with open(os.path.join(ROOT, "benchmarks", "data", "checkpoint_overhead.json"), encoding="utf-8") as f:
        doc = json.load(f)
    rows = [r for r in doc["rows"] if r["device"] == "cpu"]
    assert {r["layer"] for r in rows} == {"llama", "qwen3_moe"}
    for mode, (forward, recompute) in ct.CHECKPOINT_HOST_RATIOS.items():
        measured_f = [r["modes"][mode]["forward_host_ratio"] for r in rows]
        measured_r = [r["modes"][mode]["recompute_host_ratio"] for r in rows]
        assert forward == pytest.approx(statistics.mean(measured_f), abs=0.01)
        assert recompute == pytest.approx(statistics.mean(measured_r), abs=0.01)
        assert all(abs(m / forward - 1) < 0.1 for m in measured_f)
        assert all(abs(m / recompute - 1) < 0.1 for m in measured_r)
    ops_f = [(r["modes"]["core_attention"]["forward_host_ratio"] - 1) * r["forward_ops"] for r in rows]
    ops_r = [r["modes"]["core_attention"]["recompute_host_ratio"] * r["forward_ops"] for r in rows]
    assert ct.CORE_ATTENTION_HOST_OPS[0] == pytest.approx(statistics.mean(ops_f), abs=0.5)
    assert ct.CORE_ATTENTION_HOST_OPS[1] == pytest.approx(statistics.mean(ops_r), abs=0.5)


@pytest.mark.slow
def test_the_script_measures_a_tiny_layer():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import measure_checkpoint_overhead as script
    finally:
        sys.path.pop(0)
    out = io.StringIO()
    with redirect_stdout(out):
        assert script.main(["--tiny", "--device", "cpu", "--layers", "llama", "--json"]) == 0
    doc = json.loads(out.getvalue())
    assert {"torch", "transformers", "machine"} <= set(doc["provenance"])
    (row,) = doc["rows"]
    assert row["layer"] == "llama" and row["device"] == "cpu"
    assert row["forward_ops"] == LAUNCHES and row["backward_ops"] > row["forward_ops"] and row["saved_tensors"] > 0
    assert set(row["modes"]) == {"plain", "full", "selective", "core_attention"}
    for mode in ("full", "selective", "core_attention"):
        # checkpoint's own host work is positive: beyond the plain step (and, under full, the forward it reruns)
        assert row["modes"][mode]["overhead_ops"] > 0, (mode, row["modes"][mode])
