"""Offloading to host memory, derived by hand: the host's bytes, what leaves the device, the PCIe seconds.

The parameter count is Llama-3.1-8B's by the hand formula below (Meta's published 8.03B, exactly the count
Transformers' LlamaForCausalLM holds); the dtype widths are the strategy's; the host link is the H200
datasheet's PCIe Gen5 (64 GB/s a direction); the CPU step is the ZeRO-Offload paper's CPU-Adam rate
(arXiv:2101.06840 Table 3: 10 billion parameters in 2.57 s a node).
"""
from __future__ import annotations

import json
import math

import attrs
import numpy as np
import pytest

import ndcost
from ndcost import Strategy, invariants
from ndcost.cli import main
from ndcost.compose.topology import worst_node_total
from ndcost.errors import InvalidStrategy, InvalidValue
from ndcost.specio import hardware_from_mapping

SEQ = 4096
# Llama-3.1-8B (config in specs/models/llama-3.1-8b.yaml): untied embedding and head, 32 layers of attention
# (q and o h x h, k and v h x 8 * 128), SwiGLU (three h x 14336) and two RMSNorms, and the final norm
H, LAYERS, VOCAB, FFN, KV_WIDTH = 4096, 32, 128256, 14336, 8 * 128
PARAMS = 2 * VOCAB * H + LAYERS * (2 * H * H + 2 * H * KV_WIDTH + 3 * H * FFN + 2 * H) + H
LINK = 64e9  # specs/hardware/h200.yaml host_to_device_bytes_per_second
CPU_ADAM = 10e9 / 2.57  # parameters a second a node
MIXED = "grad_dtype=fp32,master_dtype=fp32,optimizer_dtype=fp32"  # bf16 parameters, fp32 the rest
# the rotary cos and sin (bf16, 128 wide each) every layer saves: one storage a stage and micro-batch on the
# device, but save_on_cpu copies each layer's save (torch/autograd/graph.py pack_to_cpu): one a layer on the host
ROTARY = SEQ * 2 * 128 * 2


@pytest.fixture(scope="module")
def llama():
    return ndcost.resolve("llama-3.1-8b", census="off")


def test_the_hand_count_is_the_published_one(llama):
    assert PARAMS == 8_030_261_248
    assert llama.parameters.total == PARAMS


def test_offload_optimizer_moves_master_and_states_to_the_host(llama):
    base = llama.evaluate(f"fsdp=8,seq={SEQ},{MIXED}")
    cost = llama.evaluate(f"fsdp=8,seq={SEQ},{MIXED},offload_optimizer=true")
    shard = PARAMS // 8  # 8 divides the count: every FSDP rank holds exactly an eighth
    assert shard * 8 == PARAMS
    # the host: the fp32 master (4), AdamW's two fp32 states (8) and the gradients the CPU step reads (fp32, 4)
    assert cost.host_bytes == shard * (4 + 4 + 4 + 4) == cost.stages[0].host_bytes
    assert cost.host_bytes_per_node == 8 * cost.host_bytes  # one node holds the eight FSDP ranks
    # the device: master and states gone, by exactly their bytes; the rest as it was
    before, after = base.stages[0].bytes_by_category, cost.stages[0].bytes_by_category
    assert before["master"] == 4 * shard and before["optimizer_states"] == 8 * shard
    assert after["master"] == after["optimizer_states"] == 0
    assert {c: after[c] for c in after if c not in ("master", "optimizer_states")} == \
        {c: before[c] for c in before if c not in ("master", "optimizer_states")}
    assert base.peak_bytes - cost.peak_bytes == 12 * shard
    assert base.host_bytes == base.host_bytes_per_node == 0


