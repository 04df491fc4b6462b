"""Golden cases (a)-(d) of the resolver's memory composition, and the schedules' in-flight counts.

Every expected number is derived here by hand from the model's shapes and the
per-token records the test states (parameters counted tensor by tensor, a
training step's timeline walked moment by moment), never read back from the
code under test. The cost models are built from hand-made records
(``CostModel.from_records``), so the composition is checked on its own.
"""
from __future__ import annotations

import math

import pytest

from ndcost.layer import LayerKind
from ndcost.records import KindRecord
from ndcost.values import LayerGroup, ModelSpec, Strategy

GIB = 2 ** 30


# ---------------------------------------------------------------------------
# a small Llama-shaped model, its parameters counted by hand
# ---------------------------------------------------------------------------
H, A, KV, DH, I, V, L = 1024, 16, 4, 64, 2816, 32000, 8


def llama_spec(layers=L, tied=False):
    return ModelSpec(name="tiny-llama", model_type="llama", family="llama", hidden_size=H, vocab_size=V,
                     layers=(LayerGroup(kind="dense", count=layers),), num_attention_heads=A,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")},
                     num_key_value_heads=KV, head_dim=DH, intermediate_size=I, tie_word_embeddings=tied)


ATTN = H * A * DH + 2 * H * KV * DH + A * DH * H      # q, k, v, o (no biases)
FFN = 3 * H * I                                       # gate, up, down
NORMS = 2 * H                                         # input and post-attention RMSNorm weights
LAYER = ATTN + FFN + NORMS
EMB = V * H
HEAD = V * H
FINAL = H


def llama_counts(layers=L, tied=False):
    from ndcost.models import ParameterCount
    head = 0 if tied else HEAD
    total = layers * LAYER + EMB + head + FINAL
    return ParameterCount(by_kind={"dense": {"attention": ATTN, "ffn": FFN, "norm": NORMS}},
                          layer_counts={"dense": layers}, embedding=EMB, head=head, final_norm=FINAL, mtp=0,
                          buffers=0, total=total,
                          by_part={"attention": layers * ATTN, "ffn": layers * FFN, "norm": layers * NORMS + FINAL,
                                   "embedding": EMB, "head": head})


# Per-token records (TP 1) the tests state: what a layer keeps (not split / split by TP), its backward's
# peak, and the output layer's (final norm, head, fp32 loss).
SAVED, SAVED_TP, WORK, WORK_TP = 12_288.0, 40_960.0, 10_240.0, 61_440.0
OUT_SAVED, OUT_SAVED_TP, OUT_WORK, OUT_WORK_TP = 4_096.0, 4.0 * V, 4_096.0, 12.0 * V


def records(seq, kind="dense", **over):
    layer = dict(kind=kind, seq=seq, source="test", saved_per_token=SAVED, saved_tp_per_token=SAVED_TP,
                 working_per_token=WORK, working_tp_per_token=WORK_TP, selective_per_token=4_096.0,
                 selective_tp_per_token=8_192.0)
    layer.update(over)
    out = KindRecord(kind="output", seq=seq, source="test", saved_per_token=OUT_SAVED,
                     saved_tp_per_token=OUT_SAVED_TP, working_per_token=OUT_WORK, working_tp_per_token=OUT_WORK_TP)
    return {kind: KindRecord(**layer)}, out


def cost_model(spec, counts, seq, **rec):
    from ndcost.resolver import CostModel
    return CostModel.from_records(spec, counts, {seq: records(seq, **rec)})


@pytest.mark.slow
def test_hand_parameter_count_equals_transformers_llama_on_meta():
    """The hand counts above against Transformers' LlamaForCausalLM of the same shapes built on the meta device."""
    pytest.importorskip("transformers")
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=H, num_attention_heads=A, num_key_value_heads=KV, head_dim=DH,
                         intermediate_size=I, vocab_size=V, num_hidden_layers=L, tie_word_embeddings=False)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    layer = model.model.layers[0]
    assert sum(p.numel() for p in layer.self_attn.parameters()) == ATTN
    assert sum(p.numel() for p in layer.mlp.parameters()) == FFN
    assert sum(p.numel() for p in layer.parameters()) == LAYER
    assert model.model.embed_tokens.weight.numel() == EMB
    assert model.lm_head.weight.numel() == HEAD
    assert model.model.norm.weight.numel() == FINAL
    assert sum(p.numel() for p in model.parameters()) == llama_counts().total


