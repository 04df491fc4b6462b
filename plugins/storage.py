"""Storage formats by bits per element and per-group scale overhead."""
from __future__ import annotations

from ndcost.hookspecs import hookimpl


@hookimpl
def ndcost_register(register):
    pass  # filled by the accounting work
