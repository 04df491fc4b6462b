"""The time model: published FLOP counts, MFU's definition, and the properties a ranking relies on."""
from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ndcost.compose import time as ct
from ndcost import work
from ndcost.plugins.estimators import flops as analytic
from ndcost.layer import LayerKind
from ndcost.values import Hardware, LayerGroup, ModelSpec, NetworkLevel, Strategy


def gpt2_spec(layers=12, hidden=768, heads=12, vocab=50257):
    """GPT-2 small as its config states it (learned positions, plain 4h feed-forward, tied head)."""
    return ModelSpec(name="gpt2", model_type="gpt2", family="gpt2", hidden_size=hidden, vocab_size=vocab,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=heads,
                     num_key_value_heads=heads, intermediate_size=4 * hidden, tie_word_embeddings=True,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense", mlp_matrices=2, rotary=False)})


def llama_spec(layers=32):
    return ModelSpec(name="llama-3-8b", model_type="llama", family="llama", hidden_size=4096, vocab_size=128256,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, attention_bias=False, mlp_bias=False)


@pytest.fixture(scope="module")
def h200(registry):
    return registry.get("hardware/h200")


@pytest.fixture(scope="module")
def llama_work():
    return analytic.model_work(llama_spec(), 4096)


# ---------------------------------------------------------------------------
# FLOPs against published counts
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("seq", [1024, 2048])
@pytest.mark.parametrize("batch", [1, 8])
def test_narayanan_flops_per_iteration(seq, batch):
    """Narayanan et al. 2021 (Megatron-LM at scale), eq. 3: 72BsLh^2 (1 + s/6h + V/12Lh), and with full
    recompute 96BsLh^2 (1 + s/6h + V/16Lh); matmuls only, attention at every pair of tokens."""
    spec = gpt2_spec()
    work = analytic.model_work(spec, seq)
    B, s, L, h, V = batch, seq, 12, 768, 50257
    expected = 72 * B * s * L * h ** 2 * (1 + s / (6 * h) + V / (12 * L * h))
    expected_full = 96 * B * s * L * h ** 2 * (1 + s / (6 * h) + V / (16 * L * h))
    got = batch * work.training_flops_per_sequence(seq, all_pairs=True)
    got_full = batch * work.training_flops_per_sequence(seq, recompute="full", all_pairs=True)
    assert got == pytest.approx(expected, rel=1e-12)
    assert got_full == pytest.approx(expected_full, rel=1e-12)


def test_six_n_per_token():
    """Kaplan et al. 2020 (Table 1): training costs 6N FLOPs a token, N = 12 n_layer d_model^2 the non-embedding
    parameters (d_attn = d_model, d_ff = 4 d_model), the attention's context term aside; the (tied) head's
    matmul adds 6 V d_model."""
    spec = gpt2_spec()
    h, L, V = 768, 12, 50257
    work = analytic.model_work(spec, 1024).work
    layer = work["dense"].attention_mm_flops_per_token + work["dense"].other_mm_flops_per_token
    assert 3 * L * layer == 6 * (12 * L * h ** 2)
    model = analytic.model_work(spec, 1024)
    assert 3 * (L * layer + model.head_flops_per_token) == 6 * (12 * L * h ** 2 + V * h)


def test_causal_pairs_and_window():
    assert work.causal_pairs(4) == 10
    # window 2 over 5 tokens: 1 + 2 + 2 + 2 + 2
    assert work.window_pairs(5, 2) == 9
    assert work.window_pairs(5, 0) == 15
    assert work.window_pairs(3, 8) == 6


def test_analytic_flops_by_hand_llama():
    """One Llama-3-8B layer at 4096 tokens: 2 * tokens * (in * out) per projection; scores 4 * H * d at s(s+1)/2."""
    spec = llama_spec()
    s, h, d, H, kv, inter = 4096, 4096, 128, 32, 8, 14336
    flops = analytic.analytic_flops(spec, "dense", s)
    assert flops["attention"] == 2 * s * (h * H * d + 2 * h * kv * d + H * d * h)
    assert flops["ffn"] == 2 * s * 3 * h * inter
    assert flops["scores"] == 4 * H * d * s * (s + 1) / 2
    assert analytic.analytic_flops(spec, "dense", s, all_pairs=True)["scores"] == 4 * H * d * s * s
    assert analytic.analytic_flops(spec, "output", s) == {"head": 2 * s * h * 128256}


@pytest.mark.slow
def test_analytic_flops_match_torch_flop_counter():
    """Independent count: torch's FlopCounterMode over Transformers' own Llama and GPT-2 models (eager
    attention multiplies every pair of tokens before masking)."""
    import torch
    import transformers
    from torch.utils.flop_counter import FlopCounterMode

    from ndcost.models import load_model

    seq = 64
    cases = [
        (transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_attention_heads=8,
                                  num_key_value_heads=2, num_hidden_layers=1, vocab_size=1000),
         lambda m: m.model.layers[0]),
        (transformers.GPT2Config(n_embd=256, n_head=8, n_layer=1, vocab_size=1000), lambda m: m.transformer.h[0]),
    ]
    for config, layer_of in cases:
        config._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_config(config)
        spec = load_model(config)
        kind = spec.kinds[0]
        with FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, seq, dtype=torch.long))
        whole = counter.get_total_flops()
        expected = sum(analytic.analytic_flops(spec, kind, seq, all_pairs=True).values()) \
            + analytic.analytic_flops(spec, "output", seq)["head"]
        assert whole == expected, (spec.name, whole, expected)