# ---------------------------------------------------------------------------
# (a) one GPU, bf16 everything, AdamW with bf16 states, Transformers' model and loss
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_setup_a_single_gpu(recompute):
    s = 2048
    cm = cost_model(llama_spec(), llama_counts(), s)
    cost = cm.evaluate(Strategy.parse(f"seq={s},recompute={recompute}"))
    P = L * LAYER + EMB + HEAD + FINAL
    params, states = 2 * P, 2 * 2 * P                     # bf16 weights, AdamW's two bf16 moments
    if recompute == "none":
        kept_layer = s * (SAVED + SAVED_TP)
    else:
        kept_layer = s * H * 2                            # a checkpointed layer keeps its bf16 input
    activations = L * kept_layer
    layer_peak = s * (WORK + WORK_TP)                     # one layer's backward, its own saves included
    out_peak = s * (OUT_WORK + OUT_WORK_TP)               # the loss's backward (fp32 logits)
    head_grad = 2 * HEAD
    # the step's moments: the loss's backward (every layer's activations held, no gradient yet: the head's
    # weight gradient is made after the loss's peak); the last layer's backward (the head's gradient made);
    # the first layer's (every gradient but the embedding's, made after it; the others' activations
    # freed); the optimizer step (every gradient; fused AdamW keeps no temporaries)
    moments = {
        "output backward": params + states + activations + out_peak,
        "last layer backward": params + states + activations + (layer_peak - kept_layer) + head_grad,
        "end of backward": params + states + 2 * (P - EMB) + layer_peak,
        "optimizer step": params + states + 2 * P,
    }
    moment = max(moments, key=moments.get)
    assert cost.peak_bytes == moments[moment]
    (stage,) = cost.stages
    assert stage.provenance["moment"] == moment
    assert stage.bytes_by_category["parameters"] == params
    assert stage.bytes_by_category["optimizer_states"] == states
    assert stage.bytes_by_category["master"] == 0
    if recompute == "none":
        assert moment == "output backward"
        assert stage.bytes_by_category["activations"] == activations
        assert stage.bytes_by_category["output"] == out_peak
        assert stage.bytes_by_category["gradients"] == 0
    else:  # a checkpointed stack keeps little: the loss's fp32 logits are this small model's peak
        assert moment == "output backward"
        assert stage.bytes_by_category["activations"] == activations


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_working_leaves_out_the_input_and_the_gradients_not_yet_made(recompute):
    """The census's convention: the working figure leaves out the layer's input (no op saves it) and is
    taken where activations and gradients together peak, a quarter of the layer's gradients made by then.

    A full-recompute layer's backward holds its checkpointed input besides the working figure; the first
    and last layers' backwards hold the quarter of their own gradients made, not all; the embedding's
    backward comes last, with every other gradient and the first layer's gradient arriving (no CUDA
    kernel named by a runtime profile here: no sort scratch).
    """
    s, work = 2048, 1_000_000.0
    cm = cost_model(llama_spec(), llama_counts(), s, working_per_token=work, working_input_per_token=2.0 * H,
                    working_grad_share=0.25)
    cost = cm.evaluate(Strategy.parse(f"seq={s},recompute={recompute}"))
    P = L * LAYER + EMB + HEAD + FINAL
    base = 2 * P + 2 * 2 * P                              # bf16 weights, AdamW's two bf16 moments
    layer_input = s * H * 2                               # bf16, kept by the checkpoint under full recompute
    kept_layer = s * (SAVED + SAVED_TP) if recompute == "none" else layer_input
    held = layer_input if recompute == "full" else 0      # what the backward holds besides the working figure
    peak = s * (work + WORK_TP) + held
    out_peak = s * (OUT_WORK + OUT_WORK_TP)
    made = 2 * LAYER // 4                                 # a quarter of one layer's bf16 gradients
    moments = {
        "output backward": base + L * kept_layer + out_peak,
        "last layer backward": base + L * kept_layer + (peak - kept_layer) + 2 * HEAD + made,
        "end of backward": base + 2 * (P - EMB) - (2 * LAYER - made) + peak,
        "embedding backward": base + 2 * P + s * H * 2,
        "optimizer step": base + 2 * P,
    }
    moment = max(moments, key=moments.get)
    # every layer's activations held, or one layer's backward with nearly every gradient
    assert moment == {"none": "last layer backward", "full": "end of backward"}[recompute]
    (stage,) = cost.stages
    assert stage.provenance["moment"] == moment
    assert cost.peak_bytes == moments[moment]
    assert stage.bytes_by_category["gradients"] == {"none": 2 * HEAD + made,
                                                    "full": 2 * (P - EMB) - (2 * LAYER - made)}[recompute]
    # several micro-batches: the rank ran a backward before, so it holds every gradient throughout, and
    # the embedding's new gradient besides until it is added in
    again = cm.evaluate(Strategy.parse(f"seq={s},recompute={recompute},num_micro_batches=2"))
    grads = 2 * P
    moments = {
        "output backward": base + grads + L * kept_layer + out_peak,
        "last layer backward": base + grads + L * kept_layer + (peak - kept_layer),
        "end of backward": base + grads + peak,
        "embedding backward": base + grads + s * H * 2 + 2 * EMB,
        "optimizer step": base + grads,
    }
    assert again.stages[0].bytes_by_category["gradients"] == grads
    assert again.peak_bytes == max(moments.values())
    assert again.stages[0].provenance["moment"] == max(moments, key=moments.get)


