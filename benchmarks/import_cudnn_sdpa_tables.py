"""NVIDIA's published SDPA training benchmarks as a hardware file's ``kernel_tables.attention`` rows.

Run: ``python benchmarks/import_cudnn_sdpa_tables.py CSV HARDWARE KERNEL=BACKEND [...] --source TEXT`` to print
the ``attention`` block for *HARDWARE*'s file from one of cudnn-frontend's result files
(``benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_*.csv``): each ndcost kernel
(``cudnn``, ``flash``) read from the CSV's backend (``pyt_cudnn``: PyTorch's SDPA on cuDNN, ``cudnn_fe``: cuDNN's
frontend, ``pyt_flash_attention``: PyTorch's SDPA flash backend), a row a sequence length.

The CSV counts a causal forward's FLOPs as ``2 s^2 heads head_dim`` and its backward's as 2.5 times that
(FlashAttention's convention); ndcost counts the backward's as twice the forward's, so a row's backward
efficiency is the CSV's backward FLOP/s x 2 / 2.5 over the file's bf16 peak. Kept in ``benchmarks/data/``:
``cudnn_frontend_sdpa_bf16_B200_bb37575.csv`` (NVIDIA/cudnn-frontend bb37575d103b) and
``cudnn_frontend_sdpa_bf16_GB200_d48a60e.csv`` (d48a60eb146e).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path
from typing import Any, Dict, List

NDCOST_BACKWARD_PER_CSV = 2.0 / 2.5  # ndcost's backward FLOPs over the CSV's


def rows(path: Path, backend: str, peak_flops_per_second: float) -> List[Dict[str, Any]]:
    """*backend*'s rows of a cudnn-frontend SDPA CSV as ``kernel_tables.attention`` rows (batch 1: heads are the
    query heads), achieved over *peak_flops_per_second*."""
    out = []
    for r in csv.DictReader(path.open()):
        if r["backend"] != backend or float(r["fwd_tflops_per_sec"]) <= 0:
            continue
        if int(r["batch_size"]) != 1 or r["q_seqlen"] != r["kv_seqlen"]:
            raise SystemExit(f"{path}: a row of batch {r['batch_size']} or unequal lengths; the schema takes batch 1")
        out.append({"seq": int(r["q_seqlen"]), "heads": int(r["num_q_heads"]), "head_dim": int(r["head_dim"]),
                    "causal": r["is_causal"] == "True",
                    "forward": round(float(r["fwd_tflops_per_sec"]) * 1e12 / peak_flops_per_second, 4),
                    "backward": round(float(r["bwd_tflops_per_sec"]) * 1e12 * NDCOST_BACKWARD_PER_CSV
                                      / peak_flops_per_second, 4)})
    if not out:
        raise SystemExit(f"{path}: no rows of backend {backend!r}")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", type=Path)
    parser.add_argument("hardware")
    parser.add_argument("kernels", nargs="+", metavar="KERNEL=BACKEND")
    parser.add_argument("--source", required=True, help="where the CSV came from (repository, commit, path)")
    args = parser.parse_args(argv)
    import yaml

    from ndcost.resolver import _hardware
    peak = _hardware(args.hardware).peak_flops("bf16")
    block: Dict[str, Any] = {}
    for pair in args.kernels:
        kernel, _, backend = pair.partition("=")
        block[kernel] = {"bf16": rows(args.csv, backend, peak),
                         "source": f"{args.source}, backend {backend}: FLOP/s over this file's bf16 peak, the "
                                   f"backward's x 2 / 2.5 (benchmarks/import_cudnn_sdpa_tables.py)"}
    print(yaml.safe_dump({"attention": block}, default_flow_style=None, width=120, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
