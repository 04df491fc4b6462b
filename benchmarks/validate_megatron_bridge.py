"""ndcost beside Megatron-Bridge's published pre-training throughput (tokens/s per GPU).

    python benchmarks/validate_megatron_bridge.py [--json]

The rows are ``benchmarks/data/megatron_bridge_performance.yaml`` (NVIDIA-NeMo/Megatron-Bridge's performance
summary, its source and commit there). Each row is written as a Megatron-LM command line, the table's sizes with
the flags its recipe ran (the row's ``recipe``: recompute, token dispatcher, all-to-all overlap, a pipeline
layout, read from Megatron-Bridge's performance scripts), and read by ndcost's Megatron-LM reader
(``ndcost.from_config("megatron", path, devices=N, model=...)``), so Megatron-LM's semantics are the reader's: the
distributed optimizer, fp32 main parameters and states under ``--bf16``, bf16 main gradients (every recipe sets
``grad_reduce_in_fp32 = False``: ``--grad-reduce-in-bf16``), TE's current-scaling FP8 as
``float8=tensorwise`` with ``float8_experts``, the vocabulary split over TP, runtime ``megatron-te-cuda``. A
pipeline the layers do not divide and the recipe gives no layout for is split with the embedding and the loss
counted as a layer each (``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``).
Census off (the op records' formulas). What it leaves out: each row's ``recipe.unpriced`` (FP8 parameter
gathers, TP communication overlap, CUDA graphs, recompute modules other than the core attention), listed
beside its figure.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

import ndcost
from ndcost.errors import NdcostError
from ndcost.models import load_model
from ndcost.specio import load_yaml, read_text

from validate_torchtitan import spearman  # the same rank correlation

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "megatron_bridge_performance.yaml")
HARDWARE = {"DGX-H100": "h100", "DGX-B200": "b200", "DGX-GB200": "gb200"}
GIB = 2 ** 30


def command(row: Dict[str, Any]) -> str:
    """The row as a Megatron-LM training command (what the reader reads): the table's sizes, the recipe's flags."""
    layers = load_model(row["model"]).num_layers
    recipe = row["recipe"]["flags"]
    flags = [f"--num-layers {layers}", f"--tensor-model-parallel-size {row['tp']}",
             f"--pipeline-model-parallel-size {row['pp']}", f"--context-parallel-size {row['cp']}",
             f"--expert-model-parallel-size {row['ep']}", f"--micro-batch-size {row['mbs']}",
             f"--global-batch-size {row['gbs']}", f"--seq-length {row['seq']}", "--bf16",
             # every recipe reduces its gradients in bf16 (set_*_common_configs: grad_reduce_in_fp32 = False)
             "--grad-reduce-in-bf16", "--use-distributed-optimizer"]
    if row["tp"] > 1:
        flags.append("--sequence-parallel")
    if "etp" in row:  # else Megatron-LM's default, the TP size
        flags.append(f"--expert-tensor-parallel-size {row['etp']}")
    if row["vp"] > 1:
        flags.append(f"--num-virtual-stages-per-pipeline-rank {row['vp']}")
    if layers % (row["pp"] * row["vp"]) and "--pipeline-model-parallel-layout" not in recipe:
        flags += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    if row["fsdp"]:  # the tables' FSDP: parameters, gradients and states sharded over the data-parallel ranks
        flags.append("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params")
    if row["precision"] == "FP8-CS":
        flags.append("--fp8-format hybrid --fp8-recipe tensorwise")
    return "pretrain_gpt.py " + " ".join(flags + ([recipe] if recipe else [])) + "\n"


def price(row: Dict[str, Any]) -> Dict[str, Any]:
    """One row as its recipe ran: ndcost's tokens/s per GPU and peak, or why it cannot price it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{row['id']}.sh")
        with open(path, "w", encoding="utf-8") as out:
            out.write(command(row))
        try:
            config = ndcost.from_config("megatron", path, devices=row["gpus"], model=row["model"])
            model = ndcost.resolve(config.model, hardware=HARDWARE[row["system"]], runtime=config.runtime,
                                   census="off")
            cost = model.evaluate(config.strategy)
        except NdcostError as exc:
            return {"priced": False, "reason": str(exc).replace(tmp + os.sep, "")}
    tokens = cost.time.tokens_per_second / row["gpus"]
    return {"priced": True, "strategy": str(config.strategy), "tokens_per_second_per_gpu": tokens,
            "error": tokens / row["tokens_per_second_per_gpu"] - 1.0, "peak_gib": cost.peak_bytes / GIB,
            "fits": bool(cost.fits), "mfu": cost.time.mfu}


def evaluate(path: str = DATA) -> Dict[str, Any]:
    data = load_yaml(read_text(path, "Megatron-Bridge performance rows"), path)
    rows: List[Dict[str, Any]] = [{**row, "predicted": price(row)} for row in data["rows"]]
    priced = [r for r in rows if r["predicted"]["priced"]]
    errors = [abs(r["predicted"]["error"]) for r in priced]
    summary = {"priced": len(priced), "rows": len(rows),
               "within_15_percent": sum(e <= 0.15 for e in errors),
               "spearman": spearman([r["predicted"]["tokens_per_second_per_gpu"] for r in priced],
                                    [r["tokens_per_second_per_gpu"] for r in priced])}
    return {"sources": data["sources"], "rows": rows, "summary": summary}


def _cell(predicted: Dict[str, Any]) -> Tuple[str, str, str]:
    if not predicted["priced"]:
        return "refused", "-", "-"
    return (f"{predicted['tokens_per_second_per_gpu']:,.0f}", f"{predicted['error']:+.0%}",
            f"{predicted['peak_gib']:.1f}" + ("" if predicted["fits"] else ", does not fit"))


def table(result: Dict[str, Any]) -> str:
    lines = ["| row | edition | model | GPUs | system | precision | recipe flags | TPS/GPU published | TPS/GPU ndcost | "
             "error | peak GiB | the recipe runs, not priced |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        tokens, error, peak = _cell(r["predicted"])
        flags = r["recipe"]["flags"].replace("|", "\\|") or "-"
        lines.append(f"| {r['id']} | {r['edition']} | {r['model']} | {r['gpus']} | {r['system']} | {r['precision']} | "
                     f"`{flags}` | {r['tokens_per_second_per_gpu']:,} | {tokens} | {error} | {peak} | "
                     f"{'; '.join(r['recipe']['unpriced']) or '-'} |")
    refused = {r["predicted"]["reason"] for r in result["rows"] if not r["predicted"]["priced"]}
    lines += [""] + [f"refused: {reason}" for reason in sorted(refused)]
    s = result["summary"]
    rho = "n/a" if s["spearman"] is None else f"{s['spearman']:.2f}"
    lines.append(f"{s['priced']} of {s['rows']} rows priced, {s['within_15_percent']} within 15%; Spearman rank "
                 f"correlation of TPS/GPU: {rho}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="print the rows and the summary as JSON")
    args = parser.parse_args(argv)
    result = evaluate()
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