def test_the_embedding_backward_can_be_the_peak():
    """A layer keeping and working little: the embedding's backward, after every other gradient, peaks."""
    s = 256
    cm = cost_model(llama_spec(), llama_counts(), s, saved_per_token=1.0, saved_tp_per_token=0.0,
                    working_per_token=1.0, working_tp_per_token=0.0, working_input_per_token=2.0 * H,
                    working_grad_share=0.5)
    cost = cm.evaluate(Strategy.parse(f"seq={s},recompute=full"))
    P = L * LAYER + EMB + HEAD + FINAL
    base = 2 * P + 2 * 2 * P
    moments = {
        "output backward": base + L * s * H * 2 + s * (OUT_WORK + OUT_WORK_TP),             # 99 MB over base
        "end of backward": base + 2 * (P - EMB) - LAYER + s * (1 + 0) + s * H * 2,           # 235 MB
        "embedding backward": base + 2 * P + s * H * 2,                                     # 312 MB
        "optimizer step": base + 2 * P,
    }
    assert max(moments, key=moments.get) == "embedding backward"
    (stage,) = cost.stages
    assert stage.provenance["moment"] == "embedding backward"
    assert cost.peak_bytes == moments["embedding backward"]
    assert stage.bytes_by_category["working"] == s * H * 2
    assert stage.bytes_by_category["gradients"] == 2 * P


# ---------------------------------------------------------------------------
# (b) fp32 weights under bf16 autocast
# ---------------------------------------------------------------------------
def test_setup_b_fp32_under_autocast():
    s = 2048
    cm = cost_model(llama_spec(), llama_counts(), s)
    cost = cm.evaluate(Strategy.parse(f"seq={s},param_dtype=fp32,compute_dtype=bf16,recompute=full"))
    P = L * LAYER + EMB + HEAD + FINAL
    matmul_weights = L * (ATTN + FFN) + HEAD              # what autocast casts to bf16 and keeps for the backward
    params = 4 * P + 2 * matmul_weights
    states = 2 * 4 * P                                    # fp32 moments
    grads = 4 * P
    kept_layer = s * H * 4                                # the residual stream stays fp32 under autocast
    layer_peak = s * (WORK + WORK_TP)
    moments = [params + states + L * kept_layer + s * (OUT_WORK + OUT_WORK_TP),
               params + states + L * kept_layer + (layer_peak - kept_layer) + 4 * HEAD,
               params + states + grads - 4 * EMB + layer_peak,
               params + states + grads]
    (stage,) = cost.stages
    assert stage.bytes_by_category["parameters"] == params
    assert stage.bytes_by_category["optimizer_states"] == states
    assert cost.peak_bytes == max(moments)


