"""ndcost's collectives beside XLA's measured ones: all-reduce, all-gather, reduce-scatter and all-to-all by size.

Run: ``python benchmarks/validate_collectives.py [--json]`` to set each registered ``collective/<name>`` (NCCL's
tuner model, :mod:`ndcost.plugins.collectives`, on the bus bandwidth :func:`ndcost.compose.topology.group_link`
gives a group) beside XLA's default collective performance table: one collective of each size from 1 KiB to
a few GiB on contiguous groups of 2, 4 and 8 devices of an 8-GPU H100, B200, MI300X or MI355X node and of 4 to 72
devices of a GB200 NVL72 rack, every group of the machine at once (XLA's ``collective_perf_table_gen``, which times each
collective through XLA and NCCL and records ``tensor size / time``). ``python
benchmarks/validate_collectives.py extract TABLE OUT.json --commit SHA`` keeps those rows of a table
(``default_collective_perf_table.txtpb``) in ``benchmarks/data/``.

Sizes are the collective's whole tensor, as ndcost's ``message_bytes``: the reduced tensor, the gathered one,
the one before the scatter, what a member holds before an all-to-all. XLA's timings are its own programs'
(its collective kernels under its NCCL or RCCL), on machines it names by architecture alone.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Dict, List

sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_xla_gemm_tables import add_extract_parser, device_entries, write_extract  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "xla_collective_perf_table_4fb75ab.json"
OPCODES = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter",
           "all-to-all": "all_to_all"}
ELEMENT_BYTES = {"F32": 4, "BF16": 2, "F16": 2, "S32": 4, "U32": 4, "S8": 1, "U8": 1, "F8E4M3FN": 1}
# XLA's architecture keys and the hardware file each is priced on
DEVICES = {"sm_90": "h100", "sm_100_B200": "b200", "sm_100_GB200": "gb200", "gfx942": "mi300x", "gfx950": "mi355x"}
BANDS = ((0, 1 << 16, "up to 64 KiB"), (1 << 16, 1 << 24, "64 KiB to 16 MiB"), (1 << 24, 1 << 62, "16 MiB and more"))


def extract(table: Path, out: Path, commit: str, repository: str, path: str) -> None:
    rows: Dict[str, List[Dict[str, Any]]] = {}
    for device, entries in device_entries(table.read_text()).items():
        if device not in DEVICES:
            continue
        for entry in entries:
            instruction = dict(dict(entry)["instruction"])
            if instruction["opcode"] not in OPCODES or "network_throughput_bytes_per_sec" not in dict(entry):
                continue  # collective-permute (its pairs a pattern, not a group), or an entry timing nothing
            shape = instruction["shape"]
            elements = math.prod(int(v) for k, v in shape if k == "dimensions")
            groups = dict(instruction["iota_collective_device_list"])
            per_group = int(groups["num_devices_per_group"])
            size = elements * ELEMENT_BYTES[dict(shape)["element_type"]]
            if instruction["opcode"] == "reduce-scatter":  # its instruction is the scattered output
                size *= per_group
            rows.setdefault(device, []).append({
                "collective": OPCODES[instruction["opcode"]], "bytes": size, "group": per_group,
                "groups": int(groups["num_replica_groups"]),
                "bytes_per_second": float(dict(entry)["network_throughput_bytes_per_sec"])})
    write_extract(out, {"repository": repository, "commit": commit, "path": path,
                        "what": "XLA's default collective performance table: tensor bytes over the measured time of "
                                "one collective on every contiguous group of the machine at once"}, rows, "collectives")


def compare(data: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Each measured collective with ndcost's seconds beside XLA's."""
    import numpy as np

    from ndcost.compose import time as time_model
    from ndcost.compose.topology import group_link
    from ndcost.resolver import _hardware

    priced = time_model._collectives()
    out = []
    for device, name in DEVICES.items():
        hardware = _hardware(name)
        efficiency = time_model.efficiencies(hardware)[0]
        for row in data["devices"].get(device, []):
            ring = row["collective"] != "all_to_all"
            bandwidth, latency, link = group_link(hardware, np.ones(1), np.array([row["group"]]), efficiency,
                                                  ring=ring)
            seconds = float(priced[row["collective"]](np.array([float(row["bytes"])]), np.array([row["group"]]),
                                                      bandwidth, latency, **link)[0])
            measured = row["bytes"] / row["bytes_per_second"]
            out.append({"device": device, "hardware": name, **{k: row[k] for k in ("collective", "bytes", "group")},
                        "measured_seconds": measured, "ndcost_seconds": seconds,
                        "log_error": math.log(seconds / measured)})
    return out


def summary(rows: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Root mean square and median of the log error by device, collective and size band."""
    import numpy as np
    out = []
    keys = sorted({(r["device"], r["hardware"], r["collective"]) for r in rows})
    for device, hardware, collective in keys:
        for low, high, band in BANDS:
            errors = [r["log_error"] for r in rows if (r["device"], r["collective"]) == (device, collective)
                      and low <= r["bytes"] < high]
            if errors:
                out.append({"device": device, "hardware": hardware, "collective": collective, "sizes": band,
                            "count": len(errors), "rms_log_error": float(np.sqrt(np.mean(np.square(errors)))),
                            "median_error": float(np.expm1(np.median(errors)))})
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    add_extract_parser(sub, "collectives", "xla/service/gpu/model/default_collective_perf_table.txtpb")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", action="store_true", help="every row and the summary as JSON")
    args = parser.parse_args(argv)
    if args.command == "extract":
        extract(args.table, args.out, args.commit, args.repository, args.path)
        return 0
    data = json.loads(args.data.read_text())
    rows = compare(data)
    table = summary(rows)
    if args.json:
        print(json.dumps({"source": data["source"], "summary": table, "rows": rows}, indent=1))
        return 0
    print(f"ndcost beside XLA's measured collectives ({data['source']['repository']} "
          f"{data['source']['commit'][:10]}); error = ndcost / measured - 1, the median of each band\n")
    print(f"{'device':13s} {'hardware':8s} {'collective':15s} {'sizes':17s} {'count':>5s} {'median':>8s} "
          f"{'rms log':>8s}")
    for r in table:
        print(f"{r['device']:13s} {r['hardware']:8s} {r['collective']:15s} {r['sizes']:17s} {r['count']:5d} "
              f"{r['median_error']:+8.0%} {r['rms_log_error']:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
