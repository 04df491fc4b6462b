"""The decoder machinery families share: reading the common fields, describing each layer kind, and a
layer's parameters by part.

A family's ``spec`` gives a table of its kinds, ``{kind: {"attention": mechanism, "mlp": "dense" | "moe"
| ..., "mtp": bool, "sliding": bool, "mechanism_class": str}}``, and the choices every kind shares (QK-norm, an output gate,
sinks, rotary positions, the MLP's matrices); :meth:`DecoderFamily.build` turns them into the
:class:`~ndcost.layer.LayerKind` of each kind (``ModelSpec.kind_specs``), which is what the estimators
read. The mechanisms are ``gqa`` (MHA/GQA/MQA with the spec's biases, QK-norm, output gate and sinks),
``mla``, ``dsa`` (MLA with the V3.2 indexer) and ``gated_delta_net``. The layer's parameters compose the
formula slots from that description, so most families only read their config.
"""
from __future__ import annotations

from collections import Counter
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.layer import LayerKind
from ndcost.models import ConfigReader, Family, check_heads, formula, groups_of
from ndcost.values import ModelSpec

# The config keys Transformers' families name their dropout probabilities by.
ATTENTION_DROPOUT_KEYS = ("attn_pdrop", "attention_dropout", "attention_probs_dropout_prob")
HIDDEN_DROPOUT_KEYS = ("resid_pdrop", "hidden_dropout", "hidden_dropout_prob")


