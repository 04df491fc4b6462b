"""DeepSeek-V4: hyper-connected layers of shared-KV MQA with sliding, compressed-sparse (CSA) or heavily
compressed (HCA) attention, each with an MoE (top-k or hash-routed) and a shared expert.

Kinds are ``<attention>_<mlp>``: ``sliding``, ``csa`` or ``hca``, then ``moe`` or
``hash_moe`` (``hca_hash_moe``, ``csa_moe``, ...). Each layer's two
hyper-connections and the model's hyper-connection head are part ``other``;
the compressors, the indexer and the sinks are part of the attention. Buffers
counted: the top-k routers' score-correction biases (the hash layers'
token-to-expert table is an integer lookup, not counted). The MTP layers
(``num_nextn_predict_layers``) are not built by Transformers; each is counted
as a sliding-attention MoE layer with DeepSeek's MTP glue. The layers cannot be
measured alone (the residual is ``hc_mult`` streams): ``stack_census``. Without a
census the analytic FLOPs estimator prices them from ``analytic_attention``.
"""
from __future__ import annotations

from ndcost.errors import InvalidValue
from ndcost.models import check_divides, formula
from ndcost.plugins.families._base import DecoderFamily, check_experts, layer_types, register_family
from ndcost.plugins.formulas import deepseek_v4 as work

ATTENTION = {"sliding_attention": "sliding", "compressed_sparse_attention": "csa",
             "heavily_compressed_attention": "hca"}
RATIO_TO_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention", 128: "heavily_compressed_attention"}


