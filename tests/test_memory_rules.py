"""The memory composition's rules one at a time, each against numbers derived here by hand:
ZeRO stages over dp, ZeRO-3's and EP's buffers, the allocator's overhead, MTP layers only where the
runtime builds them. The tiny models and their hand-counted parameters are test_memory's."""
from __future__ import annotations

import math

import pytest

from ndcost.layer import LayerKind
from ndcost.records import KindRecord
from ndcost.values import LayerGroup, ModelSpec, Strategy

from test_memory import (ATTN, EMB, FFN, FINAL, HEAD, L, LAYER, NORMS, OUT_SAVED, OUT_SAVED_TP, OUT_WORK,
                         OUT_WORK_TP, ROUTED, ROUTER, TOPK, H, cost_model,
                         llama_counts, llama_spec, moe_counts, moe_spec, records)

S = 2048
P = L * LAYER + EMB + HEAD + FINAL  # the tiny Llama's parameters


def _stage(cm, text):
    cost = cm.evaluate(Strategy.parse(text))
    return cost, cost.stages[0].bytes_by_category


@pytest.fixture(scope="module")
def llama():
    return cost_model(llama_spec(), llama_counts(), S)


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
def test_zero_stages_shard_states_then_gradients_then_parameters(llama, zero):
    dp = 4
    # two micro-batches: the second backward finds every gradient made, so each category is whole at any moment
    cost, stage = _stage(llama, f"dp={dp},zero={zero},num_micro_batches=2,seq={S},master_dtype=fp32")
    share = math.ceil(P / dp)
    assert stage["optimizer_states"] == 2 * 2 * (share if zero >= 1 else P)  # AdamW's two bf16 moments
    assert stage["master"] == 4 * (share if zero >= 1 else P)                # the fp32 master copy
    assert stage["gradients"] == 2 * (share if zero >= 2 else P)
    assert stage["parameters"] == 2 * (share if zero >= 3 else P)
    # ZeRO-3 gathers one module at a time with its gradient: here the root (embedding, head, final norm),
    # larger than a layer; ZeRO-2 gathers nothing; ZeRO 0-1 all-reduce whole gradients through PyTorch DDP's
    # buckets (ddp_engine's default), every bf16 gradient again
    assert stage["communication"] == ((EMB + HEAD + FINAL) * (2 + 2) if zero == 3 else 2 * P if zero < 2 else 0)


def test_allocator_overhead_is_a_share_of_the_rest(llama):
    plain, _ = _stage(llama, f"seq={S}")
    cost, stage = _stage(llama, f"seq={S},allocator_overhead=0.1")
    rest = sum(v for k, v in stage.items() if k != "allocator")
    assert rest == plain.peak_bytes                       # the same moment, the same categories
    assert stage["allocator"] == math.ceil(0.1 * rest)
    assert cost.peak_bytes == rest + math.ceil(0.1 * rest)