def test_offload_optimizer_time_is_the_copies_and_the_cpu_step_by_hand(llama):
    cost = llama.evaluate(f"fsdp=8,seq={SEQ},{MIXED},offload_optimizer=true")
    t, shard = cost.time, PARAMS / 8
    # the node's CPUs step its eight devices' shards: the whole model once
    assert t.optimizer_seconds == pytest.approx(8 * shard / CPU_ADAM, rel=1e-12)
    # gradients out (fp32) and the updated parameters in (bf16)
    assert t.offload_seconds == pytest.approx(shard * (4 + 2) / LINK, rel=1e-12)
    # the gradients' 63 ms hide behind the backward (more than 0.1 s of compute); the copy in does not
    assert shard * 4 / LINK < t.compute_seconds / 3
    assert t.exposed_offload_seconds == pytest.approx(shard * 2 / LINK, rel=1e-12)
    assert t.step_seconds == pytest.approx(t.compute_seconds + t.exposed_communication_seconds + t.bubble_seconds
                                           + t.optimizer_seconds + t.exposed_offload_seconds, rel=1e-12)
    assert "ZeRO-Offload" in t.provenance["offload"] and "offload_optimizer" in t.provenance["overlap"]


def test_offload_params_moves_the_shards_and_their_gradients(llama):
    base = llama.evaluate(f"fsdp=8,seq={SEQ},{MIXED}")
    cost = llama.evaluate(f"fsdp=8,seq={SEQ},{MIXED},offload_params=true,offload_optimizer=true")
    shard = PARAMS // 8
    # bf16 parameters (2) and fp32 gradients (4) join master and states (12) on the host; no second gradient copy
    assert cost.host_bytes == shard * (2 + 4 + 4 + 8)
    after, before = cost.stages[0].bytes_by_category, base.stages[0].bytes_by_category
    assert after["parameters"] == after["gradients"] == after["master"] == after["optimizer_states"] == 0
    # the gathered working copies stay: the communication buffers, the activations, as they were
    for category in ("communication", "activations", "working", "output"):
        assert after[category] == before[category], category
    # a micro-batch copies the bf16 shard in for the forward and again for the backward (resharded after the
    # forward), and the fp32 gradient shard out; the CPU step as above, and no copy after it
    t = cost.time
    assert t.offload_seconds == pytest.approx(shard * (2 + 2 + 4) / LINK, rel=1e-12)
    assert t.optimizer_seconds == pytest.approx(PARAMS / CPU_ADAM, rel=1e-12)


def test_offload_activations_moves_the_saved_activations(llama):
    text = f"seq={SEQ},tp=2,num_micro_batches=2"
    base = llama.evaluate(text)
    cost = llama.evaluate(text + ",offload_activations=true")
    batch = llama.evaluate_many([Strategy.parse(text)])
    one_layer = int(batch.layer_activation_bytes[0, 0])  # one layer keeps this a micro-batch, per device
    kept = base.stages[0].bytes_by_category["activations"]
    assert kept == LAYERS * one_layer + ROTARY  # one stage: a micro-batch's backward follows its forward
    assert cost.host_bytes == LAYERS * (one_layer + ROTARY)
    # the device keeps at most the layer in flight
    assert cost.stages[0].bytes_by_category["activations"] <= one_layer + ROTARY
    # each of the two micro-batches copies its 32 layers' bytes out and back
    assert cost.time.offload_seconds == pytest.approx(2 * 2 * LAYERS * (one_layer + ROTARY) / LINK, rel=1e-12)
    assert cost.time.optimizer_seconds == base.time.optimizer_seconds  # the optimizer stays on the device


def test_offload_activations_host_follows_the_micro_batches_each_stage_keeps(llama):
    # 1F1B (Narayanan et al. 2021, section 2.2): stage s of p keeps p - s micro-batches' activations in flight
    text = f"seq={SEQ},pp=2,num_micro_batches=4"
    one_layer = int(llama.evaluate_many([Strategy.parse(text)]).layer_activation_bytes[0, 0])
    cost = llama.evaluate(text + ",offload_activations=true")
    one_layer += ROTARY
    assert [s.host_bytes for s in cost.stages] == [2 * 16 * one_layer, 1 * 16 * one_layer]
    assert cost.host_bytes_per_node == 2 * 16 * one_layer + 16 * one_layer  # both stages' devices on one node


