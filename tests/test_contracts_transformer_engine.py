"""Transformer Engine's fused RMSNorm and Megatron-LM's fused SwiGLU (contracts te-rms-norm and te-swiglu, the
replacements of runtime megatron-te-cuda): the census under them against the census of Transformers' modules, and
the formulas beside the census.

Differences derived by hand from Transformers' Llama modules and the kernels' saves, for one Llama layer of ``s``
tokens, hidden ``h``, feed-forward ``I``, in bf16. LlamaRMSNorm keeps the fp32 input (its pow and its product, one
storage: 4 s h), the rstd (4 s) and the bf16 normalized value the weight multiplies (2 s h); Transformer Engine's
rmsnorm_fwd keeps its bf16 input (2 s h) and an fp32 rsigma a row (4 s). LlamaMLP keeps gate_proj's output (SiLU's
input), SiLU's output, up_proj's output and their product (down_proj's input): four [s, I]; Megatron-LM's
linear_fc1 (gate and up, one matmul) feeds BiasSwiGLUFunction, which keeps its input [s, 2I]
(megatron/core/fusions/fused_bias_swiglu.py), and linear_fc2 keeps its input [s, I]: three.
"""
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from _helpers import small_llama_config  # noqa: E402

import ndcost  # noqa: E402
from ndcost.manager import registry  # noqa: E402
from ndcost.models import load_model  # noqa: E402
from ndcost.plugins import op_records  # noqa: E402
from ndcost.plugins.runtimes import profile_from_mapping  # noqa: E402

S, H, N, KV, D, I = 256, 256, 8, 2, 32, 512


def _config():
    return small_llama_config(H, I, N, KV, D)


def _saved(profile):
    from ndcost.plugins.census import records as R
    return R._measure_plain(_config(), 0, S, profile)


@pytest.mark.slow
def test_the_fused_norms_and_swiglu_keep_what_the_kernels_keep():
    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census import records as R

    plain = _saved(profile_from_mapping(dict(name="t-cuda", contracts=["cuda-sdpa"])))
    te = _saved(R.runtime_profile("megatron-te-cuda"))
    per_norm_hf, per_norm_te = 4 * S * H + 4 * S + 2 * S * H, 2 * S * H + 4 * S
    assert plain.saved_bytes - te.saved_bytes == 2 * (per_norm_hf - per_norm_te) + 2 * S * I
    assert te.ops_bytes["normOp"] == 2 * per_norm_te
    assert te.ops_bytes["ffAct"] == 2 * S * 2 * I
    with L.fake_layer(_config(), 0, R.runtime_profile("megatron-te-cuda")) as fake:
        assert type(fake.layer.input_layernorm).__name__ == "TeRMSNorm"
        assert type(fake.layer.mlp).__name__ == "TeSwiGLUMLP"


def test_the_formulas_take_the_fused_modules_values():
    # a Llama layer: 2 bytes an element and 4 a row for each norm, 2 feed-forward-wide tensors for the activation
    spec = load_model("llama-3.1-8b")
    te, plain = registry().get("runtime/megatron-te-cuda"), registry().get("runtime/hf-cuda-fused")
    assert op_records.runtime_values(spec, "dense", te) == {"norm_bytes": 2, "norm_row_bytes": 4, "act_widths": 2,
                                                           "act_fused": 1, "expert_act_widths": 3}
    assert op_records.runtime_values(spec, "dense", plain) == {}
    # GPT-OSS: RMSNorms fused; its clamped experts as Megatron-LM's grouped MLP runs them (te-grouped-mlp): four
    # expert-wide tensors where Transformers' keep six
    gpt_oss = load_model("gpt-oss-20b")
    values = op_records.runtime_values(gpt_oss, gpt_oss.kinds[0], te)
    assert (values["norm_bytes"], values["norm_row_bytes"], values["expert_act_widths"]) == (2, 4, 4)


def test_llama_70b_megatron_layer_as_transformer_engine_keeps_it():
    """Llama-3.1-70B (h 8192, 64 query and 8 KV heads of 128, I 28672) a token at TP 1, by hand: the two norms'
    inputs and rows (2 (2 h + 4)) and the QKV and fc1 inputs (2 h each) beside the sequence; q, k, v, the
    attention output, its fp32 log-sum-exp a head, fc1's output (2 I), the SwiGLU's output (I) across TP."""
    model = ndcost.resolve("llama-3.1-70b", runtime="megatron-te-cuda", hardware="h100", census="off")
    model.record_tables(8192)
    record = model.resolved.kind_records[8192][0]["dense"]
    h, q, kv, i = 8192, 64 * 128, 8 * 128, 28672
    assert record.saved_per_token == pytest.approx(2 * (2 * h + 4) + 2 * h * 2, abs=0.01)
    assert record.saved_tp_per_token == 2 * (q + 2 * kv + q) + 64 * 4 + 2 * (2 * i + i)


