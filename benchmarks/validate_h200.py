"""ndcost beside our own H200 measurements: whole training steps and single layers.

    python benchmarks/validate_h200.py [--json] [--census off|auto] [--only GLOB]

The rows: every whole step of ``tests/data/h200_measurements.json`` and ``tests/data/h200_qwen3_moe_steps.json``
(``models[]``, ``benchmarks/measure_cuda.py``'s ``measure_model``: one H200, micro-batch 1, fused AdamW) and every
layer of ``benchmarks/bench_time_h200.json`` (``benchmarks/bench_time.py``: forward, and forward plus backward).
A step is priced by ``ndcost.resolve(config, hardware=h200).evaluate(seq=..., recompute=full where
checkpointed, fp32 parameters computed in bf16 under autocast)``: ``step_seconds`` beside ``step_ms``, and
``peak_bytes`` beside ``max_allocated_during_step_bytes`` less what was allocated before the step beyond the
parameters and optimizer states (cuBLAS workspaces, the input ids: not the cost model's), as
tests/test_resolver.py and tests/test_resolver_moe_h200.py compare them. Reserved bytes are not measured in
these files ("not measured"). A layer is priced by ``ndcost.plugins.calibration.layer_times``, the figure
``ndcost calibrate`` fits. Each time is priced twice: under the shipped ``h200`` and under it with the launch
costs ndcost priced with before they were fitted ("prior": launch 2 us, dispatch 10 us, round figures; the
fitted dispatch is now every device's prior too, ``ndcost.kernels.PRIOR_DISPATCH_SECONDS``). The Spearman rank
correlation of predicted against measured time is over every time row, and
over the whole steps alone.

The layer timings include the launch-bound layers ``ndcost calibrate`` fitted dispatch on (llama3_8b@1024,
qwen3_30b_a3b_moe@4096) and the dense layers it fitted efficiencies on: only the whole steps are held out.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from typing import Any, Dict, List, Optional

import ndcost
from ndcost import manager
from ndcost.compose import time as time_model
from ndcost.plugins import calibration
from ndcost.specio import read_text

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from validate_torchtitan import spearman  # noqa: E402  (the same rank correlation)

ROOT = os.path.dirname(HERE)
STEPS = [os.path.join(ROOT, "tests", "data", name) for name in ("h200_measurements.json", "h200_qwen3_moe_steps.json")]
LAYERS = os.path.join(HERE, "bench_time_h200.json")
GIB = 2 ** 30
# the launch costs before the fit: round order-of-magnitude figures
UNFITTED_LAUNCH_SECONDS, UNFITTED_DISPATCH_SECONDS = 2.0e-6, 1.0e-5


def hardwares() -> Dict[str, Any]:
    """``prior``: the shipped h200 with the launch costs before the fit; ``fitted``: the shipped h200."""
    h200 = manager.registry().get("hardware/h200")
    prior = calibration.with_launch_costs(h200, UNFITTED_LAUNCH_SECONDS, UNFITTED_DISPATCH_SECONDS)
    return {"prior": prior, "fitted": h200}


def _error(predicted: float, measured: float) -> float:
    return predicted / measured - 1.0


def step_strategy(case: Dict[str, Any]) -> ndcost.Strategy:
    text = f"seq={case['seq']}"
    if case["checkpointing"]:
        text += ",recompute=full"
    if case["autocast_bf16"]:
        text += ",param_dtype=fp32,compute_dtype=bf16"
    return ndcost.Strategy.parse(text)


def evaluate_step(case: Dict[str, Any], source: str, census: str, hw: Dict[str, Any]) -> Dict[str, Any]:
    """One measured whole step beside ndcost's estimate of it."""
    strategy = step_strategy(case)
    costs = {name: ndcost.resolve(case["config"], hardware=h, census=census).evaluate(strategy)
             for name, h in hw.items()}
    untracked = case["allocated_before_step_bytes"] - case["param_bytes"] - case["optimizer_state_bytes"]
    measured_bytes = case["max_allocated_during_step_bytes"] - untracked
    measured_seconds = case["step_ms"] / 1e3
    out: Dict[str, Any] = {"row": f"step {case['case']}", "source": source, "measured_seconds": measured_seconds,
                           "measured_allocated_bytes": measured_bytes,
                           "max_allocated_during_step_bytes": case["max_allocated_during_step_bytes"],
                           "predicted_peak_bytes": costs["fitted"].peak_bytes,
                           "allocated_error": _error(costs["fitted"].peak_bytes, measured_bytes),
                           "measured_reserved_bytes": None, "reserved": "not measured"}
    for name, cost in costs.items():
        out[f"predicted_seconds_{name}"] = cost.time.step_seconds
        out[f"time_error_{name}"] = _error(cost.time.step_seconds, measured_seconds)
    return out


