"""The step's parts derived by hand: the JSON keys, placement on the topology, volumes, optimizer, recompute, bubble."""
from __future__ import annotations

import json

import attrs
import numpy as np
import pytest

from ndcost.compose import time as ct
from ndcost.plugins.estimators import flops as analytic
from ndcost.layer import LayerKind
from ndcost.values import Hardware, LayerGroup, ModelSpec, NetworkLevel, Strategy

TIME_KEYS = {"step_seconds", "tokens_per_second", "mfu", "compute_seconds", "communication_seconds",
             "exposed_communication_seconds", "bubble_seconds", "optimizer_seconds", "offload_seconds",
             "exposed_offload_seconds", "exposed_tp_seconds", "exposed_cp_seconds", "exposed_ep_seconds",
             "exposed_fsdp_seconds", "exposed_dp_seconds", "exposed_pp_seconds"}
WITHIN, ACROSS = 100e9, 10e9


# NCCL's constants (src/graph/tuning.cc, tests/test_nccl.py): a Simple ring's base latency and step on NVLink
BASE, STEP = 8.4e-6, 3.4e-6


def toy_hardware(per_node=8, peak=1e15, hbm=1e12, memory=1.0, nics=None):
    """Round numbers, no link latency beyond NCCL's, no launch or dispatch cost, efficiency 1 for everything
    but the memory class."""
    return Hardware(name="toy", memory_bytes=1 << 40, hbm_bytes_per_second=hbm, peak_flops_per_second={"bf16": peak},
                    devices_per_node=per_node, nics_per_node=per_node if nics is None else nics,
                    network=(NetworkLevel(name="within_node", bytes_per_second=WITHIN),
                             NetworkLevel(name="across_nodes", bytes_per_second=ACROSS)),
                    efficiency={k: 1.0 for k in ct.EFFICIENCY_KEYS} | {"memory": memory, "memory_backward": memory},
                    kernel_tables={"launch_seconds": 0.0, "dispatch_seconds": 0.0, "source": "toy: no launch cost"})


def toy_spec(layers=2, hidden=1024, heads=8, vocab=1000):
    return ModelSpec(name="toy", model_type="llama", family="llama", hidden_size=hidden, vocab_size=vocab,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=heads,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, attention_bias=False, mlp_bias=False,
                     num_key_value_heads=heads, intermediate_size=4 * hidden)


def toy_parameters(spec):
    """q, k, v, o; gate, up, down; two norms a layer; embedding and untied head; the final norm."""
    h, inter, vocab = spec.hidden_size, spec.intermediate_size, spec.vocab_size
    return spec.num_layers * (4 * h * h + 3 * h * inter + 2 * h) + 2 * vocab * h + h


# ---------------------------------------------------------------------------
# "time" in `ndcost estimate --json` and in the resolver's result
# ---------------------------------------------------------------------------
def test_estimate_json_and_resolver_time(capsys):
    """Every key of the step's time (TIME_KEYS), the step as the sum of its parts, and MFU by hand for Llama-3.1-8B."""
    from ndcost.cli import main
    from ndcost.resolver import resolve

    text = "seq=4096,dp=4,tp=2,pp=2,num_micro_batches=8,recompute=full"
    assert main(["estimate", "llama-3.1-8b", "--strategy", text, "--census", "off", "--json"]) == 0
    time = json.loads(capsys.readouterr().out)["time"]
    assert set(time) == TIME_KEYS | {"provenance"}
    assert "overlap" in time["provenance"] and "dp_grad" in time["provenance"]["overlap"]
    parts = (time["compute_seconds"] + time["exposed_communication_seconds"] + time["bubble_seconds"]
             + time["optimizer_seconds"])
    assert time["step_seconds"] == pytest.approx(parts, rel=1e-12)
    # the exposed communication by group: TP's, the data-parallel reduction's and the pipeline's here
    by_group = {g: time[f"exposed_{g}_seconds"] for g in ("tp", "cp", "ep", "fsdp", "dp", "pp")}
    assert sum(by_group.values()) == pytest.approx(time["exposed_communication_seconds"], rel=1e-12)
    assert by_group["cp"] == by_group["ep"] == by_group["fsdp"] == 0.0
    sequences, s = 4 * 8, 4096
    assert time["tokens_per_second"] == pytest.approx(sequences * s / time["step_seconds"], rel=1e-12)
    # Llama-3.1-8B: 32 layers, hidden 4096, 32 heads (8 KV) x 128, intermediate 14336, vocabulary 128256;
    # the causal kernel computes s (s + 1) / 2 pairs; full recompute is not model FLOPs
    layer = 2 * s * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) + 4 * 32 * 128 * s * (s + 1) / 2
    forward = 32 * layer + 2 * s * 4096 * 128256
    assert time["mfu"] == pytest.approx(3 * forward * sequences / (time["step_seconds"] * 16 * 989e12), rel=1e-9)

    model = resolve("llama-3.1-8b", census="off")
    cost = model.evaluate(text)
    assert set(attrs.asdict(cost.time)) == TIME_KEYS | {"provenance"}
    batch = model.evaluate_many([Strategy.parse(text), Strategy.parse("seq=4096,tp=3")])  # tp 3: invalid
    assert set(batch.time) == TIME_KEYS | {"provenance"}
    for key in TIME_KEYS:
        assert getattr(cost.time, key) == pytest.approx(time[key], rel=1e-12)
        assert batch.time[key][0] == pytest.approx(time[key], rel=1e-12)
        assert not batch.valid[1] and np.isnan(batch.time[key][1])


