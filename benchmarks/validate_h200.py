"""ndcost beside our own H200 measurements: whole training steps and single layers.

    python benchmarks/validate_h200.py [--json] [--census off|auto] [--only GLOB] [--steps FILE ...]

The rows: every whole step of ``tests/data/h200_measurements.json`` and ``tests/data/h200_qwen3_moe_steps.json``
(``models[]``, ``benchmarks/measure_cuda.py``'s ``measure_model``: one H200, micro-batch 1, fused AdamW) and of
``tests/data/h200_steps.json`` where present (``benchmarks/measure_steps.py``'s ``steps[]``: every family, each
step in a fresh process, reserved bytes too), or of the ``--steps`` files in their place; every layer of
``benchmarks/bench_time_h200.json`` (``benchmarks/bench_time.py``: forward, and forward plus backward); and every
layer ``tests/data/h200_measurements.json`` timed (``layers[]``, ``measure_cuda.py``'s: ten families' layers at
4,096 tokens under Transformers 5.17, forward and forward plus backward), held out of every fit.
A step is priced by ``ndcost.resolve(config, runtime, hardware=h200).evaluate(strategy)``, the strategy and the
runtime read off what the step ran (:func:`step_strategy`, :func:`step_runtime`): ``step_seconds`` beside
``step_ms``, and ``peak_bytes`` beside ``max_allocated_during_step_bytes`` less what was allocated before the
step beyond the parameters and optimizer states (cuBLAS workspaces, the input ids: not the cost model's), as
tests/test_resolver.py and tests/test_resolver_moe_h200.py compare them. ``reserved_bytes`` (what the caching
allocator holds at the step's peak, parameters and optimizer states included: ``compose/memory.py``
``_reserved``) is set beside ``max_reserved_during_step_bytes`` (a steady-state step, nothing emptied before it,
in a process of its own) less the same untracked bytes, taken off as reserving what they allocate: cuBLAS's
workspaces (2 x 32 MiB) are large-pool requests of 2 MiB multiples, segments of exactly their size; the small
rest (the input ids) shares the small pool's 2 MiB segments, an error under 2 MiB. The ``measure_cuda.py``
files hold no reserved figure ("not measured"); a step whose reserved ndcost does not claim (``--census off``,
the formulas) says why. A layer is priced by ``ndcost.plugins.calibration.layer_times``, the figure
``ndcost calibrate`` fits. Each time is priced twice: under the shipped ``h200`` and under it with the launch
costs ndcost priced with before they were fitted ("prior": launch 2 us, dispatch 10 us, round figures; the
fitted dispatch is now every device's prior too, ``ndcost.kernels.PRIOR_DISPATCH_SECONDS``). The Spearman rank
correlation of predicted against measured time is over every time row, and
over the whole steps alone.

The layer timings of bench_time_h200.json include the launch-bound layers ``ndcost calibrate`` fitted dispatch on
(llama3_8b@1024, qwen3_30b_a3b_moe@4096) and the dense layers it fitted efficiencies on; the whole steps and the
layers of h200_measurements.json (rows ``held-out layer``) are held out.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from typing import Any, Dict, List, Optional, Tuple

import ndcost
from ndcost import manager
from ndcost.compose import time as time_model
from ndcost.errors import InvalidStrategy
from ndcost.plugins import calibration
from ndcost.specio import read_text

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from validate_torchtitan import spearman  # noqa: E402  (the same rank correlation)

ROOT = os.path.dirname(HERE)
STEPS = [os.path.join(ROOT, "tests", "data", name) for name in ("h200_measurements.json", "h200_qwen3_moe_steps.json")]
# benchmarks/measure_steps.py's whole steps, read with STEPS where the file is present
MEASURED_STEPS = os.path.join(ROOT, "tests", "data", "h200_steps.json")
STEPS_FORMAT = "ndcost-step-measurements"
DTYPES = {"bfloat16": "bf16", "float32": "fp32"}
LAYERS = os.path.join(HERE, "bench_time_h200.json")
HELD_OUT_LAYERS = os.path.join(ROOT, "tests", "data", "h200_measurements.json")
GIB = 2 ** 30
# the launch costs before the fit: round order-of-magnitude figures
UNFITTED_LAUNCH_SECONDS, UNFITTED_DISPATCH_SECONDS = 2.0e-6, 1.0e-5


def hardwares() -> Dict[str, Any]:
    """``prior``: the shipped h200 with the launch costs before the fit; ``fitted``: the shipped h200."""
    h200 = manager.registry().get("hardware/h200")
    prior = calibration.with_launch_costs(h200, UNFITTED_LAUNCH_SECONDS, UNFITTED_DISPATCH_SECONDS)
    return {"prior": prior, "fitted": h200}


def _error(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    return None if measured is None or predicted is None else predicted / measured - 1.0


def step_strategy(case: Dict[str, Any]) -> ndcost.Strategy:
    """ndcost's strategy for what a measured step ran (measure_cuda.py's or measure_steps.py's record)."""
    needed = ("case", "seq", "param_dtype", "autocast_bf16", "config") + (
        ("allocated_before_step_bytes", "param_bytes", "optimizer_state_bytes")
        if case.get("max_allocated_during_step_bytes") is not None else ())
    missing = [k for k in needed if k not in case]
    if missing or ("recompute" not in case and "checkpointing" not in case):
        raise ndcost.errors.InvalidValue(
            f"step {case.get('case', '?')}: no {', '.join(missing) or 'recompute (or checkpointing)'} in its "
            f"record; give a file written by benchmarks/measure_steps.py or measure_cuda.py")
    recompute = case["recompute"] if "recompute" in case else ("full" if case["checkpointing"] else "none")
    dtype = DTYPES.get(case["param_dtype"])
    if dtype is None or case.get("micro_batch", 1) != 1 or case.get("optimizer", "adamw") != "adamw":
        raise ndcost.errors.InvalidValue(
            f"step {case['case']}: param_dtype {case['param_dtype']!r}, micro_batch {case.get('micro_batch')!r}, "
            f"optimizer {case.get('optimizer')!r}: the script prices bfloat16 or float32 parameters, micro-batch 1, "
            f"AdamW (what measure_cuda.py and measure_steps.py run)")
    text = f"seq={case['seq']},micro_batch=1,optimizer=adamw,recompute={recompute},param_dtype={dtype}"
    if case["autocast_bf16"]:
        text += ",compute_dtype=bf16"
    return ndcost.Strategy.parse(text)


