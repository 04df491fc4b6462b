"""GPT-OSS: GQA with biases on every projection and learned sinks, every layer MoE with biased experts and router.

Layers alternate ``sliding_attention`` and ``full_attention`` (``layer_types``);
both hold the same parameters.
"""
from __future__ import annotations

from ndcost.errors import InvalidValue
from ndcost.models import formula
from ndcost.plugins.families._base import (DecoderFamily, check_experts, layer_types, read_attention,
                                           register_family)

# GPT-OSS's attention is GQA with a learned sink a head (softmax attention, priced as such)
KINDS = {"sliding_attention": {"attention": "gpt_oss", "mlp": "gpt_oss", "sliding": True,
                               "mechanism_class": "softmax"},
         "full_attention": {"attention": "gpt_oss", "mlp": "gpt_oss", "mechanism_class": "softmax"}}


class GptOssFamily(DecoderFamily):
    name = "gpt_oss"
    model_types = ("gpt_oss",)
    supports_sdpa = False  # its sinks: GptOssPreTrainedModel refuses SDPA, so hf-cuda runs eager attention
    # GptOssRMSNorm returns (weight * x).to(dtype): the weight multiply keeps the fp32 normalized tensor (8 bytes
    # an element with the fp32 input, not LlamaRMSNorm's 6), and moves 20 two-byte elements an element, not 18
    # its layers make the calls specs/op_records.yaml lists (every projection and the router with a bias)
    # its sinks' softmax runs in the compute dtype (its eager_attention_forward): no fp32 copy kept
    # its experts' clamped SwiGLU (GptOssExperts._apply_gate) keeps six expert-wide tensors a token copy, where an
    # unfused gated SiLU keeps three: the interleaved gate-up output (two), the clamped gate, its sigmoid, up + 1
    # and their product
    # its rotary tables hold one frequency a pair of channels (GptOssRotaryEmbedding.forward: emb = freqs)
    op_record_values = {"norm_bytes": 8, "calls_known": 1, "router_bias": 1, "softmax_upcast": 0,
                        "expert_act_widths": 6, "rotary_table_fraction": 0.5}
    # its experts' GptOssExperts._apply_gate, eager: the two clamps, gate * alpha and its sigmoid (each a read and
    # a write), their product and (up + 1) * glu (two reads, a write each), up + 1 (a read, a write): 16 elements an
    # expert-width element in 7 kernels, where SiLU times up moves 5 in 2
    elementwise_elements = {"norm": 20, "expert_act": 16}
    # its router (GptOssTopKRouter.forward): the linear with its bias, top-k over the logits, the softmax of the k;
    # its _apply_rotary_emb: two products and their difference, two more and their sum, the concatenation; its eager
    # attention beyond an SDPA call: Llama's 7 (ndcost.work.EAGER_ATTENTION_LAUNCHES) and the sinks' concatenation,
    # max and subtraction, its softmax in the compute dtype (no cast back) and no dropout kernel: 8 as the census counts
    kernel_launches = {"router": 3, "expert_act": 7, "rotary": 7, "eager_attention": 8}
    defaults = dict(num_hidden_layers=36, num_local_experts=128, vocab_size=201088, hidden_size=2880,
                    intermediate_size=2880, head_dim=64, num_attention_heads=64, num_key_value_heads=8,
                    tie_word_embeddings=False, max_position_embeddings=131072, num_experts_per_tok=4,
                    attention_bias=True)
    aliases = {"num_local_experts": ("num_experts",)}

    def spec(self, config, name):
        r = self.reader(config)
        att = read_attention(r)
        n = r.int("num_hidden_layers")
        types = layer_types(r, n) or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n)]
        bad = sorted(set(types) - set(KINDS))
        if bad:
            raise InvalidValue(f"{self.name} config: layer_types {bad} are not sliding_attention or full_attention")
        experts = r.int("num_local_experts")
        top_k = r.int("num_experts_per_tok")
        check_experts(r, experts, top_k)
        width = r.int("intermediate_size")
        return self.build(
            r, name, "gpt_oss", types, KINDS, extra={"sinks": True, "router_bias": True, "expert_bias": True},
            vocab_size=r.int("vocab_size"), intermediate_size=width, moe_intermediate_size=width,
            num_experts=experts, num_experts_per_tok=top_k, num_shared_experts=0,
            tie_word_embeddings=r.bool("tie_word_embeddings"), attention_bias=r.bool("attention_bias"),
            mlp_bias=True, max_position_embeddings=r.int("max_position_embeddings"), **att)

    def add_attention(self, parts, spec, info):
        if info.attention != "gpt_oss":
            return super().add_attention(parts, spec, info)
        parts["attention"] += formula("gpt_oss.params.attention")(
            hidden=spec.hidden_size, heads=spec.num_attention_heads, kv_heads=spec.num_key_value_heads,
            head_dim=spec.resolved_head_dim, bias=bool(spec.attention_bias))

    def add_mlp(self, parts, spec, info):
        if info.mlp != "gpt_oss":
            return super().add_mlp(parts, spec, info)
        parts["routed"] += formula("gpt_oss.params.experts")(
            hidden=spec.hidden_size, experts=spec.num_experts, intermediate=spec.moe_intermediate_size)
        parts["router"] += formula("gpt_oss.params.router")(hidden=spec.hidden_size, experts=spec.num_experts)


ndcost_register = register_family(GptOssFamily())
