"""The tensors one layer of each family keeps for its backward under ``hf-cuda``, listed by hand.

Each list is derived from the family's Transformers 5.24 module source and
the ``cuda-sdpa`` contract (flash kernel: q, the unexpanded k and v, the
output laid out ``[b, s, h, d]``, an fp32 ``[b, h, s, 1]`` logsumexp and two
int64 RNG scalars), one entry per storage with the shape and dtype of its
first save, at micro-batch 1 of ``S`` tokens in bf16. Shared pieces:

- ``rms_norm(shape)``: ``LlamaRMSNorm`` and its copies keep the fp32 input
  (``pow`` and the ``mul`` by rstd), the fp32 rstd ``[..., 1]`` and the bf16
  normalized value before the weight (``weight * x``);
- ``rope``: ``q * cos`` and ``rotate_half(q) * sin`` keep cos and sin
  ``[1, 1, s, d]`` (shared by q and k);
- a linear keeps its input as ``mm`` sees it, ``[s, in]``;
- ``grouped_mm`` experts (``integrations/moe.py``): the two index tensors
  gathering tokens and weights and the inverse permutation ``[s k]`` int64,
  the gathered tokens ``[s k, h]``, the offsets ``[E]`` int32, the
  gate-and-up output ``[s k, 2 I]`` (first kept as its gate half, the
  activation's input), the activation
  output and the down projection's input ``[s k, I]``, the down output
  ``[s k, h]`` and the routing weights ``[s k, 1]`` it is scaled by.
"""
from collections import Counter

import pytest

from _helpers import eager_delta_rule_kept_bytes

pytest.importorskip("torch")
pytest.importorskip("transformers")

S = 64
BF, F32, I64, I32, BOOL = "bfloat16", "float32", "int64", "int32", "bool"


def _census(model_type, layer_index=0, **fields):
    from transformers import AutoConfig

    from ndcost.plugins.census import records as R
    config = AutoConfig.for_model(model_type, **fields)
    measured = R._measure_plain(config, layer_index, S, R.runtime_profile("hf-cuda"))
    return Counter((tuple(shape), dtype) for shape, dtype, _, _ in measured.saved_tensors), measured


def rms_norm(*shape):
    return [((1, *shape), F32), ((1, *shape[:-1], 1), F32), ((1, *shape), BF)]


def sdpa(heads, kv_heads, width):
    return [((1, heads, S, width), BF), ((1, kv_heads, S, width), BF), ((1, kv_heads, S, width), BF),
            ((1, heads, S, width), BF), ((1, heads, S, 1), F32), ((), I64), ((), I64)]


def rope(width):
    return [((1, 1, S, width), BF), ((1, 1, S, width), BF)]


def swiglu_mlp(hidden, inner):
    # gate_proj and up_proj keep the norm's output [s, h] (one storage), SiLU its input,
    # the product its two factors, down_proj the product [s, I]
    return [((S, hidden), BF), ((1, S, inner), BF), ((1, S, inner), BF), ((1, S, inner), BF), ((S, inner), BF)]


def grouped_experts(hidden, inner, experts, top_k, weights_dtype):
    pairs = S * top_k
    return [((pairs,), I64), ((pairs,), I64), ((pairs,), I64), ((pairs, hidden), BF), ((experts,), I32),
            # the gate-and-up output [s k, 2 I], first kept as its gate half (the activation's input)
            ((pairs, inner), BF), ((pairs, inner), BF), ((pairs, inner), BF), ((pairs, hidden), BF),
            ((pairs, 1), weights_dtype)]


def softmax_top_k_router(hidden, experts, top_k):
    # F.linear keeps the norm's output [s, h]; softmax (fp32) its output; topk its indices;
    # the in-place renormalization the top values and their sum
    return [((S, hidden), BF), ((S, experts), F32), ((S, top_k), I64), ((S, top_k), F32), ((S, 1), F32)]


LLAMA = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
             vocab_size=100, num_hidden_layers=1)


def _llama_attention_block(hidden, heads, kv_heads, width):
    # input_layernorm; q/k/v_proj keep its output [s, h]; rope; SDPA; o_proj keeps SDPA's
    # output storage (already kept)
    return rms_norm(S, hidden) + [((S, hidden), BF)] + rope(width) + sdpa(heads, kv_heads, width)


@pytest.mark.slow
def test_llama():
    found, _ = _census("llama", **LLAMA)
    expected = (_llama_attention_block(64, 4, 2, 16) + rms_norm(S, 64)
                + swiglu_mlp(64, 96))
    assert found == Counter(expected)


