"""How far the formulas (``census="off"``) price each shipped model from the census (``census="auto"``).

    python benchmarks/formulas_vs_census.py [--models NAME ...] [--seq 4096 ...] [--json]

A planner without torch prices with the op records' formulas and the analytic FLOPs; with torch, the census runs
Transformers' own layers. For every model in ``specs/models/`` and a few strategies on 64 devices (TP 4 without
and with selective and full recompute, EP 8 for MoE models), this sets the two side by side: the peak bytes a
device and the step time under ``hf-cuda`` on the H200. A strategy either side refuses is said with why (DeepSeek-
V4's memory is refused without a census: ``Family.formulas_unpriced``). The census runs where it is not cached
(minutes a model the first time).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent.parent / "specs" / "models"
STRATEGIES = ("tp=4,dp=16", "tp=4,dp=16,recompute=selective", "tp=4,dp=16,recompute=full")


def compare(name: str, strategy: str, seq: int) -> dict:
    """One row: both sides' peak bytes and step seconds, or why a side refused."""
    import ndcost
    from ndcost.errors import NdcostError

    row = {"model": name, "strategy": f"{strategy},seq={seq}"}
    for census in ("off", "auto"):
        try:
            model = ndcost.resolve(name, census=census)
            row["strategy"] = f"{strategy},seq={seq}" + (",ep=8" if model.tables.num_experts else "")
            cost = model.evaluate(row["strategy"])
        except NdcostError as exc:
            row[census] = {"refused": " ".join(str(exc).split())}
            continue
        row[census] = {"peak_bytes": int(cost.peak_bytes),
                       "step_seconds": None if cost.time is None else float(cost.time.step_seconds)}
    off, auto = row["off"], row["auto"]
    if "peak_bytes" in off and "peak_bytes" in auto:
        row["peak_error"] = off["peak_bytes"] / auto["peak_bytes"] - 1
        if off["step_seconds"] and auto["step_seconds"]:
            row["step_error"] = off["step_seconds"] / auto["step_seconds"] - 1
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=None, help="model names (default: every shipped model)")
    parser.add_argument("--seq", nargs="*", type=int, default=[4096])
    parser.add_argument("--json", action="store_true", help="one JSON list of rows on stdout")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")  # the census's fallbacks are said in each row
    names = args.models or sorted(p.stem for p in MODELS_DIR.glob("*.yaml"))
    rows = []
    for i, name in enumerate(names, 1):
        print(f"[{i}/{len(names)}] {name}", file=sys.stderr, flush=True)
        rows += [compare(name, strategy, seq) for seq in args.seq for strategy in STRATEGIES]
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print("| model | strategy | peak GiB, formulas | peak GiB, census | error | step s, formulas | step s, census "
          "| error |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        off, auto = row["off"], row["auto"]
        if "peak_error" not in row:
            why = off.get("refused") or auto.get("refused")
            print(f"| {row['model']} | {row['strategy']} | refused: {why[:90]} | | | | | |")
            continue
        step = f"{row['step_error']:+.1%}" if "step_error" in row else "-"
        print(f"| {row['model']} | {row['strategy']} | {off['peak_bytes'] / 2**30:.2f} | "
              f"{auto['peak_bytes'] / 2**30:.2f} | {row['peak_error']:+.1%} | {off['step_seconds']:.3f} | "
              f"{auto['step_seconds']:.3f} | {step} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