class DeepseekV4Family(DecoderFamily):
    name = "deepseek_v4"
    model_types = ("deepseek_v4",)
    stack_census = True
    stack_census_reason = ("its layers exchange hc_mult hyper-connection streams ([b, s, hc, d]) and a mixing "
                           "state, take the model's pair of rotary flavours, and route their first MoE layers by a "
                           "hash of the input ids")
    # `ndcost verify deepseek-v4-flash`, 4,096 tokens under hf-cuda: the formulas keep 74,760 bytes a token outside
    # the routed experts where the census measures 470,612 (its norms 49,160 against 208,952 and 196,992 TP-split)
    formulas_unpriced = ("they price a plain layer of its widths, without its hyper-connection streams, compressors "
                         "and indexer: `ndcost verify` finds them keeping a sixth of what Transformers' layers keep")
    supports_sdpa = False  # DeepseekV4PreTrainedModel refuses SDPA: eager attention under hf-cuda
    # its eager_attention_forward's softmax (sinks) runs in the compute dtype: no fp32 copy kept
    op_record_values = {"softmax_upcast": 0}
    # DeepseekV4Model.forward: ``self.norm(self.hc_head(hidden_states))`` on the hc_mult streams
    output_prelude = ("hc_head",)
    output_streams = "hc_mult"
    defaults = dict(vocab_size=129280, hidden_size=4096, moe_intermediate_size=2048, num_hidden_layers=43,
                    num_attention_heads=64, num_key_value_heads=1, head_dim=512, q_lora_rank=1024,
                    num_experts_per_tok=6, n_routed_experts=256, n_shared_experts=1, max_position_embeddings=1048576,
                    hc_mult=4, sliding_window=128, o_groups=8, o_lora_rank=1024, index_n_heads=64,
                    index_head_dim=128, index_topk=512, num_nextn_predict_layers=1, tie_word_embeddings=False,
                    attention_bias=False, mlp_bias=False, swiglu_limit=10.0)
    aliases = {"n_routed_experts": ("num_local_experts",)}

    def spec(self, config, name):
        r = self.reader(config)
        hidden = r.int("hidden_size")
        heads = r.int("num_attention_heads")
        head_dim = r.int("head_dim")
        n = r.int("num_hidden_layers")
        o_groups = r.int("o_groups")
        check_divides(self.name, "o_groups", o_groups, heads * head_dim, "num_attention_heads * head_dim")
        rates = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
        rates.update(dict(config.get("compress_rates") or {}))
        if config.get("compress_rate_csa") is not None:
            rates["compressed_sparse_attention"] = int(config["compress_rate_csa"])
        if config.get("compress_rate_hca") is not None:
            rates["heavily_compressed_attention"] = int(config["compress_rate_hca"])
        types = layer_types(r, n)
        if types is None and config.get("compress_ratios") is not None:
            try:
                types = [RATIO_TO_TYPE[int(x)] for x in list(config["compress_ratios"])[:n]]
            except KeyError as exc:
                raise InvalidValue(f"{self.name} config: compress_ratios has {exc.args[0]}; "
                                   f"known ratios: 0, 4, 128") from None
        if types is None:
            types = (["heavily_compressed_attention"] * min(n, 2)
                     + ["compressed_sparse_attention" if i % 2 else "heavily_compressed_attention"
                        for i in range(max(n - 2, 0))])
        bad = sorted(set(types) - set(ATTENTION))
        if bad:
            raise InvalidValue(f"{self.name} config: layer_types {bad} unknown; known: {', '.join(ATTENTION)}")
        mlp = layer_types(r, n, "mlp_layer_types")
        if mlp is None:
            hashed = min(n, int(config.get("num_hash_layers") if config.get("num_hash_layers") is not None else 3))
            mlp = ["hash_moe"] * hashed + ["moe"] * (n - hashed)
        bad = sorted(set(mlp) - {"moe", "hash_moe"})
        if bad:
            raise InvalidValue(f"{self.name} config: mlp_layer_types {bad} unknown; known: moe, hash_moe")
        kinds = [f"{ATTENTION[a]}_{m}" for a, m in zip(types, mlp)]
        table = {f"{ATTENTION[a]}_{m}": {"attention": a, "mlp": m} for a in ATTENTION for m in ("moe", "hash_moe")}
        table["mtp"] = {"attention": "sliding_attention", "mlp": "moe", "mtp": True}
        experts = r.int("n_routed_experts")
        top_k = r.int("num_experts_per_tok")
        check_experts(r, experts, top_k)
        width = r.int("moe_intermediate_size")
        # the rotated slice of a head: partial_rotary_factor, else legacy qk_rope_head_dim, else Transformers'
        # default 64 / 512 (DeepseekV4Config.default_partial_rotary_factor)
        factor = config.get("partial_rotary_factor")
        if factor is None:
            factor = (config["qk_rope_head_dim"] / head_dim) if config.get("qk_rope_head_dim") else 64 / 512
        extra = {"hc_mult": r.int("hc_mult"), "o_groups": o_groups, "o_lora_rank": r.int("o_lora_rank"),
                 "index_n_heads": r.int("index_n_heads"), "index_head_dim": r.int("index_head_dim"),
                 "index_topk": r.int("index_topk"), "compress_rates": rates, "sliding_window": r.int("sliding_window"),
                 "hc_sinkhorn_iters": int(config.get("hc_sinkhorn_iters") or 20), "rope_dim": int(head_dim * factor)}
        return self.build(
            r, name, "deepseek_v4", kinds, table, mtp=r.int("num_nextn_predict_layers", minimum=0), extra=extra,
            hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=r.int("num_key_value_heads"),
            head_dim=head_dim, vocab_size=r.int("vocab_size"), intermediate_size=width,
            q_lora_rank=r.int("q_lora_rank"), num_experts=experts, num_experts_per_tok=top_k,
            num_shared_experts=r.int("n_shared_experts", minimum=0), moe_intermediate_size=width,
            shared_expert_intermediate_size=width, tie_word_embeddings=r.bool("tie_word_embeddings"),
            attention_bias=False, mlp_bias=r.bool("mlp_bias"), max_position_embeddings=r.int("max_position_embeddings"))

    def add_attention(self, parts, spec, info):
        ex = spec.extra
        h, d = spec.hidden_size, spec.head_dim
        parts["attention"] += formula("deepseek_v4.params.attention")(
            hidden=h, heads=spec.num_attention_heads, head_dim=d, q_lora_rank=spec.q_lora_rank,
            o_groups=ex["o_groups"], o_lora_rank=ex["o_lora_rank"])
        kind = info.attention
        if kind == "sliding_attention":
            return
        rate = int(ex["compress_rates"][kind])
        overlap = kind == "compressed_sparse_attention"
        parts["attention"] += formula("deepseek_v4.params.compressor")(hidden=h, head_dim=d, rate=rate, overlap=overlap)
        if overlap:
            parts["attention"] += formula("deepseek_v4.params.indexer")(
                hidden=h, q_lora_rank=spec.q_lora_rank, index_heads=ex["index_n_heads"],
                index_head_dim=ex["index_head_dim"], rate=rate)

    def analytic_attention(self, spec, info, norm_elements):
        """What plugins/estimators/flops.py counts of a kind's attention and its hyper-connections (the formulas'
        ``attention_matmuls`` ..., plugins/formulas/deepseek_v4.py): matmuls by part, the sparse kernel's scores
        and the entries a query gathers at a sequence length, heads, CP's widths, elementwise traffic, launches."""
        ex = spec.extra
        h, d, heads = spec.hidden_size, spec.head_dim, spec.num_attention_heads
        rate = int(ex["compress_rates"].get(info.attention, 0))
        overlap = info.attention == "compressed_sparse_attention"
        index_heads, index_dim, window = ex["index_n_heads"], ex["index_head_dim"], ex["sliding_window"]
        attention = work.attention_matmuls(hidden=h, heads=heads, head_dim=d, q_lora_rank=spec.q_lora_rank,
                                           o_groups=ex["o_groups"], o_lora_rank=ex["o_lora_rank"], rate=rate,
                                           overlap=overlap, index_heads=index_heads, index_head_dim=index_dim)

        def gathered(seq):
            """Compressed entries a query gathers (CSA: the indexer's top-k; HCA: all), and all there are."""
            compressed = formula("deepseek_v4.flops.compressed_entries")(seq=seq, rate=rate)
            return (min(ex["index_topk"], compressed) if overlap else compressed), compressed

        def window_at(seq):
            return min(window or seq, seq) + gathered(seq)[0]

        def scores(seq, all_pairs=False):
            selected, compressed = gathered(seq)
            pairs = seq * (seq + compressed) if all_pairs else formula("deepseek_v4.flops.sparse_pairs")(
                seq=seq, window=window, compressed=compressed, selected=selected)
            indexer = formula("deepseek_v4.flops.indexer_scores")(
                seq=seq, index_heads=index_heads, index_head_dim=index_dim, compressed=compressed) if overlap else 0
            return 4 * heads * d * pairs + indexer  # Q K^T and P V, K = V one shared head of width d

        split, whole = work.attention_elements(heads=heads, head_dim=d, rope_dim=ex["rope_dim"],
                                               q_lora_rank=spec.q_lora_rank, rate=rate, overlap=overlap,
                                               index_heads=index_heads, index_head_dim=index_dim, norm=norm_elements)
        return {"matmuls": {"attention": attention,
                            "other": work.hyper_connection_matmuls(hidden=h, hc_mult=ex["hc_mult"])},
                "scores": scores, "window": window_at, "heads": (heads, d, d), "query_elements": heads * d,
                # eager attention scores every query against the sequence and all compressed entries
                "extra_keys_per_token": 1.0 / rate if rate else 0.0,
                # the shared K=V a token, and its share of the compressed entries (and the indexer's keys)
                "kv_elements": d + ((d + (index_dim if overlap else 0)) // rate if rate else 0),
                "elementwise": split, "replicated": whole
                + work.hyper_connection_elements(hidden=h, hc_mult=ex["hc_mult"]),
                "launches": work.attention_launches(rate=rate, overlap=overlap)
                + work.hyper_connection_launches(sinkhorn_iters=ex["hc_sinkhorn_iters"])}

    def add_mlp(self, parts, spec, info):
        h = spec.hidden_size
        parts["routed"] += formula("moe.params.routed")(hidden=h, experts=spec.num_experts,
                                                        intermediate=spec.moe_intermediate_size, bias=False)
        if info.mlp == "hash_moe":
            parts["router"] += formula("deepseek_v4.params.hash_router")(hidden=h, experts=spec.num_experts)
        else:
            parts["router"] += formula("moe.params.router")(hidden=h, experts=spec.num_experts)
        parts["shared"] += formula("moe.params.shared")(hidden=h, intermediate=spec.shared_expert_intermediate_size,
                                                        bias=spec.mlp_bias)

    def add_other(self, parts, spec, info):
        parts["other"] += 2 * formula("deepseek_v4.params.hyper_connection")(hidden=spec.hidden_size,
                                                                             hc_mult=spec.extra["hc_mult"])

    def other_parameters(self, spec):
        return formula("deepseek_v4.params.hyper_head")(hidden=spec.hidden_size, hc_mult=spec.extra["hc_mult"])

    def buffers(self, spec):
        moe = sum(g.count for g in spec.layers if not g.mtp and spec.kind(g.kind).mlp == "moe")
        return moe * spec.num_experts


ndcost_register = register_family(DeepseekV4Family())
