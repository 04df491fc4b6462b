"""An op-level checkpoint policy (torchtitan's) priced by the op records' formulas, without a census.

The figures by hand follow torchtitan's policy (``checkpoint_policy/torchtitan``): a checkpointed layer keeps its
input and the outputs of mm (every second one recomputed, one counter a forward) and of the SDPA kernels;
Transformers' Llama layer runs q, k, v, o, gate, up, down in that order, so it keeps q (mm 1), v (mm 3), SDPA's
output and fp32 log-sum-exp (and its 16-byte philox seed and offset), gate (mm 5) and down (mm 7). The census
runs the same policy through ``torch.utils.checkpoint`` on Transformers' modules: it is the other reference.
"""
from __future__ import annotations

import pytest

import ndcost
from ndcost import manager
from ndcost.errors import InvalidStrategy, Unpriced
from ndcost.models import load_model
from ndcost.plugins import op_records

SEQ = 4096


def _formulas(model, runtime):
    spec = load_model(model)
    estimator = manager.registry().get("estimator/activations/op_records")
    return spec, estimator, estimator.records(spec, list(spec.kinds), SEQ, runtime)[0]


def test_the_decider_alternates_one_counter_and_saves_the_named_ops():
    policy = manager.registry().get("checkpoint_policy/torchtitan")
    save = policy.decider()
    calls = ["aten.mm.default", "aten.mm", "aten.addmm", "aten._scaled_dot_product_cudnn_attention.default",
             "aten.mm", "aten.bmm", "aten.mm", "aten.max.default"]
    assert [save(c) for c in calls] == [True, False, False, True, True, False, False, True]
    assert policy.decider()("aten.mm")  # a fresh decider counts from its own start


@pytest.mark.parametrize("runtime", ["hf-cuda", "torchtitan-cuda"])
def test_llama_under_torchtitans_policy_by_hand(runtime):
    """Llama-3.1-8B (h 4096, 32 heads and 8 KV heads of 128, feed-forward 14336), bytes a token at TP 1:
    not split by TP, the input and down's output, 2 * 4096 each, and the philox state, 16 bytes a layer; split,
    q 2 * 32 * 128, v 2 * 8 * 128, SDPA's output 2 * 32 * 128 and log-sum-exp 4 * 32, gate 2 * 14336. The K/V
    copies torchtitan's runtime makes before SDPA are recomputed, so both runtimes keep the same. Recomputed
    matmul FLOPs: k and o of the attention's (1024 + 4096 of 10240 columns of h), up of the other three."""
    _, _, records = _formulas("llama-3.1-8b", runtime)
    dense = records["dense"]
    assert dense.selective_per_token == 2 * 4096 + 2 * 4096 + 16 / SEQ
    assert dense.selective_tp_per_token == 2 * 32 * 128 + 2 * 8 * 128 + (2 * 32 * 128 + 4 * 32) + 2 * 14336
    assert dense.recomputed_attention_mm_share == (1024 + 4096) / (4096 + 1024 + 1024 + 4096)
    assert dense.recomputed_other_mm_share == pytest.approx(1 / 3)
    assert dense.recomputed_scores_share == 0.0  # the kernel's call kept


def test_eager_attention_keeps_no_attention_output_and_recomputes_its_batched_matmuls():
    """Eager attention runs two bmm (not in torchtitan's list: recomputed) and no SDPA: the layer keeps q, v,
    gate and down. The bmm read no weight: theirs is the scores' share, all of it recomputed, and the other
    share is the feed-forward's alone, up of its three projections."""
    _, _, records = _formulas("llama-3.1-8b", "hf-cuda-eager")
    dense = records["dense"]
    assert dense.selective_per_token == 2 * 4096 + 2 * 4096
    assert dense.selective_tp_per_token == 2 * 32 * 128 + 2 * 8 * 128 + 2 * 14336
    assert dense.recomputed_other_mm_share == pytest.approx(1 / 3)
    assert dense.recomputed_scores_share == 1.0


