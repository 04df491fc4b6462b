"""Attention efficiency by kernel, sequence, heads and head width: the tables, the prior, the kernel choice.

Expected figures are derived by hand here: the reads of small hand-written tables (linear in log2 seq), the
waves of 128-row query blocks over 132 SMs, the scores' FLOPs of a 4-head, 16-wide layer (4 h d s (s + 1) / 2),
PyTorch's SDPA backend rules (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp) and fits of hand-written
measure_kernels.py timings (ideal over measured seconds).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import attrs
import pytest
import yaml

from ndcost import kernels
from ndcost.compose import time as ct
from ndcost.errors import InvalidValue
from ndcost.layer import LayerKind
from ndcost.plugins import kernel_tables as kt
from ndcost.plugins.estimators import flops as analytic
from ndcost.specio import hardware_from_mapping
from ndcost.values import LayerGroup, ModelSpec, Strategy
from ndcost.work import window_pairs

PEAK = 1.0e15
HBM = 2.0e12
ROWS = [  # flash bf16, measured at batch 1
    {"seq": 1024, "heads": 32, "head_dim": 128, "causal": True, "forward": 0.30, "backward": 0.20},
    {"seq": 4096, "heads": 32, "head_dim": 128, "causal": True, "forward": 0.50, "backward": 0.40},
    {"seq": 4096, "heads": 8, "head_dim": 128, "causal": True, "forward": 0.25, "backward": 0.15},
    {"seq": 4096, "heads": 32, "head_dim": 64, "causal": True, "forward": 0.45, "backward": 0.35},
    {"seq": 4096, "heads": 32, "head_dim": 128, "causal": False, "forward": 0.60, "backward": 0.50},
]


def _spec(kernel_tables=None, **extra):
    spec = {"name": "attnbox", "memory_bytes": 2**36, "hbm_bytes_per_second": HBM,
            "peak_flops_per_second": {"bf16": PEAK, "fp32": PEAK / 16}, "devices_per_node": 8,
            "network": {"within_node": {"bytes_per_second": 4.0e11}, "across_nodes": {"bytes_per_second": 5.0e10}},
            "efficiency": {"matmul": 0.5, "matmul_backward": 0.5, "attention": 0.6, "attention_backward": 0.45,
                           "memory": 0.8, "memory_backward": 0.7}, "sm_count": 132, **extra}
    if kernel_tables is not None:
        spec["kernel_tables"] = kernel_tables
    return spec


def _box(kernel_tables=None, **extra):
    return hardware_from_mapping(_spec(kernel_tables, **extra))


def _flash(**entry):
    return {"attention": {"flash": {"source": "by hand", **entry}}, "source": "made up for the test"}


def tiny_llama():
    return ModelSpec(name="tiny-llama", model_type="llama", family="llama", hidden_size=64, vocab_size=128,
                     layers=(LayerGroup(kind="dense", count=2),), num_attention_heads=4, num_key_value_heads=2,
                     head_dim=16, intermediate_size=256, kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")})


def _work(kernel="sdpa", seq=4096):
    return attrs.evolve(analytic.model_work(tiny_llama(), seq), attention_kernel=kernel)


def _scores(seq, cp=1, tp=1, b=1):
    """The tiny layer's score FLOPs on one device: 4 heads x 16 wide x 4 at each causal pair, split cp x tp."""
    return 4 * 4 * 16 * seq * (seq + 1) / 2 * b / (cp * tp)


def _layer(work, hardware, **fields):
    return ct.layer_seconds(work, ct.strategy_columns([Strategy(**fields)]), hardware)


