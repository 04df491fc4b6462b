"""The resolver: pick each layer kind's estimators, then price strategies in vectorized batches.

``resolve(model, runtime="hf-cuda", hardware="h200", census="auto")`` reads
the model (its family plugin, by ``model_type``), counts its parameters by
kind and part (the family's formula slots), and returns a :class:`CostModel`.
At each sequence length, on first use, every kind's activation records come
from the first ``estimator/activations/<name>`` its family prefers that is
registered and available (the census under the runtime profile, else the op
records' formulas; ``census="off"`` passes the census over, ``"on"`` makes its
absence an error), and its work for the time model from the first
``estimator/flops/<name>`` that measures it. The choices, and why the
estimators before them were passed over, are written into the provenance of
each result; a :class:`ResolvedModel` holds what memory and time are handed.

:meth:`CostModel.evaluate_many` takes a sequence of :class:`Strategy` or a
columnar mapping (field -> list or array; categorical fields as strings;
missing fields take Strategy's defaults) and returns a :class:`BatchResult`
of numpy arrays; an invalid row is marked with its reason and never fails
the batch. :meth:`CostModel.evaluate` is ``evaluate_many`` of one row, which
raises :class:`InvalidStrategy` for a strategy that cannot run.
"""
from __future__ import annotations

import sys
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import attrs
import numpy as np

from ndcost import columns, invariants, manager, models
from ndcost.compose import memory
from ndcost.compose import time as time_model
from ndcost.compose.placement import balanced_split, split_bounds
from ndcost.compose.sharding import sharding as sharding_of
from ndcost.errors import CensusUnavailable, InvalidStrategy, InvalidValue, NdcostError, Unpriced
from ndcost.records import routed_in_record
from ndcost.specio import load_hardware_yaml
from ndcost.values import (
    CP_ALGOS,
    CP_ROTATES,
    DDP_ENGINES,
    FLOAT8_RECIPES,
    GRADIENT_SYNC,
    MEMORY_CATEGORIES,
    RECOMPUTE,
    SHARD_MESHES,
    ZERO_FIELD_STAGES,
    Hardware,
    ModelSpec,
    StageMemory,
    Strategy,
    StrategyCost,
    TimeBreakdown,  # the one message for an unregistered plugin name
    frozen_mapping,
)
from ndcost.work import KindWork, as_run, tp_whole_parameters

__all__ = ["resolve", "CostModel", "BatchResult", "CENSUS_MODES", "CensusFallbackWarning"]

CENSUS_MODES = ("auto", "on", "off")

# the functional collectives (torch/distributed/_functional_collectives.py) a decoder layer runs where DTensor shards
# it (torch.distributed.tensor.parallel, as torchtitan's and HyperParallel's plans do): SP's all-gather into the
# attention and the MLP and reduce-scatter out of them, the all-reduce in their place without SP, EP's dispatch
# and combine all-to-alls; an op-level checkpoint policy decides on them as on any op
LAYER_COLLECTIVE_OPS: Mapping[str, str] = frozen_mapping({
    "all_gather": "_c10d_functional.all_gather_into_tensor.default",
    "reduce_scatter": "_c10d_functional.reduce_scatter_tensor.default",
    "all_reduce": "_c10d_functional.all_reduce.default",
    "all_to_all": "_c10d_functional.all_to_all_single.default"})


class CensusFallbackWarning(UserWarning):
    """census='auto' and the census could not measure a model (Transformers lacks its type, ...): formulas price."""


def _registry():
    return manager.registry()


def _source_of(key: str) -> str:
    """``key (module, distribution)`` of a registry entry, for provenance."""
    try:
        entry = _registry().entry(key)
        return f"{key} ({entry.source})"
    except Exception:  # provenance must never fail a result
        return key


def _hardware(hardware: Any) -> Hardware:
    if isinstance(hardware, Hardware):
        return hardware
    if isinstance(hardware, str):
        if hardware.endswith((".yaml", ".yml")):
            return load_hardware_yaml(hardware)
        return _registry().get(f"hardware/{hardware}")
    raise InvalidValue(f"hardware must be a name (h200), a spec YAML path or a Hardware, got {hardware!r}")


# ---------------------------------------------------------------------------
# the result of a batch
# ---------------------------------------------------------------------------
_TIME_BREAKDOWN_FIELDS = frozenset(f.name for f in attrs.fields(TimeBreakdown)) - {"provenance"}


@attrs.frozen(kw_only=True, eq=False)
class BatchResult:
    """A batch's costs as numpy arrays, one entry (or row) per strategy, in input order.

    ``stage_bytes[i, s, c]`` is what pipeline stage ``s`` of strategy ``i``
    holds in category ``categories[c]`` at its worst moment (0 past the
    strategy's ``pp``); ``peak_bytes[i]`` is the most any stage holds.
    Invalid rows hold 0 everywhere, ``valid[i]`` False and ``reason[i]`` the
    constraint with its numbers. ``time`` holds the time model's arrays once
    it prices the batch. ``host_bytes`` and ``host_bytes_per_node`` are what
    offloading puts in host memory (:func:`ndcost.compose.memory.compose`).
    """

    categories: Tuple[str, ...]
    peak_bytes: np.ndarray
    stage_bytes: np.ndarray
    stage_peak_bytes: np.ndarray
    num_stages: np.ndarray
    stage_layers: np.ndarray
    stage_moment: np.ndarray
    peak_stage: np.ndarray
    layer_activation_bytes: np.ndarray  # (N, K): one layer of each kind, one micro-batch, per device
    stage_kind_layers: np.ndarray  # (N, R, K): the stack's layers of each kind on each stage (MTP aside)
    head_stage: np.ndarray         # (N,): the stage holding the head
    embedding_stage: np.ndarray    # (N,): the stage holding the embedding
    stage_host_bytes: np.ndarray   # (N, R): host memory a device of each stage holds (offloading; 0 elsewhere)
    host_bytes: np.ndarray         # (N,): the most a device of any stage holds on the host
    host_bytes_per_node: np.ndarray  # (N,): the most the devices of one node hold on the host together
    stage_offloaded_activation_bytes: np.ndarray  # (N, R): a micro-batch's activations copied each way
    kinds: Tuple[str, ...]
    valid: np.ndarray
    reason: np.ndarray
    fits: np.ndarray
    memory_bytes: int
    time: Optional[Mapping[str, np.ndarray]] = None
    provenance: Mapping[str, Any] = attrs.field(factory=dict)
    # what PyTorch's caching allocator reserves (ndcost.compose.memory._reserved): (N, R) and the most a stage
    # reserves (N,), -1 where not claimed (and in invalid rows), and why not (N,) ("" where claimed)
    stage_reserved_bytes: Optional[np.ndarray] = None
    reserved_bytes: Optional[np.ndarray] = None
    reserved_reason: Optional[np.ndarray] = None
    # what ``fits`` judged (N,): "reserved" (reserved_bytes + cuda_context_bytes <= memory_bytes), "allocated"
    # (peak_bytes in its place where reserved is not claimed), "" in invalid rows; the context subtracted
    fits_basis: Optional[np.ndarray] = None
    cuda_context_bytes: int = 0
    # (N,) bool: fp32 parameters under 16-bit autocast, priced with the records' autocast figures where they state
    # them and with their 16-bit ones elsewhere (the records' provenance "autocast" names those kinds)
    fp32_autocast: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.peak_bytes)

    def bytes_by_category(self, row: int, stage: int) -> Dict[str, int]:
        return {c: int(self.stage_bytes[row, stage, i]) for i, c in enumerate(self.categories)}

    def cost(self, row: int, strategy: Strategy) -> StrategyCost:
        """Row *row* as a :class:`StrategyCost` (its *strategy* given back to it)."""
        stages = []
        reserved, reserved_reason = self._reserved(row)
        if self.valid[row]:
            count = int(self.num_stages[row])  # each array read once, as Python ints
            by_stage, peaks = self.stage_bytes[row, :count].tolist(), self.stage_peak_bytes[row, :count].tolist()
            layers, moments = self.stage_layers[row, :count].tolist(), self.stage_moment[row, :count].tolist()
            hosts = self.stage_host_bytes[row, :count].tolist()
            reserves = ([None] * count if self.stage_reserved_bytes is None
                        else [None if r < 0 else r for r in self.stage_reserved_bytes[row, :count].tolist()])
            for s in range(count):
                stages.append(StageMemory(
                    stage=s, bytes_by_category=dict(zip(self.categories, by_stage[s], strict=True)),
                    peak_bytes=peaks[s], layers=layers[s], host_bytes=hosts[s], reserved_bytes=reserves[s],
                    provenance={"moment": memory.MOMENTS[moments[s]]}))
        time = None
        if self.time is not None and self.valid[row]:
            if _TIME_BREAKDOWN_FIELDS <= set(self.time):
                time = TimeBreakdown(**{f: float(self.time[f][row]) for f in _TIME_BREAKDOWN_FIELDS},
                                     provenance=self.time.get("provenance", {}) or {})
        basis = "" if self.fits_basis is None else str(self.fits_basis[row])
        return StrategyCost(strategy=strategy, stages=tuple(stages), peak_bytes=int(self.peak_bytes[row]),  # type: ignore[arg-type]  # attrs plugin: converter typing
                            valid=bool(self.valid[row]), reason=str(self.reason[row]), time=time,
                            fits=bool(self.fits[row]) if self.valid[row] else None, fits_basis=basis,
                            host_bytes=int(self.host_bytes[row]),
                            host_bytes_per_node=int(self.host_bytes_per_node[row]),
                            reserved_bytes=reserved, reserved_reason=reserved_reason,
                            provenance=self._row_provenance(row, strategy))

    def _row_provenance(self, row: int, strategy: Strategy) -> Mapping[str, Any]:
        """The batch's provenance, and under fp32 parameters with autocast the kinds (or output layer) its
        sequence's records price with their 16-bit figures (``autocast``), where any does."""
        if self.fp32_autocast is None or not self.fp32_autocast[row]:
            return self.provenance
        records = (self.provenance.get("records") or {}).get(strategy.seq) or {}
        fallback = records.get("autocast")
        return {**self.provenance, "autocast": dict(fallback)} if fallback else self.provenance

    def _reserved(self, row: int) -> Tuple[Optional[int], str]:
        """Row *row*'s reserved bytes (None where not claimed) and why not."""
        if not self.valid[row]:
            return None, ""
        if self.reserved_bytes is None or self.reserved_reason is None:
            return None, "the batch was priced without the allocator simulation"
        value = int(self.reserved_bytes[row])
        return (value, "") if value >= 0 else (None, str(self.reserved_reason[row]))


