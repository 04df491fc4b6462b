"""benchmarks/validate_collectives.py: ndcost's collectives beside XLA's measured ones.

The extract's sizes are read back from XLA's table by hand (a few rows), and the bandwidth-bound rows the
model prices without NVLS (all-gathers and reduce-scatters of 8 H100s, 16 MiB and more) are held to their
measurement: what ndcost's NCCL ring model must keep.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the script imports import_xla_gemm_tables beside it
_spec = importlib.util.spec_from_file_location("validate_collectives", ROOT / "benchmarks" / "validate_collectives.py")
vc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vc)
DATA = json.loads(vc.DATA.read_text())


def test_the_extract_reads_xlas_sizes_and_groups():
    # XLA's sm_100_B200 table opens with an all-to-all of F32[131072] over 2 groups of 4 devices, 14185281385
    # bytes a second (default_collective_perf_table.txtpb at ROCm/xla 4fb75ab918, read by hand)
    first = DATA["devices"]["sm_100_B200"][0]
    assert first == {"collective": "all_to_all", "bytes": 131072 * 4, "group": 4, "groups": 2,
                     "bytes_per_second": 14185281385.0}
    assert DATA["source"]["commit"].startswith("4fb75ab918")
    counts = {d: len(rows) for d, rows in DATA["devices"].items()}
    assert counts == {"sm_100_B200": 264, "sm_90": 264, "sm_100_GB200": 1041, "gfx942": 504, "gfx950": 528}
    # a reduce-scatter's size is its input, the group times the scattered output its instruction states
    scatters = [r for r in DATA["devices"]["sm_90"] if r["collective"] == "reduce_scatter"]
    assert all(r["bytes"] % r["group"] == 0 for r in scatters)


def test_large_ring_collectives_of_eight_h100s_match_their_measurement():
    rows = [r for r in vc.compare(DATA) if r["device"] == "sm_90" and r["group"] == 8 and r["bytes"] >= 1 << 24
            and r["collective"] in ("all_gather", "reduce_scatter")]
    assert len(rows) == 16
    errors = np.array([r["log_error"] for r in rows])
    assert abs(np.median(errors)) < 0.2 and np.all(np.abs(errors) < 0.45)


def test_large_collectives_of_amd_meshes_match_their_measurement():
    """Groups of 2, 4 and 8 GPUs of an MI300X or MI355X node, 256 MiB and more: on Infinity Fabric's mesh a group
    of m uses m - 1 of the 7 links, so the 2-GPU groups run at a seventh of the 8-GPU groups' bus bandwidth."""
    rows = [r for r in vc.compare(DATA) if r["device"] in ("gfx942", "gfx950") and r["bytes"] >= 1 << 28
            and r["collective"] in ("all_reduce", "all_gather", "reduce_scatter")]
    assert {r["group"] for r in rows} == {2, 4, 8}
    for group in (2, 4, 8):
        errors = np.array([r["log_error"] for r in rows if r["group"] == group])
        assert abs(np.median(errors)) < 0.25 and np.all(np.abs(errors) < 0.5)


def test_the_summary_covers_every_device_collective_and_band():
    table = vc.summary(vc.compare(DATA))
    assert {(r["hardware"], r["collective"]) for r in table} == {
        (h, c) for h in ("h100", "b200", "gb200", "mi300x", "mi355x")
        for c in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")}
    assert sum(r["count"] for r in table) == 264 + 264 + 1041 + 504 + 528
