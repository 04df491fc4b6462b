"""Pipeline schedules: how many micro-batches' activations a stage holds, and the bubble."""
from __future__ import annotations

from ndcost.hookspecs import hookimpl


@hookimpl
def ndcost_register(register):
    pass  # filled by the resolver work