FITS_BASES = ("allocated", "reserved")
_FITS_BASES = np.array(("",) + FITS_BASES, dtype=object)  # indexed by 0 (invalid), 1 + claimed
_FITS_BASES.setflags(write=False)
_RESERVED_REASONS = np.array([""] + list(memory.RESERVED_UNCLAIMED), dtype=object)  # by reserved_unclaimed
_RESERVED_REASONS.setflags(write=False)


def fits_rule(valid: np.ndarray, peak_bytes: np.ndarray, reserved_bytes: np.ndarray,
              usable_bytes: int) -> Tuple[np.ndarray, np.ndarray]:
    """Whether each row fits in *usable_bytes*, and on what basis: its reserved bytes, or where they are not
    claimed (-1) its allocated peak (a lower bound of what it reserves).

    A run fails when the caching allocator cannot reserve more, so reserved bytes are what must fit, in the
    device's memory less what is held outside the allocator (``Hardware.usable_memory_bytes``: the CUDA
    context). NCCL's own buffers are left out (docs/guides/searchers.md, section 6).
    """
    claimed = reserved_bytes >= 0
    needed = np.where(claimed, reserved_bytes, peak_bytes)
    basis = _FITS_BASES[np.where(valid, 1 + claimed, 0)]
    return valid & (needed <= usable_bytes), basis


# ---------------------------------------------------------------------------
# the cost model
# ---------------------------------------------------------------------------
_STACKED_KEPT = 64  # sets of sequence lengths whose stacked records a CostModel keeps


@attrs.frozen(kw_only=True, eq=False)
class _Codebook:
    """What the registered plugin names decide for every batch: the names the categorical codes index, the
    plugins behind the codes and their provenance; made again once the registry resolves another entry."""

    registry: Any
    generation: int
    names: Mapping[str, Tuple[str, ...]]
    plugins: columns.CodePlugins
    schedules: Mapping[str, str]   # schedule name -> its registry source, for provenance
    optimizers: Mapping[str, str]

    @classmethod
    def of(cls, registry: Any) -> "_Codebook":
        names = columns.category_names(registry)
        return cls(registry=registry, generation=registry.generation, names=names,
                   plugins=columns.code_plugins(registry, names),
                   schedules={s: _source_of(f"schedule/{s}") for s in names["schedule"]},
                   optimizers={o: _source_of(f"optimizer/{o}") for o in names["optimizer"]})


@attrs.frozen(kw_only=True, eq=False)
class ResolvedModel:
    """A model resolved against its estimators: what memory and time are handed, and nothing else.

    ``tables`` is the layer stack and parameters as arrays (built once);
    ``record_tables[seq]`` the activation records' arrays, ``kind_records[seq]``
    the records themselves (``({kind: KindRecord}, output KindRecord)``) and
    ``model_work[seq]`` the :class:`~ndcost.work.ModelWork` the flops
    estimators made of them, each filled on first use at a sequence length,
    with ``activation_sources[seq]`` and ``flops_sources[seq]`` naming the
    estimator of each kind.
    """

    spec: ModelSpec
    parameters: Any
    tables: memory.ModelTables
    # by sequence length, and (seq, 4) for the fp32-widened tables
    record_tables: Dict[Union[int, Tuple[int, int]], memory.RecordTables] = attrs.field(factory=dict)
    kind_records: Dict[int, Tuple[Dict[str, Any], Any]] = attrs.field(factory=dict)
    model_work: Dict[int, Any] = attrs.field(factory=dict)
    activation_sources: Dict[int, Dict[str, str]] = attrs.field(factory=dict)
    flops_sources: Dict[int, Dict[str, str]] = attrs.field(factory=dict)


