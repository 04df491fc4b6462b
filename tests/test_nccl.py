"""Collectives as NCCL's tuner prices them, the NVLink domain, NIC sharing, and FSDP2's per-layer prefetch.

Every expected figure is derived here by hand from NCCL's constants as ``src/graph/tuning.cc`` states them
(NVIDIA/nccl 5067397c, ``ncclTunerConstantsDefaults``), in microseconds by protocol (LL, LL128, Simple):
ring base latency 6.6 / 14.0 / 8.4, tree 6.8 / 14.0 / 8.4; a step on NVLink: ring 0.6 / 1.9 / 3.4, tree
0.6 / 1.25 / 4.0, NVLS (Simple) 25; a step on the network: ring 2.7 / 4.0 / 14.0, tree 5.0 / 8.5 / 14.0;
bus bandwidth factors: ring LL 0.5, LL128 0.92, Simple 1; NVLS: nvlsEfficiency 0.85 (Hopper) times 15/16
(16 NVLS channels, src/transport/nvls.cc).
"""
from __future__ import annotations

import attrs
import numpy as np
import pytest

from ndcost.compose import time as ct
from ndcost.compose import topology
from ndcost.errors import InvalidValue
from ndcost.layer import LayerKind
from ndcost.plugins import collectives as c
from ndcost.plugins.estimators import flops as analytic
from ndcost.specio import hardware_from_mapping
from ndcost.values import Hardware, LayerGroup, ModelSpec, NetworkLevel, Strategy

US = 1e-6
EFF = {"collective_within_node": 0.8, "collective_across_nodes": 0.85}


def test_small_all_reduce_is_latency_bound_ll_ring():
    """1 KB on 8 GPUs of one node at 360 GB/s: LL's ring, 6.6 us + 2 * 7 steps * 0.6 us = 15.0 us, plus its data
    (2 * 7 / 8 of 1 KB at half the bandwidth: 9.7 ns). The tree (a chain on one node: 6.8 + 14 * 0.6) is slower."""
    bandwidth = 360e9
    ll_ring = (6.6 + 14 * 0.6) * US + 14 / 8 * 1e3 / (0.5 * bandwidth)
    assert c.all_reduce_seconds(1e3, 8, bandwidth, 0.0) == pytest.approx(ll_ring, rel=1e-12)
    assert ll_ring == pytest.approx(15.0e-6, rel=1e-3)


def test_small_all_reduce_across_nodes_takes_the_tree():
    """1 KB over 64 nodes, one GPU each: the ring's 126 steps each cost the tree's NET latency (one GPU a node),
    5.0 us with LL; the double binary tree climbs 2 * log2(64) = 12 steps. LL tree: 6.8 + 12 * 5.0 us and
    2 * 1 KB at 0.92 / 3.8 of 10 GB/s (treeCorrectionFactor for 1000 B: log2(1000 / 64) -> bucket 3, 1.0)."""
    tree = (6.8 + 12 * 5.0) * US + 2 * 1e3 / (1e10 * 0.92 / 3.8)
    assert c.all_reduce_seconds(1e3, 64, 1e10, 0.0, nodes=64) == pytest.approx(tree, rel=1e-12)


def test_large_all_reduce_is_bandwidth_bound_simple_ring():
    """1 GB on 4 GPUs at 100 GB/s: Simple's ring, 2 * 3/4 GB / 100 GB/s = 15 ms, plus 8.4 + 6 * 3.4 us."""
    assert c.all_reduce_seconds(1e9, 4, 100e9, 0.0) == pytest.approx(0.015 + (8.4 + 6 * 3.4) * US, rel=1e-12)
    # the link's own latency (NCCL's latencyInter) adds to each of the 6 steps
    assert c.all_reduce_seconds(1e9, 4, 100e9, 1e-6) == pytest.approx(0.015 + (8.4 + 6 * 4.4) * US, rel=1e-12)


def test_gather_scatter_all_to_all_send_by_hand():
    assert c.all_gather_seconds(8e9, 8, 100e9, 0.0) == pytest.approx(7 / 8 * 8 / 100 + (8.4 + 7 * 3.4) * US)
    assert c.reduce_scatter_seconds(8e9, 8, 100e9, 0.0) == pytest.approx(7 / 8 * 8 / 100 + (8.4 + 7 * 3.4) * US)
    # n - 1 rounds of pairs after one base latency, 8 at once (NCCL_MAX_DEV_WORK_P2P_PER_BATCH): a Simple step a
    # batch of 8, NET's 14 us across nodes; a send: one Simple step
    assert c.all_to_all_seconds(2e9, 2, 50e9, 0.0) == pytest.approx(1 / 50 + (8.4 + 3.4) * US)
    assert c.all_to_all_seconds(9e9, 9, 50e9, 0.0) == pytest.approx(8 / 50 + (8.4 + 3.4) * US)
    assert c.all_to_all_seconds(10e9, 10, 50e9, 0.0) == pytest.approx(9 / 50 + (8.4 + 2 * 3.4) * US)
    assert c.all_to_all_seconds(72e9, 72, 50e9, 0.0, nodes=9) == pytest.approx(71 / 50 + (8.4 + 9 * 14.0) * US)
    assert c.send_recv_seconds(1e9, 2, 50e9, 0.0, nodes=2) == pytest.approx(1 / 50 + (8.4 + 14.0) * US)