def test_a_bias_folds_the_projection_into_addmm_which_torchtitan_neither_saves_nor_counts():
    """Qwen2.5-7B's q, k and v add a bias: torch's linear runs aten.addmm (aten/src/ATen/native/Linear.cpp),
    outside torchtitan's list and its mm counter. So o is mm 1 (kept, h wide), gate mm 2, up mm 3 (kept),
    down mm 4. h 3584, 28 heads and 4 KV heads of 128, feed-forward 18944."""
    _, _, records = _formulas("qwen2.5-7b", "hf-cuda")
    dense = records["dense"]
    assert dense.selective_per_token == 2 * 3584 + 2 * 3584 + 16 / SEQ
    assert dense.selective_tp_per_token == (2 * 28 * 128 + 4 * 28) + 2 * 18944
    q, kv, o = 28 * 128, 4 * 128, 28 * 128
    assert dense.recomputed_attention_mm_share == pytest.approx((q + 2 * kv) / (q + 2 * kv + o))
    assert dense.recomputed_other_mm_share == pytest.approx(2 / 3)


def test_a_moe_layer_keeps_its_router_logits_and_recomputes_its_experts():
    """Qwen3-30B-A3B's MoE layer (h 2048, 32 heads and 4 KV heads of 128, 128 experts of 768, top 8): q, k, v,
    SDPA, o, then the router (mm 5: kept, its bf16 logits, 2 bytes an expert a token, not split by TP) and the
    experts' two grouped GEMMs (aten._grouped_mm, outside torchtitan's list: recomputed). Of the other matmuls'
    FLOPs a token, the experts' 8 copies of 2 * 2048 * 1536 and 2 * 768 * 2048 run again, the router's
    2 * 2048 * 128 does not."""
    _, _, records = _formulas("qwen3-30b-a3b", "hf-cuda")
    moe = records["moe"]
    assert moe.selective_per_token == 2 * 2048 + 2 * 128 + 16 / SEQ
    assert moe.selective_tp_per_token == 2 * 32 * 128 + 2 * 4 * 128 + 32 * (2 * 128 + 4)
    # k (2048 x 512) and o (4096 x 2048) of q, k, v, o's columns of h: (512 + 4096) / (4096 + 512 + 512 + 4096)
    assert moe.recomputed_attention_mm_share == (4 * 128 + 32 * 128) / (2 * 32 * 128 + 2 * 4 * 128)
    experts, router = 8 * (2 * 2048 * 1536 + 2 * 768 * 2048), 2 * 2048 * 128
    assert moe.recomputed_other_mm_share == pytest.approx(experts / (experts + router))


def test_layers_the_calls_do_not_list_are_unpriced_with_the_reason():
    """A family whose modules make other calls does not state ``calls_known``: Qwen3.5 (an output gate, linear
    attention), Phi-3 (fused q/k/v and gate/up projections: under the Llama family, which states it for Llama
    and Mistral only), DeepSeek-V3.2 (its indexer's projections)."""
    for model, kind in (("qwen3.5-9b", "full_attention"), ("deepseek-v3.2", "moe")):
        spec, estimator, records = _formulas(model, "hf-cuda")
        assert records[kind].selective_per_token is None and records[kind].recomputed_other_mm_share is None
        why = estimator.selective_unpriced(spec, kind, "hf-cuda")
        assert "checkpoint_policy/torchtitan" in why and "calls_known" in why and "census='auto'" in why
        values = op_records.values_for(spec, kind, seq=SEQ, attention="sdpa")
        with pytest.raises(Unpriced, match="calls_known"):
            op_records.policy_saves(values, manager.registry().get("checkpoint_policy/torchtitan"), "aten.x")
    phi3 = load_model({"model_type": "phi3", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8,
                       "num_hidden_layers": 2, "vocab_size": 1000})
    assert op_records.policy_unpriced(op_records.values_for(phi3, "dense", seq=SEQ, attention="sdpa"), "x")
    # a kernel stating no operator: the NPU runtime's (HyperParallel's policy)
    spec, estimator, records = _formulas("llama-3.1-8b", "hf-npu")
    assert records["dense"].selective_per_token is None
    assert "AttentionKernel.call" in estimator.selective_unpriced(spec, "dense", "hf-npu")


def test_an_unstated_bias_leaves_the_policy_unpriced():
    """Whether q runs aten.mm or aten.addmm decides what torchtitan's counter sees: a spec that does not say is
    not guessed."""
    values = op_records.values_for(load_model("llama-3.1-8b"), "dense", seq=SEQ, attention="sdpa")
    unstated = {k: v for k, v in values.given.items() if k != "qkv_bias"}
    why = op_records.policy_unpriced(unstated, "aten._scaled_dot_product_cudnn_attention")
    assert "q_proj" in why and "'qkv_bias'" in why and "attention_bias" in why
    assert op_records.policy_unpriced(values, "aten._scaled_dot_product_cudnn_attention") is None


