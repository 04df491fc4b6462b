"""ndcost beside Megatron-Bridge's published pre-training throughput (tokens/s per GPU).

    python benchmarks/validate_megatron_bridge.py [--json]

The rows are ``benchmarks/data/megatron_bridge_performance.yaml`` (NVIDIA-NeMo/Megatron-Bridge's performance
summary, its source and commit there). Each row is written as a Megatron-LM command line and read by ndcost's
Megatron-LM reader (``ndcost.from_config("megatron", path, devices=N, model=...)``), so Megatron-LM's semantics
are the reader's: the distributed optimizer, fp32 main gradients, parameters and states under ``--bf16``, TE's
current-scaling FP8 as ``float8=tensorwise`` with ``float8_experts``, the vocabulary split over TP, runtime
``megatron-te-cuda``. The tables do not state the recompute, so each row is priced twice: no recompute and full
recompute of every layer (``--recompute-granularity full --recompute-method uniform --recompute-num-layers 1``);
a pipeline the layers do not divide is split with the embedding and the loss counted as a layer each
(``--account-for-embedding-in-pipeline-split --account-for-loss-in-pipeline-split``). Census off (the op records'
formulas). What it leaves out: the recipes' own recompute, dispatcher (DeepEP where they use it), overlap and
CUDA-graph settings, and their pipeline layouts where they give one (DeepSeek-V3's).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, Dict, List, Optional

import ndcost
from ndcost.errors import NdcostError
from ndcost.models import load_model
from ndcost.specio import load_yaml, read_text

from validate_torchtitan import spearman  # the same rank correlation

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "megatron_bridge_performance.yaml")
HARDWARE = {"DGX-H100": "h100", "DGX-B200": "b200", "DGX-GB200": "gb200"}
RECOMPUTE = {"none": "", "full": " --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"}
GIB = 2 ** 30


def command(row: Dict[str, Any], recompute: str) -> str:
    """The row as a Megatron-LM training command (what the reader reads)."""
    layers = load_model(row["model"]).num_layers
    flags = [f"--num-layers {layers}", f"--tensor-model-parallel-size {row['tp']}",
             f"--pipeline-model-parallel-size {row['pp']}", f"--context-parallel-size {row['cp']}",
             f"--expert-model-parallel-size {row['ep']}", f"--micro-batch-size {row['mbs']}",
             f"--global-batch-size {row['gbs']}", f"--seq-length {row['seq']}", "--bf16",
             "--use-distributed-optimizer"]
    if row["tp"] > 1:
        flags.append("--sequence-parallel")
    if "etp" in row:  # else Megatron-LM's default, the TP size
        flags.append(f"--expert-tensor-parallel-size {row['etp']}")
    if row["vp"] > 1:
        flags.append(f"--num-virtual-stages-per-pipeline-rank {row['vp']}")
    if layers % (row["pp"] * row["vp"]):
        flags += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
    if row["fsdp"]:  # the tables' FSDP: parameters, gradients and states sharded over the data-parallel ranks
        flags.append("--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params")
    if row["precision"] == "FP8-CS":
        flags.append("--fp8-format hybrid --fp8-recipe tensorwise")
    return "pretrain_gpt.py " + " ".join(flags) + RECOMPUTE[recompute] + "\n"


def price(row: Dict[str, Any], recompute: str) -> Dict[str, Any]:
    """One row under one recompute assumption: ndcost's tokens/s per GPU and peak, or why it cannot price it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{row['id']}.sh")
        with open(path, "w", encoding="utf-8") as out:
            out.write(command(row, recompute))
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
    rows: List[Dict[str, Any]] = []
    for row in data["rows"]:
        rows.append({**row, "predicted": {mode: price(row, mode) for mode in RECOMPUTE}})
    summary = {}
    for mode in RECOMPUTE:
        priced = [r for r in rows if r["predicted"][mode]["priced"]]
        summary[f"spearman_{mode}"] = spearman([r["predicted"][mode]["tokens_per_second_per_gpu"] for r in priced],
                                               [r["tokens_per_second_per_gpu"] for r in priced])
        summary[f"priced_{mode}"] = len(priced)
    return {"sources": data["sources"], "rows": rows, "summary": summary}


def _cell(predicted: Dict[str, Any]) -> str:
    if not predicted["priced"]:
        return "refused"
    fits = "" if predicted["fits"] else ", does not fit"
    return (f"{predicted['tokens_per_second_per_gpu']:,.0f} ({predicted['error']:+.0%}; "
            f"{predicted['peak_gib']:.1f} GiB{fits})")


def table(result: Dict[str, Any]) -> str:
    lines = ["| row | edition | model | GPUs | system | precision | TPS/GPU published | ndcost, no recompute | "
             "ndcost, full recompute |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['id']} | {r['edition']} | {r['model']} | {r['gpus']} | {r['system']} | {r['precision']} | "
                     f"{r['tokens_per_second_per_gpu']:,} | {_cell(r['predicted']['none'])} | "
                     f"{_cell(r['predicted']['full'])} |")
    refused = {p["reason"] for r in result["rows"] for p in r["predicted"].values() if not p["priced"]}
    lines += [""] + [f"refused: {reason}" for reason in sorted(refused)]
    s = result["summary"]

    def rho(value: Optional[float]) -> str:
        return "n/a" if value is None else f"{value:.2f}"
    lines.append(f"Spearman rank correlation of TPS/GPU: {rho(s['spearman_none'])} with no recompute "
                 f"({s['priced_none']} rows), {rho(s['spearman_full'])} with full recompute ({s['priced_full']} rows)")
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
