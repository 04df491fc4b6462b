"""ndcost: per-device memory and step time of LLM training under a parallel strategy.

The public API: :func:`resolve`, :func:`verify`, :func:`from_config`, :class:`Strategy`, :class:`Hardware`,
:class:`ModelSpec` and :mod:`ndcost.accounting`. Importing ndcost does not
import torch or transformers; only a census does.
"""
from __future__ import annotations

from ndcost.errors import (
    CensusUnavailable,
    InvalidStrategy,
    InvalidValue,
    NdcostError,
    RegistrationError,
    UnknownKey,
    Unpriced,
)
from ndcost.hookspecs import hookimpl
from ndcost.layer import LayerKind
from ndcost.values import (
    FLOP_PARTS,
    OPS,
    PARTS,
    Hardware,
    LayerGroup,
    ModelSpec,
    NetworkLevel,
    StageMemory,
    Strategy,
    StrategyCost,
    TimeBreakdown,
)

__version__ = "0.1.0"

__all__ = [
    "resolve", "verify", "from_config", "Strategy", "Hardware", "ModelSpec", "LayerGroup", "LayerKind", "NetworkLevel",
    "StageMemory",
    "StrategyCost",
    "TimeBreakdown", "accounting", "hookimpl", "PARTS", "OPS", "FLOP_PARTS",
    "NdcostError", "InvalidValue", "InvalidStrategy", "UnknownKey", "RegistrationError", "Unpriced",
    "CensusUnavailable", "__version__",
]


def resolve(model, runtime: str = "hf-cuda", hardware="h200", census: str = "auto"):
    """A :class:`~ndcost.resolver.CostModel` for *model* (see :mod:`ndcost.resolver`)."""
    from ndcost.resolver import resolve as _resolve
    return _resolve(model, runtime=runtime, hardware=hardware, census=census)


def verify(model, seq: int = 4096, runtime: str = "hf-cuda", threshold: float = 0.02, use_cache: bool = True):
    """The formulas beside the census, kind by kind (see :mod:`ndcost.verification`)."""
    from ndcost.verification import verify as _verify
    return _verify(model, seq=seq, runtime=runtime, threshold=threshold, use_cache=use_cache)


def from_config(kind, path, *, devices=None, model=None, strategy=None):
    """A trainer's configuration file as a model and a strategy (see :mod:`ndcost.trainers`)."""
    from ndcost.trainers import from_config as _from_config
    return _from_config(kind, path, devices=devices, model=model, strategy=strategy)


def __getattr__(name):
    if name == "accounting":
        import importlib
        return importlib.import_module("ndcost.accounting")
    raise AttributeError(f"module 'ndcost' has no attribute {name!r}")
