"""Qwen3-Next: hybrid layers, ``linear_attention`` (gated delta net) and ``full_attention`` (GQA with an
output gate fused into the query projection and a QK-norm), each with an MoE of routed experts and one gated
shared expert.

Layer types come from ``layer_types``, else every ``full_attention_interval``-th
layer (4) is full attention. A layer in ``mlp_only_layers`` or off the
``decoder_sparse_step`` has a dense MLP: its kind gets ``_dense``.
"""
from __future__ import annotations

from ndcost.errors import InvalidValue
from ndcost.models import check_divides
from ndcost.plugins.families._base import (DecoderFamily, check_experts, layer_types, moe_layers, read_attention,
                                           register_family)

MECHANISMS = {"linear_attention": "gated_delta_net", "full_attention": "gqa"}


def hybrid_types(r, n):
    """Each layer's attention type: ``layer_types``, else every ``full_attention_interval``-th layer full."""
    types = layer_types(r, n)
    if types is None:
        interval = r.int("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    bad = sorted(set(types) - set(MECHANISMS))
    if bad:
        raise InvalidValue(f"{r.family} config: layer_types {bad} are not linear_attention or full_attention")
    return types


def hybrid_table():
    table = {}
    for kind, mechanism in MECHANISMS.items():
        table[kind] = {"attention": mechanism, "mlp": "moe"}
        table[f"{kind}_dense"] = {"attention": mechanism, "mlp": "dense"}
    return table


def linear_fields(r):
    """The gated delta net's widths; its value heads share the key heads in equal groups."""
    check_divides(r.family, "linear_num_key_heads", r.int("linear_num_key_heads"), r.int("linear_num_value_heads"),
                  "linear_num_value_heads")
    return dict(linear_num_key_heads=r.int("linear_num_key_heads"),
                linear_num_value_heads=r.int("linear_num_value_heads"),
                linear_key_head_dim=r.int("linear_key_head_dim"),
                linear_value_head_dim=r.int("linear_value_head_dim"),
                linear_conv_kernel_dim=r.int("linear_conv_kernel_dim"))


class Qwen3NextFamily(DecoderFamily):
    name = "qwen3_next"
    model_types = ("qwen3_next",)
    # Qwen3NextRMSNorm scales by (1 + weight) in fp32 before casting back: it keeps the fp32 normalized tensor
    # (8 bytes an element with the fp32 input, not LlamaRMSNorm's 6), and moves 20 two-byte elements an element
    op_record_values = {"norm_bytes": 8}
    elementwise_elements = {"norm": 20}
    # and launches 10 kernels (the cast up, square, mean, epsilon, rsqrt, product, the weight's cast and 1 + weight,
    # its product, the cast back) where LlamaRMSNorm launches 8; its apply_rotary_pos_emb concatenates the rotated
    # channels with the passed ones, a sixth kernel a rotated tensor; its MoE block scales the shared expert's output
    # by a gate (shared_expert_gate's linear, the sigmoid, the product)
    kernel_launches = {"norm": 10, "rotary": 6, "shared_gate": 3}
    defaults = dict(vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_hidden_layers=48,
                    num_attention_heads=16, num_key_value_heads=2, max_position_embeddings=32768,
                    tie_word_embeddings=False, attention_bias=False, head_dim=256, linear_conv_kernel_dim=4,
                    linear_key_head_dim=128, linear_value_head_dim=128, linear_num_key_heads=16,
                    linear_num_value_heads=32, decoder_sparse_step=1, moe_intermediate_size=512,
                    shared_expert_intermediate_size=512, num_experts_per_tok=10, num_experts=512,
                    partial_rotary_factor=0.25)
    aliases = {"num_experts": ("num_local_experts",)}
    # whether every layer routes (Qwen3.5-MoE) or the Qwen rule of mlp_only_layers and decoder_sparse_step
    all_moe = False
    dense = False

    def text_config(self, config):
        return config

    def spec(self, config, name):
        text = self.text_config(config)
        r = self.reader(text)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        types = hybrid_types(r, n)
        fields = {}
        if self.dense:
            routes = [False] * n
            kinds = types
            table = {k: {"attention": m, "mlp": "dense"} for k, m in MECHANISMS.items()}
        else:
            experts = r.int("num_experts", minimum=0)
            top_k = r.int("num_experts_per_tok")
            check_experts(r, experts, top_k)
            routes = [True] * n if self.all_moe else moe_layers(r, n, experts)
            fields = dict(num_experts=experts, num_experts_per_tok=top_k, num_shared_experts=1,
                          moe_intermediate_size=r.int("moe_intermediate_size"),
                          shared_expert_intermediate_size=r.int("shared_expert_intermediate_size"))
            kinds = [t if moe else f"{t}_dense" for t, moe in zip(types, routes)]
            table = hybrid_table()
        # every layer routing (Qwen3.5-MoE, or Qwen3-Next without dense layers) needs no dense width
        intermediate = r.int("intermediate_size", None) if all(routes) else r.int("intermediate_size")
        return self.build(
            r, name, str(config.get("model_type") or self.model_types[0]), kinds, table,
            extra={"output_gate": True, "qk_norm": True, "shared_expert_gate": True},
            vocab_size=r.int("vocab_size"), intermediate_size=intermediate,
            tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=r.bool("attention_bias"),
            mlp_bias=False, max_position_embeddings=r.int("max_position_embeddings"), **linear_fields(r), **fields,
            **att)


ndcost_register = register_family(Qwen3NextFamily())
