"""Qwen3.5-MoE: Qwen3-Next's hybrid attention with an MoE (routed experts and one gated shared expert)
in every layer. A ``qwen3_5_moe`` config nests the text model under ``text_config``.
"""
from __future__ import annotations

from ndcost.plugins.families._base import register_family
from ndcost.plugins.families.qwen3_5 import Qwen35Family
from ndcost.plugins.families.qwen3_next import Qwen3NextFamily


class Qwen35MoeFamily(Qwen3NextFamily):
    name = "qwen3_5_moe"
    model_types = ("qwen3_5_moe", "qwen3_5_moe_text")
    all_moe = True
    defaults = dict(vocab_size=248320, hidden_size=2048, num_hidden_layers=40, num_attention_heads=16,
                    num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=False,
                    attention_bias=False, head_dim=256, linear_conv_kernel_dim=4, linear_key_head_dim=128,
                    linear_value_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
                    moe_intermediate_size=512, shared_expert_intermediate_size=512, num_experts_per_tok=8,
                    num_experts=256,
                    partial_rotary_factor=0.25)
    text_config = Qwen35Family.text_config


ndcost_register = register_family(Qwen35MoeFamily())
