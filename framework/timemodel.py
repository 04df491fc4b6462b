"""The time model: a training step's seconds from FLOPs, bytes moved and communication on a topology.

The resolver prepares a :class:`ModelWork` once per model (each layer kind's
forward work on one sequence, from the census's FLOPs by part or, without a
census, from :func:`analytic_flops`) and then prices whole batches of
strategies with :func:`step_time`, numpy arrays in and out, with no loop over
layers or strategies.

What a step costs, on each pipeline rank, per micro-batch:

- compute, priced by a roofline per op class: matmuls against the peak of
  the compute dtype (and, where the weights are read slower than the math
  runs, against HBM bandwidth), the attention kernel's scores and the linear
  recurrence each at their own efficiency, elementwise ops (norms, residual
  adds, rotary, activation functions, the loss) by the bytes they move
  against HBM bandwidth. Efficiencies are the hardware's ``efficiency``
  (``matmul``, ``attention``, ``linrec``, ``memory``, each with a
  ``_backward`` variant; fitted by ``ndcost calibrate``), or the priors of
  :data:`DEFAULT_EFFICIENCY` where a hardware states none (provenance says so).
- the backward: twice the forward's work of every class, plus recompute:
  full recompute repeats the forward of the recomputed layers, selective
  repeats the shares of the attention's and the other matmuls the census
  measured (``recomputed_*_mm_share``; without them, the core attention as
  Megatron's selective recompute does), core-attention recompute repeats the
  scores.
- per-layer communication (TP, CP, EP), priced by the ``collective/<name>``
  plugins with their overlap rules (see :mod:`ndcost.plugins.collectives`).

And per step: the pipeline bubble, the registered schedule's idle stage
steps (``schedule/<name>.bubble_stage_steps``: 1F1B and GPipe ``p - 1``, so
``(p - 1) / m`` of the busy time for balanced stages; interleaved a ``1 / v``
of that; DualPipeV a third) times the mean stage time of the ranks other than
the busiest, the data-parallel gradient and parameter collectives, the
pipeline's fill and drain sends, and the optimizer step (the bytes of
parameters, gradients, master weights and optimizer states it reads and
writes, against HBM bandwidth).

``step = compute + exposed communication + bubble + optimizer``, each taken on
the busiest pipeline rank. ``mfu`` is the model FLOPs (three times the
forward's, attention scores at the causal pairs the kernel computes, no
recompute) over the step seconds, the devices and the compute dtype's peak.

Known limitations: kernel launch overheads, the CPU and the data loader are
not priced; groups sharing a link do not contend; the expert TP collectives
and the vocabulary-parallel loss's small all-reduces are not priced; moe
imbalance scales the busiest rank's routed work and all-to-all volume.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidValue, Unpriced
from ndcost.values import DTYPES, Hardware, Strategy, TimeBreakdown, _frozen_mapping
from ndcost.work import NORM_ELEMENTS, KindWork, ModelWork, causal_pairs, window_pairs  # noqa: F401

__all__ = [
    "DEFAULT_EFFICIENCY", "EFFICIENCY_KEYS", "KindWork", "ModelWork", "TimeArrays", "analytic_flops",
    "kind_work", "model_work", "step_time", "columns", "efficiencies", "causal_pairs", "window_pairs",
    "rank_layer_counts", "layer_seconds", "TIME_FIELDS",
]

CHUNK_ROWS = 1 << 16  # strategies priced at once (the per-rank arrays are rows x ranks x kinds)
TIME_FIELDS = ("step_seconds", "tokens_per_second", "mfu", "compute_seconds", "communication_seconds",
               "exposed_communication_seconds", "bubble_seconds", "optimizer_seconds")

# Priors for a hardware whose YAML states no efficiency: round figures of what well-tuned kernels
# reach on current GPUs, used only until `ndcost calibrate` fits the device's own.
DEFAULT_EFFICIENCY: Mapping[str, float] = _frozen_mapping({
    "matmul": 0.75, "matmul_backward": 0.70,
    "attention": 0.60, "attention_backward": 0.45,
    "linrec": 0.30, "linrec_backward": 0.25,
    "memory": 0.70, "memory_backward": 0.70,
    "collective_within_node": 0.80, "collective_across_nodes": 0.85,
})
EFFICIENCY_KEYS = tuple(DEFAULT_EFFICIENCY)

def efficiencies(hardware: Hardware) -> Tuple[Dict[str, float], Dict[str, str]]:
    """The hardware's efficiency per key, and where each came from (its YAML or the prior).

    A ``<class>_backward`` the YAML leaves out takes the YAML's forward figure
    for that class before the prior; a figure outside (0, 1] is refused.
    """
    stated = dict(hardware.efficiency or {})
    unknown = sorted(set(stated) - set(EFFICIENCY_KEYS))
    if unknown:
        raise InvalidValue(f"hardware {hardware.name!r}: unknown efficiency key(s) {', '.join(unknown)}; "
                           f"known: {', '.join(EFFICIENCY_KEYS)}")
    values: Dict[str, float] = {}
    sources: Dict[str, str] = {}
    for key in EFFICIENCY_KEYS:
        forward = key[:-len("_backward")] if key.endswith("_backward") else None
        if key in stated:
            values[key], sources[key] = float(stated[key]), f"hardware/{hardware.name}"
        elif forward and forward in stated:
            values[key], sources[key] = float(stated[forward]), f"hardware/{hardware.name} ({forward})"
        else:
            values[key], sources[key] = DEFAULT_EFFICIENCY[key], "prior (uncalibrated)"
        if not 0.0 < values[key] <= 1.0:
            raise InvalidValue(f"hardware {hardware.name!r}: efficiency {key} = {values[key]} is outside (0, 1]")
    return values, sources


# ---------------------------------------------------------------------------
# strategies as columns
# ---------------------------------------------------------------------------
_INT_FIELDS = ("dp", "fsdp", "tp", "pp", "vpp", "cp", "ep", "etp", "zero", "micro_batch", "num_micro_batches", "seq")
_SCHEDULE_CODES = {"1f1b": 0, "gpipe": 1, "interleaved": 2, "dualpipev": 3}
_RECOMPUTE_CODES = {"none": 0, "full": 1, "selective": 2, "core_attention": 3}
_CP_CODES = {"ring": 0, "colossal": 0, "hybrid": 0, "ulysses": 1}


def columns(strategies: Any) -> Dict[str, np.ndarray]:
    """Strategies (a sequence of Strategy, or a mapping of field name to values) as numpy columns.

    Every field of :class:`Strategy` becomes an array of one entry a strategy;
    fields a mapping leaves out take Strategy's defaults; ``seq`` must be set.
    """
    if isinstance(strategies, Mapping):
        raw = {k: np.asarray(v) for k, v in strategies.items()}
        sizes = {len(v) for v in raw.values() if v.ndim}
        if len(sizes) > 1:
            raise InvalidValue(f"strategy columns have different lengths {sorted(sizes)}; give one value a strategy")
        n = sizes.pop() if sizes else 1
        defaults = {a.name: a.default for a in attrs.fields(Strategy)}
        unknown = sorted(set(raw) - set(defaults))
        if unknown:
            raise InvalidValue(f"unknown strategy column(s) {', '.join(unknown)}; fields: {', '.join(defaults)}")
        cols = {}
        for name, default in defaults.items():  # a field left out (or given once): one value, broadcast below
            value = raw.get(name)
            if value is None or value.ndim == 0:
                one = np.empty(1, dtype=object)
                one[0] = default if value is None else value.item()
                value = one
            cols[name] = value
    else:
        items = list(strategies)
        if not items:
            raise InvalidValue("no strategies to price")
        n = len(items)
        cols = {}
        for name in Strategy.field_names():
            column = np.empty(n, dtype=object)
            column[:] = [getattr(s, name) for s in items]
            cols[name] = column
    out = _columns_of(cols)
    for name, value in out.items():
        if len(value) == 1 and n != 1:
            if name == "pp_layers":
                spread = np.empty(n, dtype=object)
                spread[:] = [value[0]] * n
                out[name] = spread
            else:
                out[name] = np.broadcast_to(value, (n,))
    return out


def _columns_of(cols: Mapping[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The columns the time model reads, from one array (or one value) a Strategy field."""
    out: Dict[str, np.ndarray] = {}
    for name in _INT_FIELDS:
        values = cols[name]
        if name == "seq" and values.dtype == object and any(v is None for v in values):
            raise InvalidValue("the time model needs every strategy's seq; set seq=... in the strategy")
        out[name] = values.astype(np.int64)
    truth = lambda text: text.lower() in ("true", "1", "yes", "on")  # noqa: E731
    out["sp"] = _per_value(cols["sp"], truth, bool)
    out["vocab_parallel"] = _per_value(cols["vocab_parallel"], truth, bool)
    out["moe_imbalance"] = cols["moe_imbalance"].astype(np.float64)
    out["schedule"] = _per_value(cols["schedule"], lambda v: _SCHEDULE_CODES.get(v.lower(), -1), np.int64)
    out["schedule_name"] = _per_value(cols["schedule"], str.lower, object)
    out["recompute"] = _codes(cols["recompute"], _RECOMPUTE_CODES, "recompute")
    out["cp_algo"] = _codes(cols["cp_algo"], _CP_CODES, "cp_algo")
    out["recompute_layers"] = _per_value(cols["recompute_layers"],
                                         lambda v: -1 if v in ("None", "nan", "") else int(float(v)), np.int64)
    param = _per_value(cols["param_dtype"], _dtype_name, object)

    def resolved(name):  # a dtype left unset takes the parameters'
        own = _per_value(cols[name], lambda v: "" if v == "None" else _dtype_name(v), object)
        return np.where(own == "", param, own)

    def width(names):
        return _per_value(names, lambda v: float(DTYPES.get(v, 0)), np.float64)

    out["param_bytes"] = width(param)
    out["compute_dtype"] = resolved("compute_dtype")
    out["compute_bytes"] = width(out["compute_dtype"])
    out["grad_bytes"] = width(resolved("grad_dtype"))
    out["optimizer_bytes"] = width(resolved("optimizer_dtype"))
    out["master_bytes"] = width(_per_value(cols["master_dtype"], _dtype_name, object))
    out["optimizer"] = _per_value(cols["optimizer"], str.lower, object)
    splits = np.empty(len(cols["pp_layers"]), dtype=object)
    for i in np.flatnonzero(_per_value(cols["pp_layers"], lambda v: v not in ("None", "nan", ""), bool)):
        splits[i] = _pp_layers(cols["pp_layers"][i])  # only the rows that state a split
    out["pp_layers"] = splits
    return out