def test_a_host_figure_breaking_an_invariant_makes_the_row_invalid(llama):
    result = llama.evaluate_many([Strategy.parse(f"fsdp=8,seq={SEQ},offload_optimizer=true")] * 2)
    assert result.valid.all()
    node = result.host_bytes_per_node.copy()
    node[1] = result.host_bytes[1] - 1  # a node holding less than one of its devices
    broken = invariants.enforce(attrs.evolve(result, host_bytes_per_node=node))
    assert broken.valid.tolist() == [True, False] and "host bytes" in broken.reason[1]
    assert broken.host_bytes[1] == broken.stage_host_bytes[1].sum() == 0


def test_a_slow_link_exposes_the_activation_copies_beyond_compute(llama):
    hardware = attrs.evolve(llama.hardware, name="slow-link", host_to_device_bytes_per_second=1e8)
    text = f"seq={SEQ},offload_activations=true"
    cost = llama.evaluate(text, hardware=hardware)
    one_layer = int(llama.evaluate_many([Strategy.parse(f"seq={SEQ}")]).layer_activation_bytes[0, 0])
    t = cost.time
    copy = LAYERS * (one_layer + ROTARY) / 1e8  # each way; seconds, far above the forward's or backward's compute
    assert copy > t.compute_seconds
    assert t.offload_seconds == pytest.approx(2 * copy, rel=1e-12)
    # out over the forward and in over the backward, each hidden only up to that pass's compute
    assert t.exposed_offload_seconds == pytest.approx(2 * copy - t.compute_seconds, rel=1e-12)


def test_host_bytes_per_node_sums_the_stages_a_node_holds(llama):
    cost = llama.evaluate(f"tp=2,pp=4,seq={SEQ},num_micro_batches=4,{MIXED},offload_optimizer=true")
    stages = [s.host_bytes for s in cost.stages]
    assert all(stages) and cost.host_bytes == max(stages)
    # ranks: tp innermost, pp outermost; 2 devices a stage, 8 a node: one node holds all four stages
    assert cost.host_bytes_per_node == 2 * sum(stages)


def test_worst_node_over_stages_that_straddle_nodes():
    per_stage = np.array([[5.0, 7.0, 11.0, 13.0], [1.0, 2.0, 0.0, 0.0]])
    # row 0: 3 devices a stage, 8 a node: node 0 ranks 0-7 = 3*5 + 3*7 + 2*11, node 1 ranks 8-11 = 11 + 3*13
    # row 1: 16 devices a stage over 2 stages, 8 a node: each node within a stage, 8 times its figure
    found = worst_node_total(per_stage, np.array([3, 16]), np.array([4, 2]), 8)
    assert found.tolist() == [max(3 * 5 + 3 * 7 + 2 * 11, 11 + 3 * 13), 8 * 2.0]


def test_a_batch_prices_each_row_as_alone(llama):
    texts = [f"fsdp=8,seq={SEQ},{MIXED}", f"fsdp=8,seq={SEQ},{MIXED},offload_optimizer=true",
             f"zero=3,dp=8,seq={SEQ},offload_params=true,offload_optimizer=true,offload_activations=true",
             f"tp=2,pp=2,seq={SEQ},num_micro_batches=4,offload_activations=true"]
    batch = llama.evaluate_many([Strategy.parse(t) for t in texts])
    assert batch.valid.all()
    for i, text in enumerate(texts):
        alone = llama.evaluate(text)
        assert int(batch.host_bytes[i]) == alone.host_bytes
        assert int(batch.host_bytes_per_node[i]) == alone.host_bytes_per_node
        assert int(batch.peak_bytes[i]) == alone.peak_bytes
        assert batch.time["exposed_offload_seconds"][i] == pytest.approx(alone.time.exposed_offload_seconds,
                                                                         rel=1e-12)


@pytest.mark.parametrize("text,words", [
    ("dp=8,seq=4096,offload_params=true,offload_optimizer=true", "set fsdp > 1 or zero=3"),
    ("fsdp=8,seq=4096,offload_params=true", "set offload_optimizer=true too"),
])
def test_offload_params_is_refused_where_it_cannot_run(llama, text, words):
    with pytest.raises(InvalidStrategy, match=words):
        llama.evaluate(text)


