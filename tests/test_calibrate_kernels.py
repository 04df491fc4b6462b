"""Kernel tables: fitted from a real torch.profiler trace, a hand-written GPU timeline and measure_kernels.py.

Expected figures come from the shapes the tests run (written here), the trace's JSON read here on its own,
and a hand-made hardware's peaks: a cell's efficiency is its points' total 2 m n k / peak over their total
measured seconds (docs/calibration.md, "Kernel tables").
"""
from __future__ import annotations

import gzip
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ndcost.errors import InvalidValue
from ndcost.plugins import kernel_tables as kt
from ndcost.plugins.calibration import check_kernel_tables
from ndcost.specio import hardware_from_mapping

ROOT = Path(__file__).resolve().parent.parent
PEAK = {"fp32": 2.0e13, "bf16": 4.0e13}       # far above what a CPU reaches: every efficiency stays in (0, 1]
HBM = 1.0e12
SPEC = {"name": "testbox", "memory_bytes": 2**34, "hbm_bytes_per_second": HBM, "peak_flops_per_second": PEAK,
        "devices_per_node": 1, "network": {}, "efficiency": {"matmul": 0.5, "memory": 0.4}}
# The GEMMs the trace runs, in order: (name, m, n, k, batch, dtype). torch.matmul of two matrices runs
# aten::mm under aten::matmul: the mm is the one counted.
GEMMS = [("aten::mm", 64, 48, 32, 1, "fp32"), ("aten::mm", 128, 256, 64, 1, "fp32"),
         ("aten::addmm", 64, 48, 32, 1, "fp32"), ("aten::mm", 16, 12, 8, 1, "bf16"),
         ("aten::bmm", 16, 12, 8, 4, "bf16"), ("aten::mm", 32, 8, 16, 1, "fp32")]
# torch.add of two 64 x 32 fp32 tensors: two read, one written; copy_ of 1000 fp32 into 1000: one read, one written
ELEMENTWISE = [("aten::add", 3 * 64 * 32 * 4), ("aten::copy_", 2 * 1000 * 4)]


def _profile(path: Path, work, record_shapes: bool = True) -> Path:
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=record_shapes) as prof:
        work(torch)
    prof.export_chrome_trace(str(path))
    return path


def _known_work(torch) -> None:
    f, b = torch.float32, torch.bfloat16
    torch.mm(torch.randn(64, 32, dtype=f), torch.randn(32, 48, dtype=f))
    torch.mm(torch.randn(128, 64, dtype=f), torch.randn(64, 256, dtype=f))
    torch.addmm(torch.randn(48, dtype=f), torch.randn(64, 32, dtype=f), torch.randn(32, 48, dtype=f))
    torch.mm(torch.randn(16, 8, dtype=b), torch.randn(8, 12, dtype=b))
    torch.bmm(torch.randn(4, 16, 8, dtype=b), torch.randn(4, 8, 12, dtype=b))
    torch.matmul(torch.randn(32, 16, dtype=f), torch.randn(16, 8, dtype=f))
    a, c = torch.randn(64, 32), torch.randn(64, 32)
    x, y = torch.empty(1000), torch.randn(1000)
    torch.add(a, c)
    x.copy_(y)


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return _profile(tmp_path_factory.mktemp("trace") / "trace.json", _known_work)


@pytest.fixture(scope="module")
def raw_events(trace):
    """The trace's top matmul-family events read straight from its JSON, in time order (not through ndcost)."""
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("cat") == "cpu_op"]
    return sorted(events, key=lambda e: e["ts"])


@pytest.fixture()
def box(tmp_path):
    path = tmp_path / "testbox.yaml"
    path.write_text(yaml.safe_dump(SPEC))
    return path


def _expected_seconds(raw_events):
    """Each GEMM of GEMMS timed as the trace states: the i-th mm/addmm/bmm event's duration (the inner mm of
    the matmul, not the matmul's own)."""
    gemms = [e for e in raw_events if e["name"] in ("aten::mm", "aten::addmm", "aten::bmm")]
    assert [e["name"] for e in gemms] == [g[0] for g in GEMMS]
    matmul = next(e for e in raw_events if e["name"] == "aten::matmul")
    assert matmul["dur"] > gemms[-1]["dur"]    # the matmul wraps the mm: its own duration is not the one used
    return [e["dur"] * 1e-6 for e in gemms]


