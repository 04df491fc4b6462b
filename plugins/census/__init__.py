"""The census: what each layer kind keeps and computes, measured on fake tensors under kernel contracts.

Public API (torch is imported only when a census runs, never to read the cache):

- :func:`kind_records` ``(spec, seq, runtime="hf-cuda") -> {kind: KindRecord}``
- :func:`output_record` ``(spec, seq, runtime="hf-cuda") -> KindRecord`` (kind ``output``)
- :func:`census_groups` ``(config, groups, seq, runtime)`` for a Transformers config and LayerGroups

Modules: ``layer`` (the fake layer and the TP config), ``measure`` (saved
bytes, working peak, per-op attribution), ``selective`` (selective
checkpointing and recomputed shares), ``flops`` (FLOPs and traffic by part),
``output`` (the output layer), ``cache`` (disk cache), ``records`` (KindRecords
from the TP pair).
"""
from __future__ import annotations

from ndcost.errors import CensusUnavailable
from ndcost.plugins.census.records import census_groups, kind_records, output_record

__all__ = ["kind_records", "output_record", "census_groups", "CensusUnavailable"]
