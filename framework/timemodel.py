"""The time model's work: each layer kind's FLOPs and bytes moved, from the census or analytic formulas.

The resolver prepares a :class:`ModelWork` once per model and sequence
length (each layer kind's forward work on one sequence, from the census's
FLOPs by part or, without a census, from :func:`analytic_flops`);
:func:`ndcost.compose.time.step_time` prices batches of strategies from it
(roofline compute, collectives, bubble, optimizer).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidValue, Unpriced
from ndcost.values import ModelSpec, _frozen_mapping

__all__ = ["KindWork", "ModelWork", "analytic_flops", "kind_work", "model_work", "causal_pairs", "window_pairs"]

# The census's parts, by the op class the time model prices them as.
_ATTENTION_MM_PARTS = ("attention",)
_SCORE_PARTS = ("scores",)
_LINREC_PARTS = ("linrec",)
_ROUTED_PARTS = ("routed",)
# Parameters tensor parallelism splits (the rest but the routed experts are replicated over it), as the
# memory model counts them.
TP_PARTS = ("attention", "ffn", "shared")

# Model types whose feed-forward is two matrices (up, down) rather than three (gate, up, down).
_PLAIN_FFN_MODEL_TYPES = frozenset({
    "gpt2", "gpt_neox", "gptj", "gpt_bigcode", "opt", "bloom", "falcon", "phi", "starcoder2", "codegen",
    "gpt_neo", "biogpt", "xglm", "mpt",
})
# Analytic elementwise traffic, in 2-byte elements a token, as Transformers' eager modules (the default
# runtime, hf-cuda) run them; the census measures the real figure where it runs. An RMSNorm upcasts to
# fp32, squares, averages, scales, casts back and multiplies by its weight: 18 elements an element.
NORM_ELEMENTS = 18
ROTARY_ELEMENTS = 10      # rotate_half (negate, concatenate), two products with cos and sin, their sum
RESIDUAL_ELEMENTS = 3     # two reads, one write
GATED_ACT_ELEMENTS = 5    # SiLU (read, write), times up (two reads, one write)
PLAIN_ACT_ELEMENTS = {"gelu_new": 16, "gelu_fast": 16, "quick_gelu": 8}  # Python-composed GELUs; fused ones: 2
# Model types with learned absolute positions (no rotary on the queries and keys).
_NO_ROTARY_MODEL_TYPES = frozenset({"gpt2", "gpt_bigcode", "opt", "biogpt", "xglm", "bloom", "mpt"})
# Chunk of the chunked delta-rule kernel (fla, Transformers' torch_chunk_gated_delta_rule).
LINREC_CHUNK = 64


# ---------------------------------------------------------------------------
# pairs of tokens the attention computes
# ---------------------------------------------------------------------------
def causal_pairs(seq):
    """Query-key pairs a causal kernel computes on one sequence: ``s (s + 1) / 2``."""
    s = np.asarray(seq, dtype=np.float64)
    return s * (s + 1.0) / 2.0


def window_pairs(seq, window):
    """Causal pairs under a sliding window of *window* keys (0: no window), vectorized."""
    s = np.asarray(seq, dtype=np.float64)
    w = np.asarray(window, dtype=np.float64)
    windowed = w * (w + 1.0) / 2.0 + (s - w) * w
    return np.where((w > 0) & (s > w), windowed, causal_pairs(s))


# ---------------------------------------------------------------------------
# one layer kind's work
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class KindWork:
    """One layer kind's forward work, per token or per pair of tokens, at TP 1 and CP 1.

    FLOPs are split by the op class that prices them; ``routed`` is the
    routed experts' matmuls (scaled by ``moe_imbalance``). Elementwise bytes
    are in elements per token (times the compute dtype's width): those
    tensor parallelism splits, and those it splits only under sequence
    parallelism (norms and residual adds over the hidden width).
    """

    kind: str
    source: str
    attention_mm_flops_per_token: float
    other_mm_flops_per_token: float
    routed_mm_flops_per_token: float = 0.0
    score_flops_per_pair: float = 0.0
    window: int = 0
    linrec_flops_per_token: float = 0.0
    elementwise_elements_per_token: float = 0.0
    replicated_elements_per_token: float = 0.0
    dense_parameters: int = 0          # split by TP
    routed_parameters: int = 0         # split by EP x ETP
    replicated_parameters: int = 0     # norms: held whole by every TP rank
    recomputed_attention_mm_share: Optional[float] = None
    recomputed_other_mm_share: Optional[float] = None
    query_elements_per_token: int = 0  # what Ulysses moves for queries and outputs
    kv_elements_per_token: int = 0     # keys and values a CP ring passes
    experts_per_token: int = 0         # 0: no expert all-to-all
    has_attention: bool = True

    def forward_flops(self, seq, *, all_pairs: bool = False):
        """This kind's forward FLOPs on one sequence of *seq* tokens (vectorized)."""
        s = np.asarray(seq, dtype=np.float64)
        pairs = s * s if all_pairs else window_pairs(s, self.window)
        return (s * (self.attention_mm_flops_per_token + self.other_mm_flops_per_token
                     + self.routed_mm_flops_per_token + self.linrec_flops_per_token)
                + pairs * self.score_flops_per_pair)


@attrs.frozen(kw_only=True)
class ModelWork:
    """A model's work for the time model: each kind's, the layer order, and the embedding and head."""

    name: str
    hidden_size: int
    vocab_size: int
    kinds: Tuple[str, ...]
    work: Mapping[str, KindWork] = attrs.field(converter=_frozen_mapping)
    layer_order: Tuple[str, ...]           # the kind of every non-MTP layer in model order
    mtp_kinds: Tuple[str, ...] = ()        # MTP layers, placed after the last layer
    embedding_parameters: int = 0
    head_parameters: int = 0               # 0 where tied (the head still runs its matmul)
    final_norm_parameters: int = 0
    head_flops_per_token: float = 0.0
    loss_bytes_per_token: Optional[float] = None  # the output layer's elementwise bytes (census); else analytic
    source: str = ""

    def forward_flops_per_sequence(self, seq, *, all_pairs: bool = False):
        """The whole model's forward FLOPs on one sequence (every layer, MTP layers and their heads)."""
        total = 0.0
        for kind in self.layer_order + self.mtp_kinds:
            total = total + self.work[kind].forward_flops(seq, all_pairs=all_pairs)
        heads = 1 + len(self.mtp_kinds)
        return total + heads * self.head_flops_per_token * np.asarray(seq, dtype=np.float64)

    def training_flops_per_sequence(self, seq, *, recompute: str = "none", all_pairs: bool = False):
        """FLOPs a training step runs on one sequence: forward, a backward of twice it, and recompute.

        Full recompute runs every layer's forward again (not the head's, whose
        output the loss consumes at once); ``all_pairs`` counts the scores at
        every pair of tokens as Narayanan et al. do. Selective recompute
        depends on the census's shares and is priced by :func:`step_time`.
        """
        layers = sum(self.work[k].forward_flops(seq, all_pairs=all_pairs) for k in self.layer_order + self.mtp_kinds)
        heads = (1 + len(self.mtp_kinds)) * self.head_flops_per_token * np.asarray(seq, dtype=np.float64)
        if recompute not in ("none", "full"):
            raise InvalidValue(f"training_flops_per_sequence prices recompute none or full, not {recompute!r}")
        return (4.0 if recompute == "full" else 3.0) * layers + 3.0 * heads


# ---------------------------------------------------------------------------
# analytic FLOPs from a ModelSpec
# ---------------------------------------------------------------------------
def _hf(spec: ModelSpec, *names, default=None):
    for name in names:
        value = spec.hf_config.get(name)
        if value is not None:
            return value
        value = spec.extra.get(name)
        if value is not None:
            return value
    return default


def _ffn_matrices(spec: ModelSpec) -> int:
    """3 for a gated feed-forward (gate, up, down), 2 for a plain one (up, down)."""
    stated = spec.extra.get("ffn_matrices")
    if stated:
        return int(stated)
    return 2 if spec.model_type in _PLAIN_FFN_MODEL_TYPES else 3


_GQA = frozenset({"gqa", "mha", "mqa", "gpt_oss"})
_MLA = frozenset({"mla", "dsa"})
_LINEAR = frozenset({"gated_delta_net", "linear_attention"})
_MOE = frozenset({"moe", "gpt_oss", "hash_moe"})


def _mechanisms(spec: ModelSpec, kind: str) -> Tuple[str, str, bool]:
    """A kind's attention mechanism, MLP and MTP flag: the family's ``extra["kinds"]``, else read off the spec."""
    described = (spec.extra.get("kinds") or {}).get(kind)
    if described:
        return str(described.get("attention")), str(described.get("mlp")), bool(described.get("mtp", False))
    if any(w in kind for w in ("linear", "gdn", "delta")) and spec.linear_num_value_heads:
        attention = "gated_delta_net"
    else:
        attention = "mla" if spec.kv_lora_rank else "gqa"
    moe = bool(spec.num_experts) and "dense" not in kind and (
        any(w in kind for w in ("moe", "sparse", "expert")) or (spec.first_k_dense is None and not spec.sparse_step))
    return attention, "moe" if moe else "dense", "mtp" in kind


def _window(spec: ModelSpec, kind: str) -> int:
    """The sliding window of a ``sliding*`` kind (0: the kind attends to every earlier token)."""
    if any(word in kind for word in ("sliding", "swa", "local")) and _mechanisms(spec, kind)[0] in _GQA | _MLA:
        window = _hf(spec, "sliding_window", "window_size")
        if window:
            return int(window)
    return 0


def _act_elements(spec: ModelSpec, matrices: int) -> int:
    if matrices == 3:
        return GATED_ACT_ELEMENTS
    act = str(_hf(spec, "hidden_act", "activation_function", default="gelu"))
    return PLAIN_ACT_ELEMENTS.get(act, 2)


def _kind_shapes(spec: ModelSpec, kind: str) -> Dict[str, Any]:
    """The matmul widths of one layer of *kind*: what analytic_flops and kind_work count."""
    h = spec.hidden_size
    out: Dict[str, Any] = {"matmuls": {}, "score_per_pair": 0.0, "linrec_per_token": 0.0,
                           "query_elements": 0, "kv_elements": 0, "has_attention": True, "experts_per_token": 0,
                           "elementwise": 0.0, "replicated": 0.0}
    mm = out["matmuls"]  # part -> list of (in, out, tokens_multiplier)
    rotary = spec.model_type not in _NO_ROTARY_MODEL_TYPES
    attention, mlp, mtp = _mechanisms(spec, kind)
    if attention not in _GQA | _MLA | _LINEAR:
        raise Unpriced(f"layer kind {kind!r} of {spec.name!r}: no analytic FLOPs for attention {attention!r}; "
                       f"run the census (census='auto') to measure them")
    if mlp not in _MOE | {"dense"}:
        raise Unpriced(f"layer kind {kind!r} of {spec.name!r}: no analytic FLOPs for mlp {mlp!r}; "
                       f"run the census (census='auto') to measure them")
    if attention in _LINEAR:
        hk, hv = spec.linear_num_key_heads or spec.linear_num_value_heads, spec.linear_num_value_heads
        dk, dv = spec.linear_key_head_dim, spec.linear_value_head_dim
        if not (dk and dv):
            raise Unpriced(f"layer kind {kind!r} of {spec.name!r} looks like linear attention but the spec "
                           f"states no linear_key_head_dim / linear_value_head_dim; a census prices it")
        key_dim, value_dim = hk * dk, hv * dv
        mm["attention"] = [(h, 2 * key_dim + 2 * value_dim, 1), (h, 2 * hv, 1), (value_dim, h, 1)]
        # chunked delta rule: state update and readout (4 dk dv a head) plus the intra-chunk products
        out["linrec_per_token"] = float(hv * (4 * dk * dv + 2 * LINREC_CHUNK * (dk + dv)))
        out["has_attention"] = False
        out["elementwise"] += 4 * value_dim + 2 * (2 * key_dim + 2 * value_dim)  # gating, norm, conv
    else:
        heads = spec.num_attention_heads
        if attention in _MLA:
            rope = spec.qk_rope_head_dim or 0
            nope = spec.qk_nope_head_dim or 0
            vdim = spec.v_head_dim or spec.resolved_head_dim
            qk = nope + rope
            if spec.q_lora_rank:
                mm["attention"] = [(h, spec.q_lora_rank, 1), (spec.q_lora_rank, heads * qk, 1)]
            else:
                mm["attention"] = [(h, heads * qk, 1)]
            mm["attention"] += [(h, spec.kv_lora_rank + rope, 1), (spec.kv_lora_rank, heads * (nope + vdim), 1),
                                (heads * vdim, h, 1)]
            out["score_per_pair"] = float(2 * heads * qk + 2 * heads * vdim)
            out["query_elements"] = heads * qk
            out["kv_elements"] = heads * (qk + vdim)
            out["elementwise"] += ROTARY_ELEMENTS * (heads + 1) * rope if rotary else 0
        else:
            d = spec.resolved_head_dim
            kv = spec.num_key_value_heads or heads
            gate = 2 if spec.extra.get("output_gate") else 1  # a gate fused into the query projection
            mm["attention"] = [(h, gate * heads * d, 1), (h, kv * d, 1), (h, kv * d, 1), (heads * d, h, 1)]
            out["score_per_pair"] = float(4 * heads * d)
            out["query_elements"] = heads * d
            out["kv_elements"] = 2 * kv * d
            out["elementwise"] += ROTARY_ELEMENTS * (heads + kv) * d if rotary else 0
            if spec.extra.get("qk_norm"):
                out["elementwise"] += NORM_ELEMENTS * (heads + kv) * d
    matrices = _ffn_matrices(spec)
    if mlp in _MOE:
        width = spec.moe_intermediate_size or spec.intermediate_size
        top_k = spec.num_experts_per_tok or 1
        if not width:
            raise Unpriced(f"layer kind {kind!r} of {spec.name!r} has experts but no moe_intermediate_size")
        mm["routed"] = [(h, width, top_k)] * (matrices - 1) + [(width, h, top_k)]
        mm["router"] = [(h, spec.num_experts, 1)]
        shared_width = spec.shared_expert_intermediate_size or (
            (spec.num_shared_experts or 0) * width)
        if shared_width:
            mm["shared"] = [(h, shared_width, 1)] * (matrices - 1) + [(shared_width, h, 1)]
        out["experts_per_token"] = top_k
        act = top_k * width + shared_width
        out["elementwise"] += _act_elements(spec, matrices) * act + 4 * top_k * h  # activation, (un)permute
    else:
        width = spec.intermediate_size or _hf(spec, "n_inner") or 4 * h
        mm["ffn"] = [(h, width, 1)] * (matrices - 1) + [(width, h, 1)]
        out["elementwise"] += _act_elements(spec, matrices) * width
    if mtp:
        mm["mtp"] = [(2 * h, h, 1)]
        out["replicated"] += 2 * NORM_ELEMENTS * h
    # two norms and two residual adds over the hidden width
    out["replicated"] += 2 * NORM_ELEMENTS * h + 2 * RESIDUAL_ELEMENTS * h
    # activation elements a token the matmuls read and write (their weights aside), by part
    out["matmul_io"] = {part: sum((i + o) * mult for i, o, mult in matmuls) for part, matmuls in mm.items()}
    return out


def analytic_flops(spec: ModelSpec, kind: str, seq: int, *, all_pairs: bool = False) -> Dict[str, float]:
    """The forward FLOPs of one layer of *kind* on one sequence of *seq* tokens, by part.

    Matmuls only, ``2 * tokens * in * out`` a projection (no biases, norms or
    elementwise ops), routed experts at ``num_experts_per_tok`` experts a
    token; ``scores`` is the attention kernel's ``Q K^T`` and ``P V`` at the
    causal pairs it computes (``all_pairs=True``: at every pair, as Narayanan
    et al. count); ``linrec`` a linear attention's chunked recurrence. Kind
    ``"output"`` is the LM head (part ``head``): ``2 * tokens * hidden * vocab``.
    """
    if seq < 1:
        raise InvalidValue(f"analytic_flops: seq must be >= 1, got {seq}")
    if kind == "output":
        return {"head": float(2 * seq * spec.hidden_size * spec.vocab_size)}
    if kind not in spec.kinds:
        raise InvalidValue(f"analytic_flops: {spec.name!r} has no layer kind {kind!r}; kinds: {', '.join(spec.kinds)}")
    shapes = _kind_shapes(spec, kind)
    flops: Dict[str, float] = {}
    for part, matmuls in shapes["matmuls"].items():
        flops[part] = float(sum(2 * seq * multiplier * i * o for i, o, multiplier in matmuls))
    if shapes["has_attention"]:
        window = _window(spec, kind)
        pairs = float(seq) * seq if all_pairs else float(window_pairs(seq, window))
        flops["scores"] = shapes["score_per_pair"] * pairs
    if shapes["linrec_per_token"]:
        flops["linrec"] = shapes["linrec_per_token"] * seq
    return flops


def _analytic_parameters(spec: ModelSpec, kind: str) -> Dict[str, int]:
    shapes = _kind_shapes(spec, kind)
    params = {part: sum(i * o for i, o, _ in matmuls) for part, matmuls in shapes["matmuls"].items()}
    if "routed" in params:
        params["routed"] = params["routed"] * (spec.num_experts or 1)
    params["norm"] = 2 * spec.hidden_size
    return params


def kind_work(spec: ModelSpec, kind: str, seq: int, record: Any = None,
              parameters: Optional[Mapping[str, int]] = None) -> KindWork:
    """One kind's :class:`KindWork`: the census record's FLOPs where it has them, else analytic_flops.

    A record's FLOPs (on one sequence of ``record.seq`` tokens) become per-token
    and per-pair figures, so strategies at other sequence lengths rescale them
    exactly (matmuls are linear in tokens, scores in pairs). *parameters* is
    one layer's parameters by part (``ndcost.models.parameters(spec).by_kind``);
    without it they are counted from the same shapes.
    """
    measured = record is not None and bool(getattr(record, "flops_by_part", None))
    try:
        shapes = _kind_shapes(spec, kind)
    except Unpriced:
        if not measured:
            raise
        shapes = _generic_shapes(spec)  # the census measured what the formulas cannot shape
    window = _window(spec, kind)
    flops: Mapping[str, float]
    if measured:
        flops, at, source = dict(record.flops_by_part), int(record.seq), f"census flops ({record.source})"
    else:
        flops, at, source = analytic_flops(spec, kind, seq), int(seq), "analytic flops"
    unknown = sorted(set(flops) - set(_ALL_FLOP_PARTS))
    if unknown:
        raise Unpriced(f"layer kind {kind!r}: FLOPs of part(s) {', '.join(unknown)} have no op class; "
                       f"known parts: {', '.join(_ALL_FLOP_PARTS)}")
    per_token = {part: float(v) / at for part, v in flops.items()}
    pairs = float(window_pairs(at, window))
    attention_mm = sum(per_token.get(p, 0.0) for p in _ATTENTION_MM_PARTS)
    routed = sum(per_token.get(p, 0.0) for p in _ROUTED_PARTS)
    linrec = sum(per_token.get(p, 0.0) for p in _LINREC_PARTS)
    scores = sum(float(flops.get(p, 0.0)) for p in _SCORE_PARTS) / pairs
    other = sum(v for p, v in per_token.items()
                if p not in _ATTENTION_MM_PARTS + _ROUTED_PARTS + _LINREC_PARTS + _SCORE_PARTS)
    params = dict(parameters) if parameters is not None else _analytic_parameters(spec, kind)
    elementwise = float(shapes["elementwise"])
    replicated_elements = float(shapes["replicated"])
    census_traffic = _census_elementwise(record, shapes) if record is not None else None
    if census_traffic is not None:
        elementwise, replicated_elements = census_traffic
        source += "; census traffic"
    else:
        source += "; analytic traffic"
    dense = sum(v for p, v in params.items() if p in TP_PARTS)
    routed_params = sum(v for p, v in params.items() if p in _ROUTED_PARTS)
    replicated = sum(params.values()) - dense - routed_params
    return KindWork(
        kind=kind, source=source,
        attention_mm_flops_per_token=attention_mm, other_mm_flops_per_token=other,
        routed_mm_flops_per_token=routed, score_flops_per_pair=scores, window=window,
        linrec_flops_per_token=linrec,
        elementwise_elements_per_token=elementwise,
        replicated_elements_per_token=replicated_elements,
        dense_parameters=int(dense), routed_parameters=int(routed_params), replicated_parameters=int(replicated),
        recomputed_attention_mm_share=getattr(record, "recomputed_attention_mm_share", None),
        recomputed_other_mm_share=getattr(record, "recomputed_other_mm_share", None),
        query_elements_per_token=int(shapes["query_elements"]), kv_elements_per_token=int(shapes["kv_elements"]),
        experts_per_token=int(shapes["experts_per_token"] if spec.num_experts else 0),
        has_attention=bool(shapes["has_attention"] and scores > 0),
    )


# Parts whose elementwise traffic tensor parallelism leaves whole (without sequence parallelism).
_REPLICATED_TRAFFIC_PARTS = ("norm", "other", "router", "embedding", "mtp")
# Parts whose traffic is a kernel the time model prices by its FLOPs (the attention kernel, the recurrence).
_KERNEL_TRAFFIC_PARTS = ("scores", "linrec")


def _census_elementwise(record: Any, shapes: Mapping[str, Any]) -> Optional[Tuple[float, float]]:
    """Elementwise traffic a token from a census record: (TP-split, TP-replicated) in 2-byte elements.

    The census counts every op's reads and writes by part on one forward
    (``traffic["moved_bytes"]``); the weights it read (``parameter_bytes``),
    the matmuls' activation inputs and outputs (from the matmul shapes, at 2
    bytes) and the attention kernel's and recurrence's own traffic are taken
    out, so what is left is what the elementwise ops move: norms in fp32,
    rotary, activation functions, residual adds, copies. None where the
    record has no traffic.
    """
    traffic = getattr(record, "traffic", None) or {}
    moved = traffic.get("moved_bytes")
    if not moved:
        return None
    parameter = traffic.get("parameter_bytes") or {}
    tokens = float(record.seq)
    io = shapes.get("matmul_io", {})
    split = replicated = 0.0
    for part, value in moved.items():
        if part in _KERNEL_TRAFFIC_PARTS:
            continue
        rest = max(0.0, float(value) - float(parameter.get(part, 0)) - 2.0 * io.get(part, 0) * tokens)
        if part in _REPLICATED_TRAFFIC_PARTS:
            replicated += rest
        else:
            split += rest
    return split / 2.0 / tokens, replicated / 2.0 / tokens


def _generic_shapes(spec: ModelSpec) -> Dict[str, Any]:
    """What a census-measured kind the formulas cannot shape still needs: its heads' widths, nothing else."""
    heads = spec.num_attention_heads
    d = spec.resolved_head_dim
    kv = spec.num_key_value_heads or heads
    return {"matmuls": {}, "score_per_pair": 0.0, "linrec_per_token": 0.0, "query_elements": heads * d,
            "kv_elements": 2 * kv * d, "has_attention": True, "experts_per_token": spec.num_experts_per_tok or 0,
            "elementwise": 0.0, "replicated": 0.0, "matmul_io": {}}


_ALL_FLOP_PARTS = ("attention", "norm", "ffn", "routed", "shared", "router", "embedding", "head", "mtp", "other",
                   "scores", "linrec")


def model_work(spec: ModelSpec, seq: int, records: Optional[Mapping[str, Any]] = None,
               parameters: Any = None) -> ModelWork:
    """The :class:`ModelWork` of *spec*: every kind's work, the layer order, the embedding and the head.

    *records* maps kinds to KindRecords (a census's; kinds without FLOPs fall
    back to :func:`analytic_flops`); *parameters* is ``ndcost.models.parameters(spec)``
    where available, else the parameters are counted from the matmul shapes.
    """
    records = dict(records or {})
    if parameters is None:
        try:
            from ndcost.models import parameters as count_parameters
            parameters = count_parameters(spec)
        except Exception:  # families not loadable: count from the shapes (the work's source says so)
            parameters = None
    work = {}
    for kind in spec.kinds:
        by_part = parameters.by_kind.get(kind) if parameters is not None else None
        work[kind] = kind_work(spec, kind, seq, records.get(kind), by_part)
    h, vocab = spec.hidden_size, spec.vocab_size
    output = records.get("output")
    if output is not None and getattr(output, "flops_by_part", None) and output.flops_by_part.get("head"):
        head_flops = float(output.flops_by_part["head"]) / int(output.seq)
    else:
        head_flops = float(2 * h * vocab)
    loss_bytes = None
    traffic = getattr(output, "traffic", None) or {}
    if traffic.get("moved_bytes"):
        # the output layer's elementwise bytes: all it moves but the head's weights and its matmul's input/output
        tokens = float(output.seq)
        loss_bytes = max(0.0, (sum(float(v) for v in traffic["moved_bytes"].values())
                               - sum(float(v) for v in (traffic.get("parameter_bytes") or {}).values())
                               - 2.0 * (h + vocab) * tokens) / tokens)
    if parameters is not None:
        embedding, head, final_norm = parameters.embedding, parameters.head, parameters.final_norm
    else:
        embedding, head, final_norm = vocab * h, 0 if spec.tie_word_embeddings else vocab * h, h
    sources = sorted({w.source for w in work.values()})
    return ModelWork(
        name=spec.name, hidden_size=h, vocab_size=vocab, kinds=spec.kinds, work=work,
        layer_order=spec.layer_kinds(include_mtp=False),
        mtp_kinds=tuple(g.kind for g in spec.layers if g.mtp for _ in range(g.count)),
        embedding_parameters=int(embedding), head_parameters=int(head), final_norm_parameters=int(final_norm),
        head_flops_per_token=head_flops, loss_bytes_per_token=loss_bytes, source="; ".join(sources),
    )