def test_a_group_of_one_costs_nothing_and_arrays_broadcast():
    for collective in c.BUILTIN:
        assert collective.seconds(1e9, 1, 1e9, 1e-3) == 0.0
    out = c.all_reduce_seconds(np.array([1e9, 2e9]), np.array([2, 4]), np.array([1e11, 1e11]), 0.0)
    np.testing.assert_allclose(out, [1e9 / 1e11 + (8.4 + 2 * 3.4) * US, 1.5 * 2e9 / 1e11 + (8.4 + 6 * 3.4) * US])


def test_nvls_beats_the_ring_on_eight_h200(registry):
    """1 GB all-reduce on an H200 node: the ring moves 2 * 7/8 GB at B; NVLS 7/8 GB at B * 0.85 * 7/9 (one NVLS
    channel a GPU, each at a ninth of the link: NCCL's search), so its data term is 2 * 0.85 * 7/9 = 1.3222 times
    shorter (476 GB/s of bus bandwidth on 360); latency 25 us against 8.4 + 14 * 3.4 = 56 us. Two GPUs: 0.85 *
    1/3, and the ring wins."""
    h200 = registry.get("hardware/h200")
    bandwidth, latency, link = topology.group_link(h200, np.array([1]), np.array([8]), EFF)
    assert bandwidth[0] == 450e9 * 0.8 and latency[0] == 0.0 and link["nodes"][0] == 1
    assert link["nvls_efficiency"][0] == pytest.approx(0.85 * 7 / 9)
    ring = 56.0 * US + 2 * 7 / 8 * 1e9 / 360e9
    nvls = 25.0 * US + 7 / 8 * 1e9 / (360e9 * 0.85 * 7 / 9)
    assert (ring - 56.0 * US) / (nvls - 25.0 * US) == pytest.approx(2 * 0.85 * 7 / 9)
    assert 2 * 7 / 8 * 1e9 / (nvls - 25.0 * US) / 1e9 == pytest.approx(476, abs=1)
    assert c.all_reduce_seconds(1e9, 8, bandwidth, latency, **link)[0] == pytest.approx(nvls, rel=1e-12)
    assert c.all_reduce_seconds(1e9, 8, bandwidth, latency)[0] == pytest.approx(ring, rel=1e-12)  # without NVLS
    # a small one stays on LL's ring: 15 us beats NVLS's 25 us
    assert c.all_reduce_seconds(1e3, 8, bandwidth, latency, **link)[0] < 25.0 * US
    # two GPUs: NVLS at 0.85 / 3 moves half a GB at 102 GB/s, the ring a GB at 360: the ring
    bandwidth, latency, link = topology.group_link(h200, np.array([1]), np.array([2]), EFF)
    assert link["nvls_efficiency"][0] == pytest.approx(0.85 / 3)
    ring_two = (8.4 + 2 * 3.4) * US + 1e9 / 360e9
    assert c.all_reduce_seconds(1e9, 2, bandwidth, latency, **link)[0] == pytest.approx(ring_two, rel=1e-12)


def test_a_group_of_16_stays_on_nvlink_on_gb200_and_crosses_on_h200(registry):
    gb200, h200 = registry.get("hardware/gb200"), registry.get("hardware/h200")
    assert (gb200.devices_per_node, gb200.nvlink_domain_devices, gb200.nics_per_node) == (4, 72, 4)
    assert h200.nvlink_domain_devices == h200.devices_per_node == 8
    bandwidth, _, link = topology.group_link(gb200, np.array([1]), np.array([16]), EFF)
    assert link["nodes"][0] == 1 and bandwidth[0] == 900e9 * 0.8
    assert link["nvls_efficiency"][0] == pytest.approx(0.74 * 15 / 17)  # Blackwell's 0.74, 16 GPUs
    # on H200 the 16 span two nodes: a hierarchical ring, NVLink 360 GB/s against 8 NICs * 50 GB/s * 0.85
    bandwidth, _, link = topology.group_link(h200, np.array([1]), np.array([16]), EFF)
    assert link["nodes"][0] == 2 and bandwidth[0] == pytest.approx(8 * 50e9 * 0.85)
    assert link["nvls_efficiency"][0] == 0.0
    # one member a node (stride 8): no NVLink leg, its own NIC
    bandwidth, _, link = topology.group_link(h200, np.array([8]), np.array([2]), EFF)
    assert link["nodes"][0] == 2 and bandwidth[0] == pytest.approx(50e9 * 0.85)
    # 16 GPUs across two GB200 racks (stride 72): one member a rack, each GPU its own NIC
    bandwidth, _, link = topology.group_link(gb200, np.array([72]), np.array([2]), EFF)
    assert link["nodes"][0] == 2 and bandwidth[0] == pytest.approx(50e9 * 0.85)


