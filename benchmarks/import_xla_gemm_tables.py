"""XLA's published GEMM timings as a hardware file's ``kernel_tables.gemm_shape`` (docs/calibration.md).

Run: ``python benchmarks/import_xla_gemm_tables.py extract TABLE OUT.json --commit SHA`` to keep the bf16 and
fp8 GEMMs (single and batched) of XLA's default matmul performance table (the ``kDefaultMatmulPTable`` textproto in
``xla/service/gpu/model/matmul_interpolator_data.h``, or ``default_matmul_perf_table.txtpb``), then
``python benchmarks/import_xla_gemm_tables.py yaml DEVICE HARDWARE [--data OUT.json]`` to print the
``gemm_shape`` block for *HARDWARE*'s file from the single GEMMs: each cell XLA's FLOP/s over the file's bf16
peak. ``check`` sets the
time model's grouped-GEMM rule beside XLA's batched GEMMs (2 and 4 problems, each its own operands), which the
hardware files do not read.

XLA's compiler measured these to schedule its own programs (one GEMM of each shape, cuBLAS / hipBLASLt through
XLA, on a device its table names by architecture alone), so the time model reads them for their shape
dependence only: the best cell lands at the file's ``efficiency.matmul`` (:func:`ndcost.kernels.gemm_efficiency`).
Only bf16 is kept in the hardware files: the table's fp8 rows on ``sm_90`` exceed the H100's dense fp8 peak
(2.4 PFLOP/s at 4096^3 beside 1.98) and those on ``gfx942`` AMD's own best MI300X fp8 GEMM, so they are
kept in the extract but not read.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Tuple

DATA = Path(__file__).resolve().parent / "data" / "xla_matmul_perf_table_ea2c45f.json"
BF16 = "bf16xbf16->bf16"
KEPT = (BF16, "f8e4m3fnxf8e4m3fn->bf16", "f8e4m3fnuzxf8e4m3fnuz->bf16")


def _tokens(text: str) -> List[str]:
    if 'R"pb(' in text:  # the C++ header: the textproto between its raw-string delimiters
        text = text[text.index('R"pb(') + 5:text.rindex(')pb"')]
    text = re.sub(r"#[^\n]*", "", text)
    return re.findall(r'"[^"]*"|[A-Za-z_][A-Za-z0-9_]*|-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|[{}:]', text)


def textproto(text: str) -> List[Tuple[str, Any]]:
    """A textproto message as ``(field, value)`` pairs in order (a message's value its own pairs, a number a float,
    a string or enum a str): enough of the format for XLA's perf tables, no schema."""
    tokens, pos = _tokens(text), 0

    def block() -> List[Tuple[str, Any]]:
        nonlocal pos
        fields: List[Tuple[str, Any]] = []
        while pos < len(tokens) and tokens[pos] != "}":
            name = tokens[pos]
            pos += 1
            if tokens[pos] == ":":
                value = tokens[pos + 1]
                pos += 2
                number = re.fullmatch(r"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?", value)
                fields.append((name, value.strip('"') if value.startswith('"') else float(value) if number else value))
            else:  # a message
                pos += 1
                fields.append((name, block()))
                pos += 1
        return fields

    return block()


def device_entries(text: str) -> Dict[str, List[List[Tuple[str, Any]]]]:
    """Each device key's entries of a perf table (``entries { key: ... value { entries {...} ... } }``)."""
    devices = {}
    for _, entry in textproto(text):
        key = next(v for k, v in entry if k == "key")
        devices[key] = [e for _, e in next(v for k, v in entry if k == "value")]
    return devices


def parse(text: str) -> Dict[str, List[Dict[str, Any]]]:
    """Each device's entries ``{b, m, n, k, flops: {dtype key: FLOP/s}}`` of a matmul perf table."""
    devices = {}
    for device, entries in device_entries(text).items():
        rows = []
        for gemm in entries:
            row: Dict[str, Any] = {k: int(v) for k, v in gemm if k in ("b", "m", "n", "k")}
            row["flops"] = {dict(f)["key"]: dict(f)["value"] for k, f in gemm if k == "flops"}
            rows.append(row)
        devices[device] = rows
    return devices


def add_extract_parser(sub: Any, what: str, path: str) -> None:
    """The ``extract TABLE OUT --commit SHA`` command of a script keeping *what* of an XLA perf table."""
    e = sub.add_parser("extract", help=f"keep a perf table's {what} as JSON")
    e.add_argument("table", type=Path)
    e.add_argument("out", type=Path)
    e.add_argument("--commit", required=True)
    e.add_argument("--repository", default="ROCm/xla")
    e.add_argument("--path", default=path)