def test_census_off_prices_selective_where_the_calls_are_listed_and_refuses_it_elsewhere():
    """Selective sits between full recompute and none; Qwen3.5's rows are refused saying why."""
    model = ndcost.resolve("llama-3.1-8b", runtime="hf-cuda", census="off")
    base = "fsdp=8,seq=8192,micro_batch=2,recompute="
    peaks = {mode: model.evaluate(base + mode).peak_bytes for mode in ("none", "selective", "full")}
    assert peaks["full"] < peaks["selective"] < peaks["none"]
    times = {mode: model.evaluate(base + mode).time.step_seconds for mode in ("none", "selective", "full")}
    assert times["none"] < times["selective"] < times["full"]
    unlisted = ndcost.resolve("qwen3.5-9b", runtime="hf-cuda", census="off")
    with pytest.raises(InvalidStrategy) as refused:
        unlisted.evaluate("fsdp=8,seq=8192,recompute=selective")
    for said in ("has no selective figure", "checkpoint_policy/torchtitan", "census='auto'",
                 "recompute=core_attention"):
        assert said in str(refused.value)


# ---------------------------------------------------------------------------
# beside the census: the policy run through torch.utils.checkpoint on Transformers' modules
# ---------------------------------------------------------------------------
SMALL = {"hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 8, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
         "tie_word_embeddings": False}
CONFIGS = {
    "llama": dict(SMALL, model_type="llama", attention_bias=False, mlp_bias=False),
    "qwen2": dict(SMALL, model_type="qwen2"),
    "qwen3": dict(SMALL, model_type="qwen3", head_dim=32, attention_bias=False),
    # GLM-4.5-Air's (specs/models/glm-4.5-air.yaml) at small widths: a dense layer with q/k/v biases, then MoE
    # with a shared expert and an fp32 router
    "glm4_moe": dict(SMALL, model_type="glm4_moe", head_dim=32, moe_intermediate_size=64, n_shared_experts=1,
                     n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1, n_group=1, topk_group=1,
                     norm_topk_prob=True, use_qk_norm=False, attention_bias=True, num_nextn_predict_layers=0,
                     partial_rotary_factor=0.5),
    "qwen3_moe": dict(SMALL, model_type="qwen3_moe", head_dim=32, moe_intermediate_size=64, num_experts=8,
                      num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True),
    "mixtral": dict(SMALL, model_type="mixtral", num_local_experts=8, num_experts_per_tok=2),
    # DeepSeek-V3's at small widths: MLA with a query latent, a dense layer, then MoE with a shared expert
    "deepseek_v3": dict(SMALL, model_type="deepseek_v3", num_key_value_heads=8, moe_intermediate_size=64,
                        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, first_k_dense_replace=1,
                        n_group=1, topk_group=1, q_lora_rank=64, kv_lora_rank=32, qk_nope_head_dim=32,
                        qk_rope_head_dim=16, v_head_dim=32, num_nextn_predict_layers=0),
    # GPT-OSS's at small widths: biases on every projection and the router, sinks (eager attention under
    # hf-cuda: GptOssPreTrainedModel refuses SDPA), a sliding and a full layer
    "gpt_oss": dict(SMALL, model_type="gpt_oss", intermediate_size=64, head_dim=32, num_local_experts=8,
                    num_experts_per_tok=2, sliding_window=32, layer_types=["sliding_attention", "full_attention"],
                    attention_bias=True),
    # and without the query latent (q_proj)
    "deepseek_v3_no_q_latent": dict(SMALL, model_type="deepseek_v3", num_key_value_heads=8, moe_intermediate_size=64,
                                    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
                                    first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=None,
                                    kv_lora_rank=32, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32,
                                    num_nextn_predict_layers=0),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("runtime", ["hf-cuda", "torchtitan-cuda", "hf-cuda-eager"])
def test_the_formulas_equal_the_census_under_the_runtimes_policy(family, runtime):
    pytest.importorskip("transformers")
    from ndcost.plugins.census.records import kind_records

    spec = load_model(CONFIGS[family])
    estimator = manager.registry().get("estimator/activations/op_records")
    formulas = estimator.records(spec, list(spec.kinds), 256, runtime)[0]
    census = kind_records(spec, 256, runtime, use_cache=False, progress=None)
    for kind in spec.kinds:
        for field in ("selective_per_token", "selective_tp_per_token", "recomputed_attention_mm_share",
                      "recomputed_other_mm_share", "recomputed_scores_share"):
            assert getattr(formulas[kind], field) == pytest.approx(getattr(census[kind], field), rel=1e-12), \
                (kind, field)
