"""DeepSeek-V2: V3's layers (MLA, with or without a query latent; dense then MoE layers with shared experts) behind
a softmax router, greedy or limited to the best groups (``topk_method``), no MTP layers and no score-correction
biases (Transformers' ``DeepseekV2TopkRouter``).

torchtitan runs these as its ``deepseek_v3`` flavors ``16B`` (DeepSeek-V2-Lite's widths) and ``236B``
(DeepSeek-V2's).
"""
from __future__ import annotations

from ndcost.errors import InvalidValue
from ndcost.plugins.families._base import register_family
from ndcost.plugins.families.deepseek_v3 import DeepseekV3Family, group_limited_selection_bytes

TOPK_METHODS = ("greedy", "group_limited_greedy")


class DeepseekV2Family(DeepseekV3Family):
    name = "deepseek_v2"
    model_types = ("deepseek_v2",)
    # its layers make the calls specs/op_records.yaml lists (V3's: its router's are a linear and no others a policy
    # saves); the router casts to fp32 before its matmul
    op_record_values = {"calls_known": 1, "router_logit_bytes": 4}
    # DeepseekV2TopkRouter.forward: the input's and the weight's fp32 copies, the linear, the softmax, top-k and
    # the scaling (greedy; the census counts 6). Left out of the formulas' count: the 8 group_limited_greedy
    # adds (the groups' max and top-k, the mask's zeros, scatter, expanded copy, bool and negation, the masked
    # fill), which the census counts
    kernel_launches = {"router": 6}
    defaults = dict(vocab_size=102400, hidden_size=4096, intermediate_size=11008, moe_intermediate_size=1407,
                    num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=None, n_shared_experts=2,
                    n_routed_experts=64, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128,
                    qk_nope_head_dim=128, num_experts_per_tok=None, first_k_dense_replace=0,
                    max_position_embeddings=2048, tie_word_embeddings=False, attention_bias=False,
                    num_nextn_predict_layers=0, n_group=None, topk_group=None, topk_method="greedy")

    def spec(self, config, name):
        method = self.reader(config).get("topk_method")
        if method not in TOPK_METHODS:
            raise InvalidValue(f"{self.name} config: topk_method {method!r} is not one of Transformers' "
                               f"({', '.join(TOPK_METHODS)})")
        if method == "greedy":  # the groups limit nothing: DeepseekV2TopkRouter reads them only when limited
            config = {**config, "n_group": 1, "topk_group": 1}
        return super().spec(config, name)

    def buffers(self, spec):
        return 0

    def router_selection_bytes(self, spec):
        """group_limited_greedy's group mask, V3's (its tensors need no gradient); greedy selects under autograd."""
        return group_limited_selection_bytes(spec) if spec.expert_groups else 0


ndcost_register = register_family(DeepseekV2Family())