def test_fewer_nics_than_gpus_are_shared():
    """4 NICs for 8 GPUs: the 8 groups of one node at stride 8 share them, half a NIC each; a group with all 8
    of a node's GPUs gets its 4 NICs; point-to-point traffic gets each device's half NIC."""
    hw = Hardware(name="toy", memory_bytes=1 << 40, hbm_bytes_per_second=1e12, peak_flops_per_second={"bf16": 1e15},
                  devices_per_node=8, nics_per_node=4,
                  network=(NetworkLevel(name="within_node", bytes_per_second=100e9),
                           NetworkLevel(name="across_nodes", bytes_per_second=10e9)))
    one = {"collective_within_node": 1.0, "collective_across_nodes": 1.0}
    assert topology.group_link(hw, np.array([8]), np.array([2]), one)[0][0] == pytest.approx(5e9)
    assert topology.group_link(hw, np.array([1]), np.array([16]), one)[0][0] == pytest.approx(40e9)
    assert topology.group_link(hw, np.array([1]), np.array([16]), one, ring=False)[0][0] == pytest.approx(5e9)


def test_a_mesh_gives_a_group_the_links_between_its_members(registry):
    """On a mesh (a link to each peer, no switch) a group of m of a node's 8 devices uses m - 1 of each device's
    7 links: the MI300X's 7 x 64 GB/s at 0.7, by hand; a group spanning nodes, its members' links on each node.
    Through NVSwitch (the H200) every group has the device's whole bandwidth."""
    mi300x, h200 = registry.get("hardware/mi300x"), registry.get("hardware/h200")
    eff = {"collective_within_node": 0.7, "collective_across_nodes": 0.8}
    assert mi300x.node_fabric == "mesh" and h200.node_fabric == "switch"
    for size in (2, 4, 8):
        bandwidth = topology.group_link(mi300x, np.array([1]), np.array([size]), eff)[0]
        assert bandwidth[0] == pytest.approx(448e9 * 0.7 * (size - 1) / 7)
        assert topology.group_link(h200, np.array([1]), np.array([size]), EFF)[0][0] == pytest.approx(450e9 * 0.8)
    # 8 members 2 apart span two nodes, 4 on each: the slower leg is their 3 links of 7 (134 GB/s), not their
    # 4 NICs (4 x 50 GB/s x 0.8)
    both = topology.group_link(mi300x, np.array([2]), np.array([8]), eff)[0]
    assert both[0] == pytest.approx(448e9 * 0.7 * 3 / 7) and both[0] < 4 * 50e9 * 0.8
    # the batched path prices the same
    batch = topology.group_link(mi300x, np.array([1, 1, 2]), np.array([2, 8, 8]), eff)[0]
    assert batch == pytest.approx([448e9 * 0.7 / 7, 448e9 * 0.7, 448e9 * 0.7 * 3 / 7])


@pytest.mark.parametrize("field, value, match", [
    ("node_fabric", "torus", "node_fabric 'torus' is not one of switch, mesh"),
    ("nvlink_domain_devices", 12, "not a whole number of nodes"),
    ("nvlink_domain_devices", 0, "positive integer"),
    ("nics_per_node", -1, "positive integer"),
    ("nics_per_node", 2.5, "positive integer"),
    ("nvls_architecture", "ampere", "nvls_architecture 'ampere' is not one of"),
])
def test_invalid_fields_are_refused(field, value, match):
    data = {"name": "bad", "memory_bytes": 1 << 30, "hbm_bytes_per_second": 1e12,
            "peak_flops_per_second": {"bf16": 1e15}, "devices_per_node": 8,
            "network": {"within_node": {"bytes_per_second": 1e11}}, field: value}
    with pytest.raises(InvalidValue, match=match):
        hardware_from_mapping(data, where="bad.yaml")