def step_runtime(case: Dict[str, Any]) -> str:
    """The runtime profile of the attention a step ran: eager asked for is hf-cuda-eager; Transformers' pick
    (SDPA where the model has it, else eager) is hf-cuda, whose fallback is eager."""
    return "hf-cuda-eager" if case.get("attention_asked") == "eager" else "hf-cuda"


def _untracked_bytes(case: Dict[str, Any]) -> int:
    """What was allocated before the step beyond the parameters and optimizer states (not the cost model's)."""
    return case["allocated_before_step_bytes"] - case["param_bytes"] - case["optimizer_state_bytes"]


def evaluate_step(case: Dict[str, Any], source: str, census: str, hw: Dict[str, Any]) -> Dict[str, Any]:
    """One measured whole step beside ndcost's estimate of it (measured figures None where not measured)."""
    strategy, runtime = step_strategy(case), step_runtime(case)
    untracked = None if case.get("max_allocated_during_step_bytes") is None else _untracked_bytes(case)
    measured_bytes = None if untracked is None else case["max_allocated_during_step_bytes"] - untracked
    measured_seconds = case["step_ms"] / 1e3 if case.get("step_ms") is not None else None
    out: Dict[str, Any] = {"row": f"step {case['case']}", "source": source, "strategy": str(strategy),
                           "runtime": runtime, "measured_seconds": measured_seconds,
                           "measured_allocated_bytes": measured_bytes,
                           "max_allocated_during_step_bytes": case.get("max_allocated_during_step_bytes"),
                           "alloc_conf": case.get("alloc_conf")}
    try:
        costs = {name: ndcost.resolve(case["config"], runtime=runtime, hardware=h, census=census).evaluate(strategy)
                 for name, h in hw.items()}
    except InvalidStrategy as exc:  # refused (a figure ndcost cannot price here): no prediction, and why
        out.update(predicted_peak_bytes=None, allocated_error=None, predicted_reserved_bytes=None,
                   reserved_error=None, refused=str(exc).split(": ", 1)[-1],
                   reserved="refused: " + ": ".join(str(exc).split(": ")[1:3]))
        for name in hw:
            out[f"predicted_seconds_{name}"] = out[f"time_error_{name}"] = None
        return out
    fitted = costs["fitted"]
    out.update(predicted_peak_bytes=fitted.peak_bytes, allocated_error=_error(fitted.peak_bytes, measured_bytes))
    out.update(_reserved_row(case, fitted, untracked))
    for name, cost in costs.items():  # time None where ndcost leaves it unpriced (the provenance says why)
        seconds = None if cost.time is None else cost.time.step_seconds
        out[f"predicted_seconds_{name}"] = seconds
        out[f"time_error_{name}"] = _error(seconds, measured_seconds)
    if fitted.time is None:
        out["time_unpriced"] = str((fitted.provenance.get("time") or {}).get("unpriced", "time unpriced"))
    return out