def test_unpriced_time_is_said_not_zeroed(capsys, monkeypatch):
    """A kind no FLOPs source covers (DeepSeek-V4's compressed attention without a census, were its family to
    state no analytic work for it): no "time" key, the reason in the provenance and in the text."""
    from ndcost.cli import main
    from ndcost.models import family_for

    monkeypatch.delattr(type(family_for("deepseek_v4")), "analytic_attention")
    monkeypatch.setattr(type(family_for("deepseek_v4")), "formulas_unpriced", "")  # its memory priced regardless

    args = ["estimate", "deepseek-v4-flash", "--strategy", "seq=1024,dp=8,ep=8", "--census", "off"]
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "time" not in data and "no analytic FLOPs" in data["provenance"]["time"]["unpriced"]
    assert main(args) == 0
    assert "step time: unpriced (" in capsys.readouterr().out


# ---------------------------------------------------------------------------
# placement: TP innermost, then CP, then DP, then PP
# ---------------------------------------------------------------------------
def _crosses(strategy, measure):
    """How much slower *measure* is on 8-device nodes than on one node holding every device: 1 within, and
    across several times slower (one NIC a node, shared by its groups: a group gets its members'
    share of it at a tenth of NVLink; NCCL's latencies dilute the ratio of small messages)."""
    work = analytic.model_work(toy_spec(), 1024)
    nodes = ct.step_time(work, [Strategy.parse(strategy)], toy_hardware(per_node=8, nics=1))
    one = ct.step_time(work, [Strategy.parse(strategy)], toy_hardware(per_node=1 << 20))
    return measure(nodes) / measure(one)


def comm(r):
    return r.communication_seconds[0]


def grad(r):
    return r.detail["grad_sync_seconds"][0]


def send(r):
    return r.detail["pp_send_seconds"][0]


def not_grad(r):
    return r.communication_seconds[0] - r.detail["grad_sync_seconds"][0]


def test_placement_tp_innermost():
    assert _crosses("seq=1024,tp=8", comm) == pytest.approx(1.0)
    assert _crosses("seq=1024,tp=16", comm) > 3


def test_placement_cp_next_to_tp():
    # CP 4 at stride TP 2 spans 8 ranks: one node; at stride TP 4 it spans 16: its ring crosses
    assert _crosses("seq=1024,tp=2,cp=4", comm) == pytest.approx(1.0)
    assert _crosses("seq=1024,tp=4,cp=4", not_grad) > 1.5
    # CP inside DP: CP 8 (stride 1) stays in the node while the gradient reduction over dp x cp = 16 crosses
    assert _crosses("seq=1024,cp=8,dp=2", not_grad) == pytest.approx(1.0)
    assert _crosses("seq=1024,cp=8,dp=2", grad) > 3