# ---------------------------------------------------------------------------
# (c) torch TP (q/k/v/gate/up column-wise, o/down row-wise, no SP, head replicated) with FSDP2
# ---------------------------------------------------------------------------
def test_setup_c_fsdp_with_tensor_parallel():
    s, N, M = 4096, 4, 2
    cm = cost_model(llama_spec(), llama_counts(), s)
    cost = cm.evaluate(Strategy.parse(f"fsdp={N},tp={M},seq={s}"))
    layer_rank = (ATTN + FFN) // M + NORMS                # a TP rank's layer: matrices halved, norms whole
    root = EMB + HEAD + FINAL                             # the root module's own parameters, replicated over TP
    rank = L * layer_rank + root
    shard = math.ceil(rank / N)                           # fully_shard over the fsdp ranks
    params, grads, states = 2 * shard, 2 * shard, 2 * 2 * shard
    head_shard, emb_shard = 2 * math.ceil(HEAD / N), 2 * math.ceil(EMB / N)
    kept_layer = s * (SAVED + SAVED_TP / M)
    layer_peak = s * (WORK + WORK_TP / M)
    out_keep = s * (OUT_SAVED + OUT_SAVED_TP)             # the loss is replicated: the whole vocabulary a rank
    out_peak = s * (OUT_WORK + OUT_WORK_TP)
    # FSDP2's timeline (bf16 all-gathers and reduce-scatters): the root's parameters are gathered at the
    # forward's start and, the root not resharding after forward, held to the backward's end; each layer
    # is resharded after its forward. The loss's backward: the root gathered, no gradient yet. The last
    # layer's backward: the head's gradient whole (the root reduce-scatters at the backward's end), the
    # last layer and the one before it (prefetched) gathered, the last layer's gradient before its
    # reduce-scatter; no gradient sharded yet. The first layer's backward: every layer's gradient but its
    # own sharded, the head's whole, one layer gathered with its gradient (or, just after, the
    # embedding's whole gradient, which is smaller here). The optimizer step: every sharded gradient.
    comm_loss = 2 * root
    comm_last = 2 * root + 2 * HEAD + layer_rank * (2 * 2 + 2)
    comm_end = 2 * root + 2 * HEAD + max(layer_rank * (2 + 2), 2 * EMB)

    def timeline(kept, peak):
        """The step's four moments, each layer keeping *kept* and peaking at *peak* in its backward."""
        return {"output backward": params + states + L * kept + out_peak + comm_loss,
                "last layer backward": params + states + L * kept + (peak - kept) + comm_last,
                "end of backward": params + states + grads - head_shard - emb_shard + peak + comm_end,
                "optimizer step": params + states + grads}

    moments = timeline(kept_layer, layer_peak)
    moment = max(moments, key=moments.get)
    (stage,) = cost.stages
    assert stage.provenance["moment"] == moment == "output backward"
    assert stage.bytes_by_category["parameters"] == params
    assert stage.bytes_by_category["optimizer_states"] == states
    assert stage.bytes_by_category["gradients"] == 0
    assert stage.bytes_by_category["communication"] == comm_loss
    assert cost.peak_bytes == math.ceil(moments[moment])
    assert out_keep < out_peak
    # a layer whose backward peaks far above the loss's: the layers' moments decide, each with its buffers
    big = cost_model(llama_spec(), llama_counts(), s, working_per_token=400_000.0)
    later = big.evaluate(Strategy.parse(f"fsdp={N},tp={M},seq={s},recompute=full"))
    kept_full = s * H * 2                                 # a checkpointed layer keeps its bf16 input
    full = timeline(kept_full, s * (400_000.0 + WORK_TP / M))
    worst = max(full, key=full.get)
    assert worst != "output backward"
    assert later.stages[0].provenance["moment"] == worst
    assert later.stages[0].bytes_by_category["communication"] == {"last layer backward": comm_last,
                                                                  "end of backward": comm_end}[worst]
    assert later.peak_bytes == math.ceil(full[worst])


