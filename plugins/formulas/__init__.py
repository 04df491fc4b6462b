"""Formula slots: analytic counts, each registered as ``formula/<name>`` so a plugin can override one.

Every slot is a plain function of keyword integers (widths, counts) and
stated flags, returning an exact int; none imports torch. A family composes
them into a layer's parameters by part. Modules: ``common`` (biases,
embedding, head, norms), ``attention`` (MHA/GQA/MQA, output gate, QK-norm,
MLA, DSA indexer), ``moe`` (dense FFN, routed with ETP slicing, shared,
router), ``linear_attention`` (gated delta net), ``deepseek_v4`` and
``gpt_oss``.
"""
from __future__ import annotations

from typing import Callable, Dict

from ndcost.errors import InvalidValue


def slots(table: Dict[str, Callable[..., int]]):
    """A ``ndcost_register`` hook registering each of *table* as ``formula/<name>``."""

    def ndcost_register(register):
        for name, function in table.items():
            register(f"formula/{name}", function)

    return ndcost_register


def count(name: str, value) -> int:
    """*value* as a count (an int >= 0), else an InvalidValue naming the slot's argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValue(f"formula argument {name} must be an integer >= 0, got {value!r}")
    return value


def sliced(name: str, width: int, parts: int) -> int:
    """*width* split *parts* ways (ETP, TP); parts must divide it."""
    count(name, width)
    if parts < 1:
        raise InvalidValue(f"{name}: cannot split over {parts} ranks; the split must be >= 1")
    if width % parts:
        raise InvalidValue(f"{name} {width} is not divisible by the split {parts} "
                           f"({width} / {parts} = {width / parts:g})")
    return width // parts