# ---------------------------------------------------------------------------
# MFU and the step's composition
# ---------------------------------------------------------------------------
def test_mfu_definition(h200, llama_work):
    """MFU = 3 x forward FLOPs (causal scores, no recompute) x tokens / (step x devices x peak), by hand."""
    spec = llama_spec()
    s = 4096
    strategy = Strategy.parse(f"seq={s},dp=2,tp=2,pp=2,num_micro_batches=4,micro_batch=2,recompute=full")
    r = ct.step_time(llama_work, [strategy], h200)
    per_layer = 2 * s * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 4 * 32 * 128 * s * (s + 1) / 2
    forward = 32 * per_layer + 2 * s * 4096 * 128256
    sequences = 2 * 4 * 2
    expected = 3 * forward * sequences / (r.step_seconds[0] * 8 * 989e12)
    assert r.mfu[0] == pytest.approx(expected, rel=1e-12)
    assert r.tokens_per_second[0] == pytest.approx(sequences * s / r.step_seconds[0], rel=1e-12)
    assert spec.num_layers == 32


STRATEGIES = [
    "seq=4096", "seq=4096,tp=8,sp=true", "seq=4096,dp=8,zero=1", "seq=4096,pp=4,num_micro_batches=8",
    "seq=4096,pp=4,vpp=2,schedule=interleaved,num_micro_batches=8", "seq=8192,cp=2,tp=4,dp=4,recompute=selective",
    "seq=4096,fsdp=8,num_micro_batches=2", "seq=4096,pp=2,vpp=2,schedule=dualpipev,num_micro_batches=6",
    "seq=2048,dp=16,tp=4,pp=2,num_micro_batches=16,zero=1,recompute=full,recompute_layers=4",
    "seq=4096,cp=4,cp_algo=ulysses,dp=2",
]


def test_step_is_the_sum_of_its_parts(h200, llama_work):
    r = ct.step_time(llama_work, [Strategy.parse(s) for s in STRATEGIES], h200)
    total = r.compute_seconds + r.exposed_communication_seconds + r.bubble_seconds + r.optimizer_seconds
    np.testing.assert_allclose(r.step_seconds, total, rtol=1e-12)
    assert np.all(r.exposed_communication_seconds <= r.communication_seconds + 1e-15)
    assert np.all((r.mfu > 0) & (r.mfu < 1))


def test_batch_equals_one_at_a_time(h200, llama_work):
    strategies = [Strategy.parse(s) for s in STRATEGIES]
    batch = ct.step_time(llama_work, strategies, h200)
    for i, strategy in enumerate(strategies):
        alone = ct.step_time(llama_work, [strategy], h200)
        for field in ct.TIME_FIELDS:
            assert getattr(alone, field)[0] == pytest.approx(getattr(batch, field)[i], rel=1e-12), (strategy, field)
    assert batch.breakdown(3).step_seconds == batch.step_seconds[3]