# ---------------------------------------------------------------------------
# (d) Megatron: TP + SP + PP + VPP + CP + EP, distributed optimizer, fp32 master, core-attention recompute
# ---------------------------------------------------------------------------
E, TOPK, EW = 8, 2, 2048
MOE_ATTN = ATTN
ROUTER = H * E
ROUTED = E * 3 * H * EW


def moe_spec():
    return ModelSpec(name="tiny-moe", model_type="mixtral", family="mixtral", hidden_size=H, vocab_size=V,
                     layers=(LayerGroup(kind="moe", count=L),), num_attention_heads=A, num_key_value_heads=KV,
                     kind_specs={"moe": LayerKind(attention="gqa", mlp="moe")},
                     head_dim=DH, intermediate_size=EW, num_experts=E, num_experts_per_tok=TOPK,
                     moe_intermediate_size=EW)


def moe_counts():
    from ndcost.models import ParameterCount
    total = L * (MOE_ATTN + NORMS + ROUTER + ROUTED) + EMB + HEAD + FINAL
    return ParameterCount(by_kind={"moe": {"attention": MOE_ATTN, "norm": NORMS, "router": ROUTER,
                                           "routed": ROUTED}},
                          layer_counts={"moe": L}, embedding=EMB, head=HEAD, final_norm=FINAL, mtp=0, buffers=0,
                          total=total, by_part={"attention": L * MOE_ATTN, "norm": L * NORMS + FINAL,
                                                "router": L * ROUTER, "routed": L * ROUTED, "embedding": EMB,
                                                "head": HEAD})