@pytest.mark.slow
def test_trace_finds_every_matmul_with_its_shape_dtype_and_duration(trace, raw_events):
    points = kt.read_trace(str(trace))
    assert points.device == "cpu"
    found = sorted((p.op, p.m, p.n, p.k, p.batch, p.dtype, p.seconds) for p in points.gemm)
    expected = sorted((*g, s) for g, s in zip(GEMMS, _expected_seconds(raw_events), strict=True))
    assert found == expected
    adds = [e["dur"] * 1e-6 for e in raw_events if e["name"] == "aten::add"]
    copies = [e["dur"] * 1e-6 for e in raw_events if e["name"] == "aten::copy_"]
    assert len(adds) == 1 and len(copies) == 2     # addmm broadcasts its bias with a copy_: part of the addmm
    found = {(p.op, p.bytes): p.seconds for p in points.elementwise}
    assert found == {ELEMENTWISE[0]: adds[0], ELEMENTWISE[1]: copies[1]}
    assert points.launch_seconds is None and points.dispatch_seconds is None   # no GPU timeline
    zipped = trace.parent / "trace.json.gz"                    # as tensorboard_trace_handler writes it
    zipped.write_bytes(gzip.compress(trace.read_bytes()))
    again = kt.read_trace(str(zipped))
    assert (again.gemm, again.elementwise) == (points.gemm, points.elementwise)


@pytest.mark.slow
def test_cell_fit_is_achieved_over_peak_of_its_points(trace, raw_events, box):
    """Every shape here is below the default grid's first node: all bin to (256, 1024, 1024), whose interpolated
    value is then the cell's own, so the errors are computable by hand too."""
    hardware = hardware_from_mapping(SPEC)
    seconds = _expected_seconds(raw_events)
    fit = kt.fit_kernel_tables(kt.read_trace(str(trace)), hardware)
    corner = {(c["dtype"], c["m"], c["n"], c["k"]): c for c in fit.cells if "m" in c}
    assert set(corner) == {("fp32", 256, 1024, 1024), ("bf16", 256, 1024, 1024)}
    for dtype in ("fp32", "bf16"):
        mine = [(g, s) for g, s in zip(GEMMS, seconds, strict=True) if g[5] == dtype]
        ideal = [2 * g[1] * g[2] * g[3] * g[4] / PEAK[dtype] for g, _ in mine]
        efficiency = sum(ideal) / sum(s for _, s in mine)
        cell = corner[(dtype, 256, 1024, 1024)]
        assert cell["points"] == len(mine) and cell["prior"] == 0.5
        assert cell["fitted"] == pytest.approx(efficiency, rel=1e-12)
        table = fit.tables["gemm"][dtype]
        assert table["efficiency"][0][0][0] == pytest.approx(efficiency, rel=1e-12)
        cells = [v for plane in table["efficiency"] for row in plane for v in row]
        assert len(cells) == 4 * 3 * 3 and cells.count(0.5) == len(cells) - 1   # the rest keep the prior
    errors_prior, errors_fitted = [], []
    for g, s in zip(GEMMS, seconds, strict=True):
        ideal = 2 * g[1] * g[2] * g[3] * g[4] / PEAK[g[5]]
        errors_prior.append(math.log(ideal / 0.5 / s))
        errors_fitted.append(math.log(ideal / corner[(g[5], 256, 1024, 1024)]["fitted"] / s))
    assert fit.errors["gemm"]["points"] == 6
    assert fit.errors["gemm"]["rms_log_error_prior"] == pytest.approx(
        math.sqrt(sum(e * e for e in errors_prior) / 6), rel=1e-9)
    assert fit.errors["gemm"]["rms_log_error_fitted"] == pytest.approx(
        math.sqrt(sum(e * e for e in errors_fitted) / 6), rel=1e-9)
    (elementwise,) = [c for c in fit.cells if "bytes" in c]
    add = next(e for e in raw_events if e["name"] == "aten::add")["dur"] * 1e-6
    copy = [e for e in raw_events if e["name"] == "aten::copy_"][1]["dur"] * 1e-6
    assert elementwise["bytes"] == 65536 and elementwise["points"] == 2 and elementwise["prior"] == 0.4
    assert elementwise["fitted"] == pytest.approx((ELEMENTWISE[0][1] + ELEMENTWISE[1][1]) / HBM / (add + copy),
                                                  rel=1e-12)
    check_kernel_tables(fit.tables, "test")


