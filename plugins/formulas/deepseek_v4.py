"""DeepSeek-V4's parts: hyper-connections, its attention, the CSA/HCA compressors, the indexer, the hash router.

Shapes follow Transformers' ``modeling_deepseek_v4``: a layer keeps ``hc_mult``
residual streams mixed by two manifold-constrained hyper-connections; its
attention is shared-KV MQA with a query latent, attention sinks and a grouped
low-rank output projection; compressed layers add a compressor (CSA: with an
overlapping window and a lightning indexer; HCA: without either). Beside the
parameters, the forward work the analytic FLOPs estimator counts of a layer: its
matmuls, the sparse attention kernel's pairs, the indexer's scores, and
estimates of its elementwise traffic and kernel launches.
"""
from __future__ import annotations

from typing import List, Tuple

from ndcost.hookspecs import hookimpl
from ndcost.plugins.formulas import count, sliced, slots

# A matmul of a layer as the analytic FLOPs count it: (in, out, tokens_per_token, how TP splits it).
Matmul = Tuple[int, int, int, str]


def hyper_connection(*, hidden: int, hc_mult: int) -> int:
    """One mHC: a projection of the ``hc_mult`` streams to the pre, post and comb weights, their base and 3 scales."""
    n = count("hc_mult", hc_mult)
    width = (2 + n) * n
    return width * n * count("hidden", hidden) + width + 3


def hyper_head(*, hidden: int, hc_mult: int) -> int:
    """The model's hyper-connection head folding the streams into one before the final norm."""
    n = count("hc_mult", hc_mult)
    return n * n * count("hidden", hidden) + n + 1


def attention(*, hidden: int, heads: int, head_dim: int, q_lora_rank: int, o_groups: int, o_lora_rank: int) -> int:
    """The attention without its compressor: query latent and its norm, the query up-projection, one shared
    key-value head and its norm, the grouped output projection (per-group then mixing), and the sinks."""
    count("hidden", hidden)
    q = count("heads", heads) * count("head_dim", head_dim)
    group_in = sliced("num_attention_heads * head_dim per o_groups", q, count("o_groups", o_groups))
    o_mid = o_groups * count("o_lora_rank", o_lora_rank)
    return (hidden * count("q_lora_rank", q_lora_rank) + q_lora_rank + q_lora_rank * q
            + hidden * head_dim + head_dim
            + o_mid * group_in + o_mid * hidden
            + heads)


def compressor(*, hidden: int, head_dim: int, rate: int, overlap: bool) -> int:
    """A KV compressor: kv and gate projections, a position bias per window slot, the compressed key's norm.

    CSA's windows overlap, so its projections and position bias are twice the head width.
    """
    width = (2 if overlap else 1) * count("head_dim", head_dim)
    return 2 * count("hidden", hidden) * width + count("rate", rate) * width + head_dim


def indexer(*, hidden: int, q_lora_rank: int, index_heads: int, index_head_dim: int, rate: int) -> int:
    """CSA's lightning indexer: its own overlapping compressor at the indexer width, the query
    up-projection from the query latent, and the per-head score weights."""
    return (compressor(hidden=hidden, head_dim=index_head_dim, rate=rate, overlap=True)
            + count("q_lora_rank", q_lora_rank) * count("index_heads", index_heads) * index_head_dim
            + hidden * index_heads)


def hash_router(*, hidden: int, experts: int) -> int:
    """The hash-routed layers' router weight (the token-to-expert table is a buffer, not counted)."""
    return count("experts", experts) * count("hidden", hidden)