def test_placement_dp_then_pp_outermost():
    # TP 2 x CP 2 x DP 2 fill a node: the gradient reduction stays inside, PP's sends cross
    assert _crosses("seq=1024,tp=2,cp=2,dp=2,pp=2,num_micro_batches=4", grad) == pytest.approx(1.0)
    assert _crosses("seq=1024,tp=2,cp=2,dp=2,pp=2,num_micro_batches=4", send) > 3
    # DP 4 x PP 2 in one node: PP (stride 4) stays inside
    assert _crosses("seq=1024,dp=4,pp=2,num_micro_batches=4", send) == pytest.approx(1.0)
    assert _crosses("seq=1024,tp=4,dp=4", grad) > 3


# ---------------------------------------------------------------------------
# volumes by hand
# ---------------------------------------------------------------------------
def test_ulysses_volume():
    """CP 2 Ulysses: Q, K, V in and the output back (forward), their gradients the other way (backward): a rank
    holds 512 tokens of q (8 x 128) twice and K, V (2 x 8 x 128), bf16, and sends half of it a pass."""
    spec = toy_spec(layers=1)
    r = ct.step_time(analytic.model_work(spec, 1024), [Strategy.parse("seq=1024,cp=2,cp_algo=ulysses")],
                     toy_hardware(peak=1e12))  # slow compute: the gradient reduction hides behind the backward
    message = 512 * 2 * (2 * 1024 + 2 * 1024)
    a2a = (1 / 2) * message / WITHIN + BASE + STEP                       # one round of pairs
    grads = 2 * (1 / 2) * toy_parameters(spec) * 2 / WITHIN + BASE + 2 * STEP  # the CP pair's gradient all-reduce
    assert r.communication_seconds[0] == pytest.approx(2 * a2a + grads, rel=1e-12)
    # none of it overlapped
    assert r.exposed_communication_seconds[0] == pytest.approx(2 * a2a, rel=1e-12)


