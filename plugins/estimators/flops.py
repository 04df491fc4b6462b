"""FLOPs and bytes moved by a layer kind: the census's measured FLOPs, or analytic shapes from the spec.

Two FLOPs estimators, registered as ``estimator/flops/census`` and
``estimator/flops/analytic``: the census's counts a layer's FLOPs and bytes
by part on one sequence (``FlopCounterMode`` over the real modules), the
analytic one counts the matmuls of the layer's :class:`~ndcost.layer.LayerKind`
(``2 * tokens * in * out`` a projection), the attention kernel's pairs and the
elementwise traffic of Transformers' eager modules (a mechanism a family names
itself, class ``other``, as its family's ``analytic_attention`` counts it:
DeepSeek-V4's sparse attention). Both give the time model a
:class:`~ndcost.work.KindWork`; the resolver picks per kind (the census where it
measured the kind).
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import attrs

from ndcost.compose.sharding import ROUTED_PARTS, TP_PARTS  # the parts TP splits, as memory counts them
from ndcost.errors import InvalidValue, Unpriced
from ndcost.hookspecs import hookimpl
from ndcost.layer import LayerKind
from ndcost.values import FLOP_PARTS, ModelSpec
from ndcost.work import ANALYTIC_FLOPS, NORM_ELEMENTS, Gemm, KindWork, ModelWork, window_pairs

# The census's parts, by the op class the time model prices them as.
_ATTENTION_MM_PARTS = ("attention",)
_SCORE_PARTS = ("scores",)
_LINREC_PARTS = ("linrec",)

# Analytic elementwise traffic, in 2-byte elements a token, as Transformers' eager modules (the default
# runtime, hf-cuda) run them; the census measures the real figure where it runs. An RMSNorm upcasts to
# fp32, squares, averages, scales, casts back and multiplies by its weight: 18 elements an element.
ROTARY_ELEMENTS = 10      # rotate_half (negate, concatenate), two products with cos and sin, their sum
ROTARY_TABLE_READS = 4    # and a token's cos and sin, each read by the queries' product and the keys'
RESIDUAL_ELEMENTS = 3     # two reads, one write
GATED_ACT_ELEMENTS = 5    # SiLU (read, write), times up (two reads, one write)
EXPERT_BIAS_ELEMENTS = 5  # an expert's bias: gathered for its token copy (read, write), added (two reads, a write)
FUSED_EXPERT_BIAS_ELEMENTS = 3
PLAIN_ACT_ELEMENTS = {"gelu_new": 16, "gelu_fast": 16, "quick_gelu": 8}  # Python-composed GELUs; fused ones: 2
# Under torch.compile (Strategy.compile) each chain of pointwise ops between matmuls reads its inputs and writes
# its outputs once: a norm, a rotary embedding 2 elements an element (read, write), a gated activation 3 (gate and
# up read, the product written), a plain one 2; a layer's two norms and two residual adds 9 elements a hidden
# element (the first norm 2; the residual add fused with the second norm: both inputs read, the sum and the
# normed output written, 4; the last residual add 3, the block's end: torchtitan compiles block by block).
FUSED_NORM_ELEMENTS = 2
FUSED_ROTARY_ELEMENTS = 2  # the cos and sin tables' reads left out
# torchtitan's complex rotary under torch.compile (RuntimeProfile.rotary complex), which Inductor runs as ATen
# kernels: the cast to fp32 (read 1, write 2), the complex product (read 2, write 2) and the cast back (read 2,
# write 1), 10 elements a rotated element, the freqs_cis table's reads left out
COMPLEX_ROTARY_ELEMENTS = 10
FUSED_LAYER_NORMS_AND_RESIDUALS = 9
# Chunk of the chunked delta-rule kernel (fla, Transformers' torch_chunk_gated_delta_rule).
LINREC_CHUNK = 64

# Analytic kernel launches of a forward, counted from Transformers' eager modules (the census counts the real
# ones where it runs; tests/test_census.py checks these counts on LlamaDecoderLayer): an RMSNorm casts up,
# squares, means, adds eps, takes rsqrt, multiplies, casts back and scales by its weight.
NORM_LAUNCHES = 8
ROTARY_LAUNCHES = 5         # a rotated tensor: x * cos, rotate_half's neg and cat, * sin, the sum
ACT_LAUNCHES = {"gated": 2, "gelu_new": 8, "gelu_fast": 8, "quick_gelu": 3}  # gated: act and the product; else 1
# Qwen3NextGatedDeltaNet.forward and torch_chunk_gated_delta_rule (Transformers 5.x), outside the projections:
# the convolution and its SiLU, the gates (sigmoid; exp, softplus, products), fp32 copies, the q/k l2 norms,
# padding, the chunk's decays and masks, two triangular solves, the gated RMSNorm: 73 as the census counts them on
# Qwen3.5's layer under hf-cuda (Transformers 5.x); then each chunk of 64 tokens: four matmuls, a subtraction, two
# adds, a product and the output's copy.
LINEAR_ATTENTION_LAUNCHES = 73
LINREC_LAUNCHES_PER_CHUNK = 9
# An eager MoE block outside its expert matmuls and activation: Transformers' softmax router (Qwen3-MoE's, Mixtral's:
# its linear, the softmax to fp32, top-k, renormalization and cast, and under autograd the copy of the top-k values
# it makes before their in-place division, whose backward reads them: 8 as the census counts them; 5 without the
# renormalization, Qwen3MoeConfig's norm_topk_prob=False, which the count leaves out) unless the family
# states its own (Family.kernel_launches["router"]), and the grouped_mm experts' dispatch
# (transformers/integrations/moe.py grouped_mm_experts_forward: the copies' sort, source rows, gathers of the hidden
# states and the weights, histogram and offsets; the weighting, the inverse permutation, the gather back and the sum
# over a token's copies). The census counts 19 together on Qwen3-30B-A3B's and Mixtral-8x7B's layers under hf-cuda.
MOE_ROUTER_LAUNCHES = 8
MOE_DISPATCH_LAUNCHES = 11
# What the grouped_mm dispatch's index bookkeeping moves, forward-only (integers: autograd records no backward),
# as the census counts it: bytes a token copy (one an expert a token is routed to: the expert ids' sort, 24, their
# division, 16, cast to int32, 12, histogram, 4, the inverse permutation's empty_like, 16, arange, 8, and index_put,
# 32) and bytes an expert a layer (the histogram's counts and their cumulative sum, 12)
MOE_DISPATCH_BYTES_PER_COPY = 112
MOE_DISPATCH_BYTES_PER_EXPERT = 12
# DeepSeek-V3.2's lightning indexer as Transformers runs it (modeling_deepseek_v32.py DeepseekV32Indexer.forward,
# under no_grad: autograd records no backward for any of it), beside its three projections (q from the query
# latent, one key head, a weight a head): the key's LayerNorm, rotary on the queries' and key's rope widths, their
# concatenations and fp32 copies, the scores' batched matmul, scale and ReLU, the weights' fp32 copy and scale,
# their batched matmul with the scores, the causal mask's inversion and fill, top-k, the indices' casts and the
# selection's mask (new_ones, scatter) and its combination with the causal mask (inversion, and): 30 kernels as
# the census counts them; SDPA's turning the combined mask into a bias is the masked call's (MASKED_SDPA_LAUNCHES)
DSA_INDEXER_LAUNCHES = 30


# ---------------------------------------------------------------------------
# analytic FLOPs from a ModelSpec
# ---------------------------------------------------------------------------
def _window(info: LayerKind) -> int:
    """The sliding window of a softmax or latent attention (0: the kind attends to every earlier token)."""
    return info.sliding_window if info.attention_class in ("softmax", "latent") else 0


def _act_elements(info: LayerKind) -> int:
    if info.gated_mlp:
        return GATED_ACT_ELEMENTS
    return PLAIN_ACT_ELEMENTS.get(info.activation, 2)


def _fused_act_elements(info: LayerKind) -> int:
    return 3 if info.gated_mlp else 2


def _act_launches(info: LayerKind) -> int:
    return ACT_LAUNCHES["gated"] if info.gated_mlp else ACT_LAUNCHES.get(info.activation, 1)


def _gemms(mm: Mapping[str, Any], splits: Mapping[str, Any], experts: int,
           forward_only: Mapping[str, Any]) -> Tuple[Gemm, ...]:
    """The matmuls as :class:`Gemm` shapes, same shapes of a part merged into one with their count; those of
    *forward_only* (part -> matmuls, as ``forward_only_matmuls``) marked so."""
    counted: Dict[Tuple[Any, ...], int] = {}
    for part, matmuls in mm.items():
        op_class = "attention" if part in _ATTENTION_MM_PARTS else "routed" if part in ROUTED_PARTS else "other"
        only = list(forward_only.get(part, ()))
        for matmul, split in zip(matmuls, splits[part], strict=True):
            marked = matmul in only
            if marked:
                only.remove(matmul)  # each forward-only matmul marks one of the part's
            key = (op_class, *matmul, split, marked)
            counted[key] = counted.get(key, 0) + 1
    return tuple(Gemm(op_class=c, in_features=int(i), out_features=int(o), count=n, split=split,
                      tokens_per_token=int(mult), experts=experts if c == "routed" else 1, forward_only=marked)
                 for (c, i, o, mult, split, marked), n in counted.items())


def _family_attention(spec: ModelSpec, info: LayerKind, norm_elements: int) -> Optional[Mapping[str, Any]]:
    """A family's own attention mechanism (class ``other``) as its formulas count it, or None where it states none.

    ``Family.analytic_attention(spec, info, norm_elements)`` (DeepSeek-V4's,
    plugins/families/deepseek_v4.py) returns ``matmuls`` by part as ``(in, out,
    tokens_per_token, split)`` (the attention's, and those the family's layer adds
    beside its attention and MLP: DeepSeek-V4's hyper-connections, part ``other``),
    ``scores(seq, all_pairs)`` (the kernel's FLOPs
    on one sequence) and ``window(seq)`` (the entries a query gathers), optionally
    ``extra_keys_per_token`` (the keys eager attention adds to the sequence's, a token), the
    kernel's ``heads`` ``(heads, head_dim, value_head_dim)``, CP's
    ``query_elements`` and ``kv_elements`` a token, ``elementwise`` (TP-split)
    and ``replicated`` elements a token, and its forward's ``launches`` outside
    the matmuls.
    """
    from ndcost.models import family_for
    describe = getattr(family_for(spec.model_type), "analytic_attention", None)
    return describe(spec, info, norm_elements) if describe is not None else None


def _family_elements(spec: ModelSpec) -> Dict[str, Any]:
    """A norm's and the rotary's elements an element for *spec*'s family.

    The Llama figures above unless the family states others (``Family.elementwise_elements``;
    ``rotary_table``: 2-byte elements a cos or sin element, 2 where fp32; ``expert_act``: a routed expert's
    activation, elements an expert-width element of a token copy, where it is not the feed-forward's, else None),
    ``launches``, the family's ``kernel_launches``, and ``router_selection``, its router's forward-only bytes a
    token (``Family.router_selection_bytes``).
    """
    from ndcost.models import family_for
    family = family_for(spec.model_type)
    stated = dict(getattr(family, "elementwise_elements", None) or {})
    return {"norm": stated.get("norm", NORM_ELEMENTS), "rotary": stated.get("rotary", ROTARY_ELEMENTS),
            "rotary_table": stated.get("rotary_table", 1), "expert_act": stated.get("expert_act"),
            "launches": dict(getattr(family, "kernel_launches", None) or {}),
            "router_selection": family.router_selection_bytes(spec) if family is not None else 0}


def _kind_shapes(spec: ModelSpec, kind: str) -> Dict[str, Any]:
    """The matmul widths of one layer of *kind*, and its forward's kernel launches (Transformers' eager
    modules): what analytic_flops and kind_work count."""
    h = spec.hidden_size
    out: Dict[str, Any] = {"matmuls": {}, "score_per_pair": 0.0, "linrec_per_token": 0.0,
                           "query_elements": 0, "kv_elements": 0, "rotary_elements": 0, "has_attention": True,
                           "experts_per_token": 0,
                           "elementwise": 0.0, "replicated": 0.0, "fused_elementwise": 0.0, "fused_replicated": 0.0,
                           "splits": {}, "launches": 0, "launches_per_token": 0.0, "heads": (0, 0, 0),
                           "extra_keys_per_token": 0.0, "forward_only_elements_at": []}
    mm = out["matmuls"]  # part -> list of (in, out, tokens_multiplier)
    splits = out["splits"]  # part -> how TP splits each of mm[part]: none, column, row
    info = spec.kind(kind)
    rotary = info.rotary
    family = _family_elements(spec)
    norm_elements, rotary_elements = family["norm"], family["rotary"]
    table_reads = ROTARY_TABLE_READS * family["rotary_table"]  # 2-byte elements a rotated width
    rotary_launches = family["launches"].get("rotary", ROTARY_LAUNCHES)
    norm_launches = family["launches"].get("norm", NORM_LAUNCHES)
    described = None
    if info.attention_class == "other":
        described = _family_attention(spec, info, norm_elements)
        if described is None:
            raise Unpriced(f"layer kind {kind!r} of {spec.name!r}: no analytic FLOPs for attention "
                           f"{info.attention!r}; run the census (census='auto') to measure them")
    if not info.has_mlp:
        raise Unpriced(f"layer kind {kind!r} of {spec.name!r}: no analytic FLOPs for mlp {info.mlp!r}; "
                       f"run the census (census='auto') to measure them")
    if described is not None:  # the family's own mechanism, counted by its formulas
        for part, matmuls in described["matmuls"].items():
            mm[part] = [(i, o, mult) for i, o, mult, _ in matmuls]
            splits[part] = [split for *_, split in matmuls]
        out["score_flops_at"], out["window_at"] = described["scores"], described["window"]
        out["heads"] = tuple(described["heads"])
        out["extra_keys_per_token"] = float(described.get("extra_keys_per_token", 0.0))
        out["query_elements"], out["kv_elements"] = described["query_elements"], described["kv_elements"]
        out["elementwise"] += described["elementwise"]
        out["replicated"] += described["replicated"]
        out["fused_elementwise"] += described["elementwise"]  # priced as eager
        out["fused_replicated"] += described["replicated"]
        out["launches"] += described["launches"]
    elif info.linear:
        hk, hv = spec.linear_num_key_heads or spec.linear_num_value_heads, spec.linear_num_value_heads
        dk, dv = spec.linear_key_head_dim, spec.linear_value_head_dim
        if not (dk and dv):
            raise Unpriced(f"layer kind {kind!r} of {spec.name!r} looks like linear attention but the spec "
                           f"states no linear_key_head_dim / linear_value_head_dim; a census prices it")
        key_dim, value_dim = hk * dk, hv * dv
        mm["attention"] = [(h, 2 * key_dim + 2 * value_dim, 1), (h, 2 * hv, 1), (value_dim, h, 1)]
        splits["attention"] = ["column", "column", "row"]
        out["launches"] += LINEAR_ATTENTION_LAUNCHES
        out["launches_per_token"] = LINREC_LAUNCHES_PER_CHUNK / LINREC_CHUNK
        # Transformers' torch_chunk_gated_delta_rule, a value head a token: the chunk's k_beta k^T and q k^T (2 c dk
        # each) and its scores times the new values (2 c dv); the state read by the decayed keys and the queries and
        # its update (2 dk dv each). The triangular solves are not counted (nor by the census's FlopCounterMode);
        # flash-linear-attention's kernel applies the solved system as matmuls (2 c dk + 2 c dv more:
        # plugins/contracts/delta_rule.py chunk_rule_flops)
        out["linrec_per_token"] = float(hv * (6 * dk * dv + 4 * LINREC_CHUNK * dk + 2 * LINREC_CHUNK * dv))
        out["has_attention"] = False
        out["elementwise"] += 4 * value_dim + 2 * (2 * key_dim + 2 * value_dim)  # gating, norm, conv
        out["fused_elementwise"] += 4 * value_dim + 2 * (2 * key_dim + 2 * value_dim)  # priced as eager
    else:
        heads = spec.num_attention_heads
        if info.latent:
            rope = spec.qk_rope_head_dim or 0
            nope = spec.qk_nope_head_dim or 0
            vdim = spec.v_head_dim or spec.resolved_head_dim
            qk = nope + rope
            if spec.q_lora_rank:  # the down-projections are replicated (Megatron's MLA), the up ones split
                mm["attention"] = [(h, spec.q_lora_rank, 1), (spec.q_lora_rank, heads * qk, 1)]
                splits["attention"] = ["none", "column"]
                out["launches"] += norm_launches
            else:
                mm["attention"] = [(h, heads * qk, 1)]
                splits["attention"] = ["column"]
            mm["attention"] += [(h, spec.kv_lora_rank + rope, 1), (spec.kv_lora_rank, heads * (nope + vdim), 1),
                                (heads * vdim, h, 1)]
            splits["attention"] += ["none", "column", "row"]
            # the kv norm, rotary on the rope parts of q and k, the key's concatenation, the kernel
            out["launches"] += norm_launches + (2 * rotary_launches if rotary else 0) + 2 + 1
            if info.attention == "dsa":
                _dsa_indexer(spec, out)
            out["score_per_pair"] = float(2 * heads * qk + 2 * heads * vdim)
            out["heads"] = (heads, qk, vdim)
            out["query_elements"] = heads * qk
            out["kv_elements"] = heads * (qk + vdim)
            out["elementwise"] += (rotary_elements * (heads + 1) + table_reads) * rope if rotary else 0
            out["fused_elementwise"] += FUSED_ROTARY_ELEMENTS * (heads + 1) * rope if rotary else 0
            out["rotary_elements"] = (heads + 1) * rope if rotary else 0
        else:
            d = spec.resolved_head_dim
            kv = spec.num_key_value_heads or heads
            gate = 2 if info.output_gate else 1  # a gate fused into the query projection
            mm["attention"] = [(h, gate * heads * d, 1), (h, kv * d, 1), (h, kv * d, 1), (heads * d, h, 1)]
            splits["attention"] = ["column", "column", "column", "row"]
            # rotary on q and k, q/k norms, the kernel, an output gate's sigmoid and product
            out["launches"] += ((2 * rotary_launches if rotary else 0) + (2 * norm_launches if info.qk_norm else 0)
                                + 1 + (2 if info.output_gate else 0))
            out["score_per_pair"] = float(4 * heads * d)
            out["heads"] = (heads, d, d)
            out["query_elements"] = heads * d
            out["kv_elements"] = 2 * kv * d
            out["elementwise"] += (rotary_elements * (heads + kv) + table_reads) * d if rotary else 0
            out["fused_elementwise"] += FUSED_ROTARY_ELEMENTS * (heads + kv) * d if rotary else 0
            out["rotary_elements"] = (heads + kv) * d if rotary else 0
            if info.qk_norm:  # a head's or the whole projection's: a rank normalizes its own heads' share
                out["elementwise"] += norm_elements * (heads + kv) * d
                out["fused_elementwise"] += FUSED_NORM_ELEMENTS * (heads + kv) * d
    matrices = info.mlp_matrices
    if info.routed:
        width = spec.moe_intermediate_size or spec.intermediate_size
        top_k = spec.num_experts_per_tok or 1
        if not width:
            raise Unpriced(f"layer kind {kind!r} of {spec.name!r} has experts but no moe_intermediate_size")
        mm["routed"] = [(h, width, top_k)] * (matrices - 1) + [(width, h, top_k)]
        mm["router"] = [(h, spec.num_experts, 1)]
        splits["routed"] = ["column"] * (matrices - 1) + ["row"]
        splits["router"] = ["none"]
        shared_width = spec.shared_expert_intermediate_size or (
            (spec.num_shared_experts or 0) * width)
        expert_act = _act_elements(info) if family["expert_act"] is None else family["expert_act"]
        launches = family["launches"]
        out["launches"] += (launches.get("router", MOE_ROUTER_LAUNCHES) + MOE_DISPATCH_LAUNCHES
                            + launches.get("expert_act", _act_launches(info)))
        experts, selection = spec.num_experts or 1, family["router_selection"]
        out["forward_only_elements_at"].append(lambda seq: (
            (MOE_DISPATCH_BYTES_PER_COPY * top_k + MOE_DISPATCH_BYTES_PER_EXPERT * experts / seq) / 2.0,
            selection / 2.0))
        if spec.extra.get("expert_bias"):
            # transformers/integrations/moe.py grouped_mm_experts_forward: each grouped GEMM gathers its token
            # copies' experts' biases (read, write) and adds them (two reads, one write); compiled, one pass
            biased = top_k * ((matrices - 1) * width + h)
            out["elementwise"] += EXPERT_BIAS_ELEMENTS * biased
            out["fused_elementwise"] += FUSED_EXPERT_BIAS_ELEMENTS * biased
            out["launches"] += 2 * 2
        if shared_width:
            mm["shared"] = [(h, shared_width, 1)] * (matrices - 1) + [(shared_width, h, 1)]
            splits["shared"] = ["column"] * (matrices - 1) + ["row"]
            # and its sum with the routed output, and a gate's where the family's has one (its kernel_launches)
            out["launches"] += _act_launches(info) + 1 + family["launches"].get("shared_gate", 0)
        out["experts_per_token"] = top_k
        act = top_k * width + shared_width
        out["elementwise"] += expert_act * top_k * width + _act_elements(info) * shared_width + 4 * top_k * h
        out["fused_elementwise"] += _fused_act_elements(info) * act + 4 * top_k * h  # copies as eager
    else:
        width = spec.intermediate_size
        if not width:
            raise Unpriced(f"layer kind {kind!r} of {spec.name!r} has a dense MLP but no intermediate_size")
        mm["ffn"] = [(h, width, 1)] * (matrices - 1) + [(width, h, 1)]
        splits["ffn"] = ["column"] * (matrices - 1) + ["row"]
        out["elementwise"] += _act_elements(info) * width
        out["fused_elementwise"] += _fused_act_elements(info) * width
        out["launches"] += _act_launches(info)
    if info.mtp:
        mm["mtp"] = [(2 * h, h, 1)]
        splits["mtp"] = ["none"]
        out["replicated"] += 2 * norm_elements * h
        out["fused_replicated"] += 2 * FUSED_NORM_ELEMENTS * h
        out["launches"] += 2 * norm_launches + 1  # its two input norms and their concatenation
    # two norms and two residual adds over the hidden width
    out["replicated"] += 2 * norm_elements * h + 2 * RESIDUAL_ELEMENTS * h
    out["fused_replicated"] += FUSED_LAYER_NORMS_AND_RESIDUALS * h
    out["launches"] += 2 * norm_launches + 2 + sum(len(matmuls) for matmuls in mm.values())  # a kernel a matmul
    out["gemms"] = _gemms(mm, splits, spec.num_experts or 1, out.get("forward_only_matmuls", {}))
    # activation elements a token the matmuls read and write (their weights aside), by part
    out["matmul_io"] = {part: sum((i + o) * mult for i, o, mult in matmuls) for part, matmuls in mm.items()}
    return out


def _dsa_indexer(spec: ModelSpec, out: Dict[str, Any]) -> None:
    """DeepSeek-V3.2's lightning indexer (:data:`DSA_INDEXER_LAUNCHES`) added to one layer's *out* shapes, all of it
    forward-only: its projections (TP leaves them whole: DeepseekV32Config's tp plan names none; priced split, as
    the census prices them), the scores of every query-key pair, ``2 heads (dim + 1)`` FLOPs a pair (``q k^T`` in
    fp32, then each head's weight), and the elementwise bytes a token at *seq* tokens, derived op by op from the
    module (the census measures the same to the byte, tests/test_forward_only.py): its projections' outputs
    through the key's norm, rotary, concatenations and fp32 copies, 16 bytes a key and head (the fp32 scores
    scaled and ReLU'd), and where ``index_topk`` is below *seq* top-k's read of the weighted scores (4 a key)
    and its outputs, 36 bytes an index (values and int64 indices written, cast to int32 and back). Left out, as
    the census files them with the kernel's bytes (tensors of the sequence's pairs): the weighted scores'
    masking and the selection's mask, 21 bytes a key."""
    ex = spec.extra
    heads, dim, topk = int(ex["index_n_heads"]), int(ex["index_head_dim"]), int(ex["index_topk"])
    rope, h = int(spec.qk_rope_head_dim or 0), spec.hidden_size
    matmuls = [(int(spec.q_lora_rank or 0), heads * dim, 1), (h, dim, 1), (h, heads, 1)]
    out["matmuls"]["attention"] += matmuls
    out["splits"]["attention"] += ["none"] * len(matmuls)
    out["forward_only_matmuls"] = {"attention": matmuls}
    out["forward_only_scores_at"] = lambda seq: float(2 * heads * (dim + 1) * seq * seq)

    def elements(seq: int) -> Tuple[float, float]:
        key_norm = 4 * dim + 8  # a LayerNorm: the key read and written, its mean and rstd in fp32 (a norm's: whole)
        projections = 10 * dim + 10 * heads * dim + 20 * heads * rope + 28 * rope + 14 * heads
        selection = 36 * topk + 4 * seq if topk < seq else 0
        return (projections + 16 * heads * seq + selection) / 2.0, key_norm / 2.0
    out["forward_only_elements_at"].append(elements)
    out["launches"] += DSA_INDEXER_LAUNCHES


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
    if shapes.get("score_flops_at") is not None:
        flops["scores"] = float(shapes["score_flops_at"](seq, all_pairs))
    elif shapes["has_attention"]:
        window = _window(spec.kind(kind))
        pairs = float(seq) * seq if all_pairs else float(window_pairs(seq, window))
        flops["scores"] = shapes["score_per_pair"] * pairs
    if shapes["linrec_per_token"]:
        flops["linrec"] = shapes["linrec_per_token"] * seq
    for part, value in _analytic_forward_only(shapes, seq).items():
        if part == "scores":  # the forward-only scores: beside the kernel's (their matmuls are counted above)
            flops[part] = flops.get(part, 0.0) + value
    return flops


def _analytic_forward_only(shapes: Mapping[str, Any], seq: int) -> Dict[str, float]:
    """The forward FLOPs by part, on one sequence of *seq* tokens, of what *shapes* mark forward-only."""
    out = {part: float(sum(2 * seq * multiplier * i * o for i, o, multiplier in matmuls))
           for part, matmuls in shapes.get("forward_only_matmuls", {}).items()}
    if shapes.get("forward_only_scores_at") is not None:
        out["scores"] = out.get("scores", 0.0) + shapes["forward_only_scores_at"](seq)
    return out


def analytic_parameters(spec: ModelSpec, kind: str) -> Dict[str, int]:
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
    without it they are counted from the same shapes. The GEMM shapes are
    always the analytic ones: with measured FLOPs the time model reads only
    their distribution within each op class (the census counts FLOPs, not
    shapes); a kind the formulas cannot shape has none (a constant
    efficiency prices it). Launches are the census's where it counted them
    (less a chunked recurrence's loop, counted at the analytic rate a token so
    it scales with the sequence), else the analytic count of the eager modules.
    """
    measured = record is not None and bool(getattr(record, "flops_by_part", None))
    try:
        shapes = _kind_shapes(spec, kind)
    except Unpriced:
        if not measured:
            raise
        shapes = _generic_shapes(spec)  # the census measured what the formulas cannot shape
    flops: Mapping[str, float]
    if measured:
        flops, at, source = dict(record.flops_by_part), int(record.seq), f"census flops ({record.source})"
    else:
        flops, at, source = analytic_flops(spec, kind, seq), int(seq), ANALYTIC_FLOPS
    # a family's sparse kernel gathers a number of entries that depends on the sequence (the work is made at each)
    window = int(shapes["window_at"](at)) if shapes.get("window_at") else _window(spec.kind(kind))
    unknown = sorted(set(flops) - set(FLOP_PARTS))
    if unknown:
        raise Unpriced(f"layer kind {kind!r}: FLOPs of part(s) {', '.join(unknown)} have no op class; "
                       f"known parts: {', '.join(FLOP_PARTS)}")
    per_token = {part: float(v) / at for part, v in flops.items()}
    pairs = float(window_pairs(at, window))
    attention_mm, other, routed, linrec, scores = _by_class(flops, at, pairs)
    if measured:
        forward_only = dict(getattr(record, "forward_only_flops_by_part", None) or {})
    else:
        forward_only = _analytic_forward_only(shapes, at)
    params = dict(parameters) if parameters is not None else analytic_parameters(spec, kind)
    elementwise = float(shapes["elementwise"])
    replicated_elements = float(shapes["replicated"])
    census_traffic = _census_elementwise(record, shapes) if record is not None else None
    if census_traffic is not None:
        elementwise, replicated_elements = census_traffic
        only_elements = _census_forward_only_elements(record)
        source += "; census traffic"
    else:
        parts = [elements_at(seq) for elements_at in shapes.get("forward_only_elements_at", ())]
        only_elements = (sum(p[0] for p in parts), sum(p[1] for p in parts))
        elementwise += only_elements[0]
        replicated_elements += only_elements[1]
        source += "; analytic traffic"
    launches, launches_per_token = float(shapes["launches"]), float(shapes["launches_per_token"])
    counted = (getattr(record, "traffic", None) or {}).get("launches") if record is not None else None
    if counted:  # the census's count at its sequence length; a chunked loop's share rescales at the analytic rate
        launches = max(0.0, float(sum(counted.values())) - launches_per_token * int(record.seq))
        source += "; census launches"
    else:
        source += "; analytic launches"
    dense = sum(v for p, v in params.items() if p in TP_PARTS)
    # the Linear layers torchao's float8 converts: the TP-split parts (attention projections, dense and shared
    # MLP), their FLOPs and the input and output widths of their matmuls; None where no shapes are known
    linears = [m for p in TP_PARTS for m in shapes["matmuls"].get(p, ())]
    splits = [split for p in TP_PARTS for split in shapes["splits"].get(p, ())]
    # a part's projections reading the layer's h-wide input (q, k and v; MLA's down-projections; gate and up) read
    # one tensor, which a fused linear casts once (Megatron-LM's linear_qkv, linear_fc1)
    fused_inputs = 0.0
    for p in TP_PARTS:
        reads_input = False
        for (i, _, m), split in zip(shapes["matmuls"].get(p, ()), shapes["splits"].get(p, ()), strict=True):
            shared = i == spec.hidden_size and split != "row"
            fused_inputs += 0.0 if shared and reads_input else i * m
            reads_input = reads_input or shared
    # under float8_experts: a copy's inputs and outputs of the experts' matmuls; the column ones (gate and up) are
    # one grouped GEMM reading the copy once (Transformers' experts hold gate_up_proj fused)
    experts = [(m, split) for p in ROUTED_PARTS
               for m, split in zip(shapes["matmuls"].get(p, ()), shapes["splits"].get(p, ()), strict=True)]
    column = [m for m, split in experts if split == "column"]
    routed_inputs = (column[0][0] * column[0][2] if column else 0) + sum(
        i * m for (i, _, m), split in experts if split != "column")
    routed_outputs = sum(o * m for (_, o, m), _ in experts)
    shaped = shapes["fused_elementwise"] is not None
    routed_params = sum(v for p, v in params.items() if p in ROUTED_PARTS)
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
        recomputed_scores_share=getattr(record, "recomputed_scores_share", None),
        query_elements_per_token=int(shapes["query_elements"]), kv_elements_per_token=int(shapes["kv_elements"]),
        unfused_rotary_elements_per_token=float(
            (COMPLEX_ROTARY_ELEMENTS - FUSED_ROTARY_ELEMENTS) * shapes.get("rotary_elements", 0)),
        experts_per_token=int(shapes["experts_per_token"] if spec.num_experts else 0),
        has_attention=bool(shapes["has_attention"] and scores > 0),
        float8_mm_flops_per_token=sum(per_token.get(p, 0.0) for p in TP_PARTS) if shaped else None,
        float8_input_elements_per_token=float(sum(i * m for i, _, m in linears)) if shaped else None,
        float8_fused_input_elements_per_token=fused_inputs if shaped else None,
        float8_output_elements_per_token=float(sum(o * m for _, o, m in linears)) if shaped else None,
        float8_gathered_input_elements_per_token=float(sum(
            i * m for (i, _, m), split in zip(linears, splits, strict=True) if split != "row")) if shaped else None,
        float8_gathered_output_elements_per_token=float(sum(
            o * m for (_, o, m), split in zip(linears, splits, strict=True) if split != "column")) if shaped else None,
        float8_routed_input_elements_per_token=float(routed_inputs) if shaped else None,
        float8_routed_output_elements_per_token=float(routed_outputs) if shaped else None,
        compiled_elementwise_elements_per_token=shapes["fused_elementwise"],
        compiled_replicated_elements_per_token=shapes["fused_replicated"],
        gemms=tuple(shapes["gemms"]), launches_per_layer=launches, launches_per_token=launches_per_token,
        attention_heads=int(shapes["heads"][0]), attention_head_dim=int(shapes["heads"][1]),
        attention_value_head_dim=int(shapes["heads"][2]), extra_keys_per_token=shapes["extra_keys_per_token"],
        **_forward_only_fields(forward_only, at, pairs, only_elements),
    )


def _by_class(flops: Mapping[str, float], at: int, pairs: float) -> Tuple[float, float, float, float, float]:
    """FLOPs by part on one sequence of *at* tokens (*pairs* the pairs its scores span) as KindWork's classes:
    attention, other and routed matmuls and the linear recurrence a token, and the scores a pair."""
    def per_token(parts):
        return sum(float(flops.get(p, 0.0)) for p in parts) / at

    other = sum(float(v) for p, v in flops.items()
                if p not in _ATTENTION_MM_PARTS + ROUTED_PARTS + _LINREC_PARTS + _SCORE_PARTS) / at
    return (per_token(_ATTENTION_MM_PARTS), other, per_token(ROUTED_PARTS), per_token(_LINREC_PARTS),
            sum(float(flops.get(p, 0.0)) for p in _SCORE_PARTS) / pairs)


def _forward_only_fields(flops: Mapping[str, float], at: int, pairs: float,
                         elements: Tuple[float, float]) -> Dict[str, float]:
    """KindWork's ``forward_only_*`` figures from forward-only FLOPs by part on one sequence of *at* tokens and the
    forward-only (TP-split, replicated) elementwise elements a token."""
    attention_mm, other, routed, linrec, scores = _by_class(flops, at, pairs)
    return {"forward_only_attention_mm_flops_per_token": attention_mm, "forward_only_other_mm_flops_per_token": other,
            "forward_only_routed_mm_flops_per_token": routed, "forward_only_linrec_flops_per_token": linrec,
            "forward_only_score_flops_per_pair": scores, "forward_only_elementwise_elements_per_token": elements[0],
            "forward_only_replicated_elements_per_token": elements[1]}


def _census_forward_only_elements(record: Any) -> Tuple[float, float]:
    """(TP-split, replicated) 2-byte elements a token the census's FLOP-less forward-only ops moved beyond the weights
    they read (``traffic["forward_only_moved_bytes"]``), filed as :func:`_census_elementwise` files their parts
    (those a TP rank holds whole replicated, the rest split)."""
    moved = (getattr(record, "traffic", None) or {}).get("forward_only_moved_bytes") or {}
    tokens = float(record.seq)
    split = sum(float(v) for p, v in moved.items() if p not in _KERNEL_TRAFFIC_PARTS + _REPLICATED_TRAFFIC_PARTS)
    replicated = sum(float(v) for p, v in moved.items() if p in _REPLICATED_TRAFFIC_PARTS)
    return split / 2.0 / tokens, replicated / 2.0 / tokens


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
    rotary, activation functions, residual adds, copies. Of the parts a TP
    rank holds whole (norms, residual adds, router), those without a matmul
    are split by what the census's TP 2 rank moves (``tp2_moved_bytes``):
    the bytes it halves are TP-split, as per-head query and key norms'
    (Qwen3's, GLM-4.5's) are, and the rest replicated, as the layer norms'
    and MLA's latent norms' are. None where the record has no traffic.
    """
    traffic = getattr(record, "traffic", None) or {}
    moved = traffic.get("moved_bytes")
    if not moved:
        return None
    parameter = traffic.get("parameter_bytes") or {}
    moved_2, parameter_2 = traffic.get("tp2_moved_bytes") or {}, traffic.get("tp2_parameter_bytes") or {}
    tokens = float(record.seq)
    io = shapes.get("matmul_io", {})
    split = replicated = 0.0
    for part, value in moved.items():
        if part in _KERNEL_TRAFFIC_PARTS:
            continue
        rest = max(0.0, float(value) - float(parameter.get(part, 0)) - 2.0 * io.get(part, 0) * tokens)
        if part in _REPLICATED_TRAFFIC_PARTS:
            halved = 0.0
            if part in moved_2 and not io.get(part, 0):  # what a TP 2 rank moves less: 2 (x1 - x2) is split
                rest_2 = max(0.0, float(moved_2[part]) - float(parameter_2.get(part, 0)))
                halved = min(rest, max(0.0, 2.0 * (rest - rest_2)))
            split += halved
            replicated += rest - halved
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
            "elementwise": 0.0, "replicated": 0.0, "matmul_io": {}, "fused_elementwise": None,
            "fused_replicated": None, "gemms": (), "launches": 0, "launches_per_token": 0.0, "heads": (0, 0, 0)}




def model_work(spec: ModelSpec, seq: int, records: Optional[Mapping[str, Any]] = None,
               parameters: Any = None, works: Optional[Mapping[str, KindWork]] = None) -> ModelWork:
    """The :class:`ModelWork` of *spec*: every kind's work, the layer order, the embedding and the head.

    *records* maps kinds to KindRecords (a census's; kinds without FLOPs fall
    back to :func:`analytic_flops`; ``"output"`` the output layer's);
    *parameters* is ``ndcost.models.parameters(spec)`` where available, else
    the parameters are counted from the matmul shapes. *works* gives kinds'
    work an estimator the resolver chose already made.
    """
    records = dict(records or {})
    if parameters is None:
        try:
            from ndcost.models import parameters as count_parameters
            parameters = count_parameters(spec)
        except Exception:  # families not loadable: count from the shapes (the work's source says so)
            parameters = None
    work = dict(works or {})
    for kind in spec.kinds:
        if kind not in work:
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
        layer_runs=tuple((g.kind, g.count) for g in spec.layers if not g.mtp),
        mtp_kinds=tuple(g.kind for g in spec.layers if g.mtp for _ in range(g.count)),
        embedding_parameters=int(embedding), head_parameters=int(head), final_norm_parameters=int(final_norm),
        head_flops_per_token=head_flops, loss_bytes_per_token=loss_bytes, source="; ".join(sources),
        routed_experts=spec.num_experts or 0, experts_per_token=spec.num_experts_per_tok or 0,
        expert_groups=spec.expert_groups or 1, expert_groups_per_token=spec.expert_groups_per_token or 1,
    )