# ---------------------------------------------------------------------------
# forward work (plugins/estimators/flops.py reads these through the family's ``analytic_attention``)
# ---------------------------------------------------------------------------
def attention_matmuls(*, hidden: int, heads: int, head_dim: int, q_lora_rank: int, o_groups: int,
                      o_lora_rank: int, rate: int, overlap: bool, index_heads: int,
                      index_head_dim: int) -> List[Matmul]:
    """The matmuls of one DeepSeek-V4 attention (``DeepseekV4Attention.forward`` and its compressor), a token.

    ``q_a_proj`` (replicated), ``q_b_proj`` (its heads split by TP), the one shared K=V ``kv_proj``
    (replicated), the grouped ``o_a_proj`` (``o_groups`` GEMMs of a group's ``heads * head_dim / o_groups``
    to ``o_lora_rank``: TP splits each group's heads, the input) and ``o_b_proj`` (``o_groups`` stays whole
    under TP, so it is replicated); *rate* 0 is a sliding layer, else its compressor's ``kv_proj`` and
    ``gate_proj`` (twice the head width where the windows overlap, CSA) and, on CSA, the indexer's own
    compressor at ``index_head_dim``, its ``q_b_proj`` from the query latent and ``weights_proj``. The
    compressor's pooling (a softmax-weighted sum over each window) is elementwise: no matmul.
    """
    q = count("heads", heads) * count("head_dim", head_dim)
    group_in = sliced("num_attention_heads * head_dim per o_groups", q, count("o_groups", o_groups))
    out: List[Matmul] = [(hidden, q_lora_rank, 1, "none"), (q_lora_rank, heads * head_dim, 1, "column"),
                         (hidden, head_dim, 1, "none")]
    out += [(group_in, o_lora_rank, 1, "row")] * o_groups + [(o_groups * o_lora_rank, hidden, 1, "none")]
    if count("rate", rate):
        width = (2 if overlap else 1) * head_dim
        out += [(hidden, width, 1, "none")] * 2
        if overlap:
            out += [(hidden, 2 * index_head_dim, 1, "none")] * 2
            out += [(q_lora_rank, index_heads * index_head_dim, 1, "none"), (hidden, index_heads, 1, "none")]
    return out


def hyper_connection_matmuls(*, hidden: int, hc_mult: int) -> List[Matmul]:
    """A layer's two mHCs (``DeepseekV4HyperConnection``, fp32), a token: each projects the ``hc_mult`` streams
    flattened (``hc_mult * hidden``) to the ``(2 + hc_mult) hc_mult`` pre, post and comb weights, and the layer
    mixes the streams by ``comb`` (``DeepseekV4DecoderLayer.forward``: ``comb^T @ streams``, a
    ``hc_mult x hc_mult`` by ``hc_mult x hidden`` product, written as ``hc_mult`` inputs to
    ``hc_mult * hidden`` outputs: its FLOPs and the streams it writes; it has no weight, where
    plugins/estimators/flops.py's ``analytic_parameters`` fallback counts ``in x out`` a matmul: the family's
    formulas above count the parameters)."""
    n = count("hc_mult", hc_mult)
    return [(n * count("hidden", hidden), (2 + n) * n, 1, "none"), (n, n * hidden, 1, "none")] * 2


def compressed_entries(*, seq: int, rate: int) -> int:
    """Compressed entries of a sequence: one a full window of *rate* tokens (the remainder is left out); 0 sliding."""
    return count("seq", seq) // count("rate", rate) if rate else 0


def sparse_pairs(*, seq: int, window: int, compressed: int, selected: int) -> int:
    """Query-entry pairs DeepSeek-V4's sparse attention kernel computes on one sequence.

    Query ``i`` gathers its window (``min(window, seq)`` keys) and *selected* compressed entries (CSA: the
    indexer's top-k of the *compressed*; HCA: all of them), bounded by the ``i + 1 + compressed`` entries it
    could see: ``sum_i min(w + k, i + 1 + c)`` (plugins/contracts/deepseek_v4.py, ``_SparseAttention.flops``).
    With ``b = w + k - c``: ``s (w + k)`` where ``b <= 0``, else ``s c`` plus the window pairs of ``b``.
    """
    s, c = count("seq", seq), count("compressed", compressed)
    gathered = min(count("window", window) or s, s) + count("selected", selected)
    bound = gathered - c
    if bound <= 0:
        return s * gathered
    windowed = bound * (bound + 1) // 2 + (s - bound) * bound if s > bound else s * (s + 1) // 2
    return s * c + windowed


def indexer_score_flops(*, seq: int, index_heads: int, index_head_dim: int, compressed: int) -> int:
    """The lightning indexer's scores (``DeepseekV4IndexerScorer``): every query against every compressed entry,
    each head a ``index_head_dim`` product, ``2 s h_I d_I c``; its ReLU, weighting and top-k are not matmuls."""
    return 2 * count("seq", seq) * count("index_heads", index_heads) * count("index_head_dim", index_head_dim) \
        * count("compressed", compressed)


# Kernel launches of Transformers 5.24's eager modules outside their matmuls (an estimate counted from
# modeling_deepseek_v4.py; the census counts the real ones where it runs): an RMSNorm with its fp32 weight 8
# (cast, pow, mean, add, rsqrt, product, weight, cast back), the unweighted one 7, the interleaved rotary 11
# (two repeat_interleave, casts, two products, rotate_half's negation and stack, the sum, the cast and the
# concatenation with the nope slice), the rotary table 7.
RMS_NORM_LAUNCHES, UNWEIGHTED_NORM_LAUNCHES, ROTARY_LAUNCHES, ROTARY_TABLE_LAUNCHES = 8, 7, 11, 7