def test_step_by_hand_under_ulysses():
    """A whole step by hand: one layer under CP 2 Ulysses, every efficiency 1, memory infinitely fast (so the
    embedding, the norms, the loss and the optimizer cost nothing), no pipeline (no bubble).

    A rank's matmuls take its 512 tokens (2 FLOPs a multiply-add; q, k, v, o, gate, up, down, the head); its
    attention scores take all 1024 tokens for half the heads (QK^T and PV, causal pairs s (s + 1) / 2); the
    backward is twice the forward. The all-to-alls (Q, K, V in and the output back, their gradients the other
    way) are exposed; the gradient all-reduce hides behind the slow backward (``test_ulysses_volume``)."""
    spec = toy_spec(layers=1)
    s, h, inter, heads, d, vocab, peak = 1024, 1024, 4096, 8, 128, 1000, 1e12
    tokens = s // 2
    layer = 2 * tokens * (4 * h * h + 3 * h * inter) + 4 * (heads // 2) * d * s * (s + 1) / 2
    head = 2 * tokens * h * vocab
    compute = 3 * (layer + head) / peak
    all_to_alls = 2 * ((1 / 2) * (tokens * 2 * (2 * h + 2 * h)) / WITHIN + BASE + STEP)
    r = ct.step_time(analytic.model_work(spec, s), [Strategy.parse("seq=1024,cp=2,cp_algo=ulysses")],
                     toy_hardware(peak=peak, hbm=1e30))
    assert r.step_seconds[0] == pytest.approx(compute + all_to_alls, rel=1e-12)
    # MFU: the model's FLOPs (twice one rank's: the pair splits the work evenly) over two devices' peak
    assert r.mfu[0] == pytest.approx(3 * 2 * (layer + head) / (r.step_seconds[0] * 2 * peak), rel=1e-12)


def test_fsdp_and_zero1_volumes():
    """FSDP 2: each micro-batch gathers the parameters for the forward and again for the backward and
    reduce-scatters the gradients (bf16, half of each sent), a layer at a time: the root's (embedding, head,
    norm) and 2 layers' gathers forward, 2 layers' backward, 2 layers' and the root's scatters, each a 1-step
    Simple ring; ZeRO-1 over DP 2: a reduce-scatter of the gradients and an all-gather of the updated
    parameters a step, the all-reduce's volume."""
    spec = toy_spec()
    work = analytic.model_work(spec, 512)
    P = toy_parameters(spec)
    one = (1 / 2) * P * 2 / WITHIN
    r = ct.step_time(work, [Strategy.parse("seq=512,fsdp=2,num_micro_batches=3"),
                            Strategy.parse("seq=512,dp=2,zero=1,num_micro_batches=3")], toy_hardware())
    h, vocab = spec.hidden_size, spec.vocab_size
    root = (1 / 2) * (2 * vocab * h + h) * 2 / WITHIN                    # the root stays gathered for the backward
    assert r.communication_seconds[0] == pytest.approx(3 * (3 * one - root + 8 * (BASE + STEP)), rel=1e-12)
    assert r.communication_seconds[1] == pytest.approx(2 * one + 2 * (BASE + STEP), rel=1e-12)


# ---------------------------------------------------------------------------
# optimizer and recompute by hand
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("text, bytes_per_parameter, shard", [
    # parameters read and written, gradients read, (master weights read and written,) each state read and written
    ("seq=512", 2 * 2 + 2 + 2 * 2 * 2, 1),
    ("seq=512,master_dtype=fp32,optimizer_dtype=fp32", 2 * 2 + 2 + 2 * 4 + 2 * 2 * 4, 1),
    ("seq=512,dp=4,zero=1,master_dtype=fp32,optimizer_dtype=fp32", 2 * 2 + 2 + 2 * 4 + 2 * 2 * 4, 4),
    ("seq=512,optimizer=sgd", 2 * 2 + 2, 1),
])
def test_optimizer_seconds_are_the_bytes_it_moves(text, bytes_per_parameter, shard):
    spec = toy_spec()
    r = ct.step_time(analytic.model_work(spec, 512), [Strategy.parse(text)], toy_hardware(hbm=2e12, memory=0.5))
    expected = toy_parameters(spec) / shard * bytes_per_parameter / (2e12 * 0.5)
    assert r.optimizer_seconds[0] == pytest.approx(expected, rel=1e-12)


def test_compute_is_three_forwards_and_full_recompute_a_fourth():
    """Memory infinitely fast and every efficiency 1: compute is FLOPs over the peak, the backward twice the
    forward, full recompute one more forward of every layer (not the head's)."""
    spec = toy_spec(layers=3)
    s, h, inter, heads, d, vocab, m = 512, 1024, 4096, 8, 128, 1000, 2
    layer = 2 * s * (4 * h * h + 3 * h * inter) + 4 * heads * d * s * (s + 1) / 2
    head = 2 * s * h * vocab
    peak = 1e15
    r = ct.step_time(analytic.model_work(spec, s),
                     [Strategy.parse(f"seq={s},num_micro_batches={m},recompute={x}") for x in ("none", "full")],
                     toy_hardware(peak=peak, hbm=1e30))
    assert r.compute_seconds[0] == pytest.approx(m * 3 * (3 * layer + head) / peak, rel=1e-9)
    assert r.compute_seconds[1] - r.compute_seconds[0] == pytest.approx(m * 3 * layer / peak, rel=1e-9)


def test_bubble_one_f_one_b_interleaved_dualpipev():
    """Balanced ranks (16 equal layers, a vocabulary of 8, memory infinitely fast so the embedding and loss cost
    nothing): 1F1B idles (p - 1) / m of the busy time; interleaving over v chunks divides it by v, DualPipeV
    by three (DeepSeek's (PP / 2 - 1)(F&B + B - 3W) a chunk with B = 2F, W = F; tests/test_schedule_dualpipev.py
    walks it)."""
    spec = attrs.evolve(toy_spec(layers=16), vocab_size=8)
    work = analytic.model_work(spec, 1024)
    r = ct.step_time(work, [Strategy.parse("seq=1024,pp=4,num_micro_batches=8"),
                            Strategy.parse("seq=1024,pp=4,vpp=2,schedule=interleaved,num_micro_batches=8"),
                            Strategy.parse("seq=1024,pp=4,vpp=2,schedule=dualpipev,num_micro_batches=8")],
                     toy_hardware(hbm=1e30))
    assert r.bubble_seconds[0] / r.compute_seconds[0] == pytest.approx(3 / 8, rel=1e-3)
    assert r.bubble_seconds[1] / r.bubble_seconds[0] == pytest.approx(1 / 2, rel=1e-3)
    assert r.bubble_seconds[2] / r.bubble_seconds[0] == pytest.approx(1 / 3, rel=1e-3)
    np.testing.assert_allclose(r.step_seconds, r.compute_seconds + r.exposed_communication_seconds
                               + r.bubble_seconds + r.optimizer_seconds, rtol=1e-12)


# ---------------------------------------------------------------------------
# an SDPA call handed a mask (LayerKind.sdpa_masked)
# ---------------------------------------------------------------------------
def test_a_masked_sdpa_scores_every_pair_and_launches_what_the_census_counts():
    """Mistral-7B under hf-cuda: MistralModel masks every layer by its 4,096-token window, and from 4,096 tokens on
    (transformers' masking_utils._ignore_causal_mask_sdpa) hands SDPA that mask, so the kernel scores all s^2 pairs
    (QK and PV: 4 x 32 heads x 128 FLOPs a pair), where below the window it runs is_causal over the causal pairs."""
    import ndcost
    from ndcost.work import window_pairs

    model = ndcost.resolve("mistral-7b-v0.1", census="off")
    for seq in (4096, 8192):
        work = model.model_work(seq).work["dense"]
        assert work.score_flops_per_pair * window_pairs(seq, 4096) == pytest.approx(4 * 32 * 128 * seq * seq,
                                                                                     rel=1e-12)
    below = model.model_work(2048).work["dense"]
    assert below.score_flops_per_pair == 4 * 32 * 128
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    # the launches: what the census counts running Transformers' layer at 4,096 tokens
    census = ndcost.resolve("mistral-7b-v0.1", census="on")
    census.record_tables(4096)
    counted = sum(census.resolved.kind_records[4096][0]["dense"].traffic["launches"].values())
    assert model.model_work(4096).work["dense"].launches_per_layer == counted


_TINY_LLAMA = {"model_type": "llama", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 1,
               "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}
_TINY_GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "num_local_experts": 8,
                 "num_experts_per_tok": 2, "vocab_size": 256, "sliding_window": 64,
                 "layer_types": ["sliding_attention", "full_attention"]}
# routers renormalizing their top-k, as Qwen3-30B-A3B's and Mixtral's do
_TINY_QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 128, "intermediate_size": 256,
                   "moe_intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2,
                   "vocab_size": 256, "norm_topk_prob": True}