def write_extract(out: Path, source: Dict[str, str], devices: Dict[str, List[Dict[str, Any]]], what: str) -> None:
    """*devices*' rows as JSON under *source*, a row a line (a diff shows the rows that changed)."""
    lines = [f'{{"source": {json.dumps(source)},', ' "devices": {']
    for i, (device, rows) in enumerate(devices.items()):
        lines.append(f"  {json.dumps(device)}: [")
        lines += [f"   {json.dumps(r)}{',' if j < len(rows) - 1 else ''}" for j, r in enumerate(rows)]
        lines.append("  ]" + ("," if i < len(devices) - 1 else ""))
    out.write_text("\n".join(lines + [" }", "}"]) + "\n")
    print(f"wrote {out}: " + ", ".join(f"{d} {len(rows)} {what}" for d, rows in devices.items()))


def extract(table: Path, out: Path, commit: str, repository: str, path: str) -> None:
    devices = {d: [{**{a: r[a] for a in "bmnk"}, "flops": {k: v for k, v in r["flops"].items() if k in KEPT}}
                   for r in rows] for d, rows in parse(table.read_text()).items()}
    write_extract(out, {"repository": repository, "commit": commit, "path": path,
                        "what": "XLA's default matmul performance table: FLOP/s of b GEMMs of (m, n, k), each with "
                                "its own operands (a batched GEMM), bf16 and fp8 (e4m3) operands, per device "
                                "architecture"}, devices, "GEMMs")


def gemm_shape(data: Dict[str, Any], device: str, peak_flops_per_second: float) -> Dict[str, Any]:
    """The ``gemm_shape.bf16`` table of *device*: its (m, n, k) grid and FLOP/s over *peak_flops_per_second*."""
    rows = [r for r in data["devices"][device] if r["b"] == 1]
    axes = {a: sorted({r[a] for r in rows}) for a in "mnk"}
    flops = {(r["m"], r["n"], r["k"]): r["flops"][BF16] for r in rows}
    efficiency = [[[round(flops[(m, n, k)] / peak_flops_per_second, 4) for k in axes["k"]] for n in axes["n"]]
                  for m in axes["m"]]
    return {**axes, "efficiency": efficiency}


def source_text(data: Dict[str, Any], device: str) -> str:
    s = data["source"]
    return (f"XLA's measured GEMM FLOP/s for {device} ({s['repository']} {s['commit'][:10]} {s['path']}), b = 1, "
            f"over this file's bf16 peak (benchmarks/import_xla_gemm_tables.py)")


SHIPPED = {"sm_90": "h200", "sm_100_B200": "b200", "gfx942": "mi300x", "gfx950": "mi355x"}


def batched_errors(data: Dict[str, Any], device: str, hardware: Any) -> Dict[str, List[float]]:
    """log(model / measured) over XLA's batched GEMMs (b > 1, each batch its own operands) of *device*: the time
    model's grouped rule on *hardware*'s ``gemm_shape``, each batch read as one problem, and the analytic prior;
    each at the table's best cell as the plateau, so only the shape and grouping rules are compared."""
    import numpy as np

    from ndcost import kernels
    tables = kernels.parse_kernel_tables(hardware.name, hardware.kernel_tables)
    best = tables.gemm_shape["bf16"].best
    peak = hardware.peak_flops("bf16")
    out: Dict[str, List[float]] = {"grouped": [], "one problem": [], "prior": []}
    for r in data["devices"][device]:
        if r["b"] == 1:
            continue
        measured = r["flops"][BF16] / peak
        for name, groups, table in (("grouped", r["b"], tables), ("one problem", 1, tables), ("prior", r["b"], None)):
            got = kernels.gemm_efficiency(hardware, table, "bf16", r["m"], r["n"], r["k"], stated=best, groups=groups)
            out[name].append(float(np.log(got / measured)))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    add_extract_parser(sub, "GEMMs", "xla/service/gpu/model/matmul_interpolator_data.h")
    y = sub.add_parser("yaml", help="print a hardware file's gemm_shape block")
    y.add_argument("device", help="the table's device key: sm_90, sm_100_B200, gfx942, gfx950")
    y.add_argument("hardware", help="the hardware whose bf16 peak divides the FLOP/s")
    y.add_argument("--data", type=Path, default=DATA)
    c = sub.add_parser("check", help="the grouped-GEMM rule beside XLA's batched GEMMs, per architecture")
    c.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args(argv)
    if args.command == "extract":
        extract(args.table, args.out, args.commit, args.repository, args.path)
        return 0
    import yaml

    from ndcost.resolver import _hardware
    data = json.loads(args.data.read_text())
    if args.command == "check":
        for device, name in SHIPPED.items():
            errors = batched_errors(data, device, _hardware(name))
            print(f"{device} ({name}), {len(errors['grouped'])} batched GEMMs, root mean square of log(model / "
                  "measured): " + ", ".join(f"{k} {(sum(e * e for e in v) / len(v)) ** 0.5:.3f}"
                                            for k, v in errors.items()))
        return 0
    if args.device not in data["devices"]:
        parser.error(f"no device {args.device!r} in {args.data}; it has {', '.join(data['devices'])}")
    hardware = _hardware(args.hardware)
    block = {"gemm_shape": {"bf16": gemm_shape(data, args.device, hardware.peak_flops("bf16")),
                            "source": source_text(data, args.device)}}
    print(yaml.safe_dump(block, default_flow_style=None, width=120, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
