"""DeepSeek-V3: MLA (with or without a query latent), ``first_k_dense_replace`` dense layers then MoE layers
with shared experts, and ``num_nextn_predict_layers`` MTP layers that Transformers does not build.

``head_dim`` is the query/key head width (``qk_nope_head_dim + qk_rope_head_dim``,
what the attention scores contract over); Transformers' own ``head_dim`` is the
rotary width. The routers' score-correction biases are buffers in Transformers; the
published total (671,026,419,200 for V3) counts them, so it is
``published_total`` here.
"""
from __future__ import annotations

from ndcost.errors import InvalidValue
from ndcost.models import check_heads
from ndcost.plugins.families._base import DecoderFamily, check_experts, read_expert_groups, register_family

KINDS = {"dense": {"attention": "mla", "mlp": "dense"}, "moe": {"attention": "mla", "mlp": "moe"},
         "mtp": {"attention": "mla", "mlp": "moe", "mtp": True}}


def group_limited_selection_bytes(spec) -> int:
    """What DeepSeek-V3's router (``get_topk_indices``, under no_grad) moves a token choosing its experts, as the
    census counts it: the group mask made (zeros_like, 8 bytes a group) and scattered (8 a group, 8 an allowed
    group's int64 index), expanded to the experts (a copy, 8 an expert, where there is more than one group: with
    one the expansion reshapes as a view), cast to bool (5) and negated (2). Groups that limit nothing leave the
    spec without them (read_expert_groups): priced as one group, the copy left out."""
    groups, allowed, experts = spec.expert_groups or 1, spec.expert_groups_per_token or 1, spec.num_experts or 0
    return 16 * groups + 8 * allowed + (15 if groups > 1 else 7) * experts


class DeepseekV3Family(DecoderFamily):
    name = "deepseek_v3"
    model_types = ("deepseek_v3",)
    # its layers make the calls specs/op_records.yaml lists; the router casts to fp32 before its matmul
    op_record_values = {"calls_known": 1, "router_logit_bytes": 4}
    # its group-limited router (DeepseekV3TopkRouter.forward): the casts to fp32, the linear, the sigmoid and the
    # bias, the groups' top-2 and sum, their top-k, the group mask (zeros, scatter, expanded copy, its negation),
    # the masked fill, the top-k, the weights' gather, sum, epsilon, division (and under autograd the copy of the
    # weights it divides in place, which the division's backward reads) and scaling
    kernel_launches = {"router": 20}
    attention = "mla"

    def router_selection_bytes(self, spec) -> int:
        return group_limited_selection_bytes(spec)

    defaults = dict(vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                    num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128, n_shared_experts=1,
                    n_routed_experts=256, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                    qk_nope_head_dim=128, num_experts_per_tok=8, first_k_dense_replace=3,
                    max_position_embeddings=4096, tie_word_embeddings=False, attention_bias=False,
                    num_nextn_predict_layers=1, n_group=8, topk_group=4)
    aliases = {"n_routed_experts": ("num_local_experts",), "num_nextn_predict_layers": ("num_mtp_layers",)}

    def mlp_kinds(self, r, n):
        first = r.int("first_k_dense_replace", minimum=0)
        if first > n:
            raise InvalidValue(f"{self.name} config: first_k_dense_replace {first} exceeds num_hidden_layers {n}")
        return ["dense"] * first + ["moe"] * (n - first), first

    def extra(self, r):
        return {}

    def spec(self, config, name):
        r = self.reader(config)
        hidden = r.int("hidden_size")
        heads = r.int("num_attention_heads")
        check_heads(self.name, hidden, heads, r.int("num_key_value_heads", heads), True)
        n = r.int("num_hidden_layers")
        experts = r.int("n_routed_experts")
        top_k = r.int("num_experts_per_tok")
        check_experts(r, experts, top_k)
        kinds, first = self.mlp_kinds(r, n)
        moe_width = r.int("moe_intermediate_size")
        shared = r.int("n_shared_experts", minimum=0)
        mtp = r.int("num_nextn_predict_layers", minimum=0)
        table = {k: dict(v, attention=self.attention) for k, v in KINDS.items()}
        return self.build(
            r, name, self.model_types[0], kinds, table, mtp=mtp, extra=self.extra(r),
            hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=r.int("num_key_value_heads", heads),
            head_dim=r.int("qk_nope_head_dim") + r.int("qk_rope_head_dim"), vocab_size=r.int("vocab_size"),
            intermediate_size=r.int("intermediate_size"), q_lora_rank=r.optional_int("q_lora_rank"),
            kv_lora_rank=r.int("kv_lora_rank"), qk_rope_head_dim=r.int("qk_rope_head_dim"),
            qk_nope_head_dim=r.int("qk_nope_head_dim"), v_head_dim=r.int("v_head_dim"),
            num_experts=experts, num_shared_experts=shared, num_experts_per_tok=top_k,
            moe_intermediate_size=moe_width, shared_expert_intermediate_size=shared * moe_width,
            first_k_dense=first, tie_word_embeddings=r.bool("tie_word_embeddings"),
            attention_bias=r.bool("attention_bias"), mlp_bias=False,
            max_position_embeddings=r.int("max_position_embeddings"), **read_expert_groups(r, experts, top_k))

    def buffers(self, spec):
        """One score-correction bias per routed expert in every MoE layer (MTP layers are not built)."""
        moe = sum(g.count for g in spec.layers if not g.mtp and spec.kind(g.kind).mlp == "moe")
        return moe * spec.num_experts

    def published_total(self, spec, total, buffers):
        stated = super().published_total(spec, total, buffers)
        if stated is not None:
            return stated
        return total + buffers if buffers else None


ndcost_register = register_family(DeepseekV3Family())
