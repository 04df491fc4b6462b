"""Estimator registry: validated keys, sources, explicit overrides, lookups that suggest."""
from ndcost.registry.registry import Entry, Registry, Source, validate_key

__all__ = ["Entry", "Registry", "Source", "validate_key"]