def attention_launches(*, rate: int, overlap: bool) -> int:
    """Launches of one attention outside its matmuls: the query-latent, query and key-value norms, rotary on q
    and K=V and its inverse on the output (one more negation), the kernel, the output's regrouping copies
    (4); a compressor adds its gate bias, fp32 softmax, weighting and sum (5), its norm, rotary and table, and
    its mask (HCA's causal block bias 6, CSA's overlapping layout and the indexer's selection scatter 11);
    CSA's indexer its own pooling (11), norm, two tables and two rotaries, the scores kernel, the future mask
    and top-k (9)."""
    out = RMS_NORM_LAUNCHES * 2 + UNWEIGHTED_NORM_LAUNCHES + 3 * ROTARY_LAUNCHES + 1 + 1 + 4
    if count("rate", rate):
        out += 5 + RMS_NORM_LAUNCHES + ROTARY_LAUNCHES + ROTARY_TABLE_LAUNCHES + (11 if overlap else 6)
        if overlap:
            out += 11 + RMS_NORM_LAUNCHES + 2 * (ROTARY_TABLE_LAUNCHES + ROTARY_LAUNCHES) + 1 + 9
    return out


def hyper_connection_launches(*, sinkhorn_iters: int) -> int:
    """Launches of a layer's two mHCs outside their matmuls (``DeepseekV4HyperConnection.forward``): the fp32
    copy and unweighted norm (6), pre, post and comb (4 each), the first column normalization (3), six a further
    Sinkhorn iteration, the collapse (3); and the layer's mixing of each (the two casts and the product with
    ``post``: 3; the sum is the residual add every layer is counted)."""
    return 2 * (6 + 3 * 4 + 3 + 6 * (count("sinkhorn_iters", sinkhorn_iters) - 1) + 3 + 3)


def attention_elements(*, heads: int, head_dim: int, rope_dim: int, q_lora_rank: int, rate: int, overlap: bool,
                       index_heads: int, index_head_dim: int, norm: int) -> Tuple[int, int]:
    """Elementwise traffic of one attention a token, in 2-byte elements: (the part TP splits: the query heads';
    the part it leaves whole). An estimate from the eager modules: the query's unweighted norm (11 an element:
    fp32 copy, square, mean, product), rotary on the rope slice (10) and the concatenation with the nope slice
    (2) on the query and, inverted, on the output; whole: the latent's and K=V's norms (*norm*), K=V's rotary
    and concatenation; a compressor's gate bias, fp32 softmax, cast and weighting over its projection width
    (12 an element; CSA's overlapping layout copies 4 more), the indexer's the same at its width and its
    query's rotary and concatenation. The kernels' own traffic is the scores'."""
    q = heads * head_dim
    split = 11 * q + 2 * (10 * heads * rope_dim + 2 * q)
    whole = norm * (q_lora_rank + head_dim) + 10 * rope_dim + 2 * head_dim
    if count("rate", rate):
        whole += (16 if overlap else 12) * (2 if overlap else 1) * head_dim
        if overlap:
            whole += 16 * 2 * index_head_dim + 10 * index_heads * rope_dim + 2 * index_heads * index_head_dim
    return split, whole


def hyper_connection_elements(*, hidden: int, hc_mult: int) -> int:
    """Elementwise traffic of a layer's two mHCs and their mixing a token, in 2-byte elements (an estimate): each
    copies the streams to fp32 (3 an element of the ``hc_mult * hidden`` streams), normalizes them (square,
    mean, product: 10), collapses them by ``pre`` (product and sum: 6), and the layer adds ``post`` times the
    block's output to the mixed streams (5)."""
    return 2 * 24 * count("hc_mult", hc_mult) * count("hidden", hidden)


SLOTS = {
    "deepseek_v4.params.hyper_connection": hyper_connection,
    "deepseek_v4.params.hyper_head": hyper_head,
    "deepseek_v4.params.attention": attention,
    "deepseek_v4.params.compressor": compressor,
    "deepseek_v4.params.indexer": indexer,
    "deepseek_v4.params.hash_router": hash_router,
    "deepseek_v4.flops.compressed_entries": compressed_entries,
    "deepseek_v4.flops.sparse_pairs": sparse_pairs,
    "deepseek_v4.flops.indexer_scores": indexer_score_flops,
}

ndcost_register = hookimpl(slots(SLOTS))