# ---------------------------------------------------------------------------
# the schema
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("tables, says", [
    (_flash(bf16=[{**ROWS[0], "forward": 1.2}]), "bf16[0].forward = 1.2 is outside (0, 1]"),
    (_flash(bf16=[{k: v for k, v in ROWS[0].items() if k != "heads"}]), "bf16[0] must state exactly"),
    (_flash(bf16=[{**ROWS[0], "causal": "yes"}]), "bf16[0].causal must be true or false"),
    (_flash(bf16=[{**ROWS[0], "seq": 0}]), "bf16[0].seq must be a positive integer"),
    (_flash(bf16=[ROWS[0], dict(ROWS[0])]), "bf16[1] repeats seq 1024"),
    (_flash(bf16=[]), "attention.flash.bf16 must be a non-empty list"),
    (_flash(bf17=[ROWS[0]]), "attention.flash has unknown key(s) bf17"),
    (_flash(), "attention.flash states neither a plateau nor rows"),
    (_flash(plateau={"forward": 0.5}), "attention.flash.plateau must state exactly forward and backward"),
    ({"attention": {"flash": {"plateau": {"forward": 0.5, "backward": 0.4}}}, "source": "x"},
     "attention.flash.source must say where"),
    ({"attention": ["flash"], "source": "x"}, "kernel_tables.attention must map a kernel name"),
    ({"sdpa_backends": ["cudnn", "flash", "flash"], "source": "x"}, "sdpa_backends must list SDPA's backends"),
    ({"sdpa_backends": ["fa3"], "source": "x"}, "sdpa_backends must list SDPA's backends"),
])
def test_bad_attention_tables_are_refused_naming_the_key(tables, says):
    with pytest.raises(InvalidValue, match="hardware 'x'") as caught:
        kernels.parse_kernel_tables("hardware 'x'", tables)
    assert says in str(caught.value)


def test_curves_are_linear_in_log2_seq_nearest_in_head_dim_and_heads():
    curves = kernels.parse_kernel_tables("t", _flash(bf16=ROWS)).attention["flash"].curves["bf16"]
    def read(seq, heads=32, head_dim=128, causal=True):
        return [float(v) for v in kernels.table_attention_efficiency(curves, seq, heads, head_dim, causal)]
    assert read(1024) == pytest.approx([0.30, 0.20])
    assert read(2048) == pytest.approx([0.40, 0.30])         # halfway in log2 between 1024 and 4096
    assert read(512) == pytest.approx([0.30, 0.20])          # clamped at the curve's ends
    assert read(65536) == pytest.approx([0.50, 0.40])
    assert read(4096, causal=False) == pytest.approx([0.60, 0.50])
    assert read(4096, heads=8) == pytest.approx([0.25, 0.15])
    assert read(4096, heads=12) == pytest.approx([0.25, 0.15])   # log2 12 nearer 8 than 32
    assert read(4096, heads=20) == pytest.approx([0.50, 0.40])   # nearer 32
    assert read(4096, head_dim=64) == pytest.approx([0.45, 0.35])
    assert read(4096, head_dim=96) == pytest.approx([0.50, 0.40])  # log2 96 = 6.58: nearer 128 than 64
    assert read(4096, head_dim=64, causal=False) == pytest.approx([0.45, 0.35])  # no such curve: the other causality
    forward, backward = kernels.table_attention_efficiency(curves, [[1024, 4096]], [[32], [8]], 128, True)
    assert forward.shape == (2, 2)                      # vectorized, broadcast; the 8-head curve holds one seq
    assert forward.ravel().tolist() == pytest.approx([0.30, 0.50, 0.25, 0.25])
    assert backward.ravel().tolist() == pytest.approx([0.20, 0.40, 0.15, 0.15])