class CostModel:
    """A model resolved against its estimators: prices strategies' memory (and time) in batches.

    Build one with :func:`resolve`; tests and third parties may build one from
    their own parameters and records (:meth:`from_records`).
    """

    def __init__(self, spec: ModelSpec, parameters: Any, *, runtime: str = "hf-cuda",
                 hardware: Any = "h200", census: str = "auto", records: Optional[Mapping[int, Any]] = None,
                 builds_mtp: Optional[bool] = None, provenance: Optional[Mapping[str, Any]] = None):
        if census not in CENSUS_MODES:
            raise InvalidValue(f"census={census!r}: allowed: {', '.join(CENSUS_MODES)}")
        self.spec = spec
        self.parameters = parameters
        self.runtime = runtime
        self.census = census
        self.hardware = _hardware(hardware)
        self._given_records = dict(records or {})
        self._census_warned = False
        self._codebook_made: Optional[_Codebook] = None
        self._stacked_records: Dict[Tuple[Tuple[int, int], ...],
                                    Tuple[Tuple[memory.RecordTables, ...], Dict[str, np.ndarray]]] = {}
        self._profile = None
        runtime_note = ""
        if builds_mtp is None:
            try:
                self._profile = _registry().find(f"runtime/{runtime}")
            except Exception as exc:  # a broken plugin set: say so, build no MTP
                runtime_note = f"runtime profiles unavailable ({exc})"
            if self._profile is None and not runtime_note:
                runtime_note = f"runtime/{runtime} is not registered: no MTP layers built"
            builds_mtp = self._profile is not None and bool(self._profile.build_mtp)
        self._family = models.family_for(spec.model_type) or models.generic_family()
        # the runtime the estimators price under: none where no profile is registered (the formulas' eager)
        self._estimator_runtime = runtime if self._profile is not None else None
        self._selective_kept, self._selective_rerun = self._selective_collectives()
        self.resolved = ResolvedModel(spec=spec, parameters=parameters,
                                      tables=memory.ModelTables.build(
                                          spec, parameters, builds_mtp, kv_repeated=self._repeats_kv(),
                                          selective_kept_collectives=self._selective_kept,
                                          whole_params=self._whole_parameters(spec, parameters)))
        self.provenance: Dict[str, Any] = {
            "model": spec.name, "model_type": spec.model_type,
            "family": _source_of(f"family/{spec.model_type}"),
            "runtime": _source_of(f"runtime/{runtime}") + (f": {runtime_note}" if runtime_note else ""),
            "mtp": (f"{spec.num_mtp_layers} MTP layer(s) built by the runtime, placed with the head"
                    if builds_mtp and spec.num_mtp_layers else
                    (f"{spec.num_mtp_layers} MTP layer(s) not built by runtime {runtime}" if spec.num_mtp_layers
                     else "no MTP layers")),
            "hardware": _source_of(f"hardware/{self.hardware.name}"),
            "census": census,
            "composition": ("ndcost.compose.memory.compose (numpy over the batch; moments: "
                            + ", ".join(memory.MOMENTS) + ")"),
            "buffers": f"{parameters.buffers} buffer elements (not priced as memory)",
            **dict(provenance or {}),
        }

    @property
    def tables(self) -> memory.ModelTables:
        """The model's layer stack and parameters as arrays (:attr:`resolved`'s)."""
        return self.resolved.tables

    # -- construction ----------------------------------------------------------------------------
    @classmethod
    def from_records(cls, spec: ModelSpec, parameters: Any, records: Mapping[int, Tuple[Mapping[str, Any], Any]],
                     *, hardware: Any = "h200", builds_mtp: bool = False, **kw) -> "CostModel":
        """A cost model priced from given ``{seq: ({kind: KindRecord}, output KindRecord)}`` (tests, third parties)."""
        return cls(spec, parameters, records=records, hardware=hardware, builds_mtp=builds_mtp, census="off", **kw)

    # -- the records ----------------------------------------------------------------------------
    def record_tables(self, seq: int, compute_bytes: int = 2) -> memory.RecordTables:
        """The activation records at *seq* (chosen and cached on first use); with *compute_bytes* 4, widened to
        fp32 activations by the formulas' ratios (:meth:`ndcost.compose.memory.RecordTables.widened`)."""
        seq = int(seq)
        if seq not in self.resolved.record_tables:
            self.resolved.record_tables[seq] = self._choose_records(seq)
        if compute_bytes != 4:
            return self.resolved.record_tables[seq]
        key = (seq, 4)
        if key not in self.resolved.record_tables:
            formulas = _estimator("activations", "op_records")
            built = self._built_kinds()
            ratios, output = formulas.widening(self.spec, built, seq, self._estimator_runtime)
            ratios.update({k: (1.0, 1.0) for k in self.tables.kinds if k not in ratios})  # not built: zeros
            self.resolved.record_tables[key] = self.resolved.record_tables[seq].widened(
                ratios, self.tables.kinds, output,
                "fp32 activations: the 16-bit figures times the op records' ratios of their bytes at 4-byte and "
                "2-byte activations, by kind (an estimate where a census measured them); reserved bytes not "
                "claimed")
        return self.resolved.record_tables[key]

    def model_work(self, seq: int) -> Any:
        """The :class:`~ndcost.work.ModelWork` at *seq*: each kind's work from the first flops estimator its
        family prefers that measures it (``Family.flops_estimators``; chosen and cached on first use)."""
        seq = int(seq)
        if seq not in self.resolved.model_work:
            self.record_tables(seq)
            records, output = self.resolved.kind_records.get(seq, ({}, None))
            works, sources = {}, {}
            built = self._built_kinds()
            for kind in self.spec.kinds:
                if kind not in built:  # no layer of it runs (MTP under hf-cuda): nothing to price, none placed
                    works[kind] = KindWork.idle(kind, f"not built by runtime {self.runtime}")
                    sources[kind] = works[kind].source
                    continue
                record = records.get(kind)
                by_part = self.parameters.by_kind.get(kind)
                for name in self._family.flops_estimators(self.spec, kind):
                    estimator = _registry().find(f"estimator/flops/{name}")
                    if estimator is None or estimator.available(self.spec, self._estimator_runtime) is not None \
                            or not estimator.measures(record):
                        continue
                    works[kind] = estimator.kind_work(self.spec, kind, seq, record, by_part)
                    sources[kind] = _source_of(f"estimator/flops/{name}")
                    break
                else:
                    raise Unpriced(f"no flops estimator prices layer kind {kind!r} of {self.spec.name!r} "
                                   f"(tried {', '.join(self._family.flops_estimators(self.spec, kind))})")
            flops = _estimator("flops", "analytic")
            merged = {**records, "output": output} if output is not None else dict(records)
            work = flops.model_work(self.spec, seq, merged, self.parameters, works)
            # the time model places MTP layers with the head only where the runtime builds them, as memory does
            self.resolved.model_work[seq] = attrs.evolve(
                work, attention_kernel=self._attention_kernel(), selective_rerun_collectives=self._selective_rerun,
                attention_backends=self._profile.attention_backends if self._profile is not None else {},
                fused_pointwise=self._profile is not None and self._profile.pointwise == "fused",
                complex_rotary=self._profile is not None and self._profile.rotary == "complex",
                float8_casts=self._profile.float8_casts if self._profile is not None else "torchao",
                mtp_kinds=work.mtp_kinds if self.tables.builds_mtp else (),
                work=self._repeated_kv(self._as_run(work.work, seq)))
            self.resolved.flops_sources[seq] = sources
        return self.resolved.model_work[seq]

    @staticmethod
    def _whole_parameters(spec: ModelSpec, parameters: Any) -> Dict[str, int]:
        """Each kind's weights TP leaves whole (``ndcost.work.tp_whole_parameters``), by the formulas' GEMM shapes
        (the time model's); none for a kind they do not shape."""
        flops = _estimator("flops", "analytic")
        out: Dict[str, int] = {}
        for kind, by_part in parameters.by_kind.items():
            try:
                out[kind] = tp_whole_parameters(flops.kind_work(spec, kind, 1, None, by_part).gemms)
            except NdcostError:
                out[kind] = 0
        return out

    def _attention_kernel(self) -> str:
        """The attention kernel the runtime profile runs for this model, which the time model prices the scores
        by (the formulas' rule, ``op_records.runtime_attention``: a contract the profile installs in place of the
        family's attention function, else the profile's kernel or its fallback); "" without a profile or where none
        is registered."""
        if self._profile is None:
            return ""
        try:
            return str(_estimator("activations", "op_records").attention_kernel(self.spec, self._estimator_runtime))
        except NdcostError:
            return ""

    def _selective_collectives(self) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        """``(kept, rerun)``: the layer collectives (:data:`LAYER_COLLECTIVE_OPS`' keys) whose outputs
        ``recompute=selective`` keeps under the runtime's policy, and those its recompute runs again; neither where
        the policy's scope is the core attention (the attention function alone runs again), it states no
        ``decider``, or there is no profile."""
        if self._profile is None:
            return (), ()
        policy = _registry().find(f"checkpoint_policy/{self._profile.selective_policy}")
        if policy is None or policy.scope != "layer" or not hasattr(policy, "decider"):
            return (), ()
        kept = tuple(name for name, op in LAYER_COLLECTIVE_OPS.items() if policy.decider()(op))
        return kept, tuple(name for name in LAYER_COLLECTIVE_OPS if name not in kept)

    def _repeats_kv(self) -> bool:
        """Whether the runtime's attention takes this model's keys and values repeated to every query head (the
        formulas' rule, ``op_records.runtime_repeats_kv``); False without a profile."""
        if self._profile is None:
            return False
        return bool(_estimator("activations", "op_records").repeats_kv(self.spec, self._estimator_runtime))

    def _repeated_kv(self, works: Mapping[str, KindWork]) -> Dict[str, KindWork]:
        """Each kind's work with the K/V elements its attention takes: a KV head's times its copies
        (``ModelTables.kv_copies``), what ring CP passes; Ulysses passes the projections' (``KindWork.kv_copies``)."""
        copies = dict(zip(self.tables.kinds, self.tables.kv_copies.tolist(), strict=True))
        return {kind: work if copies.get(kind, 1) == 1 else
                attrs.evolve(work, kv_elements_per_token=work.kv_elements_per_token * copies[kind],
                             kv_copies=copies[kind])
                for kind, work in works.items()}

    def _as_run(self, works: Mapping[str, KindWork], seq: int) -> Dict[str, KindWork]:
        """Each analytic kind's work as the runtime's attention kernel runs it (:func:`ndcost.work.as_run`)."""
        kernel = self._attention_kernel()
        return {kind: as_run(work, self.spec, kind, kernel, seq, self._family.kernel_launches)
                for kind, work in works.items()}

    def _built_kinds(self) -> List[str]:
        """The kinds the runtime builds a layer of: the stack's, and the MTP layers' where it builds them."""
        return [k for i, k in enumerate(self.tables.kinds)
                if self.tables.stack.counts[i] > 0 or (self.tables.builds_mtp and self.tables.mtp_counts[i] > 0)]

    def _choose_records(self, seq: int) -> memory.RecordTables:
        built = self._built_kinds()
        records_all = self._choose_built_records(seq, tuple(built))
        if len(built) == len(self.tables.kinds):
            return records_all
        # kinds the runtime does not build (MTP under hf-cuda) hold no layer: zeros, never read
        index = [self.tables.kinds.index(k) for k in built]
        arrays = {}
        for f in memory.RecordTables.ROW_FIELDS:
            full = np.zeros(len(self.tables.kinds))
            full[index] = getattr(records_all, f)
            arrays[f] = full
        return attrs.evolve(records_all, **arrays)  # type: ignore[arg-type]  # attrs plugin: **arrays holds only array fields

    def _choose_built_records(self, seq: int, kinds: Tuple[str, ...]) -> memory.RecordTables:
        prov: Dict[str, Any] = {}
        if seq in self._given_records:
            records, output = self._given_records[seq]
            source = {k: f"given ({records[k].source})" for k in records}
            out_source = f"given ({output.source})"
            measured = False
        else:
            records, output, source, out_source = self._estimate_activations(seq, kinds)
            measured = any(self._needs_census(name)
                           for name in self.resolved.activation_sources.get(seq, {}).values())
        prov["activations"] = source
        prov["output"] = out_source
        formulas = _estimator("activations", "op_records")
        try:
            kernel = formulas.attention_kernel(self.spec, self._estimator_runtime)
            prov["attention"] = (f"{kernel} (op records' formulas; runtime {self.runtime}"
                                 + ("" if self._profile is not None else " unknown: the published formulas' eager")
                                 + ")")
        except NdcostError as exc:
            prov["attention"] = f"unpriced: {exc}"
        sel_fallback: Dict[str, Any] = {}
        names = self.resolved.activation_sources.get(seq, {})
        for k in kinds:
            if k in names:  # an estimator's record (not given): its selective figure must price the runtime's policy
                why = self._selective_mismatch(self._activation_estimator(names[k]), k)
                if why is not None and records[k].selective_per_token is not None:
                    records[k] = attrs.evolve(records[k], selective_per_token=None, selective_tp_per_token=None)
                    prov.setdefault("selective", {})[k] = f"unpriced: {why}"
                    continue
            if records[k].selective_per_token is None:
                why = self._selective_mismatch(formulas, k)
                if why is not None:
                    prov.setdefault("selective", {})[k] = f"unpriced: {why}"
                    continue
                try:
                    sel_fallback[k] = formulas.records(self.spec, [k], seq, self._estimator_runtime)[0][k]
                except (NdcostError, KeyError) as exc:
                    prov.setdefault("selective", {})[k] = f"unpriced: {exc}"
                    continue
                prov.setdefault("selective", {})[k] = "formulas (the record states no selective figure)"
        # fp32 parameters under autocast keep the norms' outputs in fp32, cast each projection's input anew and
        # take fp32 rotary tables (tests/test_census_autocast.py): a record the census did not measure so is
        # priced with its 16-bit figures, which leave those out
        unmeasured = [k for k in kinds if records[k].autocast_saved_per_token is None]
        unmeasured += ["output"] if getattr(output, "autocast_saved_per_token", None) is None else []
        if unmeasured:
            prov["autocast"] = {k: "fp32 parameters under autocast priced with the 16-bit figures (the record "
                                   "states none under autocast: the norms' fp32 outputs, each projection's cast "
                                   "and fp32 rotary tables left out)" for k in unmeasured}
        if any(records[k].working_per_token is None for k in kinds):
            prov["working"] = {k: "unpriced: the record states no backward working peak (counted as what the "
                                  "layer keeps; the peak may be higher)"
                               for k in kinds if records[k].working_per_token is None}
        routed_share = self._routed_share(seq, kinds, formulas, "census" if measured else "saved")
        if routed_share:
            prov["routed"] = ("routed experts' token-proportional bytes from the op records (scaled by "
                              "moe_imbalance, width split by etp)")
        try:
            core_kept = formulas.core_attention_kept(self.spec, kinds, seq, self._estimator_runtime)
            prov["core_attention"] = "the op records' core_attention mode (what the attention core keeps)"
        except (NdcostError, KeyError) as exc:  # the record's own ops stand in
            core_kept = {}
            prov["core_attention"] = f"the records' ops attBMM, softmax and dropout dropped (op records: {exc})"
        self.resolved.kind_records[seq] = ({k: records[k] for k in kinds}, output)  # the time model reads FLOPs here
        tables = memory.RecordTables.build(kinds, seq, records, output, selective_fallback=sel_fallback,
                                           routed_share=routed_share, provenance=prov)
        if core_kept:
            tables = tables.with_core_attention(kinds, core_kept)
        return tables

    def _activation_estimator(self, name: str) -> Any:
        return _registry().find(f"estimator/activations/{name}")

    @staticmethod
    def _selective_refusal(tables: Sequence[memory.RecordTables]) -> str:
        """The reason a row under recompute=selective is refused: the first unpriced kind's, from the provenance."""
        for table in tables:
            for kind, why in dict(table.provenance.get("selective", {})).items():
                if str(why).startswith("unpriced: "):
                    return f"recompute=selective: layer kind {kind!r} has no selective figure: {why[10:]}"
        return ("recompute=selective: no selective figure for some layer kind (neither the census nor the formulas "
                "state one); use recompute=full or core_attention")

    def _selective_mismatch(self, estimator: Any, kind: str) -> Optional[str]:
        """Why *estimator*'s selective figure for *kind* does not price ``recompute=selective`` here, or None.

        ``selective`` is the runtime profile's checkpoint policy
        (``Strategy.recompute``), which the census runs; an estimator stating
        ``selective_unpriced`` (the op records) says where its figures price
        another recompute or none.
        """
        unpriced = getattr(estimator, "selective_unpriced", None)
        return None if unpriced is None else unpriced(self.spec, kind, self._estimator_runtime)

    def _needs_census(self, name: str) -> bool:
        estimator = self._activation_estimator(name)
        return estimator is not None and bool(estimator.needs_census)

    def _estimate_activations(self, seq: int, kinds: Sequence[str]):
        """Each kind's record from the first estimator its family prefers that is available and delivers.

        Returns the records, the output layer's record, and for each the
        estimator that priced it with the reasons the ones before it were passed over.
        """
        family = self._family
        preference = {k: [name for name in family.activation_estimators(self.spec, k)
                          if not (self.census == "off" and self._needs_census(name))]
                      for k in kinds}
        records: Dict[str, Any] = {}
        source: Dict[str, str] = {}
        passed_over: Dict[str, List[str]] = {k: [] for k in kinds}
        output, out_source = None, ""
        chosen: Dict[str, str] = {}
        pending = list(kinds)
        while pending:
            name = preference[pending[0]][0] if preference[pending[0]] else None
            if name is None:
                named = family.activation_estimators(self.spec, pending[0])
                skipped = [n for n in named if self.census == "off" and self._needs_census(n)]
                why = "; ".join(passed_over[pending[0]] + [
                    f"census='off' skips {n}" for n in skipped]) or "its family names no activation estimator"
                if family.formulas_unpriced:
                    why += (f"; the op records' formulas do not price {family.name}'s layers "
                            f"({family.formulas_unpriced})")
                if skipped:
                    why += "; resolve with census='auto' (torch and transformers installed) to measure them"
                raise Unpriced(f"no activation record for kind {pending[0]!r} at seq {seq}: {why}")
            group = [k for k in pending if preference[k] and preference[k][0] == name]
            estimator = self._activation_estimator(name)
            try:
                why = "not registered" if estimator is None else estimator.available(self.spec, self._estimator_runtime)
                if why is None:
                    got, out = estimator.records(self.spec, group, seq, self._estimator_runtime)
            except (CensusUnavailable, ImportError) as exc:
                why = str(exc)
                refused = True
            else:
                refused = False
            if why is not None:
                key = f"estimator/activations/{name}"
                for k in group:
                    passed_over[k].append(f"{name} unavailable: {why}")
                    preference[k] = preference[k][1:]
                if estimator is not None and estimator.needs_census and self.census == "on":
                    raise CensusUnavailable(f"census='on' but {name} unavailable for kind(s) {', '.join(group)} "
                                            f"({key}): {why}; use census='auto' to fall back to the formulas")
                if refused and estimator is not None and estimator.needs_census:
                    self._warn_census_fallback(name, group, why)
                continue
            for k in group:
                records[k], chosen[k] = got[k], name
                source[k] = _chosen(f"estimator/activations/{name}", got[k], passed_over[k], self.census)
            if output is None and out is not None:
                output, out_source = out, _chosen(f"estimator/activations/{name}", out, passed_over[group[0]],
                                                  self.census)
            pending = [k for k in pending if k not in records]
        if output is None:
            raise Unpriced(f"no estimator priced the output layer at seq {seq}")
        self.resolved.activation_sources[seq] = chosen
        return records, output, source, out_source

    def _warn_census_fallback(self, name: str, kinds: Sequence[str], why: str) -> None:
        """Say once a cost model that the census could not run and what prices in its place."""
        if "pip install 'ndcost[census]'" in why:
            _note_census_extra(why)
        elif not self._census_warned:
            self._census_warned = True
            warnings.warn(f"census='auto': {name} could not measure {self.spec.name!r} (kind(s) {', '.join(kinds)}): "
                          f"{why}; pricing its activations with the next estimator its family names (the op "
                          f"records' formulas)", CensusFallbackWarning, stacklevel=4)

    def _routed_share(self, seq: int, kinds, formulas: Any, where: str) -> Dict[str, Tuple[float, float, float, float]]:
        """Per MoE kind: (in saved, in saved_tp, token part, width part) of the routed bytes, per token, TP 1."""
        out = {}
        for kind in kinds:
            if not self.tables.is_moe[self.tables.kinds.index(kind)]:
                continue
            try:
                routed_all, width = formulas.routed_bytes(self.spec, kind, seq, self.runtime)
            except (NdcostError, KeyError, TypeError, ValueError) as exc:  # never priced as if not routed
                raise Unpriced(f"the routed experts' bytes of MoE kind {kind!r} at seq {seq}: the op records "
                               f"({_source_of('estimator/activations/op_records')}) could not state them "
                               f"({type(exc).__name__}: {exc}); expert parallelism and moe_imbalance cannot "
                               f"be priced without them") from exc
            out[kind] = (*routed_in_record(where == "census", routed_all, width), routed_all - width, width)
        return out

    # -- evaluation ------------------------------------------------------------------------------
    def names(self) -> Dict[str, Tuple[str, ...]]:
        """The names each categorical strategy field's codes index (:func:`ndcost.columns.category_names`)."""
        return dict(self._codebook().names)

    def _codebook(self) -> _Codebook:
        """The registry's names and the plugins behind the codes, made again only when the registry changes."""
        registry = _registry()
        book = self._codebook_made
        if book is None or book.registry is not registry or book.generation != registry.generation:
            book = self._codebook_made = _Codebook.of(registry)
        return book

    def _stack_records(self, tables: Sequence[memory.RecordTables]) -> Dict[str, np.ndarray]:
        """:func:`ndcost.compose.memory.stack_records` of *tables* (read-only), stacked once per set of sequence
        lengths; the last ``_STACKED_KEPT`` sets are kept."""
        key = tuple((t.seq, t.compute_bytes) for t in tables)
        hit = self._stacked_records.get(key)
        if hit is None or any(a is not b for a, b in zip(hit[0], tables, strict=True)):
            stacked = memory.stack_records(tables)
            for array in stacked.values():
                array.setflags(write=False)
            if len(self._stacked_records) >= _STACKED_KEPT:
                self._stacked_records.clear()
            hit = self._stacked_records[key] = (tuple(tables), stacked)
        return hit[1]

    def evaluate(self, strategy: Any, hardware: Any = None) -> StrategyCost:
        """The cost of one strategy (``evaluate_many`` of one row); InvalidStrategy where it cannot run."""
        if isinstance(strategy, str):
            strategy = Strategy.parse(strategy)
        elif isinstance(strategy, Mapping):
            strategy = Strategy.from_mapping(strategy)
        result = self.evaluate_many([strategy], hardware=hardware)
        if not result.valid[0]:
            raise InvalidStrategy(f"strategy {strategy} cannot run on {self.spec.name}: {result.reason[0]}")
        return result.cost(0, strategy)

    def evaluate_many(self, strategies: Any, hardware: Any = None) -> BatchResult:
        """Price a batch: a sequence of Strategy, or a mapping of field -> list/array (see module docstring).

        Every valid row keeps :mod:`ndcost.invariants`; one that would not is returned invalid, with why.
        """
        with np.errstate(all="ignore"):  # a figure gone non-finite or past its bound is said in its row's reason
            result = self._price(strategies, hardware)
        return invariants.enforce(result)

    def _price(self, strategies: Any, hardware: Any) -> BatchResult:
        hw = self.hardware if hardware is None else _hardware(hardware)
        book = self._codebook()
        names = book.names
        batch = columns.encode(strategies, names)
        self._model_checks(batch, names)
        _hardware_checks(batch, hw)
        n = batch.n
        valid = ~batch.invalid()
        c = batch.cols
        # records for each sequence length the valid rows use
        seq_index = np.zeros(n, dtype=np.int64)
        tables: List[memory.RecordTables] = []
        if valid.any():
            # one table a sequence length and compute width (fp32 activations widened: record_tables)
            wide = columns.DTYPE_BYTES[c["compute_dtype"][valid]] == 4
            keys, inverse = time_model.distinct(c["seq"][valid] * 2 + wide)
            for j, key in enumerate(keys.tolist()):
                seq = key // 2
                try:
                    tables.append(self.record_tables(seq, 4 if key % 2 else 2))
                except NdcostError as exc:
                    rows = np.zeros(n, dtype=bool)
                    rows[np.flatnonzero(valid)[inverse == j]] = True
                    batch.refuse(rows, f"seq={seq}: {exc}")
                    tables.append(None)  # type: ignore[arg-type]  # a placeholder, filtered out below
            seq_index[valid] = inverse.reshape(-1)
            if any(t is None for t in tables):
                good = [t for t in tables if t is not None]
                remap = np.cumsum([t is not None for t in tables]) - 1
                seq_index = np.where(seq_index < len(remap), remap[np.minimum(seq_index, len(remap) - 1)], 0)
                tables = good
            valid = ~batch.invalid()
        reason = batch.reason_array()
        K = len(self.tables.kinds)
        C = len(MEMORY_CATEGORIES)
        R = int(c["pp"][valid].max()) if valid.any() else 1
        # the outputs of the valid rows, sorted by pipeline layout (each layout a contiguous slice)
        order = np.flatnonzero(valid)
        if len(order) == 1 and tables:  # one row: one layout
            ends = np.ones(1, dtype=np.int64)
        elif valid.any() and tables:
            layout = (c["pp"] * (int(c["vpp"].max()) + 1) + c["vpp"])[order]
            sizes = np.bincount(layout)
            if np.count_nonzero(sizes) > 1:
                order = order[np.argsort(layout, kind="stable")]
            ends = np.cumsum(sizes[sizes > 0])
        else:
            order, ends = order[:0], np.zeros(0, dtype=np.int64)
        priced = len(order)
        in_order = priced == n and (n == 1 or bool((order[1:] > order[:-1]).all()))  # every row valid, in order
        shapes = {"stage_bytes": (R, C), "stage_peak_bytes": (R,), "stage_layers": (R,), "stage_moment": (R,),
                  "stage_kind_layers": (R, K), "peak_bytes": (), "peak_stage": (), "head_stage": (),
                  "embedding_stage": (),
                  "layer_bytes": (K,), "stage_host_bytes": (R,), "host_bytes_per_node": (),
                  "stage_offloaded_activation_bytes": (R,), "stage_reserved_bytes": (R,), "reserved_unclaimed": ()}
        # one layout with every row valid (one strategy's batch): compose's own arrays are the outputs
        whole_batch = in_order and len(ends) == 1
        out = {} if whole_batch else {name: np.zeros((priced,) + shape, dtype=np.int64)
                                      for name, shape in shapes.items()}
        fp32_autocast = np.zeros(n, dtype=bool)
        if priced:
            recs = self._stack_records(tables)
            plugins = book.plugins
            unpriced_selective = np.zeros(n, dtype=bool)
            beyond_exact = np.zeros(n, dtype=bool)
            cols_sorted = c if in_order else {k: v[order] for k, v in c.items()}
            seq_sorted = seq_index if in_order else seq_index[order]
            bounds_sorted = self._pp_bounds(batch.pp_layers, order)
            lo = 0
            for hi in ends.tolist():  # a loop over pipeline layouts, not rows: no row pays for another's stages
                sub = dict(cols_sorted) if hi - lo == n else {k: v[lo:hi] for k, v in cols_sorted.items()}
                sub["pp_bounds"] = None if bounds_sorted is None else bounds_sorted[lo:hi]
                r = int(sub["pp"][0])  # one layout: every row of the slice has pp stages
                composed = memory.compose(self.tables, recs, seq_sorted[lo:hi], sub, plugins.schedules,
                                          plugins.states_per_parameter, plugins.step_temporaries_per_parameter,
                                          out=None if whole_batch else out["stage_bytes"][lo:hi, :r],
                                          embedding_sort_scratch=self._profile is not None
                                          and self._profile.device == "cuda",
                                          devices_per_node=int(hw.devices_per_node))
                if whole_batch:
                    out = {name: getattr(composed, name).astype(np.int64, copy=False) for name in shapes}
                else:
                    for name in ("stage_peak_bytes", "stage_layers", "stage_moment", "stage_kind_layers",
                                 "stage_host_bytes", "stage_offloaded_activation_bytes", "stage_reserved_bytes"):
                        out[name][lo:hi, :r] = getattr(composed, name)
                    for name in ("peak_bytes", "peak_stage", "head_stage", "embedding_stage", "layer_bytes",
                                 "host_bytes_per_node", "reserved_unclaimed"):
                        out[name][lo:hi] = getattr(composed, name)
                unpriced_selective[order[lo:hi]] = composed.unpriced["selective"]
                beyond_exact[order[lo:hi]] = composed.beyond_exact
                fp32_autocast[order[lo:hi]] = composed.fp32_autocast
                lo = hi
            batch.refuse(unpriced_selective, lambda i: self._selective_refusal(tables))  # said where refused
            batch.refuse(beyond_exact, lambda i: (
                f"its bytes a device pass {memory.MAX_EXACT_BYTES:,} (2**53), past which they are not exact "
                f"integers; spread the model over more devices (tp, pp, ep, zero, fsdp) or give fewer tokens a "
                f"micro-batch (micro_batch * seq = {c['micro_batch'][i] * c['seq'][i]:,}) or a smaller "
                f"moe_imbalance ({float(c['moe_imbalance'][i])!r})"))
            if np.count_nonzero(unpriced_selective) or np.count_nonzero(beyond_exact):
                reason = batch.reason_array()
                valid = ~batch.invalid()
        if in_order:
            full = out
        else:  # back to the input order; invalid rows hold 0
            full = {}
            for name, array in out.items():
                full[name] = np.zeros((n,) + array.shape[1:], dtype=array.dtype)
                full[name][order] = array
        if not valid.all():
            for array in full.values():
                array[~valid] = 0
        num_stages = np.where(valid, c["pp"], 0)
        prov = dict(self.provenance)
        prov["records"] = {}
        for t in tables:  # a sequence length's 16-bit and fp32 tables under one entry
            prov["records"][t.seq] = {**prov["records"].get(t.seq, {}), **t.provenance}
        prov["schedules"] = dict(book.schedules)
        prov["optimizers"] = dict(book.optimizers)
        peak = full["peak_bytes"]
        unclaimed = full["reserved_unclaimed"]
        reserved = np.where(valid & (unclaimed == 0), full["stage_reserved_bytes"].max(axis=1, initial=0), -1)
        reserved_reason = _RESERVED_REASONS[unclaimed]
        fits, fits_basis = fits_rule(valid, peak, reserved, int(hw.usable_memory_bytes))
        result = BatchResult(
            categories=tuple(MEMORY_CATEGORIES), peak_bytes=peak, stage_bytes=full["stage_bytes"],
            stage_peak_bytes=full["stage_peak_bytes"], num_stages=num_stages, stage_layers=full["stage_layers"],
            stage_moment=full["stage_moment"], peak_stage=full["peak_stage"],
            layer_activation_bytes=full["layer_bytes"], stage_kind_layers=full["stage_kind_layers"],
            head_stage=full["head_stage"], embedding_stage=full["embedding_stage"],
            stage_host_bytes=full["stage_host_bytes"], host_bytes=full["stage_host_bytes"].max(axis=1, initial=0),
            host_bytes_per_node=full["host_bytes_per_node"],
            stage_offloaded_activation_bytes=full["stage_offloaded_activation_bytes"], kinds=self.tables.kinds,
            valid=valid, reason=reason,
            fits=fits, memory_bytes=int(hw.memory_bytes), provenance=prov,
            stage_reserved_bytes=full["stage_reserved_bytes"], reserved_bytes=reserved,
            reserved_reason=reserved_reason, fits_basis=fits_basis, cuda_context_bytes=int(hw.cuda_context_bytes),
            fp32_autocast=fp32_autocast & valid)
        return self._attach_time(result, batch, hw)

    def _attach_time(self, result: BatchResult, batch: columns.StrategyColumns, hardware: Hardware) -> BatchResult:
        """The time model's arrays for the batch: its work at each sequence length, the plugins by code."""
        return time_model.attach(result, batch, hardware, self.model_work,
                                 self._codebook().plugins)

    @staticmethod
    def _pp_bounds(pp_layers, rows) -> Optional[np.ndarray]:
        return None if pp_layers is None else split_bounds([pp_layers[i] for i in rows.tolist()])

    def _model_checks(self, batch: columns.StrategyColumns, names) -> None:
        """Refuse what cannot run on this model, each with the constraint and the numbers."""
        c, m, spec = batch.cols, self.tables, self.spec
        t = c["tp"]
        L = m.num_layers
        batch.refuse(c["seq"] < 1, "Strategy.seq is required to price memory; add seq=N (tokens a sequence)")
        batch.refuse(m.heads % t != 0, lambda i: f"tp={t[i]} does not divide num_attention_heads={m.heads}")
        kv_bad = (m.kv_heads % t != 0) & (t % m.kv_heads != 0)
        batch.refuse(kv_bad, lambda i: f"tp={t[i]} neither divides num_key_value_heads={m.kv_heads} nor is a "
                                       f"multiple of it (to replicate them)")
        for width in m.linear_heads:
            batch.refuse(width % t != 0, lambda i, w=width: f"tp={t[i]} does not divide the linear attention's "
                                                            f"{w} heads")
        if m.intermediate_size and (m.is_moe == False).any():  # noqa: E712
            batch.refuse(m.intermediate_size % t != 0,
                         lambda i: f"tp={t[i]} does not divide intermediate_size={m.intermediate_size}")
        nv = c["pp"] * c["vpp"]
        explicit = np.array([s is not None for s in batch.pp_layers], dtype=bool) if batch.pp_layers is not None \
            else np.zeros(batch.n, dtype=bool)
        batch.refuse(~explicit & (L % nv != 0),
                     lambda i: f"pp * vpp = {c['pp'][i]} * {c['vpp'][i]} = {nv[i]} does not divide the {L} layers; "
                               f"{_split_hint(L, int(nv[i]))}")
        largest_stage = L // nv
        if explicit.any():
            assert batch.pp_layers is not None  # explicit rows exist only with pp_layers
            sums = np.array([sum(s) if s is not None else L for s in batch.pp_layers], dtype=np.int64)
            batch.refuse(explicit & (sums != L),
                         lambda i: f"pp_layers {'/'.join(map(str, batch.pp_layers[i]))} sums to {sums[i]} but "  # type: ignore[arg-type]  # explicit rows have a split
                                   f"{spec.name} has {L} layers")
            largest_stage = np.array([max(s) if s is not None else 0 for s in batch.pp_layers], dtype=np.int64)
            largest_stage = np.where(explicit, largest_stage, L // nv)
        # a chunk recomputes its first recompute_layers layers (compose/placement.py): no more than it holds
        rl = c["recompute_layers"]
        batch.refuse((rl > 0) & (c["recompute"] == RECOMPUTE.index("none")),
                     lambda i: f"recompute_layers={rl[i]} with recompute=none: it counts the layers a recompute "
                               f"mode recomputes; set recompute=full, selective or core_attention, or leave "
                               f"recompute_layers unset")
        batch.refuse(rl > largest_stage,
                     lambda i: f"recompute_layers={rl[i]} exceeds the {largest_stage[i]} layers the largest of the "
                               f"pp * vpp = {nv[i]} pipeline stages holds ({L} layers); give at most "
                               f"{largest_stage[i]}, or leave it unset to recompute every layer")
        ep, etp = c["ep"], c["etp"]
        if m.num_experts:
            batch.refuse(m.num_experts % ep != 0,
                         lambda i: f"ep={ep[i]} does not divide the {m.num_experts} routed experts")
            width = m.moe_intermediate_size or m.intermediate_size or 0
            if width:
                batch.refuse(width % etp != 0,
                             lambda i: f"etp={etp[i]} does not divide the experts' width {width}")
        else:
            batch.refuse((ep > 1) | (etp > 1),
                         lambda i: f"ep={ep[i]}, etp={etp[i]}: {spec.name} has no routed experts; set ep=1, etp=1")
        # the embedding and head split evenly by vocabulary rows over tp; Megatron-LM pads the vocabulary first
        # (megatron/training/tokenizer/tokenizer.py _vocab_size_with_padding: to a multiple of
        # make_vocab_size_divisible_by * tp), which changes the model's parameters: the model states the padded size
        vocab = spec.vocab_size
        batch.refuse(c["vocab_parallel"] & (vocab % t != 0),
                     lambda i: f"vocab_parallel: tp={t[i]} does not divide vocab_size={vocab} (the embedding and "
                               f"head are split by rows over tp); give a tp that divides it, vocab_parallel=false, "
                               f"or a model whose vocab_size is the trainer's padded one (Megatron-LM pads it to a "
                               f"multiple of make_vocab_size_divisible_by * tp: {_padded(vocab, 128 * t[i])} at 128)")
        cp = c["cp"]
        seq = c["seq"]
        # each check below refuses rows using a feature (cp > 1, sp, ZeRO, offloaded parameters): skipped whole
        # where no row does, as every one of its rows would pass
        contexts = bool(np.count_nonzero(cp > 1))
        if contexts:
            batch.refuse((seq >= 1) & (seq % cp != 0), lambda i: f"cp={cp[i]} does not divide seq={seq[i]}")
        # Ulysses' all-to-alls give each CP rank whole heads of every token (DeepSpeed-Ulysses, arXiv:2309.14509
        # section 3.1): the composition splits a TP rank's query heads and its key/value heads by cp
        ulysses = (c["cp_algo"] == CP_ALGOS.index("ulysses")) & (cp > 1)
        if contexts and ulysses.any() and (m.kv_elements_per_token > 0).any():
            query_heads = m.heads // t
            batch.refuse(ulysses & (m.heads % t == 0) & (query_heads % cp != 0),
                         lambda i: f"cp_algo=ulysses: cp={cp[i]} does not divide the {query_heads[i]} query heads a "
                                   f"TP rank holds (num_attention_heads={m.heads} / tp={t[i]}); give a cp that "
                                   f"divides them, or cp_algo=ring")
            kv_heads = np.maximum(m.kv_heads // t, 1)  # TP beyond the KV heads replicates them: one a rank
            batch.refuse(ulysses & (kv_heads % cp != 0),
                         lambda i: f"cp_algo=ulysses: cp={cp[i]} does not divide the {kv_heads[i]} key/value "
                                   f"heads a TP rank holds (num_key_value_heads={m.kv_heads}, tp={t[i]}); give a cp "
                                   f"that divides them, or cp_algo=ring")
        # a rotation names how a ring passes its K/V blocks; Ulysses' all-to-alls pass none (values.py's FieldDoc)
        if np.count_nonzero(c["cp_rotate"]):
            batch.refuse((c["cp_algo"] == CP_ALGOS.index("ulysses")) & (c["cp_rotate"] == CP_ROTATES.index("p2p")),
                         "cp_rotate=p2p with cp_algo=ulysses: Ulysses exchanges heads by all-to-all and passes no "
                         "K/V ring to rotate; use cp_rotate=allgather (the default) with ulysses, or cp_algo=ring")
        # ring attention balances the causal work by cutting a sequence into 2 * cp chunks, two a rank
        # (Megatron-LM megatron/core/utils.py get_batch_on_this_cp_rank): the time model's even split of the scores
        if contexts:
            ring = (c["cp_algo"] == CP_ALGOS.index("ring")) & (cp > 1) & (seq >= 1) & (seq % cp == 0)
            batch.refuse(ring & (seq % (2 * cp) != 0),
                         lambda i: f"cp_algo=ring: seq={seq[i]} is not a multiple of 2 * cp = {2 * cp[i]} (ring "
                                   f"attention cuts a sequence into 2 * cp chunks); give a seq divisible by "
                                   f"{2 * cp[i]}")
        if np.count_nonzero(c["sp"]):
            sp_bad = (seq >= 1) & c["sp"] & (seq % np.maximum(cp, 1) == 0) & ((seq // np.maximum(cp, 1)) % t != 0)
            batch.refuse(sp_bad,
                         lambda i: f"sp: tp={t[i]} does not divide the {seq[i] // cp[i]} tokens a CP rank holds")
        if np.count_nonzero(c["zero"]):
            batch.refuse((c["zero"] > 0) & (c["fsdp"] > 1),
                         lambda i: f"zero={c['zero'][i]} with fsdp={c['fsdp'][i]}: both shard over the "
                                   f"data-parallel ranks; use zero over dp or fsdp, not both")
            batch.refuse((c["zero"] > 0) & (c["shard_mesh"] == SHARD_MESHES.index("fsdp_cp")),
                         lambda i: f"zero={c['zero'][i]} with shard_mesh=fsdp_cp: fsdp_cp is FSDP's mesh (fsdp * "
                                   f"cp); ZeRO shards over dp * cp (shard_mesh=dp_cp) or dp (shard_mesh=dp)")
            batch.refuse((c["zero"] == 3) & ~c["reshard_after_forward"],
                         "reshard_after_forward=false is FSDP's (fully_shard); ZeRO-3 regathers a module for its "
                         "backward as ndcost prices it: use reshard_after_forward=true with zero=3, or FSDP "
                         "(fsdp=N) with reshard_after_forward=false")
            # DeepSpeed's engine.no_sync asserts "no_sync context manager is incompatible with gradient partitioning
            # logic of ZeRO stage 2/3" (deepspeed/runtime/engine.py); its ZeRO-1 reduces at the accumulation boundary
            sync = c["gradient_sync"]
            batch.refuse((sync == GRADIENT_SYNC.index("last_micro_batch")) & (c["zero"] >= 2),
                         lambda i: f"gradient_sync=last_micro_batch with zero={c['zero'][i]}: ZeRO-2/3 partition the "
                                   f"gradients as each micro-batch's backward makes them (DeepSpeed's no_sync refuses "
                                   f"it); use gradient_sync=auto, or FSDP (fsdp=N) to defer the reduce-scatter")
            batch.refuse((sync == GRADIENT_SYNC.index("every_micro_batch")) & (c["zero"] == 1),
                         "gradient_sync=every_micro_batch with zero=1: ZeRO-1 keeps whole gradients and reduces them "
                         "once, at the accumulation boundary (DeepSpeed, Megatron-LM's distributed optimizer); use "
                         "gradient_sync=auto, or zero=2 to reduce-scatter every micro-batch")
        bucket = c["reduce_bucket_elements"] > 0
        if np.count_nonzero(bucket) or np.count_nonzero(c["reduce_buckets"] > 1):
            # DeepSpeed's ZeRO optimizers' contiguous gradient bucket (deepspeed/runtime/zero/stage_1_and_2.py,
            # stage3.py): the compose rule prices it as their own backward allocates it
            batch.refuse(bucket & ~np.isin(c["zero"], ZERO_FIELD_STAGES["reduce_bucket_elements"]),
                         lambda i: f"reduce_bucket_elements={c['reduce_bucket_elements'][i]} with zero=0: the "
                                   f"bucket is DeepSpeed ZeRO's (zero 1-3); set zero, or reduce_bucket_elements=0")
            batch.refuse(bucket & (c["pp"] > 1),
                         lambda i: f"reduce_bucket_elements={c['reduce_bucket_elements'][i]} with pp={c['pp'][i]}: "
                                   f"DeepSpeed's pipeline engine makes its ZeRO bucket at the boundary's reduction, "
                                   f"which is not priced; give reduce_bucket_elements=0 (its bytes left out)")
            deepspeed = (c["ddp_engine"] == DDP_ENGINES.index("auto")) | (c["ddp_engine"] == DDP_ENGINES.index(
                "deepspeed"))
            batch.refuse(bucket & ~deepspeed,
                         lambda i: f"reduce_bucket_elements={c['reduce_bucket_elements'][i]} with ddp_engine="
                                   f"{DDP_ENGINES[c['ddp_engine'][i]]}: the bucket is DeepSpeed's; use "
                                   f"ddp_engine=deepspeed, or reduce_bucket_elements=0")
            batch.refuse((c["reduce_buckets"] > 1) & ~bucket,
                         "reduce_buckets=2 with reduce_bucket_elements=0: it counts buckets of that many elements; "
                         "give reduce_bucket_elements (DeepSpeed's reduce_bucket_size), or reduce_buckets=1")
            batch.refuse((c["reduce_buckets"] > 1) & (c["zero"] == 3),
                         "reduce_buckets=2 with zero=3: ZeRO-3 allocates one bucket at its start whatever "
                         "overlap_comm says (deepspeed/runtime/zero/stage3.py); use reduce_buckets=1")
        for name, deepspeeds in (("reuse_distance_elements", "stage3_max_reuse_distance"),
                                 ("live_parameters_elements", "stage3_max_live_parameters"),
                                 ("sub_group_elements", "sub_group_size")):
            if np.count_nonzero(c[name]):
                batch.refuse((c[name] > 0) & (~np.isin(c["zero"], ZERO_FIELD_STAGES[name]) | (c["pp"] > 1)),
                             lambda i, name=name, deepspeeds=deepspeeds: (
                                 f"{name}={c[name][i]} with zero={c['zero'][i]}, pp={c['pp'][i]}: it is DeepSpeed "
                                 f"ZeRO-3's {deepspeeds}, which runs without a pipeline; set zero=3 and pp=1, or "
                                 f"{name}=0"))
        if np.count_nonzero(c["sub_group_elements"]):  # read by the step of DeepSpeed's engine alone
            batch.refuse((c["sub_group_elements"] > 0) & (c["ddp_engine"] != DDP_ENGINES.index("deepspeed")),
                         lambda i: f"sub_group_elements={c['sub_group_elements'][i]} with ddp_engine="
                                   f"{DDP_ENGINES[c['ddp_engine'][i]]}: it is the sub-group DeepSpeed's ZeRO-3 "
                                   f"optimizer steps at a time; use ddp_engine=deepspeed, or sub_group_elements=0")
        if np.count_nonzero(c["offload_params"]):
            # FSDP2's CPUOffloadPolicy and ZeRO-Infinity's offload_param copy the sharded parameters to the device
            # to gather them, and the optimizer steps them where they live: on the host
            gathered = sharding_of(c).fsdp | (c["zero"] >= 3)
            batch.refuse(c["offload_params"] & ~gathered,
                         lambda i: f"offload_params=true with fsdp={c['fsdp'][i]}, zero={c['zero'][i]}: the "
                                   f"parameters are copied to the device as FSDP or ZeRO-3 gathers them; set fsdp "
                                   f"> 1 or zero=3")
            batch.refuse(c["offload_params"] & ~c["offload_optimizer"],
                         "offload_params=true with offload_optimizer=false: the optimizer steps the parameters on "
                         "the host, where they live (FSDP2 CPUOffloadPolicy); set offload_optimizer=true too")
        # the schedules' own refusals, by name
        for code in time_model.distinct(c["schedule"])[0].tolist():  # the schedules the batch names, in code order
            name = names["schedule"][code]
            rows = c["schedule"] == code
            schedule = _registry().get(f"schedule/{name}")
            for mask, template in schedule.refusals(c["pp"], c["vpp"], c["num_micro_batches"]):
                mask = rows & np.asarray(mask, dtype=bool)
                batch.refuse(mask, lambda i, tpl=template: tpl.format(
                    pp=c["pp"][i], vpp=c["vpp"][i], m=c["num_micro_batches"][i]))
            for mode in getattr(schedule, "refuses_recompute", ()):  # what its trainer refuses beside it
                batch.refuse(rows & (c["recompute"] == names["recompute"].index(mode)),
                             f"schedule {name} with recompute={mode}: its trainer refuses the two together "
                             f"(Megatron-LM's TransformerConfig asserts it under the all-to-all overlap); use "
                             f"another recompute mode, or schedule={schedule.variant_of or '1f1b'}")


def _hardware_checks(batch: columns.StrategyColumns, hardware: Hardware) -> None:
    """Rows computing in a dtype *hardware* states no peak for are refused (a loop over the dtypes used), rows
    offloading to a host whose link *hardware* does not state, float8 rows where it states no fp8 peak, and
    async TP over more devices than its NVLink domain."""
    if hardware.host_to_device_bytes_per_second is None:
        for name in ("offload_optimizer", "offload_params", "offload_activations"):
            batch.refuse(batch.cols[name], f"{name}=true: hardware {hardware.name!r} states no "
                                           f"host_to_device_bytes_per_second, which prices the copies; add it "
                                           f"to its hardware file (its host link's datasheet figure, one direction)")
    refusal = time_model.float8_refusal(hardware)
    if refusal:
        batch.refuse(batch.cols["float8"] != FLOAT8_RECIPES.index("none"), refusal)
    tp = batch.cols["tp"]
    batch.refuse(np.asarray(batch.cols["async_tp"], dtype=bool) & (tp > int(hardware.nvlink_domain_devices)),
                 lambda i: time_model.async_tp_refusal(hardware, int(tp[i])))
    codes = batch.cols["compute_dtype"]
    for code in time_model.distinct(codes)[0].tolist():
        dtype = columns.DTYPE_NAMES[code]
        if dtype not in hardware.peak_flops_per_second:
            batch.refuse(codes == code, f"compute_dtype={dtype}: hardware {hardware.name!r} states no peak for it "
                                        f"(it states {', '.join(hardware.peak_flops_per_second)}); use one of "
                                        f"those or a hardware file that states a peak for {dtype}")


def _padded(vocab: int, multiple: int) -> int:
    """*vocab* rounded up to a multiple of *multiple* (Megatron-LM's padded vocabulary)."""
    return -(-vocab // multiple) * multiple


def _split_hint(layers: int, stages: int) -> str:
    split = balanced_split(layers, stages)
    if split is None:
        return f"use at most {layers} stages (pp * vpp), each holding a layer or more"
    return f"give pp_layers (for example {'/'.join(map(str, split))})"


def _estimator(kind: str, name: str) -> Any:
    """The registered ``estimator/<kind>/<name>``; a missing built-in is a stale install."""
    found = _registry().find(f"estimator/{kind}/{name}")
    if found is None:
        raise Unpriced(f"estimator/{kind}/{name} is not registered; reinstall ndcost with `pip install -e .`")
    return found


def _chosen(key: str, record: Any, passed_over: Sequence[str], census: str) -> str:
    """Provenance of one record: the estimator that made it and why those before it did not."""
    text = f"{_registry().get(key).description} ({_source_of(key)}; record: {record.source})"
    if passed_over:
        text += " (chosen over " + "; ".join(passed_over) + ")"
    elif census == "off":
        text += " (census='off')"
    return text


_NOTED: List[str] = []


def _note_census_extra(why: str) -> None:
    """Say once on stderr that the census extra is missing and the formulas price instead."""
    if "pip install 'ndcost[census]'" in why and not _NOTED:
        _NOTED.append(why)
        print(f"ndcost: {why}; pricing activations with the op records' formulas", file=sys.stderr)


# ---------------------------------------------------------------------------
# resolve
# ---------------------------------------------------------------------------
def resolve(model: Any, runtime: str = "hf-cuda", hardware: Any = "h200", census: str = "auto") -> CostModel:
    """A :class:`CostModel` for *model* (anything :func:`ndcost.models.load_model` reads, or a ModelSpec)."""
    spec = model if isinstance(model, ModelSpec) else models.load_model(model)
    _registry().entry(f"runtime/{runtime}")  # an unknown runtime fails naming the closest, never priced as none
    counts = models.parameters(spec)
    prov = {"parameters": "ndcost.models.parameters over the formula slots of "
                          f"{_source_of('family/' + spec.model_type)}"}
    return CostModel(spec, counts, runtime=runtime, hardware=hardware, census=census, provenance=prov)