@pytest.mark.slow
def test_cli_refits_from_a_written_file_keeping_its_other_cells(trace, raw_events, box, tmp_path, capsys):
    """A hardware YAML with kernel_tables on a 2 x 2 x 2 grid: the cell the points fall in moves, the others
    keep the file's figures, and the written file reads back as the same hardware with the new tables."""
    from ndcost.cli import main

    grid = {"m": [16, 1024], "n": [16, 1024], "k": [16, 1024],
            "efficiency": [[[0.3, 0.31], [0.32, 0.33]], [[0.34, 0.35], [0.36, 0.37]]]}
    spec = dict(SPEC, kernel_tables={"gemm": {"fp32": grid}, "launch_seconds": 4.0e-6, "source": "by hand"})
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "refit.yaml"
    assert main(["calibrate", "--trace", str(trace), "--hardware", str(path), "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    seconds = _expected_seconds(raw_events)
    # the fp32 shapes' nearest nodes in log2 (16 = 2^4, 1024 = 2^10): (64, 48, 32) twice and (32, 8, 16) ->
    # (16, 16, 16); (128, 256, 64) -> (16, 1024, 16), m = 2^7 halfway going to the lower node
    low = [0, 2, 5]
    ideal = sum(2 * GEMMS[i][1] * GEMMS[i][2] * GEMMS[i][3] / PEAK["fp32"] for i in low)
    cells = {(c["m"], c["n"], c["k"]): c for c in data["cells"] if c.get("dtype") == "fp32"}
    assert cells[(16, 16, 16)]["points"] == 3
    assert cells[(16, 16, 16)]["prior"] == 0.3
    assert cells[(16, 16, 16)]["fitted"] == pytest.approx(ideal / sum(seconds[i] for i in low), rel=1e-12)
    big = 2 * 128 * 256 * 64 / PEAK["fp32"] / seconds[1]
    assert cells[(16, 1024, 16)]["points"] == 1 and cells[(16, 1024, 16)]["prior"] == 0.32
    assert cells[(16, 1024, 16)]["fitted"] == pytest.approx(big, rel=1e-12)
    written = yaml.safe_load(out.read_text())
    tables = written.pop("kernel_tables")
    check_kernel_tables(tables, "written")
    efficiency = tables["gemm"]["fp32"]["efficiency"]
    assert efficiency[0][0][1] == 0.31 and efficiency[1][1][1] == 0.37        # no points: the file's figures
    assert tables["launch_seconds"] == 4.0e-6                                  # a CPU trace fits no launch floor
    assert "bf16" in tables["gemm"] and tables["source"] == f"torch.profiler trace {trace}"
    assert hardware_from_mapping(written).name == "refit" and written["peak_flops_per_second"] == PEAK
    assert main(["calibrate", "--trace", str(trace), "--hardware", str(path)]) == 0     # the same, as text
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["fp32", "16", "16", "16", "3", "0.3"] in [line[:6] for line in lines]
    assert ["launch_seconds:", "4e-06", "s", "->", "4e-06", "s"] in [line[:6] for line in lines]
    assert any(line[:5] == ["fit", "error", "on", "the", "6"] and "before," in line for line in lines)


def test_gpu_trace_matches_kernels_and_reads_the_timeline(tmp_path):
    """A hand-written Kineto trace: aten::matmul over aten::mm, whose two kernels are matched one by its
    "External id", one through its launch's correlation; nine kernels fed back to back 3 us apart, then ten
    launches 20 us apart each after the previous kernel ended."""
    def op(name, ts, dur, ext, dims=None):
        args = {"External id": ext, **({"Input Dims": dims, "Input type": ["c10::BFloat16"] * 2} if dims else {})}
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}

    def launch(ts, corr, ext=None):
        args = {"correlation": corr, **({"External id": ext} if ext else {})}
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts,
                "dur": 0.5 if ts < 1000 else 1.0, "args": args}

    def kernel(ts, dur, corr, ext=None):
        return {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                "args": {"correlation": corr, "stream": 7, **({"External id": ext} if ext else {})}}

    dims = [[256, 1024], [1024, 4096]]
    events = [op("aten::matmul", 5000, 40, 6, dims), op("aten::mm", 5001, 30, 7, dims),
              launch(5002, 70, 7), launch(5010, 71, 7), kernel(5100, 10, 70, 7), kernel(5111, 5, 71)]
    events += [launch(i, 100 + i) for i in range(10)] + [kernel(100 + 3 * i, 2, 100 + i) for i in range(10)]
    events += [launch(1000 + 20 * i, 200 + i) for i in range(10)]
    events += [kernel(1002 + 20 * i, 2, 200 + i) for i in range(10)]
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"traceEvents": events}))
    points = kt.read_trace(str(path))
    (gemm,) = points.gemm
    assert (gemm.m, gemm.n, gemm.k, gemm.batch, gemm.dtype, gemm.op) == (256, 4096, 1024, 1, "bf16", "aten::mm")
    assert gemm.seconds == pytest.approx(15e-6, rel=1e-12)
    # fed pairs: the nine 3 us ones, and the mm's second kernel, launched before its first ended (11 us)
    assert points.device == "cuda" and points.launch_samples == 10
    assert points.launch_seconds == pytest.approx(3e-6, rel=1e-9)
    # starved pairs: the ten 20 us ones but the last (9), the step from the fed run into them (1), and the one
    # from the last of them to the mm's first launch (1): median 20 us
    assert points.dispatch_samples == 11
    assert points.dispatch_seconds == pytest.approx(20e-6, rel=1e-9)