def test_columns_mapping_matches_strategies(h200, llama_work):
    strategies = [Strategy.parse(s) for s in ("seq=4096,tp=2", "seq=4096,dp=4,zero=1")]
    cols = {"seq": [4096, 4096], "tp": [2, 1], "dp": [1, 4], "zero": [0, 1]}
    a = ct.step_time(llama_work, strategies, h200)
    b = ct.step_time(llama_work, cols, h200)
    np.testing.assert_allclose(a.step_seconds, b.step_seconds, rtol=1e-12)


def test_recompute_costs_time(h200, llama_work):
    r = ct.step_time(llama_work, [Strategy.parse(f"seq=4096,recompute={x}") for x in
                                  ("none", "core_attention", "selective", "full")], h200)
    assert r.step_seconds[0] < r.step_seconds[1] <= r.step_seconds[2] < r.step_seconds[3]
    # full recompute repeats the forward: about a third more compute than none
    assert 1.2 < r.compute_seconds[3] / r.compute_seconds[0] < 1.4


def test_interleaving_halves_the_bubble(h200, llama_work):
    r = ct.step_time(llama_work, [Strategy.parse("seq=4096,pp=4,num_micro_batches=8"),
                                  Strategy.parse("seq=4096,pp=4,vpp=2,schedule=interleaved,num_micro_batches=8")],
                     h200)
    assert r.bubble_seconds[1] == pytest.approx(r.bubble_seconds[0] / 2, rel=1e-9)


# ---------------------------------------------------------------------------
# properties
# ---------------------------------------------------------------------------
def test_time_falls_with_devices_until_communication_dominates(h200, llama_work):
    """Fixed work (one micro-batch of 4096 tokens): TP within a node speeds the step up; past the node TP's
    all-reduces run as hierarchical rings over the node's 8 NICs (340 GB/s against NVLink's 360, and NET's
    longer latencies) where within it NVLS reduced in the switch: the exposed communication nearly doubles
    and eats most of the compute saved."""
    r = ct.step_time(llama_work, [Strategy.parse(f"seq=4096,tp={t}") for t in (1, 2, 4, 8, 16, 32)], h200)
    steps, exposed, compute = r.step_seconds, r.exposed_communication_seconds, r.compute_seconds
    assert steps[0] > steps[1] > steps[2] > steps[3]
    assert exposed[4] > 1.5 * exposed[3]
    assert steps[3] - steps[4] < 0.2 * (compute[3] - compute[4])
    # data parallelism at a fixed global batch: 64 micro-batches spread over more replicas
    r = ct.step_time(llama_work, [Strategy.parse(f"seq=4096,dp={d},zero=1,num_micro_batches={64 // d}")
                                  for d in (1, 2, 4, 8, 16, 32, 64)], h200)
    assert np.all(np.diff(r.step_seconds) < 0)


def _slower(hardware: Hardware, factor: float, level: str) -> Hardware:
    network = tuple(attrs.evolve(l, bytes_per_second=l.bytes_per_second * factor) if l.name == level or level == "all"
                    else l for l in hardware.network)
    return attrs.evolve(hardware, network=network)