# Megatron-LM's TEGroupedMLP behind the fused permutation (contract te-grouped-mlp), by hand from
# megatron/core/transformer/moe/experts.py and fused_bias_swiglu.py (NVIDIA/Megatron-LM d98e8a6) and Transformer
# Engine v2.9's permutation.py: a route (a token's copy to one of its top-k experts) keeps linear_fc1's input
# (2 h bytes), WeightedSwiGLUFunction's input (2 x 2 I) and its routing weight in the router logits' dtype (2 for
# Qwen3's bf16 router: moe_utils.py topk_routing_with_score_function casts the probabilities to the logits' type),
# and linear_fc2's input (2 I); a token keeps the permutation's int32 row_id_map of 2 E + 1 entries. Transformers' experts keep the
# input, the gate, its SiLU, the up projection, the down projection's input and the weighted output with its
# weight: 2 h + 3 x 2 I + 2 I + 2 h + 4 (the op records' routed and combine terms).
def test_the_routed_experts_keep_what_megatron_grouped_mlp_keeps():
    spec = load_model("qwen3-30b-a3b")
    kind = spec.kinds[0]
    formulas = registry().get("estimator/activations/op_records")
    h, i, k = 2048, 768, 8
    assert formulas.routed_bytes(spec, kind, 4096, "megatron-te-cuda") == (k * (2 * h + 4 * i + 2 + 2 * i),
                                                                          k * (4 * i + 2 * i))
    assert formulas.routed_bytes(spec, kind, 4096) == (k * (2 * h + 6 * i + 2 * i + 2 * h + 4), k * (6 * i + 2 * i))
    te = registry().get("runtime/megatron-te-cuda")
    values = op_records.runtime_values(spec, kind, te)
    assert (values["expert_act_widths"], values["expert_weighted_act"], values["row_id_map"]) == (2, 1, 1)
    # GPT-OSS (hidden 2880, experts 2880 wide, top 4) under weighted_bias_quick_geglu_impl: a route keeps
    # linear_fc1's input (2 h), its output the eager clamps read (2 x 2 I), the clamped copy torch.cat makes for
    # WeightedQuickGeGLUFunction (2 x 2 I) with its bf16 weight (2), and linear_fc2's input (2 I)
    gpt_oss = load_model("gpt-oss-20b")
    h, i, k = 2880, 2880, 4
    assert formulas.routed_bytes(gpt_oss, gpt_oss.kinds[0], 4096, "megatron-te-cuda")[0] == k * (2 * h + 10 * i + 2)
    # DeepSeek-V4's clamped experts (no biases) stay Transformers' own
    v4 = load_model("deepseek-v4-flash")
    assert all("expert_weighted_act" not in op_records.runtime_values(v4, kind, te) for kind in v4.kinds)


@pytest.mark.slow
def test_the_census_of_megatron_grouped_mlp_keeps_the_routes_inputs_weights_and_row_map():
    from transformers import Qwen3MoeConfig

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census import records as R

    tokens, hidden, inner, experts, top_k = 64, 256, 96, 8, 2
    config = Qwen3MoeConfig(hidden_size=hidden, moe_intermediate_size=inner, num_experts=experts,
                            num_experts_per_tok=top_k, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                            num_hidden_layers=1, vocab_size=128, torch_dtype="bfloat16")
    te = R.runtime_profile("megatron-te-cuda")
    measured = R._measure_plain(config, 0, tokens, te)
    routes = tokens * top_k
    assert measured.ops_bytes["ffAct"] == routes * (2 * 2 * inner + 2)  # the weighted SwiGLU: its input, weight
    assert measured.ops_bytes["other"] == tokens * (2 * experts + 1) * 4  # the permutation's row_id_map
    saved = list(measured.saved_tensors)  # (shape, dtype, bytes, op)
    assert ((routes, inner), "bfloat16", routes * inner * 2, "ffMM") in saved  # linear_fc2's input
    # linear_fc1's input, and no expert output kept for the combine (the weights scaled the activation)
    assert [s for s in saved if s[0] == (routes, hidden)] == [((routes, hidden), "bfloat16", routes * hidden * 2,
                                                                "ffMM")]
    with L.fake_layer(config, 0, te) as fake:
        assert type(fake.layer.mlp.experts).__name__ == "TeGroupedMLP"


@pytest.mark.slow
def test_the_census_of_gpt_oss_experts_under_megatron_keeps_the_clamps_and_the_clamped_copy():
    from transformers import GptOssConfig

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census import records as R

    tokens, hidden, inner, experts, top_k = 64, 256, 96, 8, 2
    config = GptOssConfig(hidden_size=hidden, intermediate_size=inner, num_local_experts=experts,
                          num_experts_per_tok=top_k, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                          num_hidden_layers=1, vocab_size=128, layer_types=["full_attention"])
    te = R.runtime_profile("megatron-te-cuda")
    routes = tokens * top_k
    saved = list(R._measure_plain(config, 0, tokens, te).saved_tensors)  # (shape, dtype, bytes, op)
    assert ((routes, hidden), "bfloat16", routes * hidden * 2, "ffMM") in saved        # linear_fc1's input
    assert ((routes, inner), "bfloat16", routes * 2 * inner * 2, "ffMM") in saved      # its output, the clamps'
    assert ((routes, 2 * inner), "bfloat16", routes * 2 * inner * 2, "ffAct") in saved  # the clamped copy
    assert ((routes, 1), "bfloat16", routes * 2, "ffAct") in saved                     # the routing weights
    assert ((routes, inner), "bfloat16", routes * inner * 2, "ffMM") in saved          # linear_fc2's input
    assert ((tokens, 2 * experts + 1), "int32", tokens * (2 * experts + 1) * 4, "other") in saved
    with L.fake_layer(config, 0, te) as fake:
        assert type(fake.layer.mlp.experts).__name__ == "TeClampedGroupedMLP"
