"""The generic decoder: what a config of a model type nobody registered is counted as (with a warning).

It reads the common Transformers fields (``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads``, ``head_dim``,
``intermediate_size``, ``vocab_size``, ``tie_word_embeddings``) and, where the
config states them, the biases, the norm kind and routed experts. What the
config leaves unstated follows the formulas' bias convention (HyperParallel's
``_bias``, cited in ``plugins/formulas/common.py``): a bias of the hidden width
on each projection, two vectors per norm. The model types below are known by
their Transformers modules to differ from a Llama-shaped decoder: an ungated
two-matrix MLP, learned absolute positions.
"""
from __future__ import annotations

import attrs

from ndcost.plugins.families._base import DecoderFamily, check_experts, read_attention, register_family

KINDS = {"dense": {"attention": "gqa", "mlp": "dense"}, "moe": {"attention": "gqa", "mlp": "moe"}}
# Transformers' model types whose MLP is up and down projections only (no gate).
PLAIN_MLP_MODEL_TYPES = frozenset({
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2", "codegen",
    "gpt_neo", "biogpt", "xglm", "mpt",
})
# Model types with learned absolute positions (no rotary on the queries and keys).
ABSOLUTE_POSITION_MODEL_TYPES = frozenset({"gpt2", "gpt_bigcode", "opt", "biogpt", "xglm", "bloom", "mpt"})


class GenericDecoderFamily(DecoderFamily):
    name = "generic_decoder"
    model_types = ("generic_decoder",)

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        vocab = r.int("vocab_size")
        tie = r.bool("tie_word_embeddings", False)
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
        model_type = str(config.get("model_type"))
        extra = {"norm_bias": norm_bias, "ffn_matrices": 2 if model_type in PLAIN_MLP_MODEL_TYPES else 3,
                 "absolute_positions": model_type in ABSOLUTE_POSITION_MODEL_TYPES}
        return self.build(
            r, name, model_type, [kind] * n, KINDS, extra=extra,
            vocab_size=vocab, intermediate_size=intermediate, tie_word_embeddings=tie,
            attention_bias=attention_bias, mlp_bias=mlp_bias, **fields, **att)


    def layer_kind(self, config, extra, info):
        described = super().layer_kind(config, extra, info)
        return attrs.evolve(described, rotary=not extra["absolute_positions"])


ndcost_register = register_family(GenericDecoderFamily())