def _dtype_name(text: str) -> str:
    from ndcost.values import _DTYPE_ALIASES
    text = text.strip().lower()
    return _DTYPE_ALIASES.get(text, text)


def _per_value(values: np.ndarray, function, dtype) -> np.ndarray:
    """``function`` of each distinct value's text, spread back over the rows (no Python loop over rows)."""
    values = np.asarray(values)
    text = values.astype(str) if values.dtype != object else np.array([str(v) for v in values.tolist()]) \
        if len(values) < 4096 else values.astype(str)
    uniq, inverse = np.unique(text, return_inverse=True)
    table = np.empty(len(uniq), dtype=dtype)
    for j, u in enumerate(uniq.tolist()):
        table[j] = function(u)
    return table[inverse.reshape(-1)]


def columns_from_codes(cols: Mapping[str, np.ndarray], names: Mapping[str, Sequence[str]],
                       pp_layers: Optional[Sequence[Any]] = None) -> Dict[str, np.ndarray]:
    """The resolver's validated columns (categoricals as codes into *names*) as :func:`columns` builds them.

    Vectorized: each categorical is a table lookup; ``-1`` in an int column is
    "unset" (``recompute_layers``: every layer).
    """
    n = len(cols["tp"])
    out: Dict[str, np.ndarray] = {name: np.asarray(cols[name], dtype=np.int64) for name in _INT_FIELDS}
    if np.any(out["seq"] < 1):
        raise InvalidValue("the time model needs every strategy's seq; set seq=... in the strategy")
    out["recompute_layers"] = np.asarray(cols["recompute_layers"], dtype=np.int64)
    out["sp"] = np.asarray(cols["sp"], dtype=bool)
    out["vocab_parallel"] = np.asarray(cols["vocab_parallel"], dtype=bool)
    out["moe_imbalance"] = np.asarray(cols["moe_imbalance"], dtype=np.float64)

    def named(field):
        table = np.array([str(v) for v in names[field]], dtype=object)
        return table[np.asarray(cols[field], dtype=np.int64)]

    def coded(field, codes):
        table = np.array([codes.get(str(v), -1) for v in names[field]], dtype=np.int64)
        return table[np.asarray(cols[field], dtype=np.int64)]

    def width(field):
        table = np.array([float(DTYPES.get(str(v), 0)) for v in names[field]], dtype=np.float64)
        return table[np.asarray(cols[field], dtype=np.int64)]

    out["schedule"] = coded("schedule", _SCHEDULE_CODES)
    out["schedule_name"] = named("schedule")
    out["recompute"] = coded("recompute", _RECOMPUTE_CODES)
    out["cp_algo"] = coded("cp_algo", _CP_CODES)
    out["param_bytes"] = width("param_dtype")
    out["compute_bytes"] = width("compute_dtype")
    out["grad_bytes"] = width("grad_dtype")
    out["optimizer_bytes"] = width("optimizer_dtype")
    out["master_bytes"] = width("master_dtype")
    out["compute_dtype"] = named("compute_dtype")
    out["optimizer"] = named("optimizer")
    splits = np.empty(n, dtype=object)
    if pp_layers is not None:
        for i, value in enumerate(pp_layers):  # the few rows that state a split
            if value is not None:
                splits[i] = _pp_layers(value)
    out["pp_layers"] = splits
    return out


