"""The time model prices a backward's launches as twice the forward's (compose/time.py ``_launch_bound``; the
census counts the forward's only). Checked here against Transformers' own eager modules: every aten op they
dispatch on the CPU, forward and backward, but those that launch no kernel (the census's rule,
``launch_counter``): about twice on Llama's layer, and well beyond on the chunk loop of Qwen3-Next's eager
gated delta rule, where the rule falls short (its H200 layer's forward and backward are 17% under the measurement)."""
from __future__ import annotations

import pytest


def _launches(layer, x, **kwargs):
    """(forward, backward) kernels *layer* dispatches on *x* (``launch_counter``'s rule)."""
    import torch

    from ndcost.plugins.census.measure import launch_counter
    forward, backward = launch_counter(), launch_counter()
    with forward:
        out = layer(x, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    with backward:
        out.backward(torch.ones_like(out))
    return forward.launches, backward.launches


@pytest.mark.slow
def test_the_backward_dispatches_about_twice_the_forwards_ops():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama import modeling_llama

    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, num_hidden_layers=1, vocab_size=100)
    config._attn_implementation = "sdpa"
    layer = modeling_llama.LlamaDecoderLayer(config, 0).to(torch.bfloat16)
    x = torch.randn(1, 32, 64, dtype=torch.bfloat16, requires_grad=True)
    positions = torch.arange(32)[None]
    rotary = tuple(t.to(torch.bfloat16) for t in modeling_llama.LlamaRotaryEmbedding(config)(x, positions))
    counts = []
    for _ in range(2):  # the second backward accumulates into the gradients the first made (a training step's)
        counts.append(_launches(layer, x, position_embeddings=rotary, position_ids=positions))
    # the forward is the analytic count by hand (plugins/estimators/flops.py, tests/test_time_kernels.py): 38
    assert counts[0][0] == counts[1][0] == 38
    # the backward: 71 ops, 81 with the 9 parameters' and the input's gradients accumulated, 1.87x and 2.13x
    assert counts[1][1] == counts[0][1] + 10
    for forward_kernels, backward_kernels in counts:
        assert 1.8 < backward_kernels / forward_kernels < 2.2


@pytest.mark.slow
def test_the_eager_chunked_delta_rule_dispatches_far_more_than_twice_its_forward_a_chunk():
    """Transformers' torch_chunk_gated_delta_rule loops over 64-token chunks: each chunk's forward is a handful
    of ops, and its backward the gradients of every one of them through the carried state."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next import modeling_qwen3_next as modeling

    config = transformers.Qwen3NextConfig(
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        num_hidden_layers=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=32, vocab_size=100, layer_types=["linear_attention", "full_attention"])
    config._attn_implementation = "sdpa"
    counts = {}
    for seq in (128, 256):  # 2 and 4 chunks of 64
        layer = modeling.Qwen3NextDecoderLayer(config, 0).to(torch.bfloat16)
        x = torch.randn(1, seq, 64, dtype=torch.bfloat16, requires_grad=True)
        rotary = tuple(t.to(torch.bfloat16) for t in modeling.Qwen3NextRotaryEmbedding(config)(
            x, torch.arange(seq)[None]))
        counts[seq] = _launches(layer, x, position_embeddings=rotary, attention_mask=None)
    forward_a_chunk = (counts[256][0] - counts[128][0]) / 2
    backward_a_chunk = (counts[256][1] - counts[128][1]) / 2
    assert forward_a_chunk == 9
    assert backward_a_chunk / forward_a_chunk > 3.0  # 32: the time model's twice is far short