@pytest.mark.parametrize("imbalance", [1.0, 1.5])
def test_expert_parallel_dispatch_and_combine_buffers(imbalance):
    cm = cost_model(moe_spec(), moe_counts(), S, kind="moe")
    # the first of two stages peaks in a layer's backward (the head, on the other, peaks alone)
    cost, stage = _stage(cm, f"pp=2,ep=2,dp=2,seq={S},moe_imbalance={imbalance}")
    assert cost.stages[0].provenance["moment"] == "last layer backward"
    # each token's hidden state to its top-k experts and back, bf16, scaled by the most loaded rank's share;
    # beside them DDP's buckets (dp=2, ddp_engine's default): the stage's bf16 gradients, as its parameters
    assert stage["communication"] == math.ceil(2 * S * TOPK * H * 2 * imbalance) + stage["parameters"]
    # the routed experts split by ep, never by tp
    assert stage["parameters"] == 2 * (L // 2 * (ATTN + NORMS + ROUTER + ROUTED // 2) + EMB)


@pytest.mark.parametrize("schedule", ["interleaved", "interleaved-a2a-overlap"])
def test_the_output_backward_holds_no_expert_buffers(schedule):
    # at the loss's backward no layer runs, so no dispatch or combine buffer is live; under the EP overlap the
    # other micro-batch runs its embedding beside it (Megatron-LM's combined 1F1B, phase 0), not a layer
    cm = cost_model(moe_spec(), moe_counts(), S, kind="moe")
    cost = cm.evaluate(Strategy.parse(f"pp=2,vpp=2,schedule={schedule},ep=2,dp=2,seq={S},num_micro_batches=4"))
    last = cost.stages[-1]
    assert last.provenance["moment"] == "output backward"
    assert last.bytes_by_category["communication"] == last.bytes_by_category["parameters"]  # DDP's buckets alone
    # on the other rank, in a layer's backward, the buffers are (test_expert_parallel_dispatch_and_combine_buffers)
    first = cost.stages[0].bytes_by_category
    assert first["communication"] == 2 * S * TOPK * H * 2 + first["parameters"]


MTP_LAYER = ATTN + FFN + NORMS + 2 * H * H + 2 * H  # a layer, the projection of [h; embedding] and two norms


def _mtp_model(builds):
    from ndcost.models import ParameterCount
    from ndcost.resolver import CostModel
    spec = ModelSpec(name="tiny-mtp", model_type="llama", family="llama", hidden_size=H, vocab_size=32000,
                     layers=(LayerGroup(kind="dense", count=L), LayerGroup(kind="dense_mtp", count=1, mtp=True)),
                     num_attention_heads=16, num_key_value_heads=4, head_dim=64, intermediate_size=2816,
                     kind_specs={"dense": LayerKind(attention="gqa", mlp="dense"),
                                 "dense_mtp": LayerKind(attention="gqa", mlp="dense", mtp=True)})
    counts = ParameterCount(
        by_kind={"dense": {"attention": ATTN, "ffn": FFN, "norm": NORMS},
                 "dense_mtp": {"attention": ATTN, "ffn": FFN, "norm": NORMS + 2 * H, "mtp": 2 * H * H}},
        layer_counts={"dense": L, "dense_mtp": 1}, embedding=EMB, head=HEAD, final_norm=FINAL, mtp=MTP_LAYER,
        buffers=0, total=P + MTP_LAYER,
        by_part={"attention": (L + 1) * ATTN, "ffn": (L + 1) * FFN, "norm": (L + 1) * NORMS + 2 * H + FINAL,
                 "mtp": 2 * H * H, "embedding": EMB, "head": HEAD})
    kinds, out = records(S)
    mtp_record = KindRecord(**{**{f: getattr(kinds["dense"], f) for f in ("saved_per_token", "saved_tp_per_token",
                                                                         "working_per_token", "working_tp_per_token")},
                               "kind": "dense_mtp", "seq": S, "source": "test"})
    return CostModel.from_records(spec, counts, {S: ({**kinds, "dense_mtp": mtp_record}, out)}, builds_mtp=builds)


@pytest.mark.parametrize("builds", [False, True])
def test_mtp_layers_only_where_the_runtime_builds_them(builds):
    cost = _mtp_model(builds).evaluate(Strategy.parse(f"pp=2,seq={S}"))
    first, last = cost.stages
    extra = MTP_LAYER if builds else 0
    assert [first.layers, last.layers] == [L // 2, L // 2 + (1 if builds else 0)]  # with the head, on the last
    assert first.bytes_by_category["parameters"] == 2 * (L // 2 * LAYER + EMB)
    assert last.bytes_by_category["parameters"] == 2 * (L // 2 * LAYER + extra + HEAD + FINAL)


def test_gpipe_last_stage_peaks_at_the_second_loss_backward(llama):
    # GPipe over 2 stages, 4 micro-batches: the last stage holds every micro-batch before its first backward, so
    # its first loss backward finds no gradient; the second finds every gradient of the stage made (fp32, whole)
    # and one micro-batch's activations (full recompute: each layer's bf16 input) and loss fewer, which here
    # free less than the gradients hold
    m = 4
    cost = llama.evaluate(Strategy.parse(f"pp=2,schedule=gpipe,num_micro_batches={m},seq={S},recompute=full,"
                                         f"grad_dtype=fp32"))
    stage_params = L // 2 * LAYER + HEAD + FINAL       # the last stage: 4 layers, the final norm and the head
    params, states, grads = 2 * stage_params, 2 * 2 * stage_params, 4 * stage_params
    acts = L // 2 * S * H * 2                          # one micro-batch: each layer's input
    keep, out_peak = S * (OUT_SAVED + OUT_SAVED_TP), S * (OUT_WORK + OUT_WORK_TP)
    first = params + states + m * acts + (m - 1) * keep + max(out_peak, keep)
    second = params + states + grads + (m - 1) * acts + (m - 2) * keep + max(out_peak, keep)
    assert second > first
    last = cost.stages[1]
    assert last.provenance["moment"] == "output backward"
    assert last.peak_bytes == second
    assert (last.bytes_by_category["gradients"], last.bytes_by_category["activations"]) == (grads, (m - 1) * acts)


def test_zero2_holds_a_gradient_whole_until_its_reduce_scatter():
    # Mistral-7B: an untied 32,000 x 4,096 head, 218,112,000 elements a layer; bf16 gradients over 8 ranks. Its
    # first layer's backward holds the head's whole gradient (reduced with the root's, at the end, as FSDP's) and
    # the largest of a layer's and the embedding's whole gradients beside the shards
    import ndcost

    model = ndcost.resolve("mistral-7b-v0.1", census="off")
    base = "dp=8,zero=2,seq=4096,recompute=full,param_dtype=bf16,master_dtype=fp32,optimizer_dtype=fp32"
    cost = model.evaluate(base)
    stage = cost.stages[0]
    assert stage.provenance["moment"] == "end of backward"
    assert stage.bytes_by_category["communication"] == 2 * 32000 * 4096 + 2 * 218_112_000
    # the shards alone, every one but the embedding's (made last): 7,241,732,096 elements, 131,072,000 of them its
    assert stage.bytes_by_category["gradients"] == 2 * (math.ceil(7_241_732_096 / 8) - 131_072_000 // 8)
    # DeepSpeed's contiguous bucket holds them instead (its own buffer; tests/test_deepspeed_zero.py), here one of
    # 2e9 elements twice (overlap_comm), so that the backward's end outweighs its step's fp32 copy of the gradients
    held = model.evaluate(f"{base},ddp_engine=deepspeed,reduce_bucket_elements=2000000000,reduce_buckets=2")
    assert held.stages[0].provenance["moment"] == "end of backward"
    assert held.stages[0].bytes_by_category["communication"] == 8 * 10 ** 9
    assert held.peak_bytes - cost.peak_bytes == 8 * 10 ** 9 - (2 * 32000 * 4096 + 2 * 218_112_000)