@pytest.mark.slow
def test_trace_refusals_are_one_line(tmp_path, capsys, box):
    from ndcost.cli import main

    no_matmul = _profile(tmp_path / "adds.json", lambda torch: torch.add(torch.ones(8), torch.ones(8)))
    no_shapes = _profile(tmp_path / "flat.json", lambda torch: torch.mm(torch.ones(4, 4), torch.ones(4, 4)),
                         record_shapes=False)
    garbled = tmp_path / "garbled.json"
    garbled.write_text('{"traceEvents": [{"ph": "X", "cat": "cpu_op"')
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"hello": 1}))
    for path, words in ((no_matmul, "no matmul"), (no_shapes, "record_shapes=True"), (garbled, "is not JSON"),
                        (other, "not a Chrome trace"), (tmp_path / "absent.json", "absent.json")):
        assert main(["calibrate", "--trace", str(path), "--hardware", str(box)]) == 1
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert main(["calibrate", "--kernels", str(other), "--hardware", str(box)]) == 1
    assert "measure_kernels.py" in capsys.readouterr().err


def test_usage_errors(capsys, tmp_path):
    from ndcost.cli import main

    for argv in (["calibrate"], ["calibrate", "--kernels", "a.json", "--trace", "b.json"],
                 ["calibrate", "--trace", "b.json", "--only", "x*"], ["calibrate", "m.json", "--trace", "b.json"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "error:" in capsys.readouterr().err


def test_cell_above_the_peak_is_refused():
    slow_peak = hardware_from_mapping(dict(SPEC, peak_flops_per_second={"fp32": 1.0e6}))
    points = kt.KernelPoints(source="by hand", device="cuda",
                             gemm=(kt.GemmPoint(m=256, n=1024, k=1024, dtype="fp32", seconds=1e-3),))
    with pytest.raises(InvalidValue, match="above 1.*--hardware"):
        kt.fit_kernel_tables(points, slow_peak)
    fp8 = kt.KernelPoints(source="by hand", device="cuda",
                          gemm=(kt.GemmPoint(m=256, n=1024, k=1024, dtype="fp8", seconds=1e-3),))
    fit = kt.fit_kernel_tables(fp8, slow_peak)      # no fp8 peak: passed over and said
    assert "gemm" not in fit.tables and list(fit.points.skipped.values()) == [1]


def test_a_measured_shape_table_is_the_cells_prior():
    """With a current gemm_shape the cells a fit leaves alone keep what the time model read there: the shape
    table's figure over its best cell, times efficiency.matmul (0.5); here a table 0.2 at m = 256, 0.8 at 1024."""
    shape = {"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096],
                      "efficiency": [[[0.2, 0.2], [0.2, 0.2]], [[0.8, 0.8], [0.8, 0.8]]]}, "source": "by hand"}
    box = hardware_from_mapping(SPEC)
    points = kt.KernelPoints(source="by hand", device="cuda",
                             gemm=(kt.GemmPoint(m=1024, n=4096, k=4096, dtype="bf16", seconds=1.0),),
                             gemm_grids={"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096]}})
    fit = kt.fit_kernel_tables(points, box, current={"gemm_shape": shape})
    cells = fit.tables["gemm"]["bf16"]["efficiency"]
    assert cells[0][0][0] == pytest.approx(0.5 * 0.2 / 0.8)     # m = 256: a quarter of the plateau
    assert cells[1][0][0] == pytest.approx(0.5)                  # m = 1024, n = k = 1024: the plateau
    measured = 2 * 1024 * 4096 * 4096 / PEAK["bf16"] / 1.0      # the one point's cell: ideal over measured
    assert cells[1][1][1] == pytest.approx(measured)
    assert fit.tables["gemm_shape"] == shape                      # kept as it was


def test_interpolation_is_trilinear_in_log2_and_clamped():
    table = {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096],
             "efficiency": [[[0.1, 0.2], [0.3, 0.4]], [[0.5, 0.6], [0.7, 0.8]]]}
    shapes = [[512, 1024, 1024],      # halfway in log2 along m: (0.1 + 0.5) / 2
              [512, 2048, 2048],      # the centre: the mean of the eight
              [64, 1 << 20, 1024],    # clamped: m to 256, n to 4096 -> 0.3
              [1024, 4096, 4096]]
    import numpy as np
    assert kt.interpolate(table, np.array(shapes, dtype=float)).tolist() == pytest.approx([0.3, 0.45, 0.3, 0.8])


def test_check_kernel_tables_takes_the_schema_and_names_what_is_wrong():
    good = {"gemm": {"bf16": {"m": [256, 1024, 4096, 16384], "n": [1024, 4096, 16384], "k": [1024, 4096, 16384],
                              "efficiency": [[[0.5] * 3] * 3] * 4}},
            "elementwise": {"bytes": [65536, 1048576, 16777216, 268435456], "efficiency": [0.2, 0.5, 0.8, 0.9]},
            "launch_seconds": 4.0e-6, "dispatch_seconds": 1.2e-5, "source": "by hand"}
    check_kernel_tables(good, "hardware 'x'")
    bad = [({**good, "sdpa": {}}, "unknown key"),
           ({**good, "gemm": {"bf16": {**good["gemm"]["bf16"], "efficiency": [[[0.5] * 3] * 3] * 3}}},
            "make it 4 x 3 x 3"),
           ({**good, "gemm": {"bf16": {**good["gemm"]["bf16"], "m": [256, 256, 4096, 16384]}}}, "increasing"),
           ({**good, "elementwise": {"bytes": good["elementwise"]["bytes"], "efficiency": [0.2, 0.5, 0.8, 1.5]}},
            r"outside \(0, 1\]"),
           ({**good, "launch_seconds": -1.0}, "launch_seconds"),
           ({**good, "gemm": {"bf16": {"m": [1], "n": [1]}}}, "exactly m, n, k")]
    for tables, words in bad:
        with pytest.raises(InvalidValue, match=words):
            check_kernel_tables(tables, "hardware 'x'")


@pytest.mark.slow
def test_measure_kernels_dry_run_feeds_calibrate(tmp_path, box, capsys):
    """measure_kernels.py --dry-run --quick on the CPU, end to end; calibrate --kernels re-derives every cell
    from its raw timings against the hardware named (here, the hand-made one)."""
    from ndcost.cli import main

    measured = tmp_path / "kernels.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "measure_kernels.py"), "--dry-run", "--quick",
                           "--hardware", str(box), "--out", str(measured)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    doc = json.loads(measured.read_text())
    assert doc["device"] == "cpu" and doc["format"] == "ndcost-kernel-measurements" and doc["torch"]
    assert doc["sdpa"]["timings"] and doc["launch"]["launch_seconds"] > 0
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "--kernels", str(measured), "--hardware", str(box), "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    for dtype, entry in doc["gemm"].items():
        grid, table = entry["grid"], data["kernel_tables"]["gemm"][dtype]
        assert {a: table[a] for a in "mnk"} == grid
        for t in entry["timings"]:
            i, j, k = grid["m"].index(t["m"]), grid["n"].index(t["n"]), grid["k"].index(t["k"])
            assert table["efficiency"][i][j][k] == pytest.approx(
                2 * t["m"] * t["n"] * t["k"] / PEAK[dtype] / t["seconds"], rel=1e-12)
        assert doc["tables"]["gemm"][dtype] == table     # the script's own tables: the same derivation
    assert data["errors"]["gemm"]["rms_log_error_fitted"] == pytest.approx(0.0, abs=1e-9)  # every point a node
    assert data["kernel_tables"]["launch_seconds"] == doc["launch"]["launch_seconds"]
    written = yaml.safe_load(out.read_text())
    check_kernel_tables(written.pop("kernel_tables"), "written")
    assert hardware_from_mapping(written).name == "fitted"
    assert main(["calibrate", "--kernels", str(measured), "--json"]) == 0   # the hardware the run divided by
    assert json.loads(capsys.readouterr().out)["hardware"] == "testbox"
