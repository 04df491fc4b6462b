"""Attention parameters: MHA/GQA/MQA with stated or unstated biases, an output gate, MLA, the DSA indexer.

Biases follow :func:`ndcost.plugins.formulas.common.bias`: ``qkv_bias`` for
the query, key and value projections, ``o_bias`` for the output projection;
True, False, or None where the model leaves them unstated.
"""
from __future__ import annotations

from typing import Optional

from ndcost.hookspecs import hookimpl
from ndcost.plugins.formulas import count, slots
from ndcost.plugins.formulas.common import bias


def gqa(*, hidden: int, heads: int, kv_heads: int, head_dim: int,
        qkv_bias: Optional[bool] = False, o_bias: Optional[bool] = False) -> int:
    """Grouped-query attention: Q and O are ``hidden x heads*head_dim``, K and V ``hidden x kv_heads*head_dim``.

    MHA is ``kv_heads == heads``, MQA ``kv_heads == 1``.
    """
    count("hidden", hidden)
    q = count("heads", heads) * count("head_dim", head_dim)
    kv = count("kv_heads", kv_heads) * head_dim
    return (hidden * q + bias(stated=qkv_bias, width=q, hidden=hidden)
            + 2 * (hidden * kv + bias(stated=qkv_bias, width=kv, hidden=hidden))
            + q * hidden + bias(stated=o_bias, width=hidden, hidden=hidden))


def mha(*, hidden: int, heads: int, head_dim: int, qkv_bias: Optional[bool] = False,
        o_bias: Optional[bool] = False) -> int:
    """Multi-head attention: a key and value head per query head."""
    return gqa(hidden=hidden, heads=heads, kv_heads=heads, head_dim=head_dim, qkv_bias=qkv_bias, o_bias=o_bias)


def mqa(*, hidden: int, heads: int, head_dim: int, qkv_bias: Optional[bool] = False,
        o_bias: Optional[bool] = False) -> int:
    """Multi-query attention: one key and value head shared by every query head."""
    return gqa(hidden=hidden, heads=heads, kv_heads=1, head_dim=head_dim, qkv_bias=qkv_bias, o_bias=o_bias)


def output_gate(*, hidden: int, heads: int, head_dim: int, qkv_bias: Optional[bool] = False) -> int:
    """An attention output gate fused into the query projection (Qwen3-Next, Qwen3.5): a second query-wide slab."""
    q = count("heads", heads) * count("head_dim", head_dim)
    return count("hidden", hidden) * q + bias(stated=qkv_bias, width=q, hidden=hidden)


def sinks(*, heads: int) -> int:
    """Learned attention sinks: one logit per query head (GPT-OSS, DeepSeek-V4)."""
    return count("heads", heads)


def mla(*, hidden: int, heads: int, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
        v_head_dim: int, q_lora_rank: Optional[int] = None, attention_bias: Optional[bool] = False) -> int:
    """Multi-head latent attention (DeepSeek-V2/V3).

    Query side: with a query latent, a compression matrix into it, a norm
    over it and a decompression to each head's rotary and non-rotary widths;
    without one (``q_lora_rank`` None or 0), a single hidden-to-heads matrix.
    Key/value side: a compression into the shared latent that also emits the
    rotary key, a norm over the latent, and a decompression to each head's
    non-rotary key and its value. Last, the output matrix from the values back
    to the hidden width. ``attention_bias`` applies, as in
    Transformers, to the two down-projections and the output projection.
    """
    count("hidden", hidden)
    count("heads", heads)
    qk_head = count("qk_nope_head_dim", qk_nope_head_dim) + count("qk_rope_head_dim", qk_rope_head_dim)
    if q_lora_rank:
        count("q_lora_rank", q_lora_rank)
        query = (hidden * q_lora_rank + bias(stated=attention_bias, width=q_lora_rank, hidden=hidden)
                 + q_lora_rank + q_lora_rank * heads * qk_head)
    else:
        query = hidden * heads * qk_head
    kv_a = count("kv_lora_rank", kv_lora_rank) + qk_rope_head_dim
    key_value = (hidden * kv_a + bias(stated=attention_bias, width=kv_a, hidden=hidden) + kv_lora_rank
                 + kv_lora_rank * heads * (qk_nope_head_dim + count("v_head_dim", v_head_dim)))
    output = heads * v_head_dim * hidden + bias(stated=attention_bias, width=hidden, hidden=hidden)
    return query + key_value + output


def dsa_indexer(*, hidden: int, q_lora_rank: int, index_heads: int, index_head_dim: int) -> int:
    """DeepSeek sparse attention's lightning indexer (V3.2): queries from the query latent, one key head
    with its LayerNorm, and per-head weights."""
    count("hidden", hidden)
    return (count("q_lora_rank", q_lora_rank) * count("index_heads", index_heads) * count("index_head_dim", index_head_dim)
            + hidden * index_head_dim + 2 * index_head_dim + hidden * index_heads)


SLOTS = {
    "attention.params.gqa": gqa,
    "attention.params.mha": mha,
    "attention.params.mqa": mqa,
    "attention.params.output_gate": output_gate,
    "attention.params.sinks": sinks,
    "attention.params.mla": mla,
    "attention.params.dsa_indexer": dsa_indexer,
}

ndcost_register = hookimpl(slots(SLOTS))