def test_a_hardware_without_a_host_link_refuses_offloading():
    model = ndcost.resolve("llama-3.1-8b", census="off", hardware="ascend-910b")
    assert model.hardware.host_to_device_bytes_per_second is None
    with pytest.raises(InvalidStrategy, match="states no host_to_device_bytes_per_second"):
        model.evaluate(f"fsdp=8,seq={SEQ},offload_optimizer=true")
    assert model.evaluate(f"fsdp=8,seq={SEQ}").host_bytes == 0


def _h200(**fields):
    data = {"name": "x", "memory_bytes": 80 * 2 ** 30, "hbm_bytes_per_second": 4.8e12,
            "peak_flops_per_second": {"bf16": 989e12}, "devices_per_node": 8,
            "network": {"within_node": {"bytes_per_second": 450e9}}}
    return hardware_from_mapping({**data, **fields}, where="test.yaml")


@pytest.mark.parametrize("field", ["host_to_device_bytes_per_second", "cpu_optimizer_parameters_per_second"])
@pytest.mark.parametrize("value,words", [(0, "must be > 0"), (-64e9, "must be > 0"), (math.nan, "finite"),
                                         (math.inf, "finite"), ("64 GB/s", "units are not parsed"),
                                         ("fast", "must be a number"), (True, "must be a number")])
def test_bad_host_figures_are_refused_by_name(field, value, words):
    with pytest.raises(InvalidValue, match=words) as err:
        _h200(**{field: value})
    assert field in str(err.value) and "test.yaml" in str(err.value)


def test_host_figures_read_and_default():
    assert _h200().host_to_device_bytes_per_second is None
    assert _h200().cpu_optimizer_parameters_per_second == CPU_ADAM
    hardware = _h200(host_to_device_bytes_per_second=32000000000, cpu_optimizer_parameters_per_second=1e9)
    assert hardware.host_to_device_bytes_per_second == 32e9 and hardware.cpu_optimizer_parameters_per_second == 1e9
    with pytest.raises(InvalidValue, match="cpu_optimizer_parameters_per_second"):
        _h200(cpu_optimizer_parameters_per_second=None)
    registry = ndcost.manager.registry()
    for name, link in (("h200", 64e9), ("h100", 64e9), ("h800", 64e9), ("h20", 64e9), ("b200", 64e9),
                       ("a100", 32e9), ("mi300x", 64e9), ("mi325x", 64e9), ("mi355x", 64e9),
                       ("gb200", None), ("ascend-910b", None), ("ascend-910c", None)):
        assert registry.get(f"hardware/{name}").host_to_device_bytes_per_second == link, name


def test_estimate_json_reports_host_bytes_as_integers(capsys):
    text = f"fsdp=8,seq={SEQ},{MIXED},offload_optimizer=true"
    assert main(["estimate", "llama-3.1-8b", "--strategy", text, "--census", "off", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    shard = PARAMS // 8
    assert data["host_bytes"] == 16 * shard and type(data["host_bytes"]) is int
    assert data["host_bytes_per_node"] == 8 * 16 * shard and type(data["host_bytes_per_node"]) is int
    assert [s["host_bytes"] for s in data["stages"]] == [16 * shard]
    assert {"offload_seconds", "exposed_offload_seconds"} <= set(data["time"])
    assert main(["estimate", "llama-3.1-8b", "--strategy", text, "--census", "off"]) == 0
    out = capsys.readouterr().out
    assert f"host: {16 * shard / 2 ** 30:.2f} GiB a device" in out and "exposed offload" in out
    assert main(["estimate", "llama-3.1-8b", "--strategy", f"fsdp=8,seq={SEQ}", "--census", "off"]) == 0
    out = capsys.readouterr().out
    assert "host:" not in out and "offload" not in out


def test_estimate_refuses_offloading_in_one_line(capsys):
    assert main(["estimate", "llama-3.1-8b", "--strategy", f"dp=2,seq={SEQ},offload_params=true,"
                 "offload_optimizer=true", "--census", "off"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "offload_params=true" in err and "Traceback" not in err