def _reserved_row(case: Dict[str, Any], cost: Any, untracked: Optional[int]) -> Dict[str, Any]:
    """ndcost's reserved_bytes beside the step's max_memory_reserved less the untracked bytes (module docstring)."""
    peak = case.get("max_reserved_during_step_bytes")
    measured = None if peak is None or untracked is None else peak - untracked
    emptied = (case.get("after_empty_cache") or {}).get("max_reserved_during_step_bytes")
    out = {"max_reserved_during_step_bytes": peak, "measured_reserved_bytes": measured,
           # the same step after torch.cuda.empty_cache() (measure_cuda.py's order), beside it for reference
           "measured_reserved_after_empty_cache_bytes": None if emptied is None or untracked is None
           else emptied - untracked,
           "predicted_reserved_bytes": cost.reserved_bytes,
           "reserved_error": None if cost.reserved_bytes is None else _error(cost.reserved_bytes, measured)}
    if measured is None:
        out["reserved"] = "not measured"
    elif cost.reserved_bytes is None:
        out["reserved"] = f"- / {_gib(measured)} GiB (not claimed: {cost.reserved_reason})"
    else:
        out["reserved"] = f"{_gib(cost.reserved_bytes)} / {_gib(measured)} GiB ({_pct(out['reserved_error'])})"
    if case.get("alloc_conf"):
        out["reserved"] += f" [{case['alloc_conf']}: ndcost prices the default allocator]"
    return out


def read_steps(path: str) -> Tuple[List[Dict[str, Any]], List[Dict[str, Any]]]:
    """The measured steps of *path* (either script's file), and measure_steps.py's records that are not steps."""
    text = read_text(path, "H200 step measurements")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ndcost.errors.InvalidValue(f"H200 step measurements {path}: not JSON ({exc}); give "
                                         f"benchmarks/measure_steps.py's or measure_cuda.py's output") from None
    if not isinstance(doc, dict):
        raise ndcost.errors.InvalidValue(f"H200 step measurements {path}: a JSON object is expected")
    if doc.get("format") != STEPS_FORMAT:
        return list(doc.get("models", [])), []
    records = doc.get("steps", [])
    steps = [r for r in records if r.get("kind") == "step" and r.get("status") == "ok"]
    return steps, [r for r in records if r not in steps]


def evaluate_layers(census: str, hw: Dict[str, Any], only: Optional[str] = None) -> List[Dict[str, Any]]:
    """Each layer of bench_time_h200.json and of h200_measurements.json (held out), forward and forward plus
    backward, beside the time model."""
    h200 = hw["fitted"]
    eff = time_model.efficiencies(h200)[0]
    out = []
    for path, prefix in ((LAYERS, "layer"), (HELD_OUT_LAYERS, "held-out layer")):
        measurements, _, _ = calibration.read_measurements(path, census=census)
        for m in measurements:
            if not only or fnmatch.fnmatch(f"{prefix} {m.label}", only):
                out += _layer_rows(m, prefix, os.path.relpath(path, ROOT), hw, eff)
    return out


def _layer_rows(m: Any, prefix: str, source: str, hw: Dict[str, Any], eff: Dict[str, float]) -> List[Dict[str, Any]]:
    times = {name: calibration.layer_times(m, h, eff) for name, h in hw.items()}
    out = []
    for label, measured, pick in (("forward", m.forward_seconds, lambda t: t[0]),
                                  ("forward+backward", m.forward_backward_seconds, lambda t: t[0] + t[1])):
        if measured is not None:
            row: Dict[str, Any] = {"row": f"{prefix} {m.label} {label}", "source": source,
                                   "measured_seconds": measured}
            for name, t in times.items():
                row[f"predicted_seconds_{name}"] = pick(t)
                row[f"time_error_{name}"] = _error(pick(t), measured)
            out.append(row)
    return out


def default_step_files() -> List[str]:
    return STEPS + ([MEASURED_STEPS] if os.path.exists(MEASURED_STEPS) else [])