def kind_table(**kinds: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {name: dict(info) for name, info in kinds.items()}


def read_attention(r: ConfigReader, *, head_dim_field: Optional[str] = "head_dim") -> Dict[str, Any]:
    """hidden, heads, KV heads and head width, checked: heads divide hidden where the head width is derived."""
    hidden = r.int("hidden_size")
    heads = r.int("num_attention_heads")
    kv = r.int("num_key_value_heads", heads)
    stated = head_dim_field is not None and r.has(head_dim_field)
    head_dim = r.int(head_dim_field) if stated else None
    check_heads(r.family, hidden, heads, kv, stated)
    if head_dim is None:
        head_dim = hidden // heads
    return {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": head_dim}


def layer_types(r: ConfigReader, n: int, field: str = "layer_types") -> Optional[List[str]]:
    types = r.config.get(field)
    if types is None:
        return None
    if not isinstance(types, (list, tuple)) or not all(isinstance(t, str) for t in types):
        raise InvalidValue(f"{r.family} config: {field} must be a list of layer type names, one a layer, "
                           f"got {types!r:.80}")
    types = list(types)
    if len(types) < n:
        raise InvalidValue(f"{r.family} config: {field} lists {len(types)} layers but num_hidden_layers is {n}")
    return types[:n]


def check_experts(r: ConfigReader, experts: int, top_k: Optional[int]) -> None:
    if top_k is not None and top_k > experts:
        raise InvalidValue(f"{r.family} config: num_experts_per_tok {top_k} exceeds the {experts} routed experts")


def read_expert_groups(r: ConfigReader, experts: int, top_k: Optional[int]) -> Dict[str, int]:
    """Group-limited routing (``n_group``, ``topk_group``: DeepSeek-V3's ``DeepseekV3TopkRouter`` picks a token's
    experts within its ``topk_group`` best of ``n_group`` equal groups) as ModelSpec fields; none where the
    groups limit nothing (one group, or every group allowed)."""
    groups, allowed = r.int("n_group"), r.int("topk_group")
    if groups is None or allowed is None:
        return {}
    if experts % groups:
        raise InvalidValue(f"{r.family} config: n_group {groups} does not divide the {experts} routed experts")
    if allowed > groups:
        raise InvalidValue(f"{r.family} config: topk_group {allowed} exceeds n_group {groups}")
    if top_k is not None and top_k > allowed * (experts // groups):
        raise InvalidValue(f"{r.family} config: num_experts_per_tok {top_k} exceeds the "
                           f"{allowed * (experts // groups)} experts of topk_group {allowed} groups")
    if allowed == groups:
        return {}
    return {"expert_groups": groups, "expert_groups_per_token": allowed}


def _probability(config: Mapping[str, Any], keys: Sequence[str], default: float) -> float:
    for key in keys:
        if config.get(key) is not None:
            return float(config[key])
    return default


class DecoderFamily(Family):
    """A decoder whose layers are an attention, two norms and an MLP, each kind a :class:`LayerKind`."""

    # Whether the attention rotates queries and keys (False: learned absolute positions, GPT-2's).
    rotary: bool = True
    # GPT-2's config defaults its dropouts to 0.1; most families' to 0.
    default_dropout: float = 0.0
    # the activation the config class defaults to where a config states none (Transformers' LlamaConfig,
    # Qwen2/3(-MoE), Mixtral, DeepseekV3, Glm4Moe: hidden_act="silu")
    default_activation: str = "silu"

    def build(self, r: ConfigReader, name: str, model_type: str, kinds: Sequence[str],
              table: Mapping[str, Mapping[str, Any]], *, mtp: int = 0, mtp_kind: str = "mtp",
              extra: Optional[Mapping[str, Any]] = None, **fields: Any) -> ModelSpec:
        """A ModelSpec with the layers in model order as groups and *table* describing each kind.

        The choices every kind shares are read from *extra* (``qk_norm``, ``output_gate``, ``sinks``,
        ``ffn_matrices``) and the config (activation, dropouts, the sliding window).
        """
        used = set(kinds) | ({mtp_kind} if mtp else set())
        ex = {"fields_read": tuple(r.read)}
        ex.update(extra or {})
        described = {kind: self.layer_kind(r.config, ex, info) for kind, info in table.items() if kind in used}
        return ModelSpec(name=name, model_type=model_type, family=self.name,
                         layers=groups_of(kinds, mtp_kind, mtp), kind_specs=described, extra=ex, **fields)

    def layer_kind(self, config: Mapping[str, Any], extra: Mapping[str, Any], info: Mapping[str, Any]) -> LayerKind:
        """One kind of the table as a LayerKind, with the choices the family's layers share."""
        window = config.get("sliding_window") or config.get("window_size") or 0 if info.get("sliding") else 0
        return LayerKind(
            attention=info["attention"], mlp=info["mlp"], mtp=bool(info.get("mtp", False)),
            mechanism_class=info.get("mechanism_class"),
            qk_norm=bool(extra.get("qk_norm", False)), output_gate=bool(extra.get("output_gate", False)),
            sinks=bool(extra.get("sinks", False)), rotary=self.rotary, sliding_window=int(window),
            masked=bool(extra.get("masked", False)),
            mlp_matrices=int(extra.get("ffn_matrices", 3)),
            activation=str(config.get("hidden_act") or config.get("activation_function") or self.default_activation),
            attention_dropout=_probability(config, ATTENTION_DROPOUT_KEYS, self.default_dropout),
            hidden_dropout=_probability(config, HIDDEN_DROPOUT_KEYS, self.default_dropout))

    # -- a layer --------------------------------------------------------------
    def layer_parameters(self, spec: ModelSpec, kind: str) -> Dict[str, int]:
        info = spec.kind(kind)
        parts: Counter = Counter()
        self.add_attention(parts, spec, info)
        parts["norm"] += formula("norm.params.layer")(hidden=spec.hidden_size,
                                                      norms=spec.extra.get("layer_norms", 2),
                                                      bias=spec.extra.get("norm_bias", False))
        self.add_mlp(parts, spec, info)
        if info.mtp:
            parts["mtp"] += formula("mtp.params.glue")(hidden=spec.hidden_size)
        self.add_other(parts, spec, info)
        return dict(parts)

    def add_attention(self, parts: Counter, spec: ModelSpec, info: LayerKind) -> None:
        mechanism = info.attention
        ex = spec.extra
        h, heads, d = spec.hidden_size, spec.num_attention_heads, spec.resolved_head_dim
        if mechanism == "gqa":
            qkv_bias = spec.qkv_bias
            parts["attention"] += formula("attention.params.gqa")(
                hidden=h, heads=heads, kv_heads=spec.num_key_value_heads or heads, head_dim=d,
                qkv_bias=qkv_bias, o_bias=spec.o_bias)
            if info.output_gate:
                parts["attention"] += formula("attention.params.output_gate")(
                    hidden=h, heads=heads, head_dim=d, qkv_bias=qkv_bias)
            if info.sinks:
                parts["attention"] += formula("attention.params.sinks")(heads=heads)
            if info.qk_norm:
                parts["norm"] += formula("norm.params.qk")(head_dim=d)
        elif mechanism in ("mla", "dsa"):
            parts["attention"] += formula("attention.params.mla")(
                hidden=h, heads=heads, q_lora_rank=spec.q_lora_rank, kv_lora_rank=spec.kv_lora_rank,
                qk_nope_head_dim=spec.qk_nope_head_dim, qk_rope_head_dim=spec.qk_rope_head_dim,
                v_head_dim=spec.v_head_dim, attention_bias=spec.attention_bias)
            if mechanism == "dsa":
                parts["attention"] += formula("attention.params.dsa_indexer")(
                    hidden=h, q_lora_rank=spec.q_lora_rank, index_heads=ex["index_n_heads"],
                    index_head_dim=ex["index_head_dim"])
        elif mechanism == "gated_delta_net":
            parts["attention"] += formula("linear_attention.params.gated_delta_net")(
                hidden=h, key_heads=spec.linear_num_key_heads, value_heads=spec.linear_num_value_heads,
                key_head_dim=spec.linear_key_head_dim, value_head_dim=spec.linear_value_head_dim,
                conv_kernel=spec.linear_conv_kernel_dim)
        else:
            raise InvalidValue(f"family {self.name}: unknown attention mechanism {mechanism!r}")

    def add_mlp(self, parts: Counter, spec: ModelSpec, info: LayerKind) -> None:
        mlp = info.mlp
        ex = spec.extra
        h = spec.hidden_size
        matrices = info.mlp_matrices
        if mlp == "dense":
            parts["ffn"] += formula("ffn.params.dense")(hidden=h, intermediate=spec.intermediate_size,
                                                        matrices=matrices, bias=spec.mlp_bias)
        elif mlp == "moe":
            parts["routed"] += formula("moe.params.routed")(
                hidden=h, experts=spec.num_experts, intermediate=spec.moe_intermediate_size, matrices=matrices,
                bias=ex.get("expert_bias", spec.mlp_bias))
            parts["router"] += formula("moe.params.router")(hidden=h, experts=spec.num_experts,
                                                            bias=bool(ex.get("router_bias", False)))
            shared = spec.shared_expert_intermediate_size or 0
            if shared:
                parts["shared"] += formula("moe.params.shared")(
                    hidden=h, intermediate=shared, matrices=matrices, bias=spec.mlp_bias,
                    gate=bool(ex.get("shared_expert_gate", False)))
        elif mlp != "none":
            raise InvalidValue(f"family {self.name}: unknown MLP {mlp!r}")

    def add_other(self, parts: Counter, spec: ModelSpec, info: LayerKind) -> None:
        """Anything else a family's layer holds (DeepSeek-V4's hyper-connections)."""


def register_family(*families: Family):
    """A ``ndcost_register`` hook registering each of *families* under each of its model types."""

    @hookimpl
    def ndcost_register(register):
        for family in families:
            for model_type in family.model_types:
                register(f"family/{model_type}", family)

    return ndcost_register


ATTENTION_KINDS = {"dense": {"attention": "gqa", "mlp": "dense"},
                   "full_attention": {"attention": "gqa", "mlp": "dense"},
                   "sliding_attention": {"attention": "gqa", "mlp": "dense", "sliding": True}}


def dense_kinds(r: ConfigReader, n: int) -> List[str]:
    """``dense`` for every layer, or the config's layer types where they differ (sliding and full attention)."""
    types = layer_types(r, n)
    if types is None and r.config.get("use_sliding_window") and r.config.get("sliding_window"):
        # Qwen2/Qwen3's rule where the config lists no layer types: sliding from max_window_layers on
        first = r.int("max_window_layers", 28, minimum=0)
        types = ["sliding_attention" if i >= first else "full_attention" for i in range(n)]
    if types and len(set(types)) > 1:
        unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise InvalidValue(f"{r.family} config: layer_types {', '.join(unknown)} are not known to the "
                               f"family; known: full_attention, sliding_attention")
        return types
    return ["dense"] * n


def moe_layers(r: ConfigReader, n: int, experts: int) -> List[bool]:
    """Which layers route (Qwen's rule): not in ``mlp_only_layers``, and every ``decoder_sparse_step``-th."""
    step = r.int("decoder_sparse_step")
    only = set(r.get("mlp_only_layers", None) or ())
    bad = sorted(i for i in only if not isinstance(i, int) or not 0 <= i < n)
    if bad:
        raise InvalidValue(f"{r.family} config: mlp_only_layers {bad} are outside layers 0..{n - 1}")
    return [i not in only and experts > 0 and (i + 1) % step == 0 for i in range(n)]
