"""Exact storage accounting (seeds 000, 002, 004)."""
from __future__ import annotations

from ndcost.hookspecs import hookimpl


@hookimpl
def ndcost_register(register):
    pass  # filled by the accounting work