def test_prior_counts_waves_of_query_blocks():
    # 32 heads x ceil(4096 / 128) = 1024 blocks: 8 waves of 132, 1056 slots
    assert kernels.prior_attention_efficiency(4096, 32, plateau=0.35, sm_count=132) == pytest.approx(
        0.35 * 1024 / 1056)
    # 8 heads x ceil(1000 / 128) = 64 blocks: one wave, 64 of its 132 slots busy
    assert kernels.prior_attention_efficiency(1000, 8, plateau=0.35, sm_count=132) == pytest.approx(0.35 * 64 / 132)
    assert kernels.prior_attention_efficiency(1000, 8, plateau=0.35, sm_count=None) == pytest.approx(0.35)
    box = _box(_flash(plateau={"forward": 0.4, "backward": 0.3}, bf16=ROWS))
    tables = kernels.parse_kernel_tables("t", box.kernel_tables)
    # rows for bf16; the plateau for fp16 (no rows); the constant for a kernel the tables do not name
    assert [float(v) for v in kernels.attention_efficiency(box, tables, "flash", "bf16", 1024, 32, 128, True,
                                                           stated=(0.6, 0.45))] == pytest.approx([0.30, 0.20])
    assert [float(v) for v in kernels.attention_efficiency(box, tables, "flash", "fp16", 1000, 8, 128, True,
                                                           stated=(0.6, 0.45))] == pytest.approx(
        [0.4 * 64 / 132, 0.3 * 64 / 132])
    assert [float(v) for v in kernels.attention_efficiency(box, tables, "efficient", "bf16", 1000, 8, 128, True,
                                                           stated=(0.6, 0.45))] == [0.6, 0.45]


def test_sdpa_backend_is_pytorchs_choice():
    pick = kernels.attention_kernel
    assert pick("sdpa", "bf16", 128, 128) == "flash"
    assert pick("sdpa", "fp16", 256, 256) == "flash"
    assert pick("sdpa", "fp32", 128, 128) == "efficient"       # flash takes fp16 / bf16 only
    assert pick("sdpa", "bf16", 192, 128) == "efficient"       # MLA: q and v widths differ
    assert pick("sdpa", "bf16", 512, 512) == "efficient"       # flash: at most 256
    cudnn_first = ("cudnn", "flash", "efficient")
    assert pick("sdpa", "bf16", 128, 128, cudnn_first) == "cudnn"
    assert pick("sdpa", "bf16", 192, 128, cudnn_first) == "efficient"   # cuDNN: at most 128 wide
    assert pick("sdpa", "bf16", 256, 256, cudnn_first) == "flash"
    assert pick("sdpa", "fp32", 64, 64, cudnn_first) == "efficient"
    # check_cudnn_tensor_shapes: 256 wide on Hopper (sm90 exactly, cuDNN >= 9.10), 128 elsewhere
    assert pick("sdpa", "bf16", 256, 256, cudnn_first, "9.0") == "cudnn"
    assert pick("sdpa", "bf16", 192, 128, cudnn_first, "9.0") == "cudnn"       # MLA's widths, both at most 256
    assert pick("sdpa", "bf16", 512, 512, cudnn_first, "9.0") == "efficient"
    assert pick("sdpa", "bf16", 256, 256, cudnn_first, "10.0") == "flash"
    assert pick("sdpa", "bf16", 256, 256, cudnn_first, "8.0") == "flash"
    assert pick("sdpa", "bf16", 256, 256, ("flash", "efficient"), "9.0") == "flash"  # PyTorch's default order
    assert pick("sdpa", "bf16", 128, 128, ("cudnn",)) == "cudnn"
    assert pick("sdpa", "fp32", 128, 128, ("cudnn", "flash")) == "math"
    assert pick("flash_attention_2", "bf16", 128, 128) == "flash"      # the same FlashAttention-2 kernels
    assert pick("npu_fusion_attention", "bf16", 128, 128) == "npu_fusion_attention"
    assert pick("eager", "bf16", 128, 128) == "eager"