@pytest.mark.slow
@pytest.mark.parametrize("model_type,fields", [("qwen2", {}), ("mistral", {"sliding_window": 4 * S})],
                         ids=["qwen2", "mistral"])
def test_llama_like(model_type, fields):
    # Qwen2 differs from Llama by the q, k and v biases (addmm keeps the same input; a bias's gradient
    # needs nothing); Mistral by its sliding window, which at a sequence inside the window builds no mask
    # (SDPA's is_causal), so both keep Llama's tensors
    found, _ = _census(model_type, **dict(LLAMA, **fields))
    assert found == Counter(_llama_attention_block(64, 4, 2, 16) + rms_norm(S, 64) + swiglu_mlp(64, 96))


def _qk_norms(heads, kv_heads, width):
    # Qwen3's q_norm and k_norm over the head width, on q_proj's and k_proj's outputs viewed per head
    return rms_norm(S, heads, width) + rms_norm(S, kv_heads, width)


@pytest.mark.slow
def test_qwen3():
    found, _ = _census("qwen3", **LLAMA)
    expected = (_llama_attention_block(64, 4, 2, 16) + _qk_norms(4, 2, 16) + rms_norm(S, 64)
                + swiglu_mlp(64, 96))
    assert found == Counter(expected)


@pytest.mark.slow
def test_mixtral():
    found, _ = _census("mixtral", **dict(LLAMA, num_local_experts=4, num_experts_per_tok=2))
    expected = (_llama_attention_block(64, 4, 2, 16) + rms_norm(S, 64)
                + softmax_top_k_router(64, 4, 2) + grouped_experts(64, 96, 4, 2, F32))
    assert found == Counter(expected)


@pytest.mark.slow
def test_qwen3_moe():
    fields = dict(LLAMA, moe_intermediate_size=48, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                  decoder_sparse_step=1, mlp_only_layers=[])
    found, _ = _census("qwen3_moe", **fields)
    # Qwen3-MoE's router casts the renormalized top values back to bf16 before the experts
    router = softmax_top_k_router(64, 4, 2)
    expected = (_llama_attention_block(64, 4, 2, 16) + _qk_norms(4, 2, 16) + rms_norm(S, 64)
                + router + grouped_experts(64, 48, 4, 2, BF))
    assert found == Counter(expected)


DEEPSEEK_V3 = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_attention_heads=4,
                   num_key_value_heads=4, q_lora_rank=48, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
                   v_head_dim=16, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                   first_k_dense_replace=1, n_group=2, topk_group=1, vocab_size=100, num_hidden_layers=2)