def evaluate_layers(census: str, hw: Dict[str, Any], only: Optional[str] = None) -> List[Dict[str, Any]]:
    """Each layer of bench_time_h200.json, forward and forward plus backward, beside the time model."""
    measurements, _, _ = calibration.read_measurements(LAYERS, census=census)
    h200 = hw["fitted"]
    eff = time_model.efficiencies(h200)[0]
    out = []
    for m in measurements:
        if only and not fnmatch.fnmatch(f"layer {m.label}", only):
            continue
        times = {name: calibration.layer_times(m, h, eff) for name, h in hw.items()}
        for label, measured, pick in (("forward", m.forward_seconds, lambda t: t[0]),
                                      ("forward+backward", m.forward_backward_seconds, lambda t: t[0] + t[1])):
            if measured is None:
                continue
            row: Dict[str, Any] = {"row": f"layer {m.label} {label}", "source": os.path.basename(LAYERS),
                                   "measured_seconds": measured}
            for name, t in times.items():
                row[f"predicted_seconds_{name}"] = pick(t)
                row[f"time_error_{name}"] = _error(pick(t), measured)
            out.append(row)
    return out


def evaluate(census: str = "auto", only: Optional[str] = None) -> Dict[str, Any]:
    hw = hardwares()
    rows = []
    for path in STEPS:
        for case in json.loads(read_text(path, "H200 measurements"))["models"]:
            if not only or fnmatch.fnmatch(f"step {case['case']}", only):
                rows.append(evaluate_step(case, os.path.relpath(path, ROOT), census, hw))
    steps = list(rows)
    rows += evaluate_layers(census, hw, only)
    measured = [r["measured_seconds"] for r in rows]
    return {"rows": rows, "census": census,
            "launch_costs": {name: dict(zip(("launch_seconds", "dispatch_seconds"), calibration.launch_costs_of(h),
                                            strict=True)) for name, h in hw.items()},
            "spearman_time": {name: spearman([r[f"predicted_seconds_{name}"] for r in rows], measured)
                              for name in hw},
            "spearman_time_steps": {name: spearman([r[f"predicted_seconds_{name}"] for r in steps],
                                                   [r["measured_seconds"] for r in steps]) for name in hw}}


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.1%}"


def render(result: Dict[str, Any]) -> str:
    from ndcost.cli import table

    costs = result["launch_costs"]
    lines = [f"ndcost beside our H200 measurements (census {result['census']}); time under the shipped h200 "
             f"(dispatch {costs['fitted']['dispatch_seconds'] * 1e6:.1f} us) and at the priors "
             f"(dispatch {costs['prior']['dispatch_seconds'] * 1e6:.1f} us)", ""]
    body = []
    for r in result["rows"]:
        allocated = ("" if "measured_allocated_bytes" not in r else
                     f"{r['predicted_peak_bytes'] / GIB:.3f} / {r['measured_allocated_bytes'] / GIB:.3f} GiB "
                     f"({_pct(r['allocated_error'])})")
        body.append([r["row"], f"{r['measured_seconds'] * 1e3:.3f}", f"{r['predicted_seconds_prior'] * 1e3:.3f}",
                     _pct(r["time_error_prior"]), f"{r['predicted_seconds_fitted'] * 1e3:.3f}",
                     _pct(r["time_error_fitted"]), allocated, r.get("reserved", "")])
    lines.append(table(body, ["row", "measured ms", "prior ms", "error", "fitted ms", "error",
                              "allocated: ndcost / measured", "reserved"], align="lrrrrrll"))
    def rho(key):
        return ", ".join(f"{name} {'-' if v is None else f'{v:.3f}'}" for name, v in result[key].items())

    lines += ["", f"Spearman rank correlation of predicted vs measured time over every row: {rho('spearman_time')}; "
              f"over the whole steps (held out of the fit): {rho('spearman_time_steps')}"]
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--census", default="auto", choices=("auto", "off"))
    parser.add_argument("--only", default=None, metavar="GLOB", help="only the rows whose name matches, "
                        "e.g. 'step small_llama_bf16' or 'layer llama3_8b@1024*'")
    args = parser.parse_args(argv)
    try:
        result = evaluate(args.census, args.only)
    except ndcost.errors.NdcostError as exc:
        print(f"validate_h200: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
