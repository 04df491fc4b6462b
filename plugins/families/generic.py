"""The generic decoder: what a config of a model type nobody registered is counted as (with a warning).

It reads the common Transformers fields (``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``) and, where the
config states them, the biases, the norm kind and routed experts. What the
config leaves unstated follows the formulas' convention (seed 003): a bias of
the hidden width on each projection, two vectors per norm.
"""
from __future__ import annotations

from ndcost.plugins.families._base import DecoderFamily, check_experts, read_attention, register_family

KINDS = {"dense": {"attention": "gqa", "mlp": "dense"}, "moe": {"attention": "gqa", "mlp": "moe"}}


class GenericDecoderFamily(DecoderFamily):
    name = "generic_decoder"
    model_types = ("generic_decoder",)

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        vocab = r.int("vocab_size")
        tie = bool(r.get("tie_word_embeddings", False))
        attention_bias = r.bool("attention_bias", None)
        mlp_bias = r.bool("mlp_bias", None)
        if r.has("rms_norm_eps"):
            r.get("rms_norm_eps")
            norm_bias = False
        elif r.has("layer_norm_eps") or r.has("layer_norm_epsilon"):
            norm_bias = True
        else:
            norm_bias = None
        experts = None
        for field in ("num_experts", "num_local_experts", "n_routed_experts"):
            if r.has(field):
                experts = r.int(field, minimum=0)
                break
        fields = {}
        kind = "dense"
        if experts:
            kind = "moe"
            top_k = r.int("num_experts_per_tok", None)
            check_experts(r, experts, top_k)
            width = r.int("moe_intermediate_size", None) or r.int("intermediate_size")
            fields = dict(num_experts=experts, num_experts_per_tok=top_k, moe_intermediate_size=width)
        intermediate = r.int("intermediate_size", None) if kind == "moe" else r.int("intermediate_size")
        return self.build(
            r, name, str(config.get("model_type")), [kind] * n, KINDS, extra={"norm_bias": norm_bias},
            vocab_size=vocab, intermediate_size=intermediate, tie_word_embeddings=tie,
            attention_bias=attention_bias, mlp_bias=mlp_bias, **fields, **att)


ndcost_register = register_family(GenericDecoderFamily())
