"""Qwen3.5 (dense): Qwen3-Next's hybrid attention (gated delta net and gated full attention) with a dense
SwiGLU MLP in every layer. A ``qwen3_5`` config nests the text model under ``text_config``; the vision
tower is not counted (Transformers' causal-LM class builds the text model only).
"""
from __future__ import annotations

from ndcost.plugins.families._base import register_family
from ndcost.plugins.families.qwen3_next import Qwen3NextFamily


class Qwen35Family(Qwen3NextFamily):
    name = "qwen3_5"
    model_types = ("qwen3_5", "qwen3_5_text")
    dense = True
    defaults = dict(vocab_size=248320, hidden_size=4096, intermediate_size=12288, num_hidden_layers=32,
                    num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=32768,
                    tie_word_embeddings=False, attention_bias=False, head_dim=256, linear_conv_kernel_dim=4,
                    linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                    linear_num_value_heads=32,
                    partial_rotary_factor=0.25)

    def text_config(self, config):
        text = config.get("text_config")
        return dict(text) if isinstance(text, dict) else config


ndcost_register = register_family(Qwen35Family())
