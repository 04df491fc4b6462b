"""Hardware specs: the shipped devices, and a third party's device added by one YAML in its own package."""
from __future__ import annotations

import sys
import textwrap

import pytest

from ndcost.compose import time as ct
from ndcost.plugins.estimators import flops as analytic
from ndcost.layer import LayerKind
from ndcost.values import LayerGroup, ModelSpec, Strategy

SHIPPED = {
    # name: (dense bf16 peak, fp8 peak or None, memory GiB at least, HBM TB/s, devices a node)
    "h100": (989.4e12, 1978.9e12, 79, 3.35e12, 8),
    "h200": (989.0e12, 1979.0e12, 140, 4.8e12, 8),
    "a100": (312.0e12, None, 79, 2.039e12, 8),
    "b200": (2.25e15, 4.5e15, 178, 8.0e12, 8),
    "ascend-910b": (313.0e12, None, 63, 1.6e12, 8),
    "ascend-910c": (376.0e12, None, 63, 1.6e12, 16),
    "h800": (989.4e12, 1978.9e12, 79, 3.35e12, 8),
    "h20": (148.0e12, 296.0e12, 95, 4.0e12, 8),
    "mi300x": (1307.4e12, 2614.9e12, 191, 5.3e12, 8),
    "mi325x": (1307.4e12, 2614.9e12, 255, 6.0e12, 8),
    "mi355x": (2516.6e12, 5033.2e12, 287, 8.0e12, 8),
    "gb200": (2.5e15, 5.0e15, 173, 8.0e12, 4),  # a compute tray of the NVL72 rack (nvlink_domain_devices 72)
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_hardware(registry, name):
    bf16, fp8, gib, hbm, per_node = SHIPPED[name]
    hw = registry.get(f"hardware/{name}")
    assert hw.peak_flops("bf16") == bf16
    assert (hw.peak_flops_per_second.get("fp8")) == fp8
    assert hw.memory_bytes >= gib * 2 ** 30
    assert hw.hbm_bytes_per_second == hbm
    assert hw.devices_per_node == per_node
    levels = {level.name: level for level in hw.network}
    assert levels["within_node"].bytes_per_second > levels["across_nodes"].bytes_per_second
    values, sources = ct.efficiencies(hw)
    assert set(values) == set(ct.EFFICIENCY_KEYS)
    assert all(s.startswith(f"hardware/{name}") for s in sources.values())


def test_fp8_compute_uses_the_fp8_peak(registry):
    spec = ModelSpec(name="toy", model_type="llama", family="llama", hidden_size=2048, vocab_size=1000,
                     layers=(LayerGroup(kind="dense", count=4),), num_attention_heads=16, intermediate_size=8192,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, attention_bias=False, mlp_bias=False)
    work = analytic.model_work(spec, 4096)
    h100 = registry.get("hardware/h100")
    r = ct.step_time(work, [Strategy.parse("seq=4096"), Strategy.parse("seq=4096,compute_dtype=fp8")], h100)
    assert r.compute_seconds[1] < r.compute_seconds[0]
    with pytest.raises(Exception, match="no peak for 'fp8'"):
        ct.step_time(work, [Strategy.parse("seq=4096,compute_dtype=fp8")], registry.get("hardware/a100"))


def test_third_party_adds_a_device_with_one_yaml(tmp_path, monkeypatch):
    """A distribution ships specs/mychip.yaml and a plugin module calling register_hardware_dir."""
    package = tmp_path / "acme_chips"
    (package / "specs").mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent('''
        from importlib import resources
        from ndcost import hookimpl
        from ndcost.plugins.hardware import register_hardware_dir

        @hookimpl
        def ndcost_register(register):
            register_hardware_dir(register, resources.files(__name__) / "specs")
    '''))
    (package / "specs" / "mychip.yaml").write_text(textwrap.dedent('''
        name: acme-x1
        description: a made-up accelerator
        memory_bytes: 68719476736
        hbm_bytes_per_second: 2.0e12
        peak_flops_per_second: {bf16: 500.0e12}
        devices_per_node: 4
        network:
          within_node: {bytes_per_second: 200.0e9, latency_seconds: 2.0e-6}
          across_nodes: {bytes_per_second: 25.0e9, latency_seconds: 8.0e-6}
        efficiency: {matmul: 0.6}
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    module = importlib.import_module("acme_chips")
    from ndcost import manager
    loaded = manager.load(extra_modules={"acme_chips": module})
    hw = loaded.registry.get("hardware/acme-x1")
    assert hw.devices_per_node == 4
    values, sources = ct.efficiencies(hw)
    assert values["matmul"] == 0.6 and values["matmul_backward"] == 0.6   # the forward figure stands in
    assert values["matmul_fp8"] == 0.6 and sources["matmul_fp8"] == "hardware/acme-x1 (matmul)"  # as does matmul
    assert sources["attention"] == "prior (uncalibrated)"
    spec = ModelSpec(name="toy", model_type="llama", family="llama", hidden_size=1024, vocab_size=1000,
                     layers=(LayerGroup(kind="dense", count=2),), num_attention_heads=8, intermediate_size=4096,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, attention_bias=False, mlp_bias=False)
    r = ct.step_time(analytic.model_work(spec, 1024), [Strategy.parse("seq=1024,tp=4"), Strategy.parse("seq=1024,tp=8")],
                     hw)
    # TP 8 spans two 4-device nodes: its all-reduces run as a hierarchical ring whose slower leg is the node's
    # 4 NICs, 4 * 25 GB/s * 0.85 = 85 GB/s against NVLink's 200 GB/s * 0.8, for 7/4 of the volume against 3/2
    assert r.communication_seconds[1] > 1.5 * r.communication_seconds[0]
    from ndcost.compose import topology
    bandwidth, _, link = topology.group_link(hw, 1, 8, values)
    assert link["nodes"] == 2 and bandwidth == pytest.approx(4 * 25e9 * 0.85)
    sys.modules.pop("acme_chips", None)


def test_unknown_efficiency_key_is_refused(registry):
    import attrs
    hw = attrs.evolve(registry.get("hardware/h200"), efficiency={"matmull": 0.5})
    with pytest.raises(Exception, match="unknown efficiency"):
        ct.efficiencies(hw)


def test_the_hopper_parts_take_the_h200s_fitted_efficiencies(registry):
    """h100, h100-hbm2e-500w and h800 run the H200's GH100 and its kernels (their comments say so), moved together
    when h200.yaml is refitted: the tensor-core shares are the H200's (times 0.75, fitted, on the
    HBM2e part); the eager elementwise kernels run at the H200's achieved bytes a second wherever the part's HBM
    allows it, else at 0.92 of its peak."""
    h200 = registry.get("hardware/h200")
    tensor_cores = ("matmul", "matmul_backward", "attention", "attention_backward", "linrec", "linrec_backward")
    for name, clock in (("h100", 1.0), ("h800", 1.0), ("h100-hbm2e-500w", 0.75)):
        part = registry.get(f"hardware/{name}")
        for key in tensor_cores:
            assert part.efficiency[key] == pytest.approx(h200.efficiency[key] * clock, abs=6e-5), (name, key)
        for key in ("memory", "memory_backward"):
            achieved = h200.efficiency[key] * h200.hbm_bytes_per_second
            expected = min(achieved / part.hbm_bytes_per_second, 0.92)
            assert part.efficiency[key] == pytest.approx(expected, abs=6e-5), (name, key)


def test_the_mi300x_takes_its_published_kernel_rates_times_one_fitted_factor(registry):
    """specs/hardware/mi300x.yaml: each tensor-core share is a published measurement over the datasheet peak
    (hipBLASLt's best BF16 GEMM, 708 TFLOP/s, and FP8 one, 1223.6; PyTorch's SDPA forward, 306.5 TFLOP/s causal;
    the backward at AITER's causal backward / forward ratio, 474.02 / 550.67, with 2.5 x forward FLOPs counted as
    2 x) times 0.6, fitted;
    the backward GEMMs and the linear recurrence in the H200's proportions; the elementwise kernels at the H200's
    share of its stream copy (4.01 TB/s) of the MI300X's (4.11 TB/s)."""
    h200, part = registry.get("hardware/h200"), registry.get("hardware/mi300x")
    peak, fitted = 1307.4e12, 0.6
    assert part.peak_flops("bf16") == peak
    matmul = 708e12 / peak * fitted
    attention = 306.5e12 / peak * fitted
    expected = {"matmul": matmul, "attention": attention,
                "matmul_backward": matmul * h200.efficiency["matmul_backward"] / h200.efficiency["matmul"],
                "attention_backward": attention * 474.02 / 550.67 * 2 / 2.5,
                "linrec": matmul * h200.efficiency["linrec"] / h200.efficiency["matmul"],
                "linrec_backward": matmul * h200.efficiency["matmul_backward"] / h200.efficiency["matmul"]
                * h200.efficiency["linrec_backward"] / h200.efficiency["matmul_backward"]}
    # the same blog's FP8 GEMM, 1223.6 TFLOP/s of 2614.9, beside its BF16 one
    expected["matmul_fp8"] = matmul * (1223.6e12 / 2614.9e12) / (708e12 / peak)
    for key in ("memory", "memory_backward"):
        expected[key] = h200.efficiency[key] * h200.hbm_bytes_per_second / 4.01e12 * 4.11e12 / 5.3e12
    for key, value in expected.items():
        assert part.efficiency[key] == pytest.approx(value, abs=1e-4), key


def test_the_mi325x_takes_the_mi300xs_rules_on_its_own_gemm_rate(registry):
    """The same CDNA3 die and software: the MI300X's shares scaled by the parts' hipBLASLt BF16 GEMMs (843 against
    708 TFLOP/s, the same peak) on the tensor-core classes, its elementwise shares as they are."""
    mi300x, part = registry.get("hardware/mi300x"), registry.get("hardware/mi325x")
    assert part.peak_flops("bf16") == mi300x.peak_flops("bf16")
    for key in ("matmul", "matmul_backward", "attention", "attention_backward", "linrec", "linrec_backward"):
        assert part.efficiency[key] == pytest.approx(mi300x.efficiency[key] * 843 / 708, abs=1e-4), key
    for key in ("memory", "memory_backward"):
        assert part.efficiency[key] == mi300x.efficiency[key]
    # its own FP8 GEMM in the same blog, 1527.7 TFLOP/s of 2614.9, beside its 843 of BF16
    assert part.efficiency["matmul_fp8"] == pytest.approx(
        part.efficiency["matmul"] * (1527.7 / 2614.9) / (843 / 1307.4), abs=1e-4)
