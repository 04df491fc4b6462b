"""GPT-OSS's attention under hf-cuda-fused: one fused kernel with its sinks (contract gpt-oss-flash-sinks).

A small GPT-OSS (hidden 256, 8 heads of 32, 2 KV heads, a sliding layer of window 16 and a full one) at
64 tokens, measured by the census with and without the contract. What differs is derived by hand:

- Transformers' ``eager_attention_forward`` (transformers/models/gpt_oss/modeling_gpt_oss.py) copies the
  keys and values to every head (``repeat_kv``), ``matmul(q, k^T)`` saves q and the copied k (as the
  bmm's 3-D operands ``[b * h, s, d]`` and ``[b * h, d, s]``), the max over the logits and the sink saves
  its int64 indices ``[b, h, s, 1]``, the softmax its bf16 output ``[b, h, s, s + 1]`` (the sink's column
  included; the probabilities are a slice of it), the second matmul the copied v; ``o_proj`` saves the
  output's transposed copy ``[b * s, h * d]``;
- the contract keeps q ``[b, h, s, d]``, the unrepeated k and v ``[b, kv, s, d]``, its output
  ``[b, s, h, d]`` (which ``o_proj`` reads as it is: one storage) and an fp32 log-sum-exp ``[b, h, s]``.

Everything else the layer saves (norms, router, experts) is the same tensors under both.
"""
from __future__ import annotations

import collections

import pytest

transformers = pytest.importorskip("transformers")
pytest.importorskip("torch")

from ndcost.models import load_model  # noqa: E402
from ndcost.plugins import op_records  # noqa: E402
from ndcost.plugins.census import records  # noqa: E402
from ndcost.plugins.contracts.gpt_oss import FLASH_SINKS, causal_pairs  # noqa: E402
from ndcost.plugins.runtimes import profile_from_mapping  # noqa: E402

H, HEADS, KV, D, S, WINDOW, B = 256, 8, 2, 32, 64, 16, 1
EAGER = dict(name="t-eager", contracts=["cuda-sdpa", "cuda-native"])
FUSED = dict(EAGER, name="t-fused", family_contracts={"gpt_oss": [FLASH_SINKS]})


def _config():
    return transformers.GptOssConfig(
        hidden_size=H, intermediate_size=128, num_attention_heads=HEADS, num_key_value_heads=KV, head_dim=D,
        num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2, vocab_size=1000, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=4096,
        rope_parameters={"rope_type": "yarn", "factor": 1.0, "rope_theta": 150000.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096, "truncate": False})


def _saved(index, runtime):
    measured = records._measure_plain(_config(), index, S, profile_from_mapping(runtime))
    return collections.Counter((shape, dtype, op) for shape, dtype, _, op in measured.saved_tensors), measured


@pytest.mark.parametrize("index", [0, 1], ids=["sliding", "full"])
def test_the_fused_kernel_keeps_q_k_v_its_output_and_the_log_sum_exp_where_eager_keeps_the_scores(index):
    eager, eager_measured = _saved(index, EAGER)
    fused, fused_measured = _saved(index, FUSED)
    assert dict(eager - fused) == {
        ((B, HEADS, S, S + 1), "bfloat16", "softmax"): 1,   # the softmax over the logits and the sink
        ((B * HEADS, S, D), "bfloat16", "attBMM"): 2,       # q, and v copied to every head
        ((B * HEADS, D, S), "bfloat16", "attBMM"): 1,       # k copied to every head, transposed
        ((B, HEADS, S, 1), "int64", "attMM"): 1,            # the max's indices
        ((B * S, HEADS * D), "bfloat16", "attMM"): 1,       # o_proj's input, the output's copy
    }
    assert dict(fused - eager) == {
        ((B, HEADS, S, D), "bfloat16", "attBMM"): 1,        # q
        ((B, KV, S, D), "bfloat16", "attBMM"): 2,           # k and v, one a KV head
        ((B, S, HEADS, D), "bfloat16", "attBMM"): 1,        # the output, o_proj's input too
        ((B, HEADS, S), "float32", "softmax"): 1,           # the log-sum-exp
    }
    eager_only = 2 * B * HEADS * S * (S + 1) + 3 * 2 * B * HEADS * S * D + 8 * B * HEADS * S + 2 * B * S * HEADS * D
    fused_only = 2 * B * HEADS * S * D + 2 * 2 * B * KV * S * D + 2 * B * S * HEADS * D + 4 * B * HEADS * S
    assert eager_measured.saved_bytes - fused_measured.saved_bytes == eager_only - fused_only


@pytest.mark.parametrize("index, window", [(0, WINDOW), (1, 0)], ids=["sliding", "full"])
def test_the_kernel_scores_only_the_causal_window(index, window):
    counted = records._count(_config(), index, S, profile_from_mapping(FUSED))
    per_pair = 2 * B * HEADS * (D + D)  # QK^T and PV, 2 FLOPs a multiply-add
    pairs = {WINDOW: WINDOW * (WINDOW + 1) // 2 + (S - WINDOW) * WINDOW, 0: S * (S + 1) // 2}[window]
    assert causal_pairs(S, window) == pairs
    assert counted.flops["scores"] == per_pair * pairs
    assert counted.all_pairs_flops["scores"] == per_pair * S * S


def test_the_formulas_price_the_runtime_s_kernel_without_scores():
    spec = load_model(_config())
    fused = op_records.runtime_attention(spec, profile_from_mapping(FUSED))
    assert fused == FLASH_SINKS
    assert op_records.runtime_attention(spec, profile_from_mapping(EAGER)) == "eager"  # SDPA refused: the fallback
    kind = spec.kinds[1]  # full_attention
    score = {kernel: op_records.values_for(spec, kind, seq=S, micro_batch=B, tp=1, attention=kernel)
             for kernel in ("eager", fused)}
    # the softmax slot: eager's [b, h, s, s] scores (the records' compute dtype), the kernel's fp32 [b, h, s]
    assert op_records.op_bytes(score["eager"], "softmax")["score"] == 2 * B * HEADS * S * S
    assert op_records.op_bytes(score[fused], "softmax")["score"] == 4 * B * HEADS * S