def _mla_attention(hidden=64, heads=4, q_rank=48, kv_rank=32, rope_width=8, nope=16, value=16):
    """DeepseekV3Attention with q_lora and interleaved rope, SDPA through the cuda-sdpa contract."""
    qk = nope + rope_width
    return (rms_norm(S, hidden)
            + [((S, hidden), BF)]                      # q_a_proj and kv_a_proj_with_mqa: the norm's output
            + rms_norm(S, q_rank) + [((S, q_rank), BF)]  # q_a_layernorm; q_b_proj keeps its output
            + rms_norm(S, kv_rank) + [((S, kv_rank), BF)]  # kv_a_layernorm; kv_b_proj keeps its output
            # interleaved rope keeps the first halves of cos and sin, [1, 1, s, rope / 2]
            + [((1, 1, S, rope_width // 2), BF), ((1, 1, S, rope_width // 2), BF)]
            # SDPA: the concatenated query and the new key [1, n, s, qk]; the value, a view of
            # kv_b_proj's output; the output, contiguous [1, n, s, v] like the query
            + [((1, heads, S, qk), BF), ((1, heads, S, qk), BF), ((1, heads, S, value), BF),
               ((1, heads, S, value), BF), ((1, heads, S, 1), F32), ((), I64), ((), I64)]
            # o_proj keeps transpose(1, 2).contiguous()'s copy of the output
            + [((S, heads * value), BF)])


@pytest.mark.slow
def test_deepseek_v3_dense_layer():
    found, _ = _census("deepseek_v3", 0, **DEEPSEEK_V3)
    assert found == Counter(_mla_attention() + rms_norm(S, 64) + swiglu_mlp(64, 96))


@pytest.mark.slow
def test_deepseek_v3_moe_layer():
    found, _ = _census("deepseek_v3", 1, **DEEPSEEK_V3)
    # the router's F.linear on an fp32 copy of the tokens (its weight is an fp32 parameter), its
    # sigmoid's output, the gather's indices, and the in-place renormalization's operands; the
    # group-limited selection saves only into a graph the forward frees (indices take no gradient)
    router = [((S, 64), F32), ((S, 8), F32), ((S, 2), I64), ((S, 2), F32), ((S, 1), F32)]
    shared = swiglu_mlp(64, 32)  # the shared expert: an MLP of moe_intermediate_size, first to keep the tokens
    expected = (_mla_attention() + rms_norm(S, 64) + router + grouped_experts(64, 32, 8, 2, F32) + shared)
    assert found == Counter(expected)


@pytest.mark.slow
def test_glm4_moe_layer():
    fields = dict(LLAMA, moe_intermediate_size=32, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                  first_k_dense_replace=0, n_group=1, topk_group=1, partial_rotary_factor=0.5, use_qk_norm=False)
    found, _ = _census("glm4_moe", 0, **fields)
    # Llama's attention with rotary on half of each head (cos and sin [1, 1, s, 8]); the rotated half is
    # concatenated with the rest, so q is contiguous [b, h, s, d], SDPA's output laid out alike, and
    # o_proj keeps the copy transpose(1, 2).reshape makes. The MoE is DeepSeek-V3's: the router's fp32
    # copy of the tokens, sigmoid output, gather indices and renormalization; fp32 routing weights; the
    # shared expert an MLP of moe_intermediate_size
    attention = (rms_norm(S, 64) + [((S, 64), BF)] + rope(8) + sdpa(4, 2, 16) + [((S, 64), BF)])
    router = [((S, 64), F32), ((S, 8), F32), ((S, 2), I64), ((S, 2), F32), ((S, 1), F32)]
    expected = attention + rms_norm(S, 64) + router + grouped_experts(64, 32, 8, 2, F32) + swiglu_mlp(64, 32)
    assert found == Counter(expected)


DEEPSEEK_V32 = dict(DEEPSEEK_V3, index_n_heads=4, index_head_dim=32, index_topk=8)


@pytest.mark.slow
@pytest.mark.parametrize("layer_index", [0, 1], ids=["dense", "moe"])
def test_deepseek_v32(layer_index):
    # DeepSeek-V3's MLA, but the model always builds the causal mask (the indexer scores against it) and
    # the attention folds the indexer's top-k into it: SDPA takes a boolean [1, 1, s, s] mask, which the
    # cuDNN kernel keeps as a bf16 bias. The indexer keeps nothing: its scores' graph is freed once the
    # top-k indices (which take no gradient) are taken
    found, _ = _census("deepseek_v32", layer_index, **DEEPSEEK_V32)
    attention = _mla_attention() + [((1, 1, S, S), BF)]
    if layer_index == 0:
        expected = attention + rms_norm(S, 64) + swiglu_mlp(64, 96)
    else:
        router = [((S, 64), F32), ((S, 8), F32), ((S, 2), I64), ((S, 2), F32), ((S, 1), F32)]
        expected = attention + rms_norm(S, 64) + router + grouped_experts(64, 32, 8, 2, F32) + swiglu_mlp(64, 32)
    assert found == Counter(expected)


@pytest.mark.slow
def test_gpt2():
    found, _ = _census("gpt2", n_embd=64, n_layer=1, n_head=4, n_positions=128, vocab_size=100,
                       bos_token_id=0, eos_token_id=0)
    layer_norm = [((1, S, 64), BF), ((1, S, 1), F32), ((1, S, 1), F32)]  # its input, mean and rstd
    expected = (layer_norm                       # ln_1 (its input is the layer's input)
                + [((S, 64), BF)]                # c_attn's addmm keeps ln_1's output
                # SDPA: q, k and v are views of c_attn's one output (kept once, first as q), the
                # output laid out as q is (c_proj keeps the same storage), the statistic and the RNG
                # scalars (attn_pdrop runs inside the kernel)
                + [((1, 4, S, 16), BF), ((1, 4, S, 16), BF), ((1, 4, S, 1), F32), ((), I64), ((), I64)]
                + [((1, S, 64), BOOL)]           # resid_dropout's mask
                + layer_norm                     # ln_2 (its input is the residual sum)
                + [((S, 64), BF)]                # c_fc keeps ln_2's output
                # gelu_new: pow keeps c_fc's output, tanh its output, the last mul 0.5 x and 1 + tanh
                + [((1, S, 256), BF)] * 4
                + [((S, 256), BF)]               # c_proj keeps the activation's output
                + [((1, S, 64), BOOL)])          # the MLP's dropout mask
    assert found == Counter(expected)


GPT_OSS = dict(hidden_size=64, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               num_local_experts=4, num_experts_per_tok=2, vocab_size=100, num_hidden_layers=2, sliding_window=16,
               layer_types=["sliding_attention", "full_attention"])


@pytest.mark.slow
@pytest.mark.parametrize("layer_index", [0, 1], ids=["sliding", "full"])
def test_gpt_oss(layer_index):
    # GPT-OSS refuses SDPA (its sinks): eager attention, the same saves on either layer type
    found, _ = _census("gpt_oss", layer_index, **GPT_OSS)
    pairs, inner, heads, width = S * 2, 48, 4, 16
    # GptOssRMSNorm multiplies its weight in fp32: the fp32 input, rstd and the fp32 normalized value
    norm = [((1, S, 64), F32), ((1, S, 1), F32), ((1, S, 64), F32)]
    attention = (norm + [((S, 64), BF)]                       # q/k/v_proj keep the norm's bf16 output
                 + [((1, 1, S, width // 2), BF)] * 2           # rope: cos and sin on each half
                 + [((heads, S, width), BF),                   # matmul(q, k^T): q as a batch of heads
                    ((heads, width, S), BF),                   # and repeat_kv's new key, transposed
                    ((1, heads, S, 1), I64),                   # max over the logits and the sink: indices
                    ((1, heads, S, S + 1), BF),                # softmax's output (sink column included)
                    ((heads, S, width), BF)]                   # matmul(p, v): repeat_kv's new value
                 + [((S, heads * width), BF)])                 # o_proj: transpose(1, 2).contiguous()'s copy
    router = [((S, 64), BF), ((S, 2), I64), ((S, 2), BF)]      # addmm input, topk indices, softmax output
    experts = ([((pairs,), I64)] * 4                           # token and weight gathers, the experts' ids
                                                               # (bias gathers), the inverse permutation
               + [((pairs, 64), BF), ((4,), I32)]              # gathered tokens, offsets
               # gate_up output (first kept as its even columns by clamp), then clamp(gate),
               # sigmoid(alpha gate), glu, up + 1 and their product (down's input)
               + [((pairs, inner), BF)] * 6
               + [((pairs, 64), BF), ((pairs, 1), BF)])        # down output and the routing weights
    assert found == Counter(attention + norm + router + experts)


QWEN3_NEXT = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=32,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                  linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                  linear_value_head_dim=16, linear_conv_kernel_dim=4, vocab_size=100, num_hidden_layers=4,
                  full_attention_interval=4, decoder_sparse_step=1, mlp_only_layers=[])


def _zero_centred_norm(*shape):
    # Qwen3NextRMSNorm: x in fp32 (pow, mul), rstd, the fp32 normalized value and the new fp32 (1 + w)
    return [((1, *shape), F32), ((1, *shape[:-1], 1), F32), ((1, *shape), F32), ((shape[-1],), F32)]


def _qwen3_next_moe():
    shared = [((S, 64), BF), ((S, 32), BF), ((S, 32), BF), ((S, 32), BF), ((S, 32), BF)]  # on [s, h] tokens
    router = softmax_top_k_router(64, 4, 2)[1:]     # the tokens are the shared expert's storage
    shared_gate = [((S, 1), BF), ((S, 64), BF)]     # sigmoid's output and the shared expert's output it scales
    return (_zero_centred_norm(S, 64) + shared + router + grouped_experts(64, 32, 4, 2, BF) + shared_gate)


def _gated_attention(heads=4, kv=2, width=16, rope_width=4):  # partial rotary: a quarter of the head
    return (_zero_centred_norm(S, 64) + [((S, 64), BF)]
            + _zero_centred_norm(S, heads, width) + _zero_centred_norm(S, kv, width)  # q_norm, k_norm
            + [((1, 1, S, rope_width), BF)] * 2
            + sdpa(heads, kv, width)
            # SDPA's output copied by transpose(1, 2).contiguous() (the concatenated query is
            # contiguous [b, h, s, d]), sigmoid(gate)'s output, and o_proj's input, their product
            + [((1, S, heads * width), BF), ((1, S, heads * width), BF), ((S, heads * width), BF)])


@pytest.mark.slow
def test_qwen3_next_full_attention_layer():
    found, _ = _census("qwen3_next", 3, **QWEN3_NEXT)
    assert found == Counter(_gated_attention() + _qwen3_next_moe())


@pytest.mark.slow
def test_qwen3_next_linear_attention_layer():
    found_all, measured = _census("qwen3_next", 0, **QWEN3_NEXT)
    hk, hv, dk, dv = 2, 4, 16, 16
    conv_dim = 2 * hk * dk + hv * dv
    kernel = 4
    delta_net = _gated_delta_net(hk, hv, dk, dv)  # in_proj_qkvz and in_proj_ba share the norm's output
    outside_rule = Counter((tuple(shape), dtype) for shape, dtype, _, op in measured.saved_tensors if op != "linrec")
    assert outside_rule == Counter(delta_net + _qwen3_next_moe())
    # the convolution's input is s tokens wide, its padded output (SiLU's input) s + kernel - 1
    sizes = sorted(size for shape, _, size, _ in measured.saved_tensors if shape == (1, conv_dim, S))
    assert sizes == [2 * conv_dim * S, 2 * conv_dim * (S + kernel - 1)]
    rule_bytes = sum(size for _, _, size, op in measured.saved_tensors if op == "linrec")
    assert rule_bytes == eager_delta_rule_kept_bytes(S, hk, hv, dk, dv)


def _gated_delta_net(hk=2, hv=4, dk=16, dv=16):
    conv_dim = 2 * hk * dk + hv * dv
    return (_zero_centred_norm(S, 64) + [((S, 64), BF)]       # the input projections share the norm's output
            + [((1, conv_dim, S), BF)]                        # conv1d's input: cat(q, k, v) transposed
            + [((1, conv_dim, S), BF)]                        # SiLU's input: the conv output [.., s + 3]
            + [((1, S, hv), BF)]                              # beta = sigmoid(b), its output
            + [((hv,), F32), ((1, S, hv), F32)]               # exp(A_log) output, softplus's input
            + [((hv,), F32), ((1, S, hv), F32)]               # -exp(A) and softplus(..) the mul keeps
            + [((S * hv, dv), F32), ((S * hv, 1), F32), ((S * hv, dv), BF), ((S * hv, dv), BF),
               ((S * hv, dv), F32), ((S * hv, dv), F32)]      # the gated RMSNorm, as Qwen3-Next's
            + [((S, hv * dv), BF)])                           # out_proj's input


QWEN3_5 = dict(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
               linear_conv_kernel_dim=4, vocab_size=100, num_hidden_layers=4,
               layer_types=["linear_attention"] * 3 + ["full_attention"])


@pytest.mark.slow
def test_qwen3_5_layers():
    # Qwen3.5's text decoder is Qwen3-Next's (gated attention with q/k norms and partial rotary, the gated
    # delta net with separate q-k-v, z, b and a projections on one input) with a dense SwiGLU MLP behind
    # a zero-centred norm
    mlp = _zero_centred_norm(S, 64) + swiglu_mlp(64, 96)
    found, _ = _census("qwen3_5_text", 3, **QWEN3_5)
    assert found == Counter(_gated_attention() + mlp)
    _, measured = _census("qwen3_5_text", 0, **QWEN3_5)
    outside_rule = Counter((tuple(shape), dtype) for shape, dtype, _, op in measured.saved_tensors if op != "linrec")
    assert outside_rule == Counter(_gated_delta_net() + mlp)
    assert sum(size for _, _, size, op in measured.saved_tensors if op == "linrec") == eager_delta_rule_kept_bytes(S, 2, 4, 16, 16)


@pytest.mark.slow
def test_qwen3_5_moe_layers():
    # Qwen3.5-MoE: Qwen3.5's attention and gated delta net with Qwen3-Next's MoE (softmax router, gated
    # shared expert, grouped experts)
    fields = {k: v for k, v in QWEN3_5.items() if k != "intermediate_size"}
    fields.update(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2)
    found, _ = _census("qwen3_5_moe_text", 3, **fields)
    assert found == Counter(_gated_attention() + _qwen3_next_moe())
    _, measured = _census("qwen3_5_moe_text", 0, **fields)
    outside_rule = Counter((tuple(shape), dtype) for shape, dtype, _, op in measured.saved_tensors if op != "linrec")
    assert outside_rule == Counter(_gated_delta_net() + _qwen3_next_moe())
