"""Qwen3-MoE: Qwen3's attention with a QK-norm; routed experts without shared ones on the sparse layers.

A layer routes unless it is in ``mlp_only_layers`` or off the ``decoder_sparse_step``; the others are
``dense`` with ``intermediate_size``.
"""
from __future__ import annotations

from ndcost.plugins.families._base import (DecoderFamily, check_experts, moe_layers, read_attention,
                                           register_family)

KINDS = {"dense": {"attention": "gqa", "mlp": "dense"}, "moe": {"attention": "gqa", "mlp": "moe"}}


class Qwen3MoeFamily(DecoderFamily):
    name = "qwen3_moe"
    model_types = ("qwen3_moe",)
    op_record_values = {"calls_known": 1}  # its layers make the calls specs/op_records.yaml lists
    defaults = dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=24,
                    num_attention_heads=32, num_key_value_heads=4, head_dim=None, max_position_embeddings=32768,
                    tie_word_embeddings=False, attention_bias=False, decoder_sparse_step=1,
                    moe_intermediate_size=768, num_experts_per_tok=8, num_experts=128)
    aliases = {"num_experts": ("num_local_experts",)}

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        experts = r.int("num_experts", minimum=0)
        top_k = r.int("num_experts_per_tok")
        check_experts(r, experts, top_k)
        routes = moe_layers(r, n, experts)
        return self.build(
            r, name, "qwen3_moe", ["moe" if x else "dense" for x in routes], KINDS, extra={"qk_norm": True},
            vocab_size=r.int("vocab_size"), intermediate_size=r.int("intermediate_size"),
            num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=r.int("moe_intermediate_size"),
            num_shared_experts=0, sparse_step=r.int("decoder_sparse_step"),
            tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=r.bool("attention_bias"),
            mlp_bias=False, max_position_embeddings=r.int("max_position_embeddings"), **att)


ndcost_register = register_family(Qwen3MoeFamily())