strategy_strategy = st.builds(
    lambda dp, tp, pp, cp, m, zero, sp, rec, sched, seq, ulysses, fsdp: Strategy(
        dp=dp, tp=tp, pp=pp, cp=cp, num_micro_batches=m, zero=0 if fsdp > 1 else zero, sp=sp, recompute=rec,
        seq=seq, schedule="interleaved" if sched and pp > 1 else "1f1b", vpp=2 if sched and pp > 1 else 1,
        cp_algo="ulysses" if ulysses else "ring", fsdp=fsdp),
    st.sampled_from([1, 2, 4, 16]), st.sampled_from([1, 2, 4, 8]), st.sampled_from([1, 2, 4]),
    st.sampled_from([1, 2]), st.integers(1, 16), st.sampled_from([0, 1, 3]), st.booleans(),
    st.sampled_from(["none", "selective", "full"]), st.booleans(), st.sampled_from([1024, 4096, 8192]),
    st.booleans(), st.sampled_from([1, 2, 8]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(strategy=strategy_strategy, factor=st.floats(0.05, 0.95), level=st.sampled_from(["within_node",
                                                                                         "across_nodes", "all"]))
def test_slower_network_never_faster(h200, llama_work, strategy, factor, level):
    fast = ct.step_time(llama_work, [strategy], h200)
    slow = ct.step_time(llama_work, [strategy], _slower(h200, factor, level))
    assert slow.step_seconds[0] >= fast.step_seconds[0] * (1 - 1e-12)
    assert slow.communication_seconds[0] >= fast.communication_seconds[0] * (1 - 1e-12)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pp=st.sampled_from([2, 4, 8]), m=st.integers(1, 32), interleaved=st.booleans())
def test_more_micro_batches_shrink_the_bubble_share(h200, llama_work, pp, m, interleaved):
    extra = ",schedule=interleaved,vpp=2" if interleaved else ""
    r = ct.step_time(llama_work, [Strategy.parse(f"seq=4096,pp={pp},num_micro_batches={n}{extra}")
                                  for n in (m, m + 1, 2 * m + 3)], h200)
    share = r.bubble_seconds / r.step_seconds
    assert share[0] > share[1] > share[2] > 0


def test_balanced_one_f_one_b_bubble_is_p_minus_1_over_m(h200):
    """Ranks carrying nearly equal work (a tiny vocabulary, so the head and loss are small): bubble/busy close
    to (p-1)/m (the last rank's final norm and loss make it a few percent busier than the others)."""
    spec = attrs.evolve(llama_spec(), vocab_size=8)
    work = analytic.model_work(spec, 4096)
    r = ct.step_time(work, [Strategy.parse("seq=4096,pp=4,num_micro_batches=8")], h200)
    busy = r.compute_seconds[0] + r.exposed_communication_seconds[0] - r.detail["pp_send_seconds"][0] * 2 * 3
    assert r.bubble_seconds[0] / busy == pytest.approx(3 / 8, rel=0.05)
    assert r.bubble_seconds[0] / busy < 3 / 8


def test_unpriced_mechanism_is_refused():
    from ndcost.errors import Unpriced
    spec = attrs.evolve(llama_spec(), kind_specs={"dense": LayerKind(attention="compressed_sparse_attention",
                                                                     mlp="dense")})
    with pytest.raises(Unpriced, match="census"):
        analytic.analytic_flops(spec, "dense", 128)


def test_hardware_without_efficiency_uses_priors_and_says_so():
    hw = Hardware(name="bare", memory_bytes=1 << 30, hbm_bytes_per_second=1e12, peak_flops_per_second={"bf16": 1e14},
                  network=(NetworkLevel(name="within_node", bytes_per_second=1e11),))
    values, sources = ct.efficiencies(hw)
    assert values == dict(ct.DEFAULT_EFFICIENCY)
    assert set(sources.values()) == {"prior (uncalibrated)"}
    r = ct.step_time(analytic.model_work(llama_spec(2), 1024), [Strategy.parse("seq=1024,tp=2")], hw)
    assert "prior (uncalibrated)" in r.provenance["efficiency"]


def moe_spec():
    return ModelSpec(name="toy-moe", model_type="qwen3_moe", family="qwen3_moe", hidden_size=2048, vocab_size=32000,
                     layers=(LayerGroup(kind="moe", count=8),), num_attention_heads=16, num_key_value_heads=4,
                     head_dim=128, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=768,
                     kind_specs={"moe": LayerKind(attention="gqa", mlp="moe")}, attention_bias=False, mlp_bias=False)


def test_moe_expert_parallel_and_dualpipev(h200):
    work = analytic.model_work(moe_spec(), 4096)
    strategies = [Strategy.parse(s) for s in (
        "seq=4096,dp=8,ep=8,pp=2,num_micro_batches=8",
        "seq=4096,dp=8,ep=8,pp=2,vpp=2,schedule=dualpipev,num_micro_batches=8",
        "seq=4096,dp=8,ep=8,pp=2,num_micro_batches=8,moe_imbalance=1.5")]
    r = ct.step_time(work, strategies, h200)
    total = r.compute_seconds + r.exposed_communication_seconds + r.bubble_seconds + r.optimizer_seconds
    np.testing.assert_allclose(r.step_seconds, total, rtol=1e-12)
    # DualPipeV overlaps the all-to-alls with compute: less of the communication is exposed
    assert r.exposed_communication_seconds[1] < r.exposed_communication_seconds[0]
    # imbalance loads the busiest rank's experts and its all-to-alls; this toy's layer is launch-bound at the
    # H200's fitted dispatch (50 launches x 38.1 us), so its experts' load shows with the launches free
    assert r.compute_seconds[2] >= r.compute_seconds[0]
    free = attrs.evolve(h200, kernel_tables={"launch_seconds": 0.0, "dispatch_seconds": 0.0, "source": "test"})
    roofline = ct.step_time(work, strategies, free)
    assert roofline.compute_seconds[2] > roofline.compute_seconds[0]
    assert r.communication_seconds[2] > r.communication_seconds[0]
    # routed experts count at top-k a token in the model FLOPs, whatever the imbalance
    assert r.detail["model_flops"][2] == r.detail["model_flops"][0]


def test_columns_broadcast_scalars(h200, llama_work):
    a = ct.step_time(llama_work, {"seq": 4096, "tp": [1, 2], "sp": True}, h200)
    b = ct.step_time(llama_work, [Strategy.parse("seq=4096,sp=true"), Strategy.parse("seq=4096,tp=2,sp=true")], h200)
    np.testing.assert_allclose(a.step_seconds, b.step_seconds, rtol=1e-12)


def test_census_traffic_becomes_elementwise_bytes():
    """A record's traffic less its weights and the matmuls' inputs and outputs is the elementwise traffic."""
    from ndcost.records import KindRecord
    spec = llama_spec(1)
    seq, h, inter = 1024, 4096, 14336
    flops = analytic.analytic_flops(spec, "dense", seq)
    attention_io = (h + 4096) + (h + 1024) * 2 + (4096 + h)     # q, k, v, o: inputs and outputs a token
    ffn_io = (h + inter) * 2 + (inter + h)
    moved = {"attention": 2 * seq * attention_io + 100 * seq + 7, "ffn": 2 * seq * ffn_io + 300 * seq + 11,
             "norm": 36 * h * seq, "other": 12 * h * seq, "scores": 999_999}
    params = {"attention": 7, "ffn": 11, "norm": 0, "other": 0, "scores": 0}
    record = KindRecord(kind="dense", seq=seq, source="test", saved_per_token=0.0, saved_tp_per_token=0.0,
                        flops_by_part=flops, traffic={"moved_bytes": moved, "parameter_bytes": params})
    work = analytic.kind_work(spec, "dense", seq, record)
    assert work.elementwise_elements_per_token == pytest.approx((100 + 300) / 2)
    assert work.replicated_elements_per_token == pytest.approx((36 + 12) * h / 2)
    assert "census traffic" in work.source
    assert work.score_flops_per_pair == pytest.approx(4 * 32 * 128)


def test_selective_recompute_repeats_the_measured_shares(h200):
    """Selective recompute adds the census's shares of the attention's and the other matmuls' forward time and,
    eager, the forward's elementwise kernels (an op-level policy reruns every op it does not keep); compiled, the
    shares alone (the partitioner fuses the rerun into the backward's kernels)."""
    from ndcost.records import KindRecord
    spec = llama_spec(2)
    seq = 4096
    record = KindRecord(kind="dense", seq=seq, source="test", saved_per_token=0.0, saved_tp_per_token=0.0,
                        flops_by_part=analytic.analytic_flops(spec, "dense", seq),
                        recomputed_attention_mm_share=0.5, recomputed_other_mm_share=1 / 3)
    work = analytic.model_work(spec, seq, {"dense": record})
    cols = ct.strategy_columns([Strategy.parse(f"seq={seq},recompute=selective")])
    # the GEMM prior: a Llama layer's GEMMs at 4096 tokens fill their waves as its 8192^3 reference does
    h200 = attrs.evolve(h200, kernel_tables={k: v for k, v in h200.kernel_tables.items() if k != "gemm_shape"})
    eff, _ = ct.efficiencies(h200)
    seconds = ct.layer_seconds(work, cols, h200, eff)
    w = work.work["dense"]
    attention = w.attention_mm_flops_per_token * seq / (989e12 * eff["matmul"])
    other = w.other_mm_flops_per_token * seq / (989e12 * eff["matmul"])
    # eager: bf16 elements a token through HBM at the stated memory efficiency (the H200 states no elementwise table)
    assert "elementwise" not in h200.kernel_tables
    moved_bytes = 2 * seq * (w.elementwise_elements_per_token + w.replicated_elements_per_token)
    elementwise = moved_bytes / (h200.hbm_bytes_per_second * eff["memory"])
    assert elementwise > 0.1 * (0.5 * attention + other / 3)
    assert seconds["recompute"][0, 0] == pytest.approx(0.5 * attention + other / 3 + elementwise, rel=1e-12)
    compiled = ct.strategy_columns([Strategy.parse(f"seq={seq},recompute=selective,compile=true")])
    seconds = ct.layer_seconds(work, compiled, h200, eff)
    assert seconds["recompute"][0, 0] == pytest.approx(0.5 * attention + other / 3, rel=1e-12)
    # a policy rerunning the scores (eager attention's matmuls under torchtitan's) adds their forward too
    rerun = analytic.model_work(spec, seq, {"dense": attrs.evolve(record, recomputed_scores_share=1.0)})
    seconds = ct.layer_seconds(rerun, cols, h200, eff)
    assert seconds["scores_forward"][0, 0] > 0
    assert seconds["recompute"][0, 0] == pytest.approx(
        0.5 * attention + other / 3 + elementwise + seconds["scores_forward"][0, 0], rel=1e-12)


def test_recompute_layers_limits_the_recompute(h200, llama_work):
    r = ct.step_time(llama_work, [Strategy.parse(f"seq=4096,pp=2,num_micro_batches=4,recompute=full{x}")
                                  for x in ("", ",recompute_layers=8", ",recompute_layers=0")]
                     + [Strategy.parse("seq=4096,pp=2,num_micro_batches=4")], h200)
    assert r.compute_seconds[0] > r.compute_seconds[1] > r.compute_seconds[2]
    assert r.compute_seconds[2] == pytest.approx(r.compute_seconds[3], rel=1e-12)


def test_fsdp_copies_each_gather_into_the_parameters_on_the_compute_stream(h200, llama_work):
    """FSDP2 copies every all-gather's output into the parameters' unsharded storage (``split_with_sizes_copy``,
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py) on the compute stream: over a replicated run of the
    same work, the compute grows by those bytes read and written at HBM. Llama-3.1-8B: 218,112,000 parameters a
    layer (q and o 4096 x 4096, k and v 4096 x 1024, three 4096 x 14336 projections, two norms), 32 layers
    gathered in the forward and again in the backward, and the root (embedding and head 128,256 x 4096, the final
    norm) once, at 2 bytes."""
    fsdp, replicated = ct.step_time(llama_work, [Strategy.parse(f"seq=4096,{x}=8") for x in ("fsdp", "dp")],
                                    h200).compute_seconds
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert layer == 218_112_000
    root = 2 * 128_256 * 4096 + 4096
    copied = 2 * 2 * (2 * 32 * layer + root)
    eff, _ = ct.efficiencies(h200)
    assert "elementwise" not in h200.kernel_tables  # each copy at the stated memory efficiency
    assert fsdp - replicated == pytest.approx(copied / (h200.hbm_bytes_per_second * eff["memory"]), rel=1e-9)
    # reshard_after_forward=false: the backward finds the layers gathered, and copies none
    kept = ct.step_time(llama_work, [Strategy.parse("seq=4096,fsdp=8,reshard_after_forward=false")],
                        h200).compute_seconds[0]
    assert kept - replicated == pytest.approx(
        2 * 2 * (32 * layer + root) / (h200.hbm_bytes_per_second * eff["memory"]), rel=1e-9)
    # ZeRO-3's and Megatron-FSDP's parameters are views of the gathered buffer: no copy
    for viewed in ("dp=8,zero=3", "fsdp=8,fsdp_engine=megatron"):
        assert ct.step_time(llama_work, [Strategy.parse(f"seq=4096,{viewed}")], h200).compute_seconds[0] == replicated