def evaluate(census: str = "auto", only: Optional[str] = None,
             step_files: Optional[List[str]] = None) -> Dict[str, Any]:
    hw = hardwares()
    rows, others = [], []
    for path in step_files or default_step_files():
        steps_here, not_steps = read_steps(path)
        source = os.path.relpath(path, ROOT) if os.path.abspath(path).startswith(ROOT + os.sep) else path
        others += [{"case": r.get("case"), "kind": r.get("kind"), "status": r.get("status"), "source": source,
                    **{k: r[k] for k in ("reason", "after_first_kernels") if k in r}} for r in not_steps]
        for case in steps_here:
            if not only or fnmatch.fnmatch(f"step {case['case']}", only):
                rows.append(evaluate_step(case, source, census, hw))
    reserved = [r["reserved_error"] for r in rows if r["reserved_error"] is not None]
    steps = [r for r in rows if r["measured_seconds"] is not None and r["predicted_seconds_fitted"] is not None]
    rows += evaluate_layers(census, hw, only)
    timed = [r for r in rows if r["measured_seconds"] is not None and r["predicted_seconds_fitted"] is not None]
    measured = [r["measured_seconds"] for r in timed]
    held_out = steps + [r for r in timed if r["row"].startswith("held-out layer")]
    return {"rows": rows, "census": census, "not_steps": others,
            "reserved_error_range": [min(reserved), max(reserved)] if reserved else None,
            "reserved_compared": len(reserved),
            "h200_cuda_context_bytes": hw["fitted"].cuda_context_bytes,
            "launch_costs": {name: dict(zip(("launch_seconds", "dispatch_seconds"), calibration.launch_costs_of(h),
                                            strict=True)) for name, h in hw.items()},
            "spearman_time": {name: spearman([r[f"predicted_seconds_{name}"] for r in timed], measured)
                              for name in hw},
            "spearman_time_steps": {name: spearman([r[f"predicted_seconds_{name}"] for r in steps],
                                                   [r["measured_seconds"] for r in steps]) for name in hw},
            "spearman_time_held_out": {name: spearman([r[f"predicted_seconds_{name}"] for r in held_out],
                                                      [r["measured_seconds"] for r in held_out]) for name in hw}}


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _gib(nbytes: Optional[int]) -> str:
    return "-" if nbytes is None else f"{nbytes / GIB:.3f}"


def _ms(seconds: Optional[float]) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f}"


def render(result: Dict[str, Any]) -> str:
    from ndcost.cli import table

    costs = result["launch_costs"]
    lines = [f"ndcost beside our H200 measurements (census {result['census']}); time under the shipped h200 "
             f"(dispatch {costs['fitted']['dispatch_seconds'] * 1e6:.1f} us) and at the priors "
             f"(dispatch {costs['prior']['dispatch_seconds'] * 1e6:.1f} us)", ""]
    body = []
    for r in result["rows"]:
        allocated = ("" if "measured_allocated_bytes" not in r else
                     f"{_gib(r['predicted_peak_bytes'])} / {_gib(r['measured_allocated_bytes'])} GiB "
                     f"({_pct(r['allocated_error'])})")
        body.append([r["row"], _ms(r["measured_seconds"]), _ms(r["predicted_seconds_prior"]),
                     _pct(r["time_error_prior"]), _ms(r["predicted_seconds_fitted"]),
                     _pct(r["time_error_fitted"]), allocated, r.get("reserved", "")])
    lines.append(table(body, ["row", "measured ms", "prior ms", "error", "fitted ms", "error",
                              "allocated: ndcost / measured", "reserved"], align="lrrrrrll"))
    def rho(key):
        return ", ".join(f"{name} {'-' if v is None else f'{v:.3f}'}" for name, v in result[key].items())

    lines += ["", f"Spearman rank correlation of predicted vs measured time over every row: {rho('spearman_time')}; "
              f"over the whole steps: {rho('spearman_time_steps')}; over every row held out of the fit (the steps "
              f"and the held-out layers): {rho('spearman_time_held_out')}"]
    lines += [f"{r['row']}: time unpriced ({r['time_unpriced']})" for r in result["rows"] if "time_unpriced" in r]
    low_high = result["reserved_error_range"]
    lines.append(f"reserved beside max_memory_reserved on {result['reserved_compared']} step(s)"
                 + ("" if low_high is None else f": errors {_pct(low_high[0])} to {_pct(low_high[1])}"))
    for r in result["not_steps"]:
        if r["kind"] == "cuda_context" and r["status"] == "ok":
            lines.append(f"cuda_context ({r['source']}): {r['after_first_kernels']['cuda_context_bytes'] / 2 ** 20:.0f}"
                         f" MiB outside the allocator after the first kernels; h200 states "
                         f"{result['h200_cuda_context_bytes'] / 2 ** 20:.0f} MiB")
        else:
            lines.append(f"{r['case']} ({r['source']}): {r['status']}: {r.get('reason', '')}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--census", default="auto", choices=("auto", "off"))
    parser.add_argument("--only", default=None, metavar="GLOB", help="only the rows whose name matches, "
                        "e.g. 'step small_llama_bf16' or 'layer llama3_8b@1024*'")
    parser.add_argument("--steps", action="append", default=None, metavar="FILE",
                        help="the whole steps of FILE (measure_steps.py's or measure_cuda.py's JSON; repeatable) in "
                             "place of the default files (tests/data/h200_*.json)")
    args = parser.parse_args(argv)
    try:
        result = evaluate(args.census, args.only, args.steps)
    except ndcost.errors.NdcostError as exc:
        print(f"validate_h200: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=1) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
