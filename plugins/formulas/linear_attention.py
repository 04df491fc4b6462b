"""Gated delta net (Qwen3-Next, Qwen3.5 linear-attention layers): projections, short convolution, gates, norm."""
from __future__ import annotations

from ndcost.hookspecs import hookimpl
from ndcost.plugins.formulas import count, slots


def gated_delta_net(*, hidden: int, key_heads: int, value_heads: int, key_head_dim: int, value_head_dim: int,
                    conv_kernel: int) -> int:
    """One gated-delta-net mixer.

    Projections: queries and keys (``key_heads*key_head_dim`` each), values and
    the output gate z (``value_heads*value_head_dim`` each), and the per-value-
    head beta and alpha gates; a depthwise short convolution without bias over
    the queries, keys and values; the per-head decay ``A_log`` and ``dt_bias``;
    a gated RMSNorm over a value head's width; the output projection.
    """
    count("hidden", hidden)
    k = count("key_heads", key_heads) * count("key_head_dim", key_head_dim)
    v = count("value_heads", value_heads) * count("value_head_dim", value_head_dim)
    projections = hidden * (2 * k + 2 * v) + hidden * 2 * value_heads
    convolution = (2 * k + v) * count("conv_kernel", conv_kernel)
    gates = 2 * value_heads
    norm = value_head_dim
    output = v * hidden
    return projections + convolution + gates + norm + output


SLOTS = {"linear_attention.params.gated_delta_net": gated_delta_net}

ndcost_register = hookimpl(slots(SLOTS))
