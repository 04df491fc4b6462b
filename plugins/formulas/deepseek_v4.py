"""DeepSeek-V4's parts: hyper-connections, its attention, the CSA/HCA compressors, the indexer, the hash router.

Shapes follow Transformers' ``modeling_deepseek_v4``: a layer keeps ``hc_mult``
residual streams mixed by two manifold-constrained hyper-connections; its
attention is shared-KV MQA with a query latent, attention sinks and a grouped
low-rank output projection; compressed layers add a compressor (CSA: with an
overlapping window and a lightning indexer; HCA: without either).
"""
from __future__ import annotations

from ndcost.hookspecs import hookimpl
from ndcost.plugins.formulas import count, sliced, slots


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


SLOTS = {
    "deepseek_v4.params.hyper_connection": hyper_connection,
    "deepseek_v4.params.hyper_head": hyper_head,
    "deepseek_v4.params.attention": attention,
    "deepseek_v4.params.compressor": compressor,
    "deepseek_v4.params.indexer": indexer,
    "deepseek_v4.params.hash_router": hash_router,
}

ndcost_register = hookimpl(slots(SLOTS))
