"""Collectives: registration, placement, the strategy's volumes by hand (the primitives: test_nccl.py)."""
from __future__ import annotations

import pytest

from ndcost.compose import topology
from ndcost.compose import time as ct
from ndcost.plugins.estimators import flops as analytic
from ndcost.layer import LayerKind
from ndcost.values import Hardware, LayerGroup, ModelSpec, NetworkLevel, Strategy

GB = 1e9


def test_registered(registry):
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"):
        assert registry.get(f"collective/{name}").name == name


# NCCL's constants (src/graph/tuning.cc; tests/test_nccl.py prices the primitives by hand): a Simple ring's
# base latency and its latency a step on NVLink, and a Simple send across nodes (base + NET step), seconds
BASE, STEP, NET_SEND = 8.4e-6, 3.4e-6, (8.4 + 14.0) * 1e-6


def test_placement_tp_innermost():
    # 8 devices a node: TP 8 stays inside, TP 16 crosses; DP of 2 above TP 8 (stride 8) crosses
    assert not topology.spans_nodes(1, 8, 8)
    assert topology.spans_nodes(1, 16, 8)
    assert topology.spans_nodes(8, 2, 8)
    assert not topology.spans_nodes(2, 4, 8)
    assert not topology.spans_nodes(64, 1, 8)  # a group of one crosses nothing


def _hardware():
    return Hardware(name="toy", memory_bytes=1 << 40, hbm_bytes_per_second=1e15, peak_flops_per_second={"bf16": 1e18},
                    devices_per_node=8,
                    network=(NetworkLevel(name="within_node", bytes_per_second=100e9),
                             NetworkLevel(name="across_nodes", bytes_per_second=10e9)),
                    efficiency={"collective_within_node": 1.0, "collective_across_nodes": 1.0})


def _spec(layers=2, hidden=1024, heads=8, vocab=1000):
    return ModelSpec(name="toy", model_type="llama", family="llama", hidden_size=hidden, vocab_size=vocab,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=heads,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, attention_bias=False, mlp_bias=False,
                     num_key_value_heads=heads, intermediate_size=4 * hidden)


def test_tp_volume_through_the_step():
    """TP 2 without SP: two all-reduces a layer each pass of the layer's activations (tokens x hidden x 2 bytes)."""
    spec = _spec()
    work = analytic.model_work(spec, 512)
    r = ct.step_time(work, [Strategy.parse("seq=512,tp=2,micro_batch=2")], _hardware())
    message = 2 * 512 * 1024 * 2
    per_all_reduce = 2 * (1 / 2) * message / 100e9 + BASE + 2 * STEP          # Simple ring, 2 steps
    assert r.communication_seconds[0] == pytest.approx(2 * 2 * 2 * per_all_reduce, rel=1e-12)
    # under SP: an all-gather and a reduce-scatter for each all-reduce, the same volume, a base latency more
    r_sp = ct.step_time(work, [Strategy.parse("seq=512,tp=2,micro_batch=2,sp=true")], _hardware())
    assert r_sp.communication_seconds[0] == pytest.approx(r.communication_seconds[0] + 8 * BASE, rel=1e-12)


def test_dp_gradient_all_reduce_volume():
    """DP 2 (stride 1, one node): one all-reduce of the rank's gradients (every parameter, bf16) a step."""
    spec = _spec()
    work = analytic.model_work(spec, 512)
    h, inter, vocab = 1024, 4096, 1000
    params = 2 * (4 * h * h + 3 * h * inter + 2 * h) + vocab * h * 2 + h  # layers, embedding, untied head, norm
    r = ct.step_time(work, [Strategy.parse("seq=512,dp=2")], _hardware())
    assert r.communication_seconds[0] == pytest.approx(2 * (1 / 2) * params * 2 / 100e9 + BASE + 2 * STEP,
                                                       rel=1e-12)


def test_pp_send_volume_and_exposure():
    """PP 2 above DP 8 (stride 8): sends cross nodes at 10 GB/s (a device's own NIC); a rank sends the activations
    forward and their gradient back a micro-batch; 2 (p - 1) sends are exposed on fill and drain."""
    spec = _spec()
    work = analytic.model_work(spec, 512)
    r = ct.step_time(work, [Strategy.parse("seq=512,pp=2,dp=8,num_micro_batches=4")], _hardware())
    send = 512 * 1024 * 2 / 10e9 + NET_SEND
    assert r.detail["pp_send_seconds"][0] == pytest.approx(send, rel=1e-12)
    assert r.exposed_communication_seconds[0] >= 2 * send


def test_ep_all_to_all_volume():
    """EP 4: dispatch and combine a pass, each moving top_k copies of every token's hidden vector."""
    spec = ModelSpec(name="toy-moe", model_type="qwen3_moe", family="qwen3_moe", hidden_size=512, vocab_size=1000,
                     layers=(LayerGroup(kind="moe", count=1),), num_attention_heads=8, num_key_value_heads=8,
                     kind_specs={"moe": LayerKind(attention="gqa", mlp="moe")}, attention_bias=False, mlp_bias=False,
                     num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256)
    work = analytic.model_work(spec, 256)
    hw = _hardware()
    base = ct.step_time(work, [Strategy.parse("seq=256,dp=4")], hw)
    ep = ct.step_time(work, [Strategy.parse("seq=256,dp=4,ep=4")], hw)
    message = 256 * 2 * 512 * 2
    a2a = 3 / 4 * message / 100e9 + BASE + STEP       # 3 rounds of pairs in one batch of NCCL's 8 at once
    # EP changes the gradient reduction too: without it the experts' bf16 gradients are all-reduced over
    # the 4 replicas; with it each rank holds a quarter of the experts and no replica (a group of one)
    expert_params = 8 * 3 * 512 * 256
    grads_saved = 2 * 3 / 4 * expert_params * 2 / 100e9 + BASE + 6 * STEP   # a Simple ring of 4
    assert ep.communication_seconds[0] - base.communication_seconds[0] == pytest.approx(4 * a2a - grads_saved,
                                                                                         rel=1e-9)


def test_cp_ring_passes_kv():
    """CP 2 ring as torch runs it: the KV of a rank's half sequence all-gathered once a pass (forward, backward),
    and in the backward its fp32 gradients sent on after each of the 2 steps."""
    spec = _spec(layers=1)
    work = analytic.model_work(spec, 1024)
    hw = _hardware()
    r = ct.step_time(work, [Strategy.parse("seq=1024,cp=2")], hw)
    kv = 512 * 2 * 1024 * 2                     # tokens, K and V of 8 heads x 128, bf16
    grads = 2 * (1 / 2) * _params(spec) * 2     # the CP pair also reduces its gradients
    gathers = 2 * (kv / 100e9 + BASE + STEP)    # a Simple ring of 2 gathering 2 blocks: one step of one block
    sends = 2 * (2 * kv / 100e9 + BASE + STEP)  # dK and dV in fp32: twice the bytes
    assert r.communication_seconds[0] == pytest.approx(gathers + sends + grads / 100e9 + BASE + 2 * STEP, rel=1e-9)


def _params(spec):
    h, inter, vocab = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    return spec.num_layers * (4 * h * h + 3 * h * inter + 2 * h) + 2 * vocab * h + h