# ---------------------------------------------------------------------------
# the estimators
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class CensusFlops:
    """A kind's work from the FLOPs and bytes the census counted on its record (``FlopCounterMode``)."""

    name: str = "census"
    description: str = "FLOPs and traffic by part the census counted running the real modules"

    def available(self, spec: ModelSpec, runtime: Any) -> Optional[str]:
        return None  # per kind: where the activation record carries measured FLOPs

    def measures(self, record: Any) -> bool:
        """Whether *record* carries the census's FLOPs."""
        return record is not None and bool(getattr(record, "flops_by_part", None))

    def kind_work(self, spec: ModelSpec, kind: str, seq: int, record: Any,
                  parameters: Optional[Mapping[str, int]]) -> KindWork:
        if not self.measures(record):
            raise Unpriced(f"layer kind {kind!r} of {spec.name!r}: its record states no measured FLOPs")
        return kind_work(spec, kind, seq, record, parameters)


@attrs.frozen(kw_only=True)
class AnalyticFlops:
    """A kind's work from the matmul shapes of its LayerKind; the record's recompute shares where it has them."""

    name: str = "analytic"
    description: str = "matmul shapes, attention pairs and eager elementwise traffic of the layer kind"

    def available(self, spec: ModelSpec, runtime: Any) -> Optional[str]:
        return None

    def measures(self, record: Any) -> bool:
        return True

    def model_work(self, spec: ModelSpec, seq: int, records: Mapping[str, Any], parameters: Any,
                   works: Mapping[str, KindWork]) -> ModelWork:
        """The model's work from the kinds' (*works*), with the head and the loss from the output record."""
        return model_work(spec, seq, records, parameters, works)

    def kind_work(self, spec: ModelSpec, kind: str, seq: int, record: Any,
                  parameters: Optional[Mapping[str, int]]) -> KindWork:
        if record is not None and (getattr(record, "flops_by_part", None) or getattr(record, "traffic", None)):
            record = attrs.evolve(record, flops_by_part={}, traffic={})  # what was measured is not used
        return kind_work(spec, kind, seq, record, parameters)


@hookimpl
def ndcost_register(register):
    for estimator in (CensusFlops(), AnalyticFlops()):
        register(f"estimator/flops/{estimator.name}", estimator)
