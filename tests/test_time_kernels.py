"""Kernels the time model knows: GEMM efficiency by shape (tables and the prior), launch and dispatch bounds.

Expected figures are derived by hand here: the trilinear reads of a small table, the waves of 128 x 128
tiles over 132 SMs, the launches of Transformers' eager LlamaDecoderLayer (the census's count in
tests/test_census.py), the dispatch bound they set.
"""
from __future__ import annotations

import math
import types

import attrs
import numpy as np
import pytest

import ndcost
from ndcost import kernels
from ndcost.compose import time as ct
from ndcost.errors import InvalidValue
from ndcost.layer import LayerKind
from ndcost.plugins.estimators import flops as analytic
from ndcost.specio import hardware_from_mapping, load_hardware_yaml
from ndcost.values import LayerGroup, ModelSpec, Strategy
from ndcost.work import Gemm

EFFICIENCY = [[[0.10, 0.20], [0.30, 0.40]],  # m = 256: n = 1024 (k = 1024, 4096), n = 4096 (k ...)
              [[0.50, 0.60], [0.70, 0.80]]]  # m = 1024


def _tables(**extra):
    return {"gemm": {"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096], "efficiency": EFFICIENCY}},
            "source": "made up for the test", **extra}


@pytest.fixture(scope="module")
def h200(registry):
    return registry.get("hardware/h200")


def _with_tables(hardware, tables):
    return attrs.evolve(hardware, name="h200_tables", kernel_tables=tables)


def tiny_llama(layers=2, hidden=64):
    return ModelSpec(name="tiny-llama", model_type="llama", family="llama", hidden_size=hidden, vocab_size=128,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=4 * hidden,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")})


def _layer(work, hardware, **fields):
    cols = ct.strategy_columns([Strategy(**{"seq": 4096, **fields})])
    return ct.layer_seconds(work, cols, hardware)


# ---------------------------------------------------------------------------
# tables
# ---------------------------------------------------------------------------
def test_table_at_grid_points_between_them_and_past_the_edges():
    table = kernels.parse_kernel_tables("test", _tables()).gemm["bf16"]
    assert kernels.table_gemm_efficiency(table, 1024, 1024, 4096) == pytest.approx(0.60)
    assert kernels.table_gemm_efficiency(table, 256, 4096, 1024) == pytest.approx(0.30)
    # m = 512 is halfway between 256 and 1024 in log2 (8, 9, 10), n = 2048 halfway too, k = 1024 on the grid:
    # the mean of the four corners at k = 1024, (0.1 + 0.3 + 0.5 + 0.7) / 4
    assert kernels.table_gemm_efficiency(table, 512, 2048, 1024) == pytest.approx(0.40)
    # a quarter of the way in log2 along k only (k = 2^10.5 between 2^10 and 2^12): 0.1 + 0.25 * (0.2 - 0.1)
    assert kernels.table_gemm_efficiency(table, 256, 1024, 2 ** 10.5) == pytest.approx(0.125)
    # clamped at the edges: below the grid reads its first point, above it its last
    assert kernels.table_gemm_efficiency(table, 16, 16, 16) == pytest.approx(0.10)
    assert kernels.table_gemm_efficiency(table, 1 << 20, 1 << 20, 1 << 20) == pytest.approx(0.80)
    got = kernels.table_gemm_efficiency(table, np.array([[1024], [256]]), 1024, np.array([4096, 1024]))
    assert got.shape == (2, 2) and got[0, 0] == pytest.approx(0.60) and got[1, 1] == pytest.approx(0.10)


def test_elementwise_table_is_linear_in_log2_bytes():
    tables = kernels.parse_kernel_tables("test", _tables(elementwise={"bytes": [65536, 1048576],
                                                                       "efficiency": [0.2, 0.6]}))
    # 262144 bytes is halfway between 2^16 and 2^20 in log2
    assert kernels.elementwise_efficiency(tables, 262144, stated=0.5) == pytest.approx(0.4)
    assert kernels.elementwise_efficiency(tables, 1, stated=0.5) == pytest.approx(0.2)
    assert kernels.elementwise_efficiency(None, 262144, stated=0.5) == 0.5


@pytest.mark.parametrize("tables, says", [
    (_tables(gemm={"bf16": {"m": [1024, 256], "n": [1024, 4096], "k": [1024, 4096], "efficiency": EFFICIENCY}}),
     "gemm.bf16.m must be strictly increasing"),
    (_tables(gemm={"bf16": {"m": [256], "n": [1024, 4096], "k": [1024, 4096], "efficiency": EFFICIENCY}}),
     "gemm.bf16.efficiency has shape 2 x 2 x 2; its axes make it 1 x 2 x 2"),
    (_tables(gemm={"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [0, 4096], "efficiency": EFFICIENCY}}),
     "gemm.bf16.k holds 0"),
    (_tables(gemm={"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096],
                            "efficiency": [[[0.1, 0.2], [0.3, 0.4]], [[0.5, 1.5], [0.7, 0.8]]]}}),
     r"gemm.bf16.efficiency\[1, 0, 1\] = 1.5 is outside \(0, 1\]"),
    (_tables(gemm={"bf16": {"m": [256, 1024], "n": [1024, 4096], "efficiency": EFFICIENCY}}),
     "gemm.bf16 must state exactly m, n, k and efficiency"),
    (_tables(elementwise={"bytes": [1, 2], "efficiency": [0.5]}),
     "elementwise.efficiency has shape 1; its axes make it 2"),
    (_tables(launch_seconds=-1.0), "launch_seconds must be a number of seconds >= 0"),
    (_tables(warps=3), "unknown key.s. warps"),
    ({"gemm": {}}, "source must say where the figures came from"),
    (_tables(gemm_shape={"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096], "efficiency": EFFICIENCY}}),
     "gemm_shape.source must say where its GEMMs were measured"),
    (_tables(gemm_shape={"bf17": {"m": [256], "n": [1024], "k": [1024], "efficiency": [[[0.5]]]}, "source": "s"}),
     "gemm_shape.bf17: 'bf17' is not a dtype"),
    (_tables(gemm_shape=[0.5]), "gemm_shape must map a dtype to its table"),
])
def test_bad_tables_are_refused_naming_the_file_and_key(h200, tmp_path, tables, says):
    import yaml
    data = {"name": "bad", "memory_bytes": 1 << 30, "hbm_bytes_per_second": 1e12,
            "peak_flops_per_second": {"bf16": 1e15}, "devices_per_node": 8, "network": {}, "kernel_tables": tables}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InvalidValue, match=f"hardware spec {path}: hardware 'bad': kernel_tables.*{says}"):
        load_hardware_yaml(path)


def test_a_table_prices_the_layer_and_says_so(h200):
    hardware = hardware_from_mapping({"name": "h200_tables", "memory_bytes": h200.memory_bytes,
                                      "hbm_bytes_per_second": h200.hbm_bytes_per_second,
                                      "peak_flops_per_second": dict(h200.peak_flops_per_second),
                                      "devices_per_node": 8, "efficiency": dict(h200.efficiency),
                                      "network": {lv.name: {"bytes_per_second": lv.bytes_per_second,
                                                            "latency_seconds": lv.latency_seconds}
                                                  for lv in h200.network},
                                      "kernel_tables": _tables(launch_seconds=0.0, dispatch_seconds=0.0)})
    # Llama-3-8B's GEMMs at 4096 tokens read the table clamped (m -> 1024, n and k -> at most 4096): q, o, gate,
    # up and down at the far corner (0.8); k and v (n = 1024, k = 4096) at 0.6
    work = analytic.model_work(ModelSpec(
        name="llama-3-8b", model_type="llama", family="llama", hidden_size=4096, vocab_size=128256,
        layers=(LayerGroup(kind="dense", count=1),), num_attention_heads=32, num_key_value_heads=8, head_dim=128,
        intermediate_size=14336, kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}), 4096)
    dense = work.work["dense"]
    matmul = (dense.attention_mm_flops_per_token + dense.other_mm_flops_per_token) * 4096
    k_v = 2 * 2 * 4096 * 4096 * 1024
    eff = ct.efficiencies(hardware)[0]
    scores = dense.score_flops_per_pair * 4096 * 4097 / 2
    elementwise = 2.0 * 4096 * (dense.elementwise_elements_per_token + dense.replicated_elements_per_token)
    peak, hbm = 989e12, 4.8e12
    expected = ((matmul - k_v) / (peak * 0.8) + k_v / (peak * 0.6) + scores / (peak * eff["attention"])
                + elementwise / (hbm * eff["memory"]))
    layer = _layer(work, hardware)
    assert layer["forward"][0, 0] == pytest.approx(expected, rel=1e-12)
    provenance = ct.step_time(work, [Strategy(seq=4096)], hardware).provenance["kernels"]
    assert "kernel_tables (bf16; made up for the test)" in provenance


def test_a_measured_shape_table_prices_by_shape_at_the_stated_plateau(h200):
    """gemm_shape: a table's shape dependence, its best cell (0.8 here) at the stated efficiency, by hand."""
    tables = kernels.parse_kernel_tables("test", {"gemm_shape": {"bf16": {
        "m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096], "efficiency": EFFICIENCY}, "source": "made up"},
        "source": "made up for the test"})

    def eff(m, n, k, groups=1.0):
        return float(kernels.gemm_efficiency(h200, tables, "bf16", m, n, k, stated=0.7, groups=groups))
    assert eff(1024, 4096, 4096) == pytest.approx(0.7)
    assert eff(1 << 16, 1 << 16, 1 << 16) == pytest.approx(0.7)        # above the grid: its last cell
    assert eff(256, 1024, 1024) == pytest.approx(0.7 * 0.1 / 0.8)
    assert eff(1024, 4096, 256) == pytest.approx(0.7 * 0.7 / 0.8)      # a k below the grid: its first
    # an m or n below the grid takes the least's time for its fewer FLOPs: 128 rows half of 256's share
    assert eff(128, 4096, 4096) == pytest.approx(0.7 * 0.4 / 0.8 / 2)
    assert eff(256, 512, 4096) == pytest.approx(0.7 * 0.2 / 0.8 / 2)
    # 16 experts of 64 rows each, each padded to a 128-row tile: as 16 experts of 128 rows, the merged GEMM of
    # 2,048 rows at the grid's last m (share 0.5 / 0.8), plus one expert's weight reads beyond the merged GEMM's
    # (bf16, 2 bytes an element: intensity 2 x 128 x 1024 x 1024 / (2 x (128 x 1024 + 1024 x 1024 + 128 x
    # 1024)) FLOP a byte, over the ridge), of whose FLOPs 64 / 128 are the problem's
    ridge = h200.peak_flops("bf16") / h200.hbm_bytes_per_second
    roof_expert = min(1.0, 2 * 128 * 1024 * 1024 / (2 * (128 * 1024 + 1024 * 1024 + 128 * 1024)) / ridge)
    roof_merged = min(1.0, 2 * 2048 * 1024 * 1024 / (2 * (2048 * 1024 + 1024 * 1024 + 2048 * 1024)) / ridge)
    assert roof_expert < 0.6 and roof_merged == 1.0
    share = 64 / 128 / (1 / (0.5 / 0.8) + 1 / roof_expert - 1 / roof_merged)
    assert eff(64, 1024, 1024, groups=16) == pytest.approx(0.7 * share)
    assert eff(64, 1024, 1024, groups=16) < eff(1024, 1024, 1024)
    # so 64 rows an expert take exactly as long as 128 (twice the FLOPs at twice the efficiency), and 1 row too
    assert eff(128, 1024, 1024, groups=16) == pytest.approx(2 * eff(64, 1024, 1024, groups=16))
    assert eff(1, 1024, 1024, groups=16) == pytest.approx(eff(128, 1024, 1024, groups=16) / 128)
    # a dtype it has no table for keeps the prior
    assert float(kernels.gemm_efficiency(h200, tables, "fp16", 8192, 8192, 8192, stated=0.7)) == pytest.approx(0.7)


def test_the_provenance_names_the_measured_shapes(h200):
    work = analytic.model_work(tiny_llama(), 256)
    provenance = ct.step_time(work, [Strategy(seq=256)], h200).provenance["kernels"]
    assert "kernel_tables.gemm_shape's measured shape dependence" in provenance and "sm_90" in provenance


def _xla_extract():
    import json
    from pathlib import Path
    return json.loads((Path(__file__).resolve().parents[1] / "benchmarks" / "data"
                       / "xla_matmul_perf_table_ea2c45f.json").read_text())


# XLA's default matmul performance table (ROCm/xla ea2c45f2ca, xla/service/gpu/model/matmul_interpolator_data.h),
# FLOP/s of one GEMM read off the header by hand: (4096, 4096, 4096) and (1024, 4096, 4096), bf16, b = 1
XLA_BY_HAND = {"sm_90": (780193877565849, 751920044817927), "sm_100_B200": (1416867213789406, 1213953447145279),
               "gfx942": (583139376939004, 433080470493332), "gfx950": (1397291136446355, 809607407351555)}


@pytest.mark.parametrize("name, device", [("h100", "sm_90"), ("h200", "sm_90"), ("h800", "sm_90"),
                                          ("h100-hbm2e-500w", "sm_90"), ("b200", "sm_100_B200"),
                                          ("gb200", "sm_100_B200"), ("mi300x", "gfx942"), ("mi325x", "gfx942"),
                                          ("mi355x", "gfx950")])
def test_shipped_gemm_shapes_are_xlas_measurements(registry, name, device):
    """Each shipped gemm_shape cell is XLA's FLOP/s over the file's bf16 peak (benchmarks/data's extract,
    checked against the header by hand), and a 1024-row GEMM runs at XLA's ratio of the 4096^3 one."""
    data = _xla_extract()
    hardware = registry.get(f"hardware/{name}")
    tables = kernels.parse_kernel_tables(name, hardware.kernel_tables)
    assert "ea2c45f2ca" in tables.gemm_shape_source and device in tables.gemm_shape_source
    rows = {(r["m"], r["n"], r["k"]): r["flops"]["bf16xbf16->bf16"] for r in data["devices"][device] if r["b"] == 1}
    big, tall = XLA_BY_HAND[device]
    assert rows[(4096, 4096, 4096)] == big and rows[(1024, 4096, 4096)] == tall and len(rows) == 125
    peak = hardware.peak_flops("bf16")
    for (m, n, k), flops in rows.items():
        assert float(kernels.table_gemm_efficiency(tables.gemm_shape["bf16"], m, n, k)) == pytest.approx(
            flops / peak, abs=5e-5)
    stated = float(hardware.efficiency["matmul"])
    got = float(kernels.gemm_efficiency(hardware, tables, "bf16", 1024, 4096, 4096, stated=stated))
    assert got == pytest.approx(stated * tall / max(rows.values()), rel=1e-3)


@pytest.mark.parametrize("name, device", [("h200", "sm_90"), ("b200", "sm_100_B200"), ("mi300x", "gfx942"),
                                          ("mi355x", "gfx950")])
def test_the_grouped_rule_predicts_xlas_batched_gemms(registry, name, device):
    """XLA's batched GEMMs (2 or 4 problems of (m, n, k), each its own operands, as a rank's experts run them),
    which no hardware file reads: from the shipped single-GEMM table (its best cell the plateau, so only the
    shape rules are compared), the grouped rule lands within 0.3 (root mean square of the log) of them; the
    analytic prior and reading the batch as one problem miss by twice that."""
    import importlib.util
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "import_xla_gemm_tables.py"
    spec = importlib.util.spec_from_file_location("import_xla_gemm_tables", script)
    importer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(importer)
    errors = importer.batched_errors(_xla_extract(), device, registry.get(f"hardware/{name}"))
    rms = {how: math.sqrt(sum(e * e for e in v) / len(v)) for how, v in errors.items()}
    assert len(errors["grouped"]) == 250
    assert rms["grouped"] < 0.3 and 2 * rms["grouped"] < min(rms["one problem"], rms["prior"])


# ---------------------------------------------------------------------------
# the prior
# ---------------------------------------------------------------------------
def test_a_large_square_gemm_lands_at_the_stated_efficiency(h200):
    assert h200.sm_count == 132
    got = kernels.gemm_efficiency(h200, None, "bf16", 8192, 8192, 8192, stated=0.7699)
    assert got == pytest.approx(0.7699, rel=1e-12)


def test_the_prior_counts_waves_of_tiles(h200):
    """128 x 128 tiles over 132 SMs, by hand.

    The reference, 8192^3: 64 x 64 = 4096 tiles in ceil(4096 / 132) = 32 waves, a share 4096 / 4224 of the
    slots; its intensity 8192 / 3 FLOP a byte, above the ridge 989e12 / 4.8e12 = 206.
    m = 128 x 132, n = 256: 264 tiles, exactly two waves (share 1); k = 65536 makes its intensity
    m n k / (m k + k n + m n) = 251 FLOP a byte (bf16: 2 bytes, 2 FLOPs), above the ridge.
    m = 128 x 133: 266 tiles, three waves of 132 slots (the last holding 2 tiles), a share 266 / 396.
    """
    reference = 4096 / 4224
    stated = 0.7
    full = kernels.gemm_efficiency(h200, None, "bf16", 128 * 132, 256, 65536, stated=stated)
    ragged = kernels.gemm_efficiency(h200, None, "bf16", 128 * 133, 256, 65536, stated=stated)
    assert full == pytest.approx(stated / reference, rel=1e-12)
    assert ragged == pytest.approx(stated * (266 / 396) / reference, rel=1e-12)
    # below the ridge the roofline scales it: n = 128 (one tile wide, 132 tiles: one wave), k = 65536
    m, n, k = 128 * 132, 128, 65536
    intensity = m * n * k / (m * k + k * n + m * n)
    assert intensity < 989e12 / 4.8e12
    got = kernels.gemm_efficiency(h200, None, "bf16", m, n, k, stated=stated)
    assert got == pytest.approx(stated * intensity / (989e12 / 4.8e12) / reference, rel=1e-12)
    # a grouped GEMM of 8 experts of 33 tiles each (264 tiles): two full waves, as one problem of 264 tiles; alone,
    # 33 tiles fill a quarter of a wave. Below the ridge (roof r) the two costs add, 1 / f = 1 / waves + 1 / r - 1:
    # grouped r, alone 1 / (4 + 1 / r - 1)
    m = 128 * 33
    roof = (m * 128 * 65536 / (m * 65536 + 65536 * 128 + m * 128)) / (989e12 / 4.8e12)
    grouped = kernels.gemm_efficiency(h200, None, "bf16", m, 128, 65536, stated=stated, groups=8.0)
    alone = kernels.gemm_efficiency(h200, None, "bf16", m, 128, 65536, stated=stated)
    assert grouped / alone == pytest.approx(roof * (3 + 1 / roof), rel=1e-12)
    # a skinny GEMM (one token through an 8B layer's MLP) runs a whole tile row: priced as 128 rows (112 tiles,
    # a wave of 132 slots; their weights' read, not m^2 less), a 128th of their FLOPs its own
    m, n, k = 128, 14336, 4096
    roof = (m * n * k / (m * k + k * n + m * n)) / (989e12 / 4.8e12)
    waves = m * n / (132 * 128 * 128)
    got = kernels.gemm_efficiency(h200, None, "bf16", 1, n, k, stated=stated)
    assert got == pytest.approx(stated / (1 / waves + 1 / roof - 1) / reference / 128, rel=1e-12)


def test_tensor_parallel_splits_move_the_shapes(h200):
    """A column GEMM's n and a row GEMM's k shrink under TP: with a table that rises along n only, the forward's
    matmul seconds at TP 2 are more than half of TP 1's."""
    flat_k = [[[0.25, 0.25], [0.5, 0.5]], [[0.25, 0.25], [0.5, 0.5]]]
    tables = _tables(gemm={"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096], "efficiency": flat_k}})
    hardware = _with_tables(h200, tables)
    spec = tiny_llama(hidden=4096)
    spec = attrs.evolve(spec, intermediate_size=4096, num_attention_heads=32, num_key_value_heads=32, head_dim=128)
    work = analytic.model_work(spec, 4096)
    shares = {g.split for g in work.work["dense"].gemms}
    assert shares == {"column", "row"}
    cols = ct.strategy_columns([Strategy(seq=1024, tp=1), Strategy(seq=1024, tp=2)])
    rows = ct._rows(cols, hardware)
    inverse_f, _ = ct._matmul_inverse_efficiency(work, rows, cols, hardware, ct.efficiencies(hardware)[0])
    # tp 1: every GEMM has n = 4096 (0.5); tp 2: the column GEMMs n = 2048 (halfway in log2: 0.375), the row
    # GEMMs keep n = 4096 (0.5). Attention: q, k, v column, o row, each a quarter of the FLOPs
    assert inverse_f[0, 0, 0] == pytest.approx(1 / 0.5)
    assert inverse_f[1, 0, 0] == pytest.approx(0.75 / 0.375 + 0.25 / 0.5)
    # the MLP (other): gate and up column, down row, a third each
    assert inverse_f[1, 0, 1] == pytest.approx(2 / 3 / 0.375 + 1 / 3 / 0.5)


# ---------------------------------------------------------------------------
# launches
# ---------------------------------------------------------------------------
def test_analytic_launches_are_the_eager_llama_layers():
    """LlamaDecoderLayer's forward, counted in tests/test_census.py from Transformers' source: two RMSNorms of
    8 kernels, q, k, v, o and rotary on q and k (5 each), SDPA, gate, up, down, SiLU and the product, two
    residual adds: 16 + 14 + 1 + 5 + 2 = 38."""
    work = analytic.model_work(tiny_llama(), 16)
    assert work.work["dense"].launches_per_layer == 38
    assert "analytic launches" in work.work["dense"].source


def test_a_tiny_model_is_dispatch_bound(h200):
    """Two layers of width 64 at 16 tokens: microseconds of GPU work, so each pass is its launches x the
    dispatch figure: the shipped H200's fitted 38.1 us, which is also the prior of a device stating none
    (dispatch is the host's): 38 x 38.1 us forward, twice that backward."""
    work = analytic.model_work(tiny_llama(), 16)
    assert _layer(work, h200, seq=16)["forward"][0, 0] == pytest.approx(38 * 3.81e-5, rel=1e-12)
    h200 = attrs.evolve(h200, kernel_tables=None)  # the priors
    layer = _layer(work, h200, seq=16)
    assert layer["forward"][0, 0] == pytest.approx(38 * 3.81e-5, rel=1e-12)
    assert layer["backward"][0, 0] == pytest.approx(76 * 3.81e-5, rel=1e-12)
    assert layer["recompute"][0, 0] == 0.0
    # full recompute: one more forward's dispatch, with checkpoint's hooks (1.90 plain forwards, measured;
    # tests/test_checkpoint_overhead.py)
    full = _layer(work, h200, seq=16, recompute="full")
    assert full["recompute"][0, 0] == pytest.approx(38 * 3.81e-5 * 1.90, rel=1e-12)
    # a table's figures replace the priors: launch 4 us, dispatch 1 us -> the GPU floor, 38 x 4 us
    stated = _with_tables(h200, _tables(launch_seconds=4.0e-6, dispatch_seconds=1.0e-6))
    assert _layer(work, stated, seq=16)["forward"][0, 0] == pytest.approx(38 * 4.0e-6, rel=1e-12)
    # a long sequence is bounded by its work, not its launches
    long = _layer(work, h200, seq=65536)
    assert long["forward"][0, 0] > 38 * 1.0e-5


def test_census_launches_and_measured_flops_with_analytic_shares():
    """A census record's FLOPs stay the totals and its launches the count; the GEMM shapes are the analytic ones."""
    spec = tiny_llama()
    shapes = analytic.model_work(spec, 16).work["dense"]
    record = types.SimpleNamespace(seq=16, source="census test", flops_by_part={"attention": 1.0e6, "ffn": 2.0e6},
                                   traffic={"launches": {"norm": 16, "attention": 20, "ffn": 7}})
    measured = analytic.kind_work(spec, "dense", 16, record)
    assert measured.attention_mm_flops_per_token == pytest.approx(1.0e6 / 16)
    assert measured.launches_per_layer == 43 and "census launches" in measured.source
    assert measured.gemms == shapes.gemms
    assert Gemm(op_class="other", in_features=64, out_features=256, count=2, split="column") in measured.gemms


def test_kinds_without_shapes_keep_the_constant_efficiency_and_say_so(h200):
    work = analytic.model_work(tiny_llama(), 4096)
    bare = attrs.evolve(work, work={"dense": attrs.evolve(work.work["dense"], gemms=())})
    cols = ct.strategy_columns([Strategy(seq=4096)])
    rows = ct._rows(cols, h200)
    eff = ct.efficiencies(h200)[0]
    forward, backward = ct._matmul_inverse_efficiency(bare, rows, cols, h200, eff)
    assert np.allclose(forward, 1 / eff["matmul"]) and np.allclose(backward, 2 / eff["matmul_backward"])
    provenance = ct.step_time(bare, [Strategy(seq=4096)], h200).provenance["kernels"]
    assert "no GEMM shapes, constant efficiency.matmul: dense" in provenance


def test_routed_gemms_see_the_tokens_an_expert_receives(h200):
    """M of an expert's GEMM: 4096 tokens x top-2 over 8 experts, EP 2 -> tokens x 2 x 2 / 8 = 2048 a local
    expert, 4 experts a rank in one grouped GEMM; with a table flat along everything but m, the m read."""
    spec = ModelSpec(name="tiny-moe", model_type="mixtral", family="mixtral", hidden_size=1024, vocab_size=128,
                     layers=(LayerGroup(kind="moe", count=1),), num_attention_heads=8, num_key_value_heads=8,
                     head_dim=128, intermediate_size=1024, moe_intermediate_size=1024, num_experts=8,
                     num_experts_per_tok=2, kind_specs={"moe": LayerKind(attention="gqa", mlp="moe")})
    work = analytic.model_work(spec, 4096)
    routed = [g for g in work.work["moe"].gemms if g.op_class == "routed"]
    assert routed and all(g.experts == 8 and g.tokens_per_token == 2 for g in routed)
    by_m = [[[0.2, 0.2], [0.2, 0.2]], [[0.8, 0.8], [0.8, 0.8]]]  # m = 256: 0.2, m = 1024: 0.8; above clamps
    hardware = _with_tables(h200, _tables(gemm={"bf16": {"m": [256, 1024], "n": [1024, 4096], "k": [1024, 4096],
                                                         "efficiency": by_m}}))
    cols = ct.strategy_columns([Strategy(seq=512, ep=2, dp=2)])
    rows = ct._rows(cols, hardware)
    inverse_f, _ = ct._matmul_inverse_efficiency(work, rows, cols, hardware, ct.efficiencies(hardware)[0])
    # 512 tokens x 2 x 2 / 8 = 256 -> 0.2
    assert inverse_f[0, 0, 2] == pytest.approx(1 / 0.2)
    assert inverse_f[0, 0, 0] == pytest.approx(1 / (0.2 + 0.6 * math.log2(512 / 256) / 2))  # attention, m = 512


def test_evaluate_equals_evaluate_many_with_tables(h200):
    from ndcost.resolver import resolve
    hardware = _with_tables(h200, _tables(launch_seconds=3e-6, dispatch_seconds=2e-5,
                                          elementwise={"bytes": [4096, 1 << 24], "efficiency": [0.1, 0.6]}))
    model = resolve(tiny_llama(), hardware=hardware, census="off")
    strategies = [Strategy.parse(text) for text in ("seq=256", "seq=2048,tp=2,sp=true", "seq=512,recompute=full",
                                                    "seq=1024,pp=2,num_micro_batches=4")]
    batch = model.evaluate_many(strategies)
    assert batch.valid.all()
    for i, strategy in enumerate(strategies):
        one = model.evaluate(strategy).time
        assert one.step_seconds == pytest.approx(float(batch.time["step_seconds"][i]), rel=1e-12)
    assert "kernel_tables (bf16; made up for the test)" in batch.time["provenance"]["kernels"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama-3.1-8b", "qwen3-8b"])
def test_analytic_launches_equal_the_census_count(name):
    """The census counts the kernels Transformers' own layer launches on fake tensors: the analytic count of a
    Llama layer (38) and of a Qwen3 layer (38 and its q and k RMSNorms, 16 more) equal it."""
    pytest.importorskip("torch")
    import ndcost
    analytic_work = ndcost.resolve(name, census="off").model_work(4096).work["dense"]
    census_work = ndcost.resolve(name, census="auto").model_work(4096).work["dense"]
    assert "census launches" in census_work.source
    assert analytic_work.launches_per_layer == census_work.launches_per_layer == {"llama-3.1-8b": 38,
                                                                                  "qwen3-8b": 54}[name]


def test_fewer_tokens_never_take_longer():
    """A micro-batch of fewer tokens runs the same kernels on less data: its step is no longer (one token is
    bound by the weights' reads and the launches, not by a GEMM prior falling as m^2)."""
    model = ndcost.resolve("llama-3.1-8b", hardware="h200", census="off")
    steps = model.evaluate_many({"seq": [1, 4, 16, 64, 256, 1024, 4096]}).time["step_seconds"]
    assert (np.diff(steps) >= 0).all()


@pytest.mark.parametrize("name", ["h200", "b200", "a100", "mi300x"])
def test_fewer_rows_an_expert_never_take_longer(registry, name):
    """A grouped GEMM's problems pad their rows to whole tiles and read their weights whatever their rows: an
    expert of fewer tokens takes no longer (Qwen3-30B-A3B's 128 experts, 2,048 wide, 768 a gate; DeepSeek-V3's
    256, 7,168 wide, 2,048 a gate; a 4-expert layer), on a measured shape table (h200, b200, mi300x) and on the
    prior (a100); one token an expert as long as a tile's 128. A measured table's own wobble between its grid
    points (XLA's MI300X GEMMs of 512 rows no faster than of 1,024 at these widths) moves it by under 1%."""
    from ndcost.compose import time as time_model
    hw = registry.get(f"hardware/{name}")
    tables, stated = time_model._kernel_tables(hw), time_model.efficiencies(hw)[0]["matmul"]
    m = np.arange(1.0, 2049.0)
    for n, k, groups in ((1536, 2048, 128), (4096, 7168, 256), (5760, 2880, 4)):
        e = kernels.gemm_efficiency(hw, tables, "bf16", m, np.full_like(m, n), np.full_like(m, k), stated=stated,
                                    groups=np.full_like(m, groups))
        seconds = m / e  # times a constant: FLOPs over the achieved rate
        assert (np.diff(seconds) >= -0.01 * seconds[1:]).all(), (n, k, groups)
        assert seconds[0] == pytest.approx(seconds[127], rel=1e-12)
