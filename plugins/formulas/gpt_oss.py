"""GPT-OSS: attention with biases on every projection and learned sinks; experts and router with biases."""
from __future__ import annotations

from ndcost.hookspecs import hookimpl
from ndcost.plugins.formulas import count, slots
from ndcost.plugins.formulas.attention import gqa, sinks
from ndcost.plugins.formulas.moe import routed, router


def attention(*, hidden: int, heads: int, kv_heads: int, head_dim: int, bias: bool = True) -> int:
    """GQA with a bias on Q, K, V and O where stated (GPT-OSS states it), plus one sink per head."""
    return gqa(hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim, qkv_bias=bias,
               o_bias=bias) + sinks(heads=heads)


def experts(*, hidden: int, experts: int, intermediate: int, etp: int = 1) -> int:
    """Routed SwiGLU experts with their biases: gate-up ``2*intermediate`` and down ``hidden`` each."""
    return routed(hidden=hidden, experts=experts, intermediate=intermediate, matrices=3, bias=True, etp=etp)


def expert_router(*, hidden: int, experts: int) -> int:
    """The router, a linear with a bias per expert."""
    return router(hidden=hidden, experts=count("experts", experts), bias=True)


SLOTS = {
    "gpt_oss.params.attention": attention,
    "gpt_oss.params.experts": experts,
    "gpt_oss.params.router": expert_router,
}

ndcost_register = hookimpl(slots(SLOTS))
