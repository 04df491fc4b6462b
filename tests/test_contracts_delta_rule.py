"""The fused gated-delta-rule contract against Transformers' eager reference rule.

A Qwen3-Next linear-attention layer under ``hf-cuda`` runs Transformers'
``torch_chunk_gated_delta_rule``; under ``hf-cuda-fused`` the rule is the
fused kernel's contract. Everything else in the layer is the same, so the two
censuses differ by what each rule keeps that nothing else in the layer keeps:

- the eager rule copies every input to fp32 before it computes, so nothing it
  saves is an outer tensor; what it keeps is measured here by running
  Transformers' own function alone on fake tensors of the layer's shapes
  (an independent source: Transformers' code, not the census);
- the fused kernel keeps (derived by hand from its contract): the queries and
  keys L2-normalized in the kernel (bf16 ``[b, s, h_k, d_k]`` each) with
  their fp32 reciprocal norms ``[b, s, h_k]``; the value, a view of the causal
  convolution's SiLU output, so that whole storage (bf16 ``[b, conv_dim, s]``);
  beta, which the sigmoid already keeps; the chunk-cumulated gates, fp32
  ``[b, s, h_v]``; and one chunk matrix ``[b, s, h_v, 64]`` bf16.
"""

import pytest

from _helpers import eager_delta_rule_kept_bytes

pytest.importorskip("torch")
pytest.importorskip("transformers")

S = 256
HIDDEN, HK, HV, DK, DV = 256, 4, 8, 32, 32
CHUNK = 64
CONV_DIM = 2 * HK * DK + HV * DV


def _config():
    from transformers import AutoConfig
    return AutoConfig.for_model(
        "qwen3_next", hidden_size=HIDDEN, intermediate_size=512, moe_intermediate_size=64,
        shared_expert_intermediate_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_experts=8, num_experts_per_tok=2, linear_num_key_heads=HK, linear_num_value_heads=HV,
        linear_key_head_dim=DK, linear_value_head_dim=DV, linear_conv_kernel_dim=4, vocab_size=1000,
        num_hidden_layers=4, full_attention_interval=4, decoder_sparse_step=1, mlp_only_layers=[])


def _measure(runtime, index):
    from ndcost.plugins.census import records as R
    return R._measure_plain(_config(), index, S, R.runtime_profile(runtime))


@pytest.mark.slow
def test_fused_rule_differs_from_the_eager_rule_by_their_own_saves():
    eager = _measure("hf-cuda", 0)
    fused = _measure("hf-cuda-fused", 0)
    fused_rule = (2 * (2 * S * HK * DK)        # q and k, normalized in the kernel, bf16
                  + 2 * (4 * S * HK)           # their fp32 reciprocal norms
                  + 2 * CONV_DIM * S           # the value's storage: the convolution's SiLU output
                  + 4 * S * HV                 # gates cumulated within each chunk, fp32
                  + 2 * S * HV * CHUNK)        # the chunk matrix A, bf16
    assert eager.saved_bytes - fused.saved_bytes == eager_delta_rule_kept_bytes(S, HK, HV, DK, DV, CHUNK) - fused_rule
    assert fused.ops_bytes["linrec"] == fused_rule


@pytest.mark.slow
def test_fused_rule_leaves_a_full_attention_layer_alone():
    assert _measure("hf-cuda", 3).saved_bytes == _measure("hf-cuda-fused", 3).saved_bytes


def test_flops_of_the_chunked_rule_by_hand():
    from ndcost.plugins.contracts.delta_rule import chunk_rule_flops
    # one chunk of 64 tokens, one head, d_k = d_v = 128:
    # 2 c^2 (3 d_k + 2 d_v) + 6 c d_k d_v
    assert chunk_rule_flops(1, 64, 1, 128, 128, 64) == 2 * 64 * 64 * 640 + 6 * 64 * 128 * 128
    assert chunk_rule_flops(2, 130, 3, 128, 128, 64) == 2 * 3 * 3 * chunk_rule_flops(1, 64, 1, 128, 128, 64)


def test_registered(registry):
    assert registry.get("contract/fla-chunk-gated-delta-rule").device == "cuda"
    assert "fla-chunk-gated-delta-rule" in registry.get("runtime/hf-cuda-fused").contracts
    assert "fla-chunk-gated-delta-rule" not in registry.get("runtime/hf-cuda").contracts