def _pp_layers(value):
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, str):
        return tuple(int(p) for p in value.replace(",", "/").split("/") if p.strip())
    return tuple(int(p) for p in value)


def _codes(values, table, name):
    try:
        return _per_value(values, lambda v: table[v.lower()], np.int64)
    except KeyError as exc:
        raise InvalidValue(f"strategy column {name}: {exc.args[0]!r} is not one of {', '.join(table)}") from None


# ---------------------------------------------------------------------------
# layers on each pipeline rank
# ---------------------------------------------------------------------------
def _schedules(names: Iterable[str]) -> Dict[str, Any]:
    from ndcost import manager
    registry = manager.registry()
    return {name: registry.get(f"schedule/{name}") for name in set(names)}


def rank_layer_counts(model: ModelWork, cols: Mapping[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Layers of each kind on each pipeline rank, ``(S, R, K)``, and the rank running the head, ``(S,)``.

    The stack is cut into ``pp * vpp`` virtual stages, as ``pp_layers`` states
    or as evenly as integers allow (earlier stages one layer fewer); the
    registered ``schedule/<name>`` says which virtual stage each rank's chunk
    is (``virtual_stage``). MTP layers and the head run with the last virtual
    stage, the embedding with the first.
    """
    kinds = list(model.kinds)
    n_kinds = len(kinds)
    order = np.array([kinds.index(k) for k in model.layer_order], dtype=np.int64)
    n_layers = len(order)
    cumulative = np.zeros((n_layers + 1, n_kinds), dtype=np.int64)
    if n_layers:
        cumulative[1:] = np.cumsum(np.eye(n_kinds, dtype=np.int64)[order], axis=0)
    pp = np.asarray(cols["pp"], dtype=np.int64)
    vpp = np.asarray(cols["vpp"], dtype=np.int64)
    stages = pp * vpp
    n = len(pp)
    ranks, max_chunks, max_stages = int(pp.max()), int(vpp.max()), int(stages.max())
    index = np.arange(max_stages + 1)[None, :]
    bounds = np.minimum(index, stages[:, None]) * n_layers // stages[:, None]      # (S, V + 1)
    for i, split in enumerate(cols["pp_layers"]):
        if split is None:
            continue
        if sum(split) != n_layers:
            raise InvalidValue(f"pp_layers {'/'.join(map(str, split))} sums to {sum(split)} but "
                               f"{model.name!r} has {n_layers} layers")
        if len(split) != stages[i]:
            raise InvalidValue(f"pp_layers gives {len(split)} stages but pp * vpp = {stages[i]}")
        edges = np.concatenate([[0], np.cumsum(split)])
        bounds[i, :len(edges)] = edges
        bounds[i, len(edges):] = n_layers
    per_stage = cumulative[bounds[:, 1:]] - cumulative[bounds[:, :-1]]                 # (S, V, K)
    rank = np.arange(ranks)[None, :, None]
    chunk = np.arange(max_chunks)[None, None, :]
    stage = np.zeros((n, ranks, max_chunks), dtype=np.int64)
    names = np.asarray(cols["schedule_name"])
    for name, schedule in _schedules(names.tolist()).items():
        rows = names == name
        stage[rows] = np.broadcast_to(
            schedule.virtual_stage(pp[rows][:, None, None], vpp[rows][:, None, None], rank, chunk),
            (int(rows.sum()), ranks, max_chunks))
    valid = (rank < pp[:, None, None]) & (chunk < vpp[:, None, None])
    stage = np.clip(stage, 0, max_stages - 1)
    gathered = per_stage[np.arange(n)[:, None, None], stage]                          # (S, R, C, K)
    counts = np.sum(gathered * valid[..., None], axis=2)
    last = (stage == (stages - 1)[:, None, None]) & valid
    head_rank = np.argmax(last.any(axis=2), axis=1)
    for kind in model.mtp_kinds:
        counts[np.arange(n), head_rank, kinds.index(kind)] += 1
    return counts, head_rank


# ---------------------------------------------------------------------------
# the step
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class TimeArrays:
    """The time model's results for a batch: one array a TimeBreakdown field, plus the provenance."""

    step_seconds: np.ndarray
    tokens_per_second: np.ndarray
    mfu: np.ndarray
    compute_seconds: np.ndarray
    communication_seconds: np.ndarray
    exposed_communication_seconds: np.ndarray
    bubble_seconds: np.ndarray
    optimizer_seconds: np.ndarray
    provenance: Mapping[str, str] = attrs.field(converter=_frozen_mapping)
    detail: Mapping[str, np.ndarray] = attrs.field(factory=dict, converter=_frozen_mapping, repr=False)

    def __len__(self) -> int:
        return len(self.step_seconds)

    def breakdown(self, i: int) -> TimeBreakdown:
        """Strategy *i*'s :class:`TimeBreakdown`."""
        return TimeBreakdown(provenance=self.provenance,
                             **{name: float(getattr(self, name)[i]) for name in TIME_FIELDS})

    def to_columns(self) -> Dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in TIME_FIELDS}


def _kind_arrays(model: ModelWork) -> Dict[str, np.ndarray]:
    fields = ("attention_mm_flops_per_token", "other_mm_flops_per_token", "routed_mm_flops_per_token",
              "score_flops_per_pair", "window", "linrec_flops_per_token", "elementwise_elements_per_token",
              "replicated_elements_per_token", "dense_parameters", "routed_parameters", "replicated_parameters",
              "query_elements_per_token", "kv_elements_per_token", "experts_per_token")
    out = {f: np.array([float(getattr(model.work[k], f)) for k in model.kinds]) for f in fields}
    out["has_attention"] = np.array([model.work[k].has_attention for k in model.kinds])
    for name in ("recomputed_attention_mm_share", "recomputed_other_mm_share"):
        out[name] = np.array([np.nan if getattr(model.work[k], name) is None else float(getattr(model.work[k], name))
                              for k in model.kinds])
    return out


def _lookup(values: np.ndarray, function) -> np.ndarray:
    """``function`` of each distinct value, spread back over the rows (no loop over rows)."""
    uniq, inverse = np.unique(np.asarray(values).astype(str), return_inverse=True)
    return np.array([function(str(u)) for u in uniq], dtype=np.float64)[inverse.reshape(-1)]


def _peaks(hardware: Hardware, dtypes: np.ndarray) -> np.ndarray:
    return _lookup(dtypes, hardware.peak_flops)


def _optimizer_states(names: np.ndarray) -> np.ndarray:
    from ndcost import manager
    registry = manager.registry()
    return _lookup(names, lambda name: float(registry.get(f"optimizer/{name}").states_per_parameter))


def _collectives():
    from ndcost import manager
    from ndcost.plugins import collectives as builtin
    try:
        registry = manager.registry()
    except Exception:  # pragma: no cover - the built-ins price without a registry
        registry = None
    out = {}
    for c in builtin.BUILTIN:
        found = registry.find(f"collective/{c.name}") if registry is not None else None
        out[c.name] = (found or c).seconds
    return out


def layer_seconds(model: ModelWork, cols: Mapping[str, np.ndarray], hardware: Hardware,
                  eff: Optional[Mapping[str, float]] = None) -> Dict[str, np.ndarray]:
    """Each kind's compute seconds for one layer and one micro-batch on one device, ``(S, K)`` arrays.

    Keys: ``forward`` and ``backward`` (no recompute), ``recompute`` (what the
    strategy's recompute adds to the backward), ``scores_forward`` and
    ``scores_backward`` (the attention kernel's share, for CP ring overlap).
    """
    if eff is None:
        eff, _ = efficiencies(hardware)
    k = _kind_arrays(model)
    col = lambda name: np.asarray(cols[name], dtype=np.float64)[:, None]  # noqa: E731
    tp, cp, b, s = col("tp"), col("cp"), col("micro_batch"), col("seq")
    ep, etp = col("ep"), col("etp")
    sp = np.asarray(cols["sp"])[:, None]
    width, pwidth = col("compute_bytes"), col("param_bytes")
    peak = (cols["peak_flops"] if "peak_flops" in cols else _peaks(hardware, cols["compute_dtype"]))[:, None]
    hbm = float(hardware.hbm_bytes_per_second)
    tokens = b * s / cp                          # tokens of a micro-batch on one CP rank
    split = tokens / tp
    attention_mm = k["attention_mm_flops_per_token"] * split
    other_mm = k["other_mm_flops_per_token"] * split
    routed_mm = k["routed_mm_flops_per_token"] * split * col("moe_imbalance")
    scores = k["score_flops_per_pair"] * window_pairs(s, k["window"]) * b / (tp * cp)
    linrec = k["linrec_flops_per_token"] * split
    weights = pwidth * (k["dense_parameters"] / tp + k["routed_parameters"] / (ep * etp) + k["replicated_parameters"])
    elementwise = width * tokens * (k["elementwise_elements_per_token"] / tp
                                    + k["replicated_elements_per_token"] / np.where(sp, tp, 1.0))
    mm = attention_mm + other_mm + routed_mm

    def matmul(passes, key):
        return np.maximum(passes * mm / (peak * eff[key]), passes * weights / (hbm * eff["memory"]))

    fwd_mm, bwd_mm = matmul(1.0, "matmul"), matmul(2.0, "matmul_backward")
    att_share = np.divide(attention_mm, mm, out=np.zeros_like(mm), where=mm > 0)
    fwd_scores = scores / (peak * eff["attention"])
    bwd_scores = 2.0 * scores / (peak * eff["attention_backward"])
    fwd_linrec = linrec / (peak * eff["linrec"])
    bwd_linrec = 2.0 * linrec / (peak * eff["linrec_backward"])
    fwd_mem = elementwise / (hbm * eff["memory"])
    bwd_mem = 2.0 * elementwise / (hbm * eff["memory_backward"])
    forward = fwd_mm + fwd_scores + fwd_linrec + fwd_mem
    backward = bwd_mm + bwd_scores + bwd_linrec + bwd_mem
    recompute_code = np.asarray(cols["recompute"])[:, None]
    share_att = k["recomputed_attention_mm_share"][None, :]
    share_other = k["recomputed_other_mm_share"][None, :]
    measured = ~np.isnan(share_att) & ~np.isnan(share_other)
    selective = np.where(measured,
                         np.nan_to_num(share_att) * fwd_mm * att_share
                         + np.nan_to_num(share_other) * fwd_mm * (1.0 - att_share),
                         fwd_scores)
    recompute = np.select([recompute_code == 1, recompute_code == 2, recompute_code == 3],
                          [forward, selective, fwd_scores], 0.0)
    return {"forward": forward, "backward": backward, "recompute": recompute,
            "scores_forward": fwd_scores, "scores_backward": bwd_scores,
            "selective_measured": np.broadcast_to(measured, forward.shape)}


def step_time(model: ModelWork, strategies: Any, hardware: Hardware, *,
              optimizer_states: Optional[np.ndarray] = None,
              rank_layers: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> TimeArrays:
    """Price a batch of strategies: one entry a strategy in each returned array.

    *strategies* is a sequence of :class:`Strategy` or the columns
    :func:`columns` builds. *optimizer_states* (states a parameter, a
    strategy) defaults to the registered ``optimizer/<name>``;
    *rank_layers* to :func:`rank_layer_counts`.
    """
    cols = strategies if isinstance(strategies, Mapping) and "compute_bytes" in strategies else columns(strategies)
    n = len(cols["tp"])
    if n > CHUNK_ROWS and rank_layers is None:  # bounded memory: the per-rank arrays are (rows, ranks, kinds)
        parts = [step_time(model, {k: v[i:i + CHUNK_ROWS] for k, v in cols.items()}, hardware,
                           optimizer_states=None if optimizer_states is None else optimizer_states[i:i + CHUNK_ROWS])
                 for i in range(0, n, CHUNK_ROWS)]
        return TimeArrays(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in TIME_FIELDS},
                          provenance=parts[0].provenance,
                          detail={k: np.concatenate([p.detail[k] for p in parts]) for k in parts[0].detail
                                  if np.ndim(parts[0].detail[k]) == 1})
    eff, eff_sources = efficiencies(hardware)
    coll = _collectives()
    from ndcost.plugins.collectives import OVERLAP_RULES, group_link

    f64 = lambda name: np.asarray(cols[name], dtype=np.float64)  # noqa: E731
    dp, fsdp, tp, pp, cp = f64("dp"), f64("fsdp"), f64("tp"), f64("pp"), f64("cp")
    ep, etp, b, m, s = f64("ep"), f64("etp"), f64("micro_batch"), f64("num_micro_batches"), f64("seq")
    zero = np.asarray(cols["zero"])
    sp = np.asarray(cols["sp"])
    vocab_parallel = np.asarray(cols["vocab_parallel"])
    schedule = np.asarray(cols["schedule"])
    width, pwidth, gwidth = f64("compute_bytes"), f64("param_bytes"), f64("grad_bytes")
    owidth, mwidth = f64("optimizer_bytes"), f64("master_bytes")
    imbalance = f64("moe_imbalance")
    peak = cols["peak_flops"] if "peak_flops" in cols else _peaks(hardware, cols["compute_dtype"])
    hbm = float(hardware.hbm_bytes_per_second)
    dualpipe = schedule == _SCHEDULE_CODES["dualpipev"]
    vpp = f64("vpp")
    if optimizer_states is None:
        optimizer_states = _optimizer_states(np.asarray(cols["optimizer"]))
    counts, head_rank = rank_layers if rank_layers is not None else rank_layer_counts(model, cols)
    counts = counts.astype(np.float64)                               # (S, R, K)
    ranks = counts.shape[1]
    rank_index = np.arange(ranks)[None, :]
    real_rank = rank_index < pp[:, None]                              # (S, R)
    is_first = rank_index == 0
    is_head = rank_index == head_rank[:, None]
    k = _kind_arrays(model)
    h, vocab = float(model.hidden_size), float(model.vocab_size)

    # --- compute per layer (S, K) ------------------------------------------------------------------
    layer = layer_seconds(model, cols, hardware, eff)
    # recompute_layers: layers a chunk recomputes (the rest keep their activations)
    layers_on_rank = counts.sum(axis=2)                               # (S, R)
    rl = np.asarray(cols["recompute_layers"], dtype=np.float64)[:, None]
    fraction = np.where(rl < 0, 1.0, np.minimum(1.0, np.divide(rl * vpp[:, None], layers_on_rank,
                                                                 out=np.ones_like(layers_on_rank),
                                                                 where=layers_on_rank > 0)))

    # --- per-layer communication (S, K) --------------------------------------------------------------
    tokens = b * s / cp
    hidden_msg = tokens * h * width                                    # a TP rank's activations of a layer
    stride_tp = np.ones(n)
    bw_tp, lat_tp = group_link(hardware, stride_tp, tp, eff)
    # two sync points a layer each pass: all-reduce, or all-gather + reduce-scatter under SP (same volume)
    tp_sp = coll["all_gather"](hidden_msg, tp, bw_tp, lat_tp) + coll["reduce_scatter"](hidden_msg, tp, bw_tp, lat_tp)
    tp_ar = coll["all_reduce"](hidden_msg, tp, bw_tp, lat_tp)
    tp_pass = 2.0 * np.where(sp, tp_sp, tp_ar)                         # (S,)
    tp_fwd = np.broadcast_to(tp_pass[:, None], (n, len(model.kinds)))
    bw_cp, lat_cp = group_link(hardware, tp, cp, eff)
    cp_ring = (cp > 1)[:, None] * (cp - 1.0)[:, None] * (
        coll["send_recv"]((tokens * width / tp)[:, None] * k["kv_elements_per_token"][None, :], 2.0,
                          bw_cp[:, None], lat_cp[:, None]))
    cp_ulysses_msg = (tokens * width / tp)[:, None] * (2.0 * k["query_elements_per_token"]
                                                       + k["kv_elements_per_token"])[None, :]
    cp_ulysses = coll["all_to_all"](cp_ulysses_msg, cp[:, None], bw_cp[:, None], lat_cp[:, None])
    ulysses = (np.asarray(cols["cp_algo"]) == _CP_CODES["ulysses"])[:, None]
    attention_kind = k["has_attention"][None, :]
    cp_fwd_total = np.where(attention_kind, np.where(ulysses, cp_ulysses, cp_ring), 0.0)
    # the ring's backward passes K/V and their gradients (twice the forward's bytes); Ulysses' backward runs
    # the forward's four all-to-alls transposed (dO in, dQ/dK/dV out): the same bytes
    cp_bwd_total = np.where(ulysses, 1.0, 2.0) * cp_fwd_total
    cp_fwd_exposed = np.where(ulysses, cp_fwd_total, np.maximum(0.0, cp_fwd_total - layer["scores_forward"]))
    cp_bwd_exposed = np.where(ulysses, cp_bwd_total, np.maximum(0.0, cp_bwd_total - layer["scores_backward"]))
    bw_ep, lat_ep = group_link(hardware, etp, ep, eff)
    ep_msg = (tokens * etp / tp * h * width * imbalance)[:, None] * k["experts_per_token"][None, :]
    ep_a2a = coll["all_to_all"](ep_msg, ep[:, None], bw_ep[:, None], lat_ep[:, None])
    ep_pass = 2.0 * ep_a2a                                             # dispatch and combine
    ep_fwd_exposed = np.where(dualpipe[:, None], np.maximum(0.0, ep_pass - layer["forward"]), ep_pass)
    ep_bwd_exposed = np.where(dualpipe[:, None], np.maximum(0.0, ep_pass - layer["backward"]), ep_pass)

    comm_fwd = tp_fwd + cp_fwd_total + ep_pass
    comm_bwd = tp_fwd + cp_bwd_total + ep_pass
    exposed_fwd = tp_fwd + cp_fwd_exposed + ep_fwd_exposed
    exposed_bwd = tp_fwd + cp_bwd_exposed + ep_bwd_exposed
    # recomputing a layer's forward repeats its forward collectives
    recompute_full = (np.asarray(cols["recompute"]) == _RECOMPUTE_CODES["full"])[:, None]

    def per_rank(per_layer):                                           # (S, K) -> (S, R)
        return np.einsum("srk,sk->sr", counts, per_layer)

    # --- embedding and head (S,) ---------------------------------------------------------------------
    # the head, like the memory model's, is split over TP only when vocabulary-parallel; otherwise
    # every TP rank runs the whole head and loss
    head_split = np.where(vocab_parallel, tp, 1.0)
    loss_split = head_split
    head_flops = model.head_flops_per_token * tokens / head_split * (1 + len(model.mtp_kinds))
    head_weights = pwidth * (model.head_parameters or model.embedding_parameters) / head_split
    head_fwd = np.maximum(head_flops / (peak * eff["matmul"]), head_weights / (hbm * eff["memory"]))
    head_bwd = np.maximum(2 * head_flops / (peak * eff["matmul_backward"]), 2 * head_weights / (hbm * eff["memory"]))
    # the loss: logits written, read back as fp32, log-sum-exp, and their gradient
    if model.loss_bytes_per_token is not None:
        loss_per_token = model.loss_bytes_per_token / loss_split
    else:
        # logits cast to fp32, log-softmax read and written, the loss's gather; the final norm
        loss_per_token = vocab / loss_split * (width + 16.0) + NORM_ELEMENTS * h * 2.0
    loss_bytes = tokens * loss_per_token * (1 + len(model.mtp_kinds))
    head_fwd = head_fwd + loss_bytes / (hbm * eff["memory"])
    head_bwd = head_bwd + loss_bytes / (hbm * eff["memory_backward"])
    embed_fwd = 2.0 * tokens * h * width / (hbm * eff["memory"])
    embed_bwd = 2.0 * tokens * h * width / (hbm * eff["memory_backward"])

    compute_f = per_rank(layer["forward"]) + is_first * embed_fwd[:, None] + is_head * head_fwd[:, None]
    compute_b = (per_rank(layer["backward"]) + fraction * per_rank(layer["recompute"])
                 + is_first * embed_bwd[:, None] + is_head * head_bwd[:, None])
    if np.any(np.asarray(cols["recompute"]) == _RECOMPUTE_CODES["full"]):
        comm_b_extra = np.where(recompute_full, tp_fwd + cp_fwd_total + ep_pass, 0.0)
        exposed_b_extra = np.where(recompute_full, exposed_fwd, 0.0)
    else:
        comm_b_extra = exposed_b_extra = np.zeros_like(tp_fwd)
    comm_layers = per_rank(comm_fwd + comm_bwd) + fraction * per_rank(comm_b_extra)       # (S, R)
    exposed_f = per_rank(exposed_fwd)
    exposed_b = per_rank(exposed_bwd) + fraction * per_rank(exposed_b_extra)

    # --- parameters on each rank (S, R) -----------------------------------------------------------------
    dense_params = np.einsum("srk,k->sr", counts, k["dense_parameters"]) / tp[:, None]
    dense_params = dense_params + np.einsum("srk,k->sr", counts, k["replicated_parameters"])
    dense_params = dense_params + is_first * (model.embedding_parameters / head_split)[:, None]
    dense_params = dense_params + is_head * ((model.head_parameters / head_split) + model.final_norm_parameters)[:, None]
    routed_params = np.einsum("srk,k->sr", counts, k["routed_parameters"]) / (ep * etp)[:, None]

    # --- data-parallel and FSDP collectives -----------------------------------------------------------
    replicas = dp * fsdp * cp                      # ranks holding (a shard of) the same dense parameters
    expert_replicas = dp * fsdp * cp * tp / (ep * etp)
    fsdp_sharded = (fsdp > 1) | (zero >= 3)
    # FSDP shards over fsdp * cp (CP next to it in the rank order, as the memory model counts it) and
    # replicates over dp (HSDP); ZeRO-3 shards over every replica
    shard = np.where(fsdp > 1, fsdp * cp, np.where(zero >= 3, replicas, 1.0))
    bw_sh, lat_sh = group_link(hardware, tp, shard, eff)
    rest = np.where(fsdp > 1, dp, 1.0)
    bw_rest, lat_rest = group_link(hardware, tp * cp * fsdp, rest, eff)
    bw_dp, lat_dp = group_link(hardware, tp, replicas, eff)
    bw_edp, lat_edp = group_link(hardware, etp * ep, expert_replicas, eff)
    param_bytes = dense_params * pwidth[:, None]
    grad_bytes = dense_params * gwidth[:, None]
    eparam_bytes = routed_params * pwidth[:, None]
    egrad_bytes = routed_params * gwidth[:, None]
    c2 = lambda name, msg, g, bw, lat: coll[name](msg, g[:, None], bw[:, None], lat[:, None])  # noqa: E731
    # per micro-batch under FSDP / ZeRO-3: gathers for the forward and the backward, a reduce-scatter
    fsdp_gather = np.where(fsdp_sharded[:, None], c2("all_gather", param_bytes, shard, bw_sh, lat_sh)
                           + c2("all_gather", eparam_bytes, expert_replicas, bw_edp, lat_edp), 0.0)
    fsdp_scatter = np.where(fsdp_sharded[:, None], c2("reduce_scatter", grad_bytes, shard, bw_sh, lat_sh)
                            + c2("reduce_scatter", egrad_bytes, expert_replicas, bw_edp, lat_edp), 0.0)
    # per step: gradients reduced (and under ZeRO 1/2 the updated parameters gathered)
    zero12 = ~fsdp_sharded & (zero >= 1)
    dense_grad_step = np.where(
        fsdp_sharded[:, None], c2("all_reduce", grad_bytes / shard[:, None], rest, bw_rest, lat_rest),
        np.where(zero12[:, None], c2("reduce_scatter", grad_bytes, replicas, bw_dp, lat_dp),
                 c2("all_reduce", grad_bytes, replicas, bw_dp, lat_dp)))
    expert_grad_step = np.where(
        fsdp_sharded[:, None], 0.0,
        np.where(zero12[:, None], c2("reduce_scatter", egrad_bytes, expert_replicas, bw_edp, lat_edp),
                 c2("all_reduce", egrad_bytes, expert_replicas, bw_edp, lat_edp)))
    grad_step = dense_grad_step + expert_grad_step
    param_step = np.where(zero12[:, None], c2("all_gather", param_bytes, replicas, bw_dp, lat_dp)
                          + c2("all_gather", eparam_bytes, expert_replicas, bw_edp, lat_edp), 0.0)

    # --- pipeline sends ---------------------------------------------------------------------------------
    pp_msg = tokens * h * width / np.where(sp, tp, 1.0)
    bw_pp, lat_pp = group_link(hardware, tp * cp * dp * fsdp, pp, eff)
    send = np.where(pp > 1, coll["send_recv"](pp_msg, pp, bw_pp, lat_pp), 0.0)
    pp_comm = 2.0 * vpp * send                                         # a rank's sends a micro-batch
    pp_exposed = np.where(pp > 1, 2.0 * (pp * vpp - 1.0) * send, 0.0)

    # --- stage times a micro-batch (S, R) --------------------------------------------------------------
    fsdp_exposed_f = np.maximum(0.0, fsdp_gather - compute_f)
    fsdp_exposed_b = np.maximum(0.0, fsdp_gather + fsdp_scatter - compute_b)
    forward = compute_f + exposed_f + fsdp_exposed_f
    backward = compute_b + exposed_b + fsdp_exposed_b
    stage = np.where(real_rank, forward + backward, 0.0)
    busiest = np.argmax(stage, axis=1)
    rows = np.arange(n)
    stage_max = stage[rows, busiest]
    total = stage.sum(axis=1)
    idle = total - stage_max
    # the schedule's idle time in stage times (1F1B: p - 1), at the other ranks' mean stage time
    steps = np.zeros(n)
    names = np.asarray(cols["schedule_name"])
    for name, plugin in _schedules(names.tolist()).items():
        mask = names == name
        steps[mask] = plugin.bubble_stage_steps(pp[mask], f64("vpp")[mask], m[mask])
    bubble = np.where(pp > 1, steps * idle / np.maximum(pp - 1.0, 1.0), 0.0)

    grad_exposed = np.where(real_rank, np.maximum(0.0, grad_step - backward), 0.0).max(axis=1)
    param_exposed = np.where(real_rank, np.maximum(0.0, param_step - forward), 0.0).max(axis=1)

    # --- optimizer (S, R) -----------------------------------------------------------------------------
    opt_shard = np.where(fsdp > 1, shard, np.where(zero >= 1, replicas, 1.0))
    eopt_shard = np.where(fsdp_sharded | (zero >= 1), expert_replicas, 1.0)
    local = dense_params / opt_shard[:, None] + routed_params / eopt_shard[:, None]
    per_param = 2 * pwidth + gwidth + 2 * mwidth + 2 * optimizer_states * owidth
    optimizer = np.where(real_rank, local * per_param[:, None] / (hbm * eff["memory"]), 0.0).max(axis=1)

    # --- the step on the busiest rank ------------------------------------------------------------------
    pick = lambda a: a[rows, busiest]  # noqa: E731
    compute = m * (pick(compute_f) + pick(compute_b))
    exposed = (m * (pick(exposed_f) + pick(exposed_b) + pick(fsdp_exposed_f) + pick(fsdp_exposed_b))
               + grad_exposed + param_exposed + pp_exposed)
    communication = (m * (pick(comm_layers) + pick(fsdp_gather) * 2.0 + pick(fsdp_scatter) + pp_comm)
                     + pick(grad_step) + pick(param_step))
    step = compute + exposed + bubble + optimizer
    sequences = dp * fsdp * m * b
    tokens_per_second = sequences * s / step
    one_seq = n > 0 and s.min() == s.max()  # the resolver prices one sequence length a call: one evaluation
    model_flops = 3.0 * model.forward_flops_per_sequence(s[:1] if one_seq else s) * sequences
    devices = dp * fsdp * cp * tp * pp
    mfu = model_flops / (step * devices * peak)

    provenance = {
        "compute": f"roofline per op class; flops: {model.source}",
        "efficiency": ", ".join(f"{key}={eff[key]:g} ({eff_sources[key]})" for key in EFFICIENCY_KEYS),
        "communication": "collective/" + ", collective/".join(sorted(coll)),
        "overlap": "; ".join(f"{use}: {rule}" for use, rule in OVERLAP_RULES.items()),
        "hardware": f"hardware/{hardware.name}",
        "model": "ndcost.timemodel",
    }
    detail = {"stage_seconds": stage, "busiest_rank": busiest, "forward_seconds": pick(forward),
              "backward_seconds": pick(backward), "model_flops": model_flops,
              "grad_sync_seconds": pick(grad_step), "pp_send_seconds": send}
    return TimeArrays(step_seconds=step, tokens_per_second=tokens_per_second, mfu=mfu, compute_seconds=compute,
                      communication_seconds=communication, exposed_communication_seconds=exposed,
                      bubble_seconds=bubble, optimizer_seconds=optimizer, provenance=provenance, detail=detail)


# ---------------------------------------------------------------------------
# the resolver's hook
# ---------------------------------------------------------------------------
def _shared_columns(cols, coded, valid, every, names, hardware: Hardware, cost_model: Any) -> None:
    """Add ``peak_flops`` and ``optimizer_states`` to *cols* from the resolver's codes (a table per name)."""
    def by_code(field, table):
        codes = np.asarray(coded[field])
        return table[codes if every else codes[valid]]
    used = np.flatnonzero(np.bincount(np.asarray(coded["compute_dtype"])[valid]))
    peaks = np.full(len(names["compute_dtype"]), np.nan)
    for code in used.tolist():  # a loop over the few dtypes the batch uses
        peaks[code] = float(hardware.peak_flops(str(names["compute_dtype"][code])))
    cols["peak_flops"] = by_code("compute_dtype", peaks)
    cols["optimizer_states"] = by_code("optimizer", cost_model.optimizer_arrays(names["optimizer"])[0])


def _shared_rank_layers(model: ModelWork, cost_model: Any, result: Any, rows: np.ndarray, ranks: int):
    """:func:`rank_layer_counts`' answer (*ranks* wide) from the memory composition's placement, or None."""
    layers = getattr(result, "stage_kind_layers", None)
    tables = getattr(cost_model, "tables", None)
    if layers is None or tables is None or not set(model.kinds) <= set(tables.kinds):
        return None
    counts = layers[rows, :ranks][:, :, [tables.kinds.index(k) for k in model.kinds]]
    head_rank = np.asarray(result.head_stage)[rows]
    for kind in model.mtp_kinds:  # MTP layers run with the head, as rank_layer_counts places them
        counts[np.arange(len(rows)), head_rank, model.kinds.index(kind)] += 1
    return counts, head_rank


def attach(cost_model: Any, result: Any, batch: Any, hardware: Hardware) -> Any:
    """*result* (the resolver's BatchResult) with ``time`` filled for its valid rows.

    Called by ``CostModel._attach_time``. Rows are grouped by sequence length
    (one :class:`ModelWork` each, from the records the resolver chose at that
    length: the census's FLOPs where it measured them, else analytic); the
    rest is one :func:`step_time` call a group. Invalid rows hold NaN. A batch
    the time model cannot price (a kind no FLOPs source covers) keeps its
    memory results and says why in ``time["provenance"]["unpriced"]``.
    """
    n = len(result.valid)
    arrays = {name: np.full(n, np.nan) for name in TIME_FIELDS}
    valid = np.asarray(result.valid, dtype=bool)
    provenance: Dict[str, Any] = {}
    if valid.any():
        try:
            names = cost_model.names()
            every = bool(valid.all())
            cols = columns_from_codes({k: np.asarray(v) if every else np.asarray(v)[valid]
                                       for k, v in batch.cols.items()}, names,
                                      None if batch.pp_layers is None else
                                      [batch.pp_layers[i] for i in np.flatnonzero(valid)])
            rows = np.flatnonzero(valid)
            # shared with the memory composition (resolver): peak FLOP/s and optimizer states by code, the
            # layers on each rank as it placed them -- no string lookups or second placement on the hot path
            _shared_columns(cols, batch.cols, valid, every, names, hardware, cost_model)
            seqs, inverse = np.unique(cols["seq"], return_inverse=True)
            works = {seq: cost_model.model_work(seq) for seq in seqs.tolist()}
            # rows grouped by (sequence length, pp), each group a contiguous slice after one sort, so a
            # group's per-rank arrays are only as wide as its pp
            pp = cols["pp"]
            key = inverse.reshape(-1) * (int(pp.max()) + 1) + pp
            order = np.argsort(key, kind="stable")
            edges = np.flatnonzero(np.diff(key[order])) + 1
            # groups cut into at most CHUNK_ROWS rows, so the per-rank arrays stay bounded
            cuts = sorted(set(edges.tolist()) | set(range(0, len(order), CHUNK_ROWS)) | {len(order)})
            ordered = {k: v[order] for k, v in cols.items()}
            for lo, hi in zip(cuts[:-1], cuts[1:]):  # a loop over the groups, not rows
                seq = seqs[key[order[lo]] // (int(pp.max()) + 1)].item()
                sub = {k: v[lo:hi] for k, v in ordered.items()}
                target = rows[order[lo:hi]]
                shared = _shared_rank_layers(works[seq], cost_model, result, target, int(sub["pp"][0]))
                priced = step_time(works[seq], sub, hardware, rank_layers=shared,
                                   optimizer_states=sub.get("optimizer_states"))
                for name in TIME_FIELDS:
                    arrays[name][target] = getattr(priced, name)
                provenance = dict(priced.provenance)
            provenance["flops"] = "; ".join(f"seq {int(seq)}: {works[seq].source}" for seq in seqs.tolist())
        except Unpriced as exc:
            provenance = {"unpriced": str(exc)}
            arrays = {name: np.full(n, np.nan) for name in TIME_FIELDS}
    time = dict(arrays)
    time["provenance"] = provenance
    if "unpriced" in provenance:
        return attrs.evolve(result, time=None, provenance={**dict(result.provenance), "time": provenance})
    return attrs.evolve(result, time=time, provenance={**dict(result.provenance), "time": provenance})