# ---------------------------------------------------------------------------
# the time model
# ---------------------------------------------------------------------------
def test_scores_run_at_the_kernels_prior_on_the_block_shape():
    box = _box(_flash(plateau={"forward": 0.35, "backward": 0.30}))
    work = _work()
    # 1 x 4 heads x ceil(4096 / 128) = 128 blocks: one wave, 128 of 132 slots
    layer = _layer(work, box, seq=4096)
    assert layer["scores_forward"][0, 0] == pytest.approx(_scores(4096) / (PEAK * 0.35 * 128 / 132))
    assert layer["scores_backward"][0, 0] == pytest.approx(2 * _scores(4096) / (PEAK * 0.30 * 128 / 132))
    # micro-batch 2 x 4 heads / tp 2 = 4 heads' blocks, the FLOPs halved by TP and doubled by the batch
    layer = _layer(work, box, seq=4096, micro_batch=2, tp=2)
    assert layer["scores_forward"][0, 0] == pytest.approx(_scores(4096, tp=2, b=2) / (PEAK * 0.35 * 128 / 132))
    # ring CP 2 at seq 2100: step 0 on the rank's 1050 queries, 4 x ceil(1050 / 128) = 36 blocks, half the pairs;
    # step 1 at the slower rank's shape, rank 0's 525 queries: 4 x ceil(525 / 128) = 20 blocks (rank 1's 1050: 36)
    layer = _layer(work, box, seq=2100, cp=2)
    half = _scores(2100, cp=2) / 2
    assert layer["scores_forward"][0, 0] == pytest.approx(half / (PEAK * 0.35 * 36 / 132)
                                                          + half / (PEAK * 0.35 * 20 / 132))
    assert layer["scores_first_forward"][0, 0] == pytest.approx(half / (PEAK * 0.35 * 36 / 132))
    # Ulysses CP 2: the whole sequence on 2 heads, 2 x ceil(2100 / 128) = 34 blocks
    layer = _layer(work, box, seq=2100, cp=2, cp_algo="ulysses")
    assert layer["scores_forward"][0, 0] == pytest.approx(_scores(2100, cp=2) / (PEAK * 0.35 * 34 / 132))


def test_without_a_kernel_or_a_table_the_constant_prices_the_scores():
    box = _box(_flash(plateau={"forward": 0.35, "backward": 0.30}))
    for work, hardware in ((_work(kernel=""), box), (_work(), _box())):
        layer = _layer(work, hardware, seq=4096)
        assert layer["scores_forward"][0, 0] == pytest.approx(_scores(4096) / (PEAK * 0.6))
        assert layer["scores_backward"][0, 0] == pytest.approx(2 * _scores(4096) / (PEAK * 0.45))
    # fp32 rows run SDPA's efficient kernel, which these tables do not name: the constant, at fp32's peak
    layer = _layer(_work(), box, seq=4096, compute_dtype="fp32")
    assert layer["scores_forward"][0, 0] == pytest.approx(_scores(4096) / (PEAK / 16 * 0.6))
    # a torch preferring cuDNN runs cuDNN there instead of flash: the constant again
    layer = _layer(_work(), _box({**_flash(plateau={"forward": 0.35, "backward": 0.30}),
                                  "sdpa_backends": ["cudnn", "flash", "efficient"]}), seq=4096)
    assert layer["scores_forward"][0, 0] == pytest.approx(_scores(4096) / (PEAK * 0.6))


def test_rows_and_kinds_of_a_batch_each_take_their_own_kernel():
    """A bf16 row runs flash (the plateau), an fp32 row the efficient kernel (the constant) in one batch; a kind
    without heads keeps the constant beside one with them."""
    box = _box(_flash(plateau={"forward": 0.35, "backward": 0.30}))
    work = _work()
    dense = work.work["dense"]
    two = attrs.evolve(work, kinds=("dense", "bare"), layer_runs=(("dense", 1), ("bare", 1)),
                       work={"dense": dense, "bare": attrs.evolve(dense, kind="bare", attention_heads=0)})
    cols = ct.strategy_columns([Strategy(seq=4096), Strategy(seq=4096, compute_dtype="fp32")])
    forward = ct.layer_seconds(two, cols, box)["scores_forward"]
    assert forward[0, 0] == pytest.approx(_scores(4096) / (PEAK * 0.35 * 128 / 132))
    assert forward[0, 1] == pytest.approx(_scores(4096) / (PEAK * 0.6))
    assert forward[1, 0] == pytest.approx(_scores(4096) / (PEAK / 16 * 0.6))
    assert forward[1, 1] == pytest.approx(_scores(4096) / (PEAK / 16 * 0.6))


