"""DeepSeek-V3.2: V3's layers with DeepSeek sparse attention (MLA plus the lightning indexer on every layer).

Dense or MoE by ``mlp_layer_types`` (``dense``/``sparse``), else the first
``first_k_dense_replace`` layers dense. MTP layers where the config states
``num_nextn_predict_layers`` (Transformers' class has no such field: 0 unless stated).
"""
from __future__ import annotations

from ndcost.errors import InvalidValue
from ndcost.plugins.families._base import layer_types, register_family
from ndcost.plugins.families.deepseek_v3 import DeepseekV3Family


class DeepseekV32Family(DeepseekV3Family):
    name = "deepseek_v32"
    model_types = ("deepseek_v32",)
    # the indexer's calls are not among those the op records list (no calls_known); the router is V3's
    op_record_values = {"router_logit_bytes": 4}
    attention = "dsa"
    defaults = dict(DeepseekV3Family.defaults, max_position_embeddings=163840, index_head_dim=128,
                    index_n_heads=64, index_topk=2048, num_nextn_predict_layers=0)

    def mlp_kinds(self, r, n):
        types = layer_types(r, n, "mlp_layer_types")
        if types is None:
            return super().mlp_kinds(r, n)
        bad = sorted(set(types) - {"dense", "sparse"})
        if bad:
            raise InvalidValue(f"{self.name} config: mlp_layer_types {bad} are not 'dense' or 'sparse'")
        kinds = ["moe" if t == "sparse" else "dense" for t in types]
        return kinds, kinds.index("moe") if "moe" in kinds else n

    def extra(self, r):
        if r.optional_int("q_lora_rank") is None:
            raise InvalidValue(f"{self.name} config: the indexer needs q_lora_rank (a query latent); "
                               f"it is None")
        # DeepseekV32Model always builds the causal mask (allow_is_causal_skip=False), and each layer's attention
        # adds its indexer's top-k selection to it: an explicit mask at every length
        return {"index_n_heads": r.int("index_n_heads"), "index_head_dim": r.int("index_head_dim"),
                "index_topk": r.int("index_topk"), "masked": True}

    def published_total(self, spec, total, buffers):
        """Only where the spec states one: V3.2's card quotes its size with the MTP layer."""
        stated = spec.extra.get("published_total")
        return None if stated is None else int(stated)


ndcost_register = register_family(DeepseekV32Family())
