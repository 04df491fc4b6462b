"""Trainer configuration formats (``trainer/<kind>``): torchtitan, Megatron-LM, DeepSpeed, HyperParallel.

Each module is its own entry point and registers one format meeting the
``trainer/`` contract (ndcost.protocols.TrainerFormatLike); the core's
:mod:`ndcost.trainers` reads and writes through the registry only.
"""
from __future__ import annotations

from typing import Any, Optional

from ndcost.trainers import field_error
from ndcost.values import _DTYPE_ALIASES, DTYPES

__all__ = ["integer", "boolean", "dtype"]


def integer(kind: str, path: str, field: str, value: Any, *, minimum: int = 1, fix: str = "") -> int:
    """*value* as a whole number of at least *minimum*, else the one-line refusal naming the file and the field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise field_error(kind, path, field, f"{value!r} is not a whole number >= {minimum}",
                          fix or f"give a whole number >= {minimum}")
    return value


def boolean(kind: str, path: str, field: str, value: Any) -> bool:
    """*value* as true or false (never a string such as "yes")."""
    if not isinstance(value, bool):
        raise field_error(kind, path, field, f"{value!r} is not a boolean", "give true or false")
    return value


def dtype(kind: str, path: str, field: str, value: Any, allowed: Optional[tuple] = None,
          fix: Optional[str] = None) -> str:
    """A trainer's dtype name ("bfloat16", "float32") as ndcost's ("bf16", "fp32"), one of *allowed* (ndcost's)."""
    name = _DTYPE_ALIASES.get(value.strip().lower(), value.strip().lower()) if isinstance(value, str) else None
    allowed = allowed or tuple(DTYPES)
    if name not in allowed:
        raise field_error(kind, path, field, f"{value!r} is not a dtype ndcost prices here",
                          fix or f"give one of {', '.join(allowed)}")
    return name
