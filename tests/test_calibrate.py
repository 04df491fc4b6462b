"""Calibration: fitted efficiencies reproduce the measured times they were fitted on."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ndcost.errors import InvalidValue
from ndcost.plugins import calibration as cal
from ndcost.specio import load_hardware_yaml

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared" / "calibration" / "h200_llama3_8b_layer.json"
BENCH = ROOT / "benchmarks" / "bench_time_h200.json"

# The shared measurement, restated here so the tests run where ../shared is absent: Transformers'
# LlamaDecoderLayer (sdpa, bf16) at 1 x 4096 tokens on one H200.
LAYER = {"what": "One Llama-3-8B-shaped decoder layer (hidden 4096, intermediate 14336, 32 heads, 8 KV heads, "
                 "head dim 128, bf16)", "seq": 4096, "params": 218112000,
         "forward_ms": 3.608, "forward_backward_ms": 11.493}


@pytest.fixture()
def layer_file(tmp_path):
    path = tmp_path / "layer.json"
    path.write_text(json.dumps(json.loads(SHARED.read_text()) if SHARED.exists() else LAYER))
    return str(path)


@pytest.fixture(scope="module")
def h200(registry):
    return registry.get("hardware/h200")


def test_fit_reproduces_the_measurement(layer_file, h200):
    measurements, hardware, components = cal.read_measurements(layer_file, census="off")
    assert hardware is None and components == []
    fit = cal.fit(measurements, h200)
    (row,) = fit.rows
    assert row["model_forward_seconds"] == pytest.approx(0.003608, rel=1e-6)
    assert row["model_forward_backward_seconds"] == pytest.approx(0.011493, rel=1e-6)
    assert set(fit.fitted) >= {"matmul", "matmul_backward"}
    assert all(0 < v <= 1 for v in fit.efficiency.values())
    # classes no measurement exercises keep the hardware's figures
    assert fit.efficiency["linrec"] == h200.efficiency["linrec"]
    assert fit.efficiency["collective_across_nodes"] == h200.efficiency["collective_across_nodes"]


def test_layer_shape_read_from_the_description_is_checked(tmp_path):
    entry = dict(LAYER, params=123)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(entry))
    with pytest.raises(InvalidValue, match="parameters"):
        cal.read_measurements(str(path), census="off")
    path.write_text(json.dumps({"seq": 128, "forward_ms": 1.0}))
    with pytest.raises(InvalidValue, match="--model"):
        cal.read_measurements(str(path), census="off")


def test_round_trip_recovers_known_efficiencies(tmp_path, h200):
    """Times the model gives under known efficiencies, fitted on the classes that differ, give them back."""
    import attrs
    truth = dict(h200.efficiency, matmul=0.61, matmul_backward=0.52)
    measurements, _, _ = cal.read_measurements(str(_write(tmp_path, LAYER)), census="off")
    fwd, bwd = cal.layer_times(measurements[0], h200, truth)
    synthetic = [attrs.evolve(measurements[0], forward_seconds=fwd, forward_backward_seconds=fwd + bwd,
                              work=None)]
    fit = cal.fit(synthetic, h200, classes=["matmul", "matmul_backward"])
    assert fit.efficiency["matmul"] == pytest.approx(0.61, rel=1e-6)
    assert fit.efficiency["matmul_backward"] == pytest.approx(0.52, rel=1e-6)
    # no layer in the compute dtype times the Float8 linears' GEMMs: they keep their share beside matmul's
    stated = dict(h200.efficiency).get("matmul_fp8", h200.efficiency["matmul"])
    assert fit.efficiency["matmul_fp8"] == pytest.approx(stated * 0.61 / h200.efficiency["matmul"], rel=1e-6)
    assert fit.moved_with == {"matmul_fp8": "matmul"}


@pytest.mark.slow
def test_faster_than_the_peak_is_refused(tmp_path, h200):
    fast = dict(LAYER, forward_ms=0.5, forward_backward_ms=1.5)
    measurements, _, _ = cal.read_measurements(str(_write(tmp_path, fast)), census="off")
    with pytest.raises(InvalidValue, match="above 1"):
        cal.fit(measurements, h200)


def test_components_pin_their_classes(h200):
    data = json.loads(BENCH.read_text())
    gemm = [c for c in data["components"] if c["op_class"] == "matmul"]
    expected = sum(c["flops"] for c in gemm) / 989e12 / sum(c["seconds"] for c in gemm)
    pinned = cal.pinned_efficiencies(data["components"], h200)
    assert pinned["matmul"] == pytest.approx(expected, rel=1e-12)
    assert 0.5 < pinned["matmul"] < 1.0


def test_cli_json_and_output(layer_file, tmp_path, capsys):
    from ndcost.cli import main
    out = tmp_path / "h200_mine.yaml"
    assert main(["calibrate", layer_file, "--hardware", "h200", "--census", "off", "--json",
                 "--output", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware"] == "h200" and data["written"] == str(out)
    row = data["measurements"][0]
    assert row["model_forward_seconds"] == pytest.approx(row["measured_forward_seconds"], rel=1e-6)
    written = load_hardware_yaml(out)
    assert written.name == "h200_mine"   # named after its file, so an estimate on it does not say h200
    assert written.efficiency["matmul"] == pytest.approx(data["efficiency"]["matmul"], abs=1e-4)
    # the network's shape travels with it: NVLink domain, NICs, NVLS
    assert (written.nvlink_domain_devices, written.nics_per_node, written.nvls_architecture) == (8, 8, "hopper")
    # and what the device is beside its speeds: the kernels a runtime picks, the memory a run can use
    assert (written.compute_capability, written.cuda_context_bytes) == ("9.0", 512 * 2**20)  # specs/hardware/h200.yaml


@pytest.mark.slow
def test_cli_only_fits_a_subset_and_prices_the_rest(layer_file, capsys):
    """Two files fitted together; --only: the matching layers are fitted, the others still priced; components
    pin matmul and attention."""
    from ndcost.cli import main
    assert main(["calibrate", str(BENCH), layer_file, "--only", "llama3_8b@[248]*,qwen3_8b*,measured-layer*",
                 "--census", "off", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["fitted_on"] == ["llama3_8b@2048", "llama3_8b@4096", "llama3_8b@8192", "measured-layer/dense@4096",
                                 "qwen3_8b@4096"]
    assert len(data["measurements"]) == len(json.loads(BENCH.read_text())["measurements"]) + 1
    assert set(data["pinned_by_components"]) == {"matmul", "matmul_backward", "attention", "attention_backward"}
    assert {"memory", "memory_backward"} <= set(data["fitted"])
    for row in data["measurements"]:
        if row["label"] in data["fitted_on"]:  # four layers, two free classes a pass: least squares, within 6%
            assert row["model_forward_seconds"] == pytest.approx(row["measured_forward_seconds"], rel=0.06)
    assert main(["calibrate", str(BENCH), "--only", "nothing*", "--census", "off"]) == 1
    assert "matches none" in capsys.readouterr().err


def test_cli_refuses_a_missing_file(capsys):
    from ndcost.cli import main
    assert main(["calibrate", "/nonexistent/measurements.json"]) == 1
    assert "no measurements file" in capsys.readouterr().err


@pytest.mark.slow
def test_shipped_h200_efficiencies_match_the_measurements(h200):
    """The H200 YAML's efficiencies price the benchmark's dense layers within 5%, the shared one within 2%."""
    measurements, _, _ = cal.read_measurements(str(BENCH), census="auto")
    fitted_on = [m for m in measurements if m.label in ("llama3_8b@2048", "llama3_8b@4096", "llama3_8b@8192",
                                                        "qwen3_8b@4096", "deepseek_v3_dense@4096")]
    assert len(fitted_on) == 5
    for row in cal.validation_rows(fitted_on, h200, h200.efficiency):
        assert row["model_forward_seconds"] == pytest.approx(row["measured_forward_seconds"], rel=0.05), row
        assert row["model_forward_backward_seconds"] == pytest.approx(
            row["measured_forward_backward_seconds"], rel=0.05), row
    shared, _, _ = cal.read_measurements(str(_write(Path(os.environ.get("TMPDIR", "/tmp")), LAYER)))
    (row,) = cal.validation_rows(shared, h200, h200.efficiency)
    assert row["model_forward_seconds"] == pytest.approx(0.003608, rel=0.02)
    assert row["model_forward_backward_seconds"] == pytest.approx(0.011493, rel=0.02)


def _write(folder: Path, entry) -> Path:
    path = Path(folder) / f"m{abs(hash(json.dumps(entry, sort_keys=True)))}.json"
    path.write_text(json.dumps(entry))
    return path


def test_a_device_name_is_matched_against_every_registered_hardware(registry):
    from ndcost.registry import Registry, Source
    from ndcost.values import Hardware

    assert cal._hardware_of_device("NVIDIA H200") == "h200"
    assert cal._hardware_of_device("NVIDIA A100-SXM4-80GB") == "a100"
    assert cal._hardware_of_device("Ascend910B") == "ascend-910b"     # registered, so recognized
    assert cal._hardware_of_device("Tesla V100") is None
    # a third party's hardware is a candidate too, the longest name first
    mine = Registry()
    for name in ("h200", "h200-nvl"):
        mine.add(f"hardware/{name}", Hardware(name=name, memory_bytes=1, hbm_bytes_per_second=1.0,
                                              peak_flops_per_second={"bf16": 1.0}),
                 source=Source(distribution="d", module="m"))
    mine.freeze()
    assert cal._hardware_of_device("NVIDIA H200 NVL", mine) == "h200-nvl"
    assert cal._hardware_of_device("NVIDIA H200", mine) == "h200"


# Transformers' eager LlamaDecoderLayer launches, counted by hand: two RMSNorms of 8 kernels (pow, mean, add,
# rsqrt, mul, two casts, the weight's mul), rotary on q and k of 5 each (x * cos, rotate_half's neg and cat,
# * sin, the sum), 7 matmuls, SDPA, SiLU and the gate's product, two residual adds: 16 + 10 + 7 + 1 + 2 + 2.
LLAMA_LAYER_LAUNCHES = 38


def _dispatch_set(h200, truth, dispatch_seconds):
    """Bench layers timed as the model prices them under *truth* (launches free: none is launch-bound), and
    Llama-3-8B's layer at 128 tokens launch-bound at *dispatch_seconds*: 38 launches forward, 76 backward
    (compose/time.py prices the backward's as twice the forward's), written out by hand."""
    import attrs
    found, _, _ = cal.read_measurements(str(BENCH), census="off")
    dense = [m for m in found if m.label in ("llama3_8b@2048", "llama3_8b@4096", "llama3_8b@8192",
                                             "qwen3_8b@4096")]
    free = cal.with_launch_costs(h200, 0.0, 0.0)
    rows = []
    for m in dense:
        fwd, bwd = cal.layer_times(m, free, truth)
        rows.append(attrs.evolve(m, forward_seconds=fwd, forward_backward_seconds=fwd + bwd))
    short = attrs.evolve(dense[0], seq=128, work=None, label="llama3_8b@128",
                         forward_seconds=LLAMA_LAYER_LAUNCHES * dispatch_seconds,
                         forward_backward_seconds=3 * LLAMA_LAYER_LAUNCHES * dispatch_seconds)
    return rows + [short]


def test_dispatch_is_recovered_beside_the_efficiencies(h200):
    truth = dict(h200.efficiency, memory=0.45, memory_backward=0.40)
    fit = cal.fit(_dispatch_set(h200, truth, 3.1e-5), h200, classes=["memory", "memory_backward", "dispatch_seconds"])
    assert fit.dispatch_seconds == (h200.kernel_tables["dispatch_seconds"], pytest.approx(3.1e-5, rel=1e-9))
    assert fit.dispatch_fitted_on == ("llama3_8b@128",) and "dispatch_seconds" in fit.fitted
    assert fit.efficiency["memory"] == pytest.approx(0.45, rel=1e-6)
    assert fit.efficiency["memory_backward"] == pytest.approx(0.40, rel=1e-6)
    assert fit.left_out == () and fit.rms_log_error_fitted < 1e-6
    short = fit.rows[-1]  # priced at its launches: the measured figures back
    assert short["model_forward_seconds"] == pytest.approx(38 * 3.1e-5, rel=1e-9)
    assert short["model_forward_backward_seconds"] == pytest.approx(3 * 38 * 3.1e-5, rel=1e-9)
    # --classes: dispatch alone (the efficiencies the hardware's), or the efficiencies alone (dispatch kept)
    alone = cal.fit(_dispatch_set(h200, dict(h200.efficiency), 3.1e-5), h200, classes=["dispatch_seconds"])
    assert alone.dispatch_seconds[1] == pytest.approx(3.1e-5, rel=1e-9) and alone.fitted == ("dispatch_seconds",)
    kept = cal.fit(_dispatch_set(h200, truth, 3.1e-5), h200, classes=["memory", "memory_backward"])
    assert kept.dispatch_seconds[1] == h200.kernel_tables["dispatch_seconds"] and kept.left_out == ("llama3_8b@128",)


def test_no_launch_bound_row_leaves_dispatch_at_its_prior_and_says_so(h200):
    truth = dict(h200.efficiency, memory=0.45, memory_backward=0.40)
    fit = cal.fit(_dispatch_set(h200, truth, 3.1e-5)[:-1], h200)
    prior = h200.kernel_tables["dispatch_seconds"]
    assert fit.dispatch_seconds == (prior, prior) and fit.dispatch_fitted_on == ()
    assert "dispatch_seconds" not in fit.fitted and "no measurement is launch-bound" in fit.dispatch_note


@pytest.mark.slow
def test_cli_writes_the_fitted_dispatch_into_kernel_tables(tmp_path, capsys):
    """On the benchmark as docs/calibration.md runs it, the fit reproduces the shipped figure; --output
    writes it with its source."""
    from ndcost.cli import main
    out = tmp_path / "h200_mine.yaml"
    assert main(["calibrate", str(BENCH), "--hardware", "h200", "--json", "--output", str(out)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dispatch_fitted_on"] == ["llama3_8b@1024", "qwen3_30b_a3b_moe@4096"]
    assert data["dispatch_seconds"] == pytest.approx(3.81e-5, rel=0.01)
    written = load_hardware_yaml(out)
    assert written.kernel_tables["dispatch_seconds"] == pytest.approx(data["dispatch_seconds"], rel=1e-12)
    assert "llama3_8b@1024" in written.kernel_tables["source"]


def test_a_bare_list_of_measurements_is_read_and_other_json_is_refused(tmp_path):
    path = tmp_path / "list.json"
    path.write_text(json.dumps([LAYER, dict(LAYER, seq=2048, forward_ms=1.9, forward_backward_ms=5.9)]))
    measurements, _, _ = cal.read_measurements(str(path), census="off")
    assert [m.seq for m in measurements] == [4096, 2048]
    for text, words in (("[]", "expected a measurement object, a list of them"),
                        ('"hello"', "measurement 0: expected a measurement object"),
                        ("null", "measurement 0: expected a measurement object"),
                        ('{"measurements": [1]}', "measurement 0: expected a measurement object"),
                        ('{"components": [3], "seq": 1, "forward_ms": 1}', "component 0: needs op_class")):
        path.write_text(text)
        with pytest.raises(InvalidValue, match=words):
            cal.read_measurements(str(path), census="off")
