"""Feed-forward parameters: a dense FFN, routed experts (with ETP slicing), shared experts and the router.

``matrices`` is the number of weight matrices of one feed-forward (3 for a
gated SwiGLU, 2 for a GELU MLP); biases follow
:func:`ndcost.plugins.formulas.common.mlp_biases`.
"""
from __future__ import annotations

from typing import Optional

from ndcost.hookspecs import hookimpl
from ndcost.plugins.formulas import count, sliced, slots
from ndcost.plugins.formulas.common import mlp_biases


def dense(*, hidden: int, intermediate: int, matrices: int = 3, bias: Optional[bool] = False) -> int:
    """One feed-forward *intermediate* wide."""
    return (count("matrices", matrices) * count("intermediate", intermediate) * count("hidden", hidden)
            + mlp_biases(stated=bias, width=intermediate, hidden=hidden, matrices=matrices))


def routed(*, hidden: int, experts: int, intermediate: int, matrices: int = 3, bias: Optional[bool] = False,
           etp: int = 1) -> int:
    """*experts* routed experts, each *intermediate* wide, as one ETP rank holds them (its 1/etp of each width)."""
    width = sliced("expert intermediate_size", intermediate, etp)
    return count("experts", experts) * dense(hidden=hidden, intermediate=width, matrices=matrices, bias=bias)


def shared(*, hidden: int, intermediate: int, matrices: int = 3, bias: Optional[bool] = False,
           gate: bool = False, etp: int = 1) -> int:
    """The shared expert(s) as one feed-forward of their total width, and the weight gating their output."""
    if not intermediate:
        return 0
    width = sliced("shared expert intermediate_size", intermediate, etp)
    return dense(hidden=hidden, intermediate=width, matrices=matrices, bias=bias) + (hidden if gate else 0)


def router(*, hidden: int, experts: int, bias: bool = False) -> int:
    """The router: a weight per routed expert the hidden width wide, and a bias per expert where stated."""
    return count("experts", experts) * (count("hidden", hidden) + (1 if bias else 0))


SLOTS = {
    "ffn.params.dense": dense,
    "moe.params.routed": routed,
    "moe.params.shared": shared,
    "moe.params.router": router,
}

ndcost_register = hookimpl(slots(SLOTS))
