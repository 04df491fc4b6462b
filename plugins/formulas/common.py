"""Biases, the embedding, the head and norms: the slots every family shares.

The bias convention (HyperParallel's ``_bias``: mindspore-ai/hyper-parallel,
hyper_parallel/auto_parallel/sapp_nd/memory_estimation/evaluators/layer_block.py):
a projection whose model states a bias has one of its output width, one whose model states none has none, and where the
model leaves it unstated, one of the hidden width.
"""
from __future__ import annotations

from typing import Optional

from ndcost.hookspecs import hookimpl
from ndcost.plugins.formulas import count, slots


def bias(*, stated: Optional[bool], width: int, hidden: int) -> int:
    """A projection's bias: *width* where stated, 0 where stated absent, *hidden* where unstated."""
    count("width", width)
    count("hidden", hidden)
    if stated is None:
        return hidden
    return width if stated else 0


def mlp_biases(*, stated: Optional[bool], width: int, hidden: int, matrices: int = 3) -> int:
    """Bias parameters of a feed-forward of *matrices* projections and inner width *width*.

    When the model states biases, every projection that widens to *width*
    carries a *width*-long bias and the closing projection back to the hidden
    size a *hidden*-long one; when it does not, all *matrices* biases are
    counted *width* long.
    """
    count("width", width)
    count("matrices", matrices)
    if stated is None:
        return matrices * width
    return (matrices - 1) * width + hidden if stated else 0


def embedding(*, vocab: int, hidden: int, positions: int = 0) -> int:
    """The token embedding, and a learned position embedding of *positions* rows where the model has one."""
    return count("vocab", vocab) * count("hidden", hidden) + count("positions", positions) * hidden


def head(*, vocab: int, hidden: int, tied: bool = False, bias: bool = False) -> int:
    """The output projection to the vocabulary: none of its own where tied to the embedding."""
    if tied:
        return 0
    return count("vocab", vocab) * count("hidden", hidden) + (vocab if bias else 0)


def layer_norms(*, hidden: int, norms: int, bias: Optional[bool] = False) -> int:
    """*norms* norms of *hidden*: a weight each (RMSNorm), a bias too (LayerNorm, or unstated: two vectors)."""
    vectors = 1 if bias is False else 2
    return count("norms", norms) * vectors * count("hidden", hidden)


def qk_norm(*, head_dim: int, bias: bool = False) -> int:
    """A QK-norm: one norm over a head's width for the queries and one for the keys."""
    return 2 * count("head_dim", head_dim) * (2 if bias else 1)


def mtp_glue(*, hidden: int) -> int:
    """A DeepSeek-style MTP layer's own tensors beside its decoder block: the embedding and hidden-state
    norms, the projection of their concatenation back to the hidden width, and its output norm (the
    embedding and head are shared with the main model)."""
    count("hidden", hidden)
    return hidden + hidden + 2 * hidden * hidden + hidden


SLOTS = {
    "bias.params": bias,
    "bias.params.mlp": mlp_biases,
    "embedding.params": embedding,
    "head.params": head,
    "norm.params.layer": layer_norms,
    "norm.params.qk": qk_norm,
    "mtp.params.glue": mtp_glue,
}

ndcost_register = hookimpl(slots(SLOTS))