def megatron_interleaved_held(p, v, m, rank):
    """Chunk-micro-batches rank *rank* holds when its first backward starts, by walking Megatron's order.

    Megatron's interleaved schedule runs ``(p - rank - 1) * 2 + (v - 1) * p`` warm-up forwards, then one
    more forward before the first backward; forward k runs model chunk ``(k // p) % v`` (groups of p
    micro-batches per chunk).
    """
    warmup = min((p - rank - 1) * 2 + (v - 1) * p, m * v)
    forwards = min(warmup + 1, m * v)
    held = [0] * v
    for k in range(forwards):
        held[(k // p) % v] += 1
    return held


def test_setup_d_megatron():
    s, t, p, v, m, cp, ep, dp = 4096, 2, 2, 2, 4, 2, 4, 2
    SV, STP, WV, WTP = 8_192.0, 180_000.0, 4_096.0, 200_000.0
    cm = cost_model(moe_spec(), moe_counts(), s, kind="moe", saved_per_token=SV, saved_tp_per_token=STP,
                    working_per_token=WV, working_tp_per_token=WTP)
    strategy = Strategy.parse(
        f"dp={dp},tp={t},sp=true,pp={p},vpp={v},schedule=interleaved,num_micro_batches={m},cp={cp},ep={ep},"
        f"zero=1,param_dtype=bf16,master_dtype=fp32,grad_dtype=fp32,optimizer_dtype=fp32,"
        f"recompute=core_attention,vocab_parallel=true,loss_engine=megatron,ddp_engine=megatron,seq={s}")
    cost = cm.evaluate(strategy)
    assert len(cost.stages) == p
    # placement: 8 layers in p * v = 4 virtual stages of 2; rank r holds virtual stages r and r + p
    per_chunk = L // (p * v)
    layer_dense = MOE_ATTN // t + NORMS + ROUTER          # attention split by TP; norms and router replicated
    layer_routed = ROUTED // ep                           # experts split by EP (etp = 1), not by TP
    zero_group = dp * cp                                  # the distributed optimizer shards over dp x cp
    expert_dp = dp * cp * t // ep                         # ...and the experts over the expert-data-parallel ranks
    T = s // cp                                           # tokens a CP rank holds
    # ring CP (torch's all-gather rotation) keeps the rank's own keys and values; its backward holds the cp
    # gathered blocks and the send concatenation (bf16), the fp32 dK/dV ring's three blocks and the fp32 dQ
    # accumulator (test_memory_ring_kv.py says where in torch's _attention.py), KV heads and query heads over TP
    ring = (cp + 1) * 2 * KV * DH * 2 / t + 3 * 2 * KV * DH * 4 / t + A * DH * 4 / t
    core = 2 * A * s                                      # the attention core: the bf16 softmax output, a token
    kept_token = (SV + STP) / t - core / t                # SP splits everything over TP
    kept_layer = T * kept_token
    layer_peak = T * ((WV + WTP) / t + ring)
    comm = max(T * H * 2,                                 # SP's gathered layer input
               2 * T * TOPK * H * 2 / t)                  # EP's dispatch and combine buffers (the ring's in the peak)
    peaks = []
    for rank in range(p):
        held = megatron_interleaved_held(p, v, m, rank)
        dense = 2 * per_chunk * layer_dense + (EMB // t if rank == 0 else 0) \
            + (HEAD // t + FINAL if rank == p - 1 else 0)
        routed = 2 * per_chunk * layer_routed
        params = 2 * (dense + routed)
        grads = 4 * (dense + routed)                      # fp32 main grads, whole (zero 1)
        sharded = math.ceil(dense / zero_group) + math.ceil(routed / expert_dp)
        master, states = 4 * sharded, 2 * 4 * sharded
        activations = sum(held) * per_chunk * kept_layer
        assert m * v > sum(held)                          # a backward has run: every gradient exists
        base = params + master + states + grads
        moments = [(base + comm + activations + (layer_peak - kept_layer), comm),
                   (base + comm + activations - per_chunk * kept_layer * sum(1 for h in held if h) + layer_peak,
                    comm)]
        if rank == p - 1:
            # Megatron-LM's vocabulary-parallel loss, SP-split input: in place, 6 bytes a logit at its backward's
            # peak where the records' F.cross_entropy holds 12 (megatron/core/tensor_parallel/cross_entropy.py);
            # no layer runs there: SP's gathered input of the head is the one buffer
            out_peak = T * (OUT_WORK + OUT_WORK_TP - 6 * V) / t
            moments.append((base + T * H * 2 + activations + out_peak, T * H * 2))
        stage = cost.stages[rank]
        assert stage.bytes_by_category["parameters"] == params
        assert stage.bytes_by_category["master"] == master
        assert stage.bytes_by_category["optimizer_states"] == states
        assert stage.bytes_by_category["gradients"] == grads
        assert stage.bytes_by_category["communication"] == math.ceil(max(moments)[1])
        assert stage.peak_bytes == math.ceil(max(moments)[0])
        assert stage.layers == 2 * per_chunk
        peaks.append(stage.peak_bytes)
    assert cost.peak_bytes == max(peaks)


# ---------------------------------------------------------------------------
# the schedules
# ---------------------------------------------------------------------------
def test_schedules_in_flight():
    import numpy as np
    from ndcost import manager
    reg = manager.registry()
    one = reg.get("schedule/1f1b")
    for p, m in [(4, 8), (4, 2), (1, 5), (8, 1)]:
        for s in range(p):
            assert int(one.in_flight(np.int64(p), np.int64(1), np.int64(m), np.int64(s), np.int64(0))) == min(p - s, m)
    gpipe = reg.get("schedule/gpipe")
    assert int(gpipe.in_flight(np.int64(4), np.int64(1), np.int64(6), np.int64(3), np.int64(0))) == 6
    inter = reg.get("schedule/interleaved")
    for p, v, m in [(2, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16)]:
        for r in range(p):
            got = [int(inter.in_flight(np.int64(p), np.int64(v), np.int64(m), np.int64(r), np.int64(c)))
                   for c in range(v)]
            assert got == megatron_interleaved_held(p, v, m, r)
        # Megatron's memory factor: rank 0 holds p micro-batches of L/p layers times 1 + (p - 1) / (p v)
        rank0 = sum(megatron_interleaved_held(p, v, m, 0))
        assert rank0 == p * v * (1 + (p - 1) / (p * v))
    dual = reg.get("schedule/dualpipev")
    assert [int(dual.virtual_stage(np.int64(4), np.int64(2), np.int64(1), np.int64(c))) for c in (0, 1)] == [1, 6]


def test_schedules_refuse_what_they_do_not_model():
    from ndcost.errors import InvalidStrategy
    s = 1024
    cm = cost_model(llama_spec(), llama_counts(), s)
    with pytest.raises(InvalidStrategy, match="schedule 1f1b does not model virtual pipeline stages"):
        cm.evaluate(Strategy.parse(f"pp=2,vpp=2,seq={s}"))
    with pytest.raises(InvalidStrategy, match="dualpipev.*vpp=2"):
        cm.evaluate(Strategy.parse(f"pp=2,schedule=dualpipev,seq={s}"))
    # torch's Interleaved1F1B runs max(1, m // p) rounds of equal size (Megatron-LM: m a multiple of p)
    with pytest.raises(InvalidStrategy, match=r"num_micro_batches=9 is not a multiple of its rounds.*pp=4"):
        cm.evaluate(Strategy.parse(f"pp=4,vpp=2,schedule=interleaved,num_micro_batches=9,seq={s}"))
    cost = cm.evaluate(Strategy.parse(f"pp=2,vpp=2,schedule=dualpipev,num_micro_batches=8,seq={s}"))
    # the V: rank 0 holds the first and the last virtual stage, so the embedding and the head
    assert cost.stages[0].bytes_by_category["output"] > 0
    assert cost.stages[1].bytes_by_category["output"] == 0


def test_core_attention_drop_above_what_a_hand_made_record_keeps_is_capped_not_negative():
    """The formulas' attention core (eager: the bf16 softmax output, 2 a s bytes a token, split by TP) beside a
    record keeping less than that split by TP: the whole split share is recomputed, none below zero, and the
    provenance says so. At s = 4096, 2 * 16 * 4096 = 131,072 bytes a token exceed SAVED_TP = 40,960."""
    s = 4096
    assert 2 * A * s > SAVED_TP
    cm = cost_model(llama_spec(), llama_counts(), s)
    cost = cm.evaluate(Strategy.parse(f"recompute=core_attention,seq={s}"))
    stage = cost.stages[0]
    # what is kept: the record's unsplit bytes, every layer, one micro-batch of s tokens
    assert stage.bytes_by_category["activations"] == L * s * SAVED
    assert "exceeds what the record keeps" in cost.provenance["records"][s]["core_attention_capped"]["dense"]
    plain = cm.evaluate(Strategy.parse(f"recompute=none,seq={s}")).stages[0]
    assert plain.bytes_by_category["activations"] == L * s * (SAVED + SAVED_TP)


@pytest.mark.parametrize("recompute", ["none", "full", "selective"])
def test_the_tables_a_model_hands_every_layer_are_held_once_a_stage_and_micro_batch(recompute):
    """The rotary cos and sin (KindRecord.shared_saved_per_token): every layer of a stage saves the same two
    storages, so a stage holds them once for each micro-batch in flight, whatever the recompute (a checkpoint
    keeps them as its input), from one row of position ids (a micro-batch of two sequences shares them)."""
    s, rotary = 2048, 2 * DH * 2.0                        # cos and sin, bf16, one row a position
    cm = cost_model(llama_spec(), llama_counts(), s, shared_saved_per_token={"position_embeddings": rotary})
    kept_layer = {"none": s * (SAVED + SAVED_TP), "full": s * H * 2, "selective": s * (4_096.0 + 8_192.0)}[recompute]
    for micro_batch in (1, 2):
        cost = cm.evaluate(Strategy.parse(f"seq={s},recompute={recompute},micro_batch={micro_batch}"))
        (stage,) = cost.stages
        assert stage.provenance["moment"] == "output backward"
        assert stage.bytes_by_category["activations"] == L * micro_batch * kept_layer + s * rotary
    # two stages of a 1F1B pipeline over 4 micro-batches: the first holds 2 in flight, the second 1
    cost = cm.evaluate(Strategy.parse(f"seq={s},recompute={recompute},pp=2,num_micro_batches=4"))
    first, second = cost.stages
    assert first.provenance["moment"] == "last layer backward"
    assert first.bytes_by_category["activations"] == 2 * (L // 2 * kept_layer + s * rotary)
    assert second.bytes_by_category["activations"] == L // 2 * kept_layer + s * rotary
    # and a record without them holds none of it
    plain = cost_model(llama_spec(), llama_counts(), s).evaluate(Strategy.parse(f"seq={s},recompute={recompute}"))
    assert plain.stages[0].bytes_by_category["activations"] == L * kept_layer
