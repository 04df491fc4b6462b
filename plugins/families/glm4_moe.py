"""GLM-4.5 (glm4_moe): GQA with query/key/value biases where stated and an optional QK-norm,
``first_k_dense_replace`` dense layers then MoE with shared experts, and MTP layers Transformers does not build.

The routers' score-correction biases are buffers (counted in ``buffers``).
"""
from __future__ import annotations

from ndcost.errors import InvalidValue
from ndcost.plugins.families._base import (DecoderFamily, check_experts, read_attention, read_expert_groups,
                                            register_family)
from ndcost.plugins.families.deepseek_v3 import group_limited_selection_bytes

KINDS = {"dense": {"attention": "gqa", "mlp": "dense"}, "moe": {"attention": "gqa", "mlp": "moe"},
         "mtp": {"attention": "gqa", "mlp": "moe", "mtp": True}}


class Glm4MoeFamily(DecoderFamily):
    name = "glm4_moe"
    model_types = ("glm4_moe",)
    # its layers make the calls specs/op_records.yaml lists; the router casts to fp32 before its matmul
    op_record_values = {"calls_known": 1, "router_logit_bytes": 4}
    # its group-limited router (Glm4MoeTopkRouter.forward, DeepseekV3TopkRouter's code): the casts to fp32, the
    # linear, the sigmoid and the bias, the groups' top-2 and sum, their top-k, the group mask (zeros, scatter,
    # expanded copy, its negation), the masked fill, the top-k, the weights' gather, sum, epsilon, division (and its
    # copy under autograd) and scaling; with its one group the census counts one fewer than on DeepSeek-V3's 20
    kernel_launches = {"router": 19}
    defaults = dict(vocab_size=151552, hidden_size=4096, intermediate_size=10944, num_hidden_layers=46,
                    num_attention_heads=96, num_key_value_heads=8, max_position_embeddings=131072,
                    tie_word_embeddings=False, attention_bias=False, moe_intermediate_size=1408,
                    num_experts_per_tok=8, n_shared_experts=1, n_routed_experts=128, first_k_dense_replace=1,
                    use_qk_norm=False, num_nextn_predict_layers=1, n_group=1, topk_group=1,
                    partial_rotary_factor=0.5)
    aliases = {"n_routed_experts": ("num_local_experts",), "num_nextn_predict_layers": ("num_mtp_layers",)}

    def router_selection_bytes(self, spec) -> int:
        return group_limited_selection_bytes(spec)  # DeepseekV3TopkRouter's code

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        experts = r.int("n_routed_experts")
        top_k = r.int("num_experts_per_tok")
        check_experts(r, experts, top_k)
        first = r.int("first_k_dense_replace", minimum=0)
        if first > n:
            raise InvalidValue(f"{self.name} config: first_k_dense_replace {first} exceeds num_hidden_layers {n}")
        moe_width = r.int("moe_intermediate_size")
        shared = r.int("n_shared_experts", minimum=0)
        bias = r.bool("attention_bias")
        return self.build(
            r, name, "glm4_moe", ["dense"] * first + ["moe"] * (n - first), KINDS,
            mtp=r.int("num_nextn_predict_layers", minimum=0),
            extra={"qkv_bias": bias, "o_bias": False, "qk_norm": r.bool("use_qk_norm")},
            vocab_size=r.int("vocab_size"), intermediate_size=r.int("intermediate_size"),
            num_experts=experts, num_shared_experts=shared, num_experts_per_tok=top_k,
            moe_intermediate_size=moe_width, shared_expert_intermediate_size=shared * moe_width,
            first_k_dense=first, tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=bias,
            mlp_bias=False, max_position_embeddings=r.int("max_position_embeddings"), **att,
            **read_expert_groups(r, experts, top_k))

    def buffers(self, spec):
        moe = sum(g.count for g in spec.layers if not g.mtp and spec.kind(g.kind).mlp == "moe")
        return moe * spec.num_experts


ndcost_register = register_family(Glm4MoeFamily())