def test_eager_scores_are_batched_matmuls_and_softmax_bytes():
    # a GEMM table at 0.5 everywhere: every batched matmul of the scores runs at half the peak
    flat = {"m": [16, 4096], "n": [16, 4096], "k": [16, 4096], "efficiency": [[[0.5] * 2] * 2] * 2}
    box = _box({"gemm": {"bf16": flat}, "source": "flat"})
    layer = _layer(_work(kernel="eager"), box, seq=4096)
    scores = 4 * 4 * 16 * 4096 * 4096      # eager masks, it skips nothing: 2 s s (d + d_v) a head, every pair
    # 28 bytes a score (scaling 4, mask add 4, the upcast 6, the fp32 softmax 8, the cast back 6), every one of
    # the 4 heads' s x s
    softmax = 28 * 4 * 4096 * 4096
    assert layer["scores_forward"][0, 0] == pytest.approx(scores / (PEAK * 0.5) + softmax / (HBM * 0.8))
    assert layer["scores_backward"][0, 0] == pytest.approx(2 * scores / (PEAK * 0.5) + softmax / (HBM * 0.7))


def test_provenance_names_the_kernel_and_its_source():
    box = _box(_flash(plateau={"forward": 0.35, "backward": 0.30}))
    provenance = ct.step_time(_work(), [Strategy(seq=4096)], box).provenance["kernels"]
    assert "attention scores under the runtime's sdpa at bf16: dense: flash, prior: query-block waves x " \
           "kernel_tables.attention.flash.plateau 0.35 / 0.3 (by hand)" in provenance


def test_the_resolver_hands_the_runtimes_kernel_to_the_time_model():
    import ndcost

    assert ndcost.resolve(tiny_llama(), census="off").model_work(4096).attention_kernel == "sdpa"
    eager = ndcost.resolve(tiny_llama(), runtime="hf-cuda-eager", census="off").model_work(4096)
    assert eager.attention_kernel == "eager"
    work = eager.work["dense"]
    assert (work.attention_heads, work.attention_head_dim, work.attention_value_head_dim) == (4, 16, 16)


def test_the_shipped_plateaus_read_as_their_papers_say(registry):
    # FlashAttention's benchmarks count a backward as 2.5 forwards' FLOPs, ndcost as 2: a paper's backward share
    # x 2 / 2.5 (FlashAttention-2 on the A100: 73% forward, 63% backward; on the H100 35% forward, its backward
    # by the A100's ratio)
    a100 = (0.73, 0.63 * 2 / 2.5)
    h100 = (0.35, round(0.35 * 63 / 73 * 2 / 2.5, 2))
    # the 500 W part's tensor cores at 0.75 of the H200's shares (specs/hardware/h100-hbm2e-500w.yaml)
    # the H200 is the H100 SXM5's GH100 at the same 700 W: FlashAttention-2's plateau unchanged
    for name, plateau in (("a100", a100), ("h100", h100), ("h200", h100),
                          ("h100-hbm2e-500w", tuple(0.75 * p for p in h100))):
        hardware = registry.get(f"hardware/{name}")
        entry = kernels.parse_kernel_tables(name, hardware.kernel_tables).attention["flash"]
        assert entry.plateau == pytest.approx(plateau) and "arXiv:2307.08691" in entry.source


def test_the_h200_runs_sdpa_as_its_measurements_torch_did(registry):
    """h200.yaml's measurements ran torch 2.11, whose SDPA prefers cuDNN on sm90 (check_prefer_cudnn_attention):
    its layers saved cuDNN's 4-D softmax statistics, [1, 32, 4096, 1] fp32 (flash's log-sum-exp is 3-D); the file
    lists cuDNN first, which keeps efficiency.attention, the figure those measurements pinned."""
    data = json.loads((Path(__file__).parent / "data" / "h200_measurements.json").read_text())
    llama = next(layer for layer in data["layers"] if layer["case"] == "llama3_8b")
    assert data["software"]["torch"].startswith("2.11")
    stats = [t for t in llama["saved_tensors"] if t["dtype"] == "float32" and t["shape"][1:2] == [32]]
    assert [t["shape"] for t in stats] == [[1, 32, 4096, 1]]
    tables = kernels.parse_kernel_tables("h200", registry.get("hardware/h200").kernel_tables)
    assert tables.sdpa_backends[0] == "cudnn" and "cudnn" not in tables.attention
    assert kernels.attention_kernel("sdpa", "bf16", 128, 128, tables.sdpa_backends, "9.0") == "cudnn"


