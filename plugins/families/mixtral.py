"""Mixtral: Mistral's attention without biases; every layer ``moe`` with top-k routed SwiGLU experts."""
from __future__ import annotations

from ndcost.plugins.families._base import DecoderFamily, check_experts, read_attention, register_family

KINDS = {"moe": {"attention": "gqa", "mlp": "moe"}}


class MixtralFamily(DecoderFamily):
    name = "mixtral"
    model_types = ("mixtral",)
    op_record_values = {"calls_known": 1}  # its layers make the calls specs/op_records.yaml lists
    defaults = dict(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                    num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096 * 32,
                    tie_word_embeddings=False, num_experts_per_tok=2, num_local_experts=8)
    aliases = {"num_local_experts": ("num_experts",)}

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        experts = r.int("num_local_experts")
        top_k = r.int("num_experts_per_tok")
        check_experts(r, experts, top_k)
        width = r.int("intermediate_size")
        return self.build(
            r, name, "mixtral", ["moe"] * n, KINDS,
            vocab_size=r.int("vocab_size"), intermediate_size=width, moe_intermediate_size=width,
            num_experts=experts, num_experts_per_tok=top_k, num_shared_experts=0,
            tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=False, mlp_bias=False,
            max_position_embeddings=r.int("max_position_embeddings"), **att)


ndcost_register = register_family(MixtralFamily())