_TINY_MIXTRAL = {"model_type": "mixtral", "hidden_size": 128, "intermediate_size": 64, "num_hidden_layers": 1,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "num_local_experts": 8, "num_experts_per_tok": 2,
                 "vocab_size": 256, "sliding_window": None}
_TINY_QWEN3_5 = {"model_type": "qwen3_5_text", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 256,
                 "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
                 "linear_value_head_dim": 32, "layer_types": ["linear_attention", "full_attention"]}
_TINY_QWEN3_5_MOE = dict(_TINY_QWEN3_5, model_type="qwen3_5_moe_text", moe_intermediate_size=64,
                         shared_expert_intermediate_size=64, num_experts=8, num_experts_per_tok=2)


@pytest.mark.parametrize("config,runtime,kind", [
    (_TINY_LLAMA, "hf-cuda-eager", "dense"), (dict(_TINY_LLAMA, num_key_value_heads=4), "hf-cuda-eager", "dense"),
    (_TINY_GPT_OSS, "hf-cuda", "full_attention"), (_TINY_QWEN3_MOE, "hf-cuda", "moe"),
    (_TINY_MIXTRAL, "hf-cuda", "moe"), (_TINY_QWEN3_5, "hf-cuda", "linear_attention"),
    (_TINY_QWEN3_5_MOE, "hf-cuda", "linear_attention")])
def test_a_layers_analytic_launches_are_what_transformers_launches(config, runtime, kind):
    """The kernels one layer's forward launches, counted without a census (the analytic estimator's counts, a
    family's kernel_launches, the runtime's attention as the resolver takes it) and by the census running
    Transformers' layer: eager attention with and without repeat_kv's copies; GPT-OSS's sinks, rotary, router and
    clamped experts; a softmax router and the grouped_mm dispatch; a gated delta net's reference rule, its norms
    (Qwen3NextRMSNorm) and a gated shared expert."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import ndcost
    analytic = ndcost.resolve(config, runtime=runtime, census="off").model_work(256).work[kind]
    measured = ndcost.resolve(config, runtime=runtime, census="on").model_work(256).work[kind]
    assert analytic.launches_per_layer == measured.launches_per_layer