def test_a_four_argument_plugin_is_still_called(registry):
    """A third party's collective written before the link keywords gets the four arguments only."""
    def old(message_bytes, group_size, bytes_per_second, latency_seconds):
        return np.zeros(np.broadcast(message_bytes, group_size).shape)

    wrapped = ct._with_link_keywords(old)
    assert wrapped(1e9, 2, 1e9, 0.0, nodes=2, nvls_efficiency=0.5) == 0.0
    assert ct._with_link_keywords(c.all_reduce_seconds) is c.all_reduce_seconds

    class Unhashable:  # a callable object, as a plugin may register
        __hash__ = None

        def __call__(self, message_bytes, group_size, bytes_per_second, latency_seconds):
            return message_bytes / bytes_per_second

    assert ct._with_link_keywords(Unhashable())(2e9, 2, 1e9, 0.0, nodes=1, nvls_efficiency=0.0) == 2.0


def test_fsdp2_exposes_the_first_gather_and_the_last_scatter_per_layer():
    """FSDP 2 over two stages of one kind each (2 dense layers, then 2 MoE layers): on each rank the root's gather
    (embedding; head and final norm) and the first layer's are exposed, the second's hides behind the first's
    forward up to it; in the backward the last layer's gather and the first's reduce-scatter (and the root's)
    are exposed, the first layer's gather behind the second's backward, the second's scatter behind the
    first's. Every gather and scatter is a 2-member Simple ring: 8.4 + 3.4 us and half the bytes at 100 GB/s."""
    spec = ModelSpec(name="toy-two", model_type="qwen3_moe", family="qwen3_moe", hidden_size=1024, vocab_size=1000,
                     layers=(LayerGroup(kind="dense", count=2), LayerGroup(kind="moe", count=2)),
                     num_attention_heads=8, num_key_value_heads=8,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense"),
                                 "moe": LayerKind(attention="gqa", mlp="moe")},
                     attention_bias=False, mlp_bias=False, intermediate_size=4096, num_experts=8,
                     num_experts_per_tok=2, moe_intermediate_size=1024)
    hw = Hardware(name="toy", memory_bytes=1 << 40, hbm_bytes_per_second=1e30, peak_flops_per_second={"bf16": 1.5e14},
                  network=(NetworkLevel(name="within_node", bytes_per_second=100e9),),
                  efficiency={k: 1.0 for k in ct.EFFICIENCY_KEYS},
                  kernel_tables={"launch_seconds": 0.0, "dispatch_seconds": 0.0, "source": "toy: no launch cost"})
    work = analytic.model_work(spec, 512)
    text = "seq=512,fsdp=2,pp=2,pp_layers=2/2,num_micro_batches=2"
    r = ct.step_time(work, [Strategy.parse(text)], hw)

    def collective(parameters):  # bf16 parameters or gradients, half of them sent
        return (8.4 + 3.4) * US + parameters * 2 / 2 / 100e9

    h, inter, experts, moe_inter = 1024, 4096, 8, 1024
    dense_layer = collective(4 * h * h + 3 * h * inter + 2 * h)                   # projections, MLP, two norms
    moe_layer = collective(4 * h * h + 2 * h + experts * h) + collective(experts * 3 * h * moe_inter)  # + routed
    roots = (collective(1000 * h), collective(1000 * h + h))                     # embedding; head, final norm
    layer = ct.layer_seconds(work, ct.strategy_columns([Strategy.parse(text)]), hw)
    forward = dict(zip(work.kinds, layer["forward"][0], strict=True))
    backward = dict(zip(work.kinds, layer["backward"][0], strict=True))
    for rank, (kind, g) in enumerate((("dense", dense_layer), ("moe", moe_layer))):
        f, b = forward[kind], backward[kind]
        exposed_f = roots[rank] + g + max(0.0, g - f)
        exposed_b = g + max(0.0, g - b) + max(0.0, g - b) + g + roots[rank]   # gathers and scatters alike
        assert r.detail["fsdp_exposed_forward_seconds"][0, rank] == pytest.approx(exposed_f, rel=1e-12)
        assert r.detail["fsdp_exposed_backward_seconds"][0, rank] == pytest.approx(exposed_b, rel=1e-12)
    assert dense_layer > forward["dense"]  # the case is one where the forward's prefetch leaves some exposed
    # every gather (forward and backward: reshard_after_forward) and scatter of the busiest rank, each micro-batch
    busiest = int(r.detail["busiest_rank"][0])
    g = (dense_layer, moe_layer)[busiest]
    send = (8.4 + 3.4) * US + 512 * h * 2 / 100e9                                # the stages' sends
    assert r.communication_seconds[0] == pytest.approx(2 * (2 * 2 * g + 2 * g + 2 * roots[busiest] + 2 * send),
                                                       rel=1e-12)


def test_shipped_nvidia_specs_state_nvls(registry):
    arch = {"h100": "hopper", "h200": "hopper", "b200": "blackwell", "gb200": "blackwell", "a100": None}
    for name, expected in arch.items():
        assert registry.get(f"hardware/{name}").nvls_architecture == expected
    assert attrs.evolve(registry.get("hardware/h200"), nvls_architecture=None).nvls_architecture is None