# ---------------------------------------------------------------------------
# the fit
# ---------------------------------------------------------------------------
def _measurements(tmp_path, timings):
    doc = {"format": kt.MEASUREMENTS_FORMAT, "device": "cuda", "device_name": "a hand-made GPU", "torch": "x",
           "hardware": "attnbox", "sdpa": {"timings": timings}}
    path = tmp_path / "kernels.json"
    path.write_text(json.dumps(doc))
    return path


def _timing(seq, causal, forward, forward_backward, backend="flash", heads=32, head_dim=128):
    return {"backend": backend, "dtype": "bf16", "seq": seq, "heads": heads, "head_dim": head_dim,
            "causal": causal, "forward_seconds": forward, "forward_backward_seconds": forward_backward}


def test_calibrate_fits_attention_rows_from_sdpa_timings(tmp_path, capsys):
    from ndcost.cli import main

    box = _box(_flash(plateau={"forward": 0.35, "backward": 0.30}))
    spec = tmp_path / "attnbox.yaml"
    spec.write_text(yaml.safe_dump(_spec(_flash(plateau={"forward": 0.35, "backward": 0.30}))))
    # flash causal at 4096: forward 4 x 32 x 128 x 4096 x 4097 / 2 FLOPs; two timings of it
    causal_flops = 4 * 32 * 128 * 4096 * 4097 / 2
    full_flops = 4 * 32 * 128 * 2048 * 2048
    timings = [_timing(4096, True, 1.0e-3, 3.5e-3), _timing(4096, True, 1.2e-3, 3.9e-3),
               _timing(2048, False, 0.5e-3, 1.6e-3, backend="efficient")]
    path = _measurements(tmp_path, timings)
    out = tmp_path / "fitted.yaml"
    assert main(["calibrate", "--kernels", str(path), "--hardware", str(spec), "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cells = {c["kernel"]: c for c in data["cells"] if "kernel" in c}
    forward = 2 * causal_flops / PEAK / (1.0e-3 + 1.2e-3)
    backward = 2 * 2 * causal_flops / PEAK / ((3.5e-3 - 1.0e-3) + (3.9e-3 - 1.2e-3))
    assert cells["flash"]["points"] == 2
    assert cells["flash"]["fitted"] == pytest.approx(forward) and cells["flash"]["fitted_backward"] == pytest.approx(
        backward)
    # its prior: the plateau over 32 x 32 = 1024 blocks, 8 waves of 132
    assert cells["flash"]["prior"] == pytest.approx(0.35 * 1024 / 1056)
    assert cells["efficient"]["prior"] == 0.6           # no entry: efficiency.attention
    assert cells["efficient"]["fitted"] == pytest.approx(full_flops / PEAK / 0.5e-3)
    assert cells["efficient"]["fitted_backward"] == pytest.approx(2 * full_flops / PEAK / 1.1e-3)
    tables = yaml.safe_load(out.read_text())["kernel_tables"]
    flash = tables["attention"]["flash"]
    assert flash["plateau"] == {"forward": 0.35, "backward": 0.30}                 # kept
    assert flash["bf16"] == [{"seq": 4096, "heads": 32, "head_dim": 128, "causal": True,
                              "forward": pytest.approx(forward), "backward": pytest.approx(backward)}]
    assert flash["source"].startswith("benchmarks/measure_kernels.py on a hand-made GPU") and "by hand" in \
        flash["source"]
    # the fitted rows price the scores: seq 4096, 32 heads, 128 wide in the time model reads the row itself
    parsed = kernels.parse_kernel_tables("fitted", tables)
    assert [float(v) for v in kernels.attention_efficiency(box, parsed, "flash", "bf16", 4096, 32, 128, True,
                                                           stated=(0.6, 0.45))] == pytest.approx(
        [forward, backward])
    assert data["errors"]["attention"]["rms_log_error_fitted"] < data["errors"]["attention"]["rms_log_error_prior"]
    assert main(["calibrate", "--kernels", str(path), "--hardware", str(spec)]) == 0    # as text
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["flash", "bf16", "4,096", "32", "128", "yes", "2"] in [line[:7] for line in lines]


def test_calibrate_refuses_timings_faster_than_the_peak(tmp_path):
    points = kt.read_kernel_measurements(str(_measurements(tmp_path, [_timing(4096, True, 1.0e-6, 1.0e-3)])))
    with pytest.raises(InvalidValue, match="ran the forward at"):
        kt.fit_kernel_tables(points, _box())


def test_calibrate_skips_a_shape_whose_backward_took_no_time(tmp_path):
    """Forward and backward timed below the forward alone is noise: that shape is left out and counted, the
    others fitted (a busy device must not fail a whole calibration, nor write a row from noise)."""
    timings = [_timing(4096, True, 1.0e-3, 0.9e-3), _timing(8192, True, 4.0e-3, 12.0e-3)]
    fit = kt.fit_kernel_tables(kt.read_kernel_measurements(str(_measurements(tmp_path, timings))), _box())
    assert [c["seq"] for c in fit.cells if "kernel" in c] == [8192]
    assert [r["seq"] for r in fit.tables["attention"]["flash"]["bf16"]] == [8192]
    assert [n for why, n in fit.points.skipped.items() if "timed no longer than the forward alone" in why] == [1]


def test_the_forward_flops_of_a_point_are_the_time_models_pairs():
    point = kt.AttentionPoint(kernel="flash", seq=8, heads=2, head_dim=4, causal=True, forward_seconds=1.0,
                              forward_backward_seconds=3.0)
    assert point.forward_flops == 4 * 2 * 4 * 36                      # 8 x 9 / 2 = 36 causal pairs
    assert attrs.evolve(point, causal=False).forward_flops == 4 * 2 * 4 * 64
    assert math.isclose(point.forward_flops, 4 * 2 * 4 * float(window_pairs(8, 0)))


@pytest.mark.parametrize("name, backend, seq, forward_tflops, backward_tflops", [
    # NVIDIA/cudnn-frontend's published rows (benchmarks/data/cudnn_frontend_sdpa_bf16_*.csv), read by hand:
    # PyTorch's SDPA on cuDNN on a B200 at 8192 tokens, cuDNN's frontend on a GB200 at 4096, SDPA's flash at 16384
    ("b200", "cudnn", 8192, 1171.278, 942.509),
    ("b200", "flash", 16384, 394.495, 319.979),
    ("gb200", "cudnn", 4096, 1386.0, 1054.0),
    ("gb200", "flash", 16384, 430.0, 352.0),
])
def test_blackwell_attention_is_nvidias_measured_sdpa(registry, name, backend, seq, forward_tflops, backward_tflops):
    """A shipped row is the CSV's FLOP/s over the file's bf16 peak, its backward x 2 / 2.5 (the CSV counts a
    backward's FLOPs 2.5 times the forward's, ndcost twice); torch 2.13's SDPA tries cuDNN first there."""
    hardware = registry.get(f"hardware/{name}")
    tables = kernels.parse_kernel_tables(name, hardware.kernel_tables)
    assert tables.sdpa_backends == ("cudnn", "flash", "efficient")
    peak = hardware.peak_flops("bf16")
    forward, backward = kernels.attention_efficiency(hardware, tables, backend, "bf16", seq, 128, 128, True,
                                                     stated=(0.0, 0.0))
    assert float(forward) == pytest.approx(forward_tflops * 1e12 / peak, abs=5e-5)
    assert float(backward) == pytest.approx(backward_tflops * 1e12 * 2 / 2.5 / peak, abs=5e-5)
