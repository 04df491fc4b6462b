"""benchmarks/validate_h200.py: its figures are ndcost's own and the data files' (consistency, not constants)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ndcost
from ndcost.compose import time as time_model
from ndcost.plugins import calibration as cal

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "validate_h200.py"
STEP = json.loads((ROOT / "tests" / "data" / "h200_measurements.json").read_text())["models"][0]


def _run(*args):
    done = subprocess.run([sys.executable, str(SCRIPT), "--census", "off", *args], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_one_step_row_is_ndcosts_estimate_beside_the_measurement(registry):
    # measure_steps.py's tests/data/h200_steps.json, where present, holds a step of the same name
    (row,) = [r for r in json.loads(_run("--json", "--only", f"step {STEP['case']}"))["rows"]
              if r["source"] == "tests/data/h200_measurements.json"]
    assert row["measured_seconds"] == STEP["step_ms"] / 1e3
    assert row["max_allocated_during_step_bytes"] == STEP["max_allocated_during_step_bytes"]
    untracked = STEP["allocated_before_step_bytes"] - STEP["param_bytes"] - STEP["optimizer_state_bytes"]
    assert row["measured_allocated_bytes"] == STEP["max_allocated_during_step_bytes"] - untracked
    assert row["reserved"] == "not measured" and row["measured_reserved_bytes"] is None
    h200 = registry.get("hardware/h200")
    strategy = ndcost.Strategy.parse(f"seq={STEP['seq']}")
    cost = ndcost.resolve(STEP["config"], hardware=h200, census="off").evaluate(strategy)
    assert row["predicted_peak_bytes"] == cost.peak_bytes
    assert row["predicted_seconds_fitted"] == cost.time.step_seconds
    prior = cal.with_launch_costs(h200, 2.0e-6, 1.0e-5)  # "prior": the round figures before the fit
    at_prior = ndcost.resolve(STEP["config"], hardware=prior, census="off").evaluate(strategy)
    assert row["predicted_seconds_prior"] == at_prior.time.step_seconds
    assert row["time_error_fitted"] == pytest.approx(cost.time.step_seconds / row["measured_seconds"] - 1)


def test_one_layer_row_prints_the_benchmarks_figures(registry):
    text = _run("--only", "layer llama3_8b@1024*")
    bench = next(m for m in json.loads((ROOT / "benchmarks" / "bench_time_h200.json").read_text())["measurements"]
                 if m["case"] == "llama3_8b@1024")
    measured, _, _ = cal.read_measurements(str(ROOT / "benchmarks" / "bench_time_h200.json"), census="off")
    m = next(x for x in measured if x.label == "llama3_8b@1024")
    h200 = registry.get("hardware/h200")
    fwd, bwd = cal.layer_times(m, h200, time_model.efficiencies(h200)[0])
    lines = {line.split("  ")[0]: line.split() for line in text.splitlines() if line.startswith("layer ")}
    forward = lines["layer llama3_8b@1024 forward"]
    assert forward[3] == f"{bench['forward_ms']:.3f}" and forward[6] == f"{fwd * 1e3:.3f}"
    both = lines["layer llama3_8b@1024 forward+backward"]
    assert both[3] == f"{bench['forward_backward_ms']:.3f}" and both[6] == f"{(fwd + bwd) * 1e3:.3f}"
    assert "Spearman" in text
