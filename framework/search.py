"""Search every parallel strategy for exactly N devices: enumerate, prune, price in batches, rank by step time.

``search(model, devices=1024, hardware="h200", global_batch=4096, seq=4096)`` returns a
:class:`SearchResult`: the strategies that run and fit, fastest first. The space, built as numpy
columns and priced by :meth:`ndcost.resolver.CostModel.evaluate_many` (the searcher's path in
``docs/guides/searchers.md``):

- the devices split as ``dp * fsdp * cp * tp * pp`` (``dp > 1`` with ``fsdp > 1`` is HSDP); ZeRO stages over ``dp *
  cp`` where FSDP is off; ``sp`` where ``tp > 1``; every registered schedule with each ``vpp`` that divides the layers
  (one that is another's variant for expert parallelism, ``variant_of``, only with ``ep > 1``, and at ``pp = 1`` where
  it is 1F1B's, in 1F1B's place where it holds as much), and under ``pp_splits="balanced"`` ``vpp`` 1 and 2 where ``pp
  * vpp`` does not divide them, cut by :func:`ndcost.compose.placement.balanced_split` (``pp_layers``: torchtitan's
  split, the embedding and the head a layer each; DeepSeek-V3's 61 layers take no pipeline otherwise, and a pipeline's
  rows cost about ``pp`` times a row without); every ``cp_algo`` where ``cp > 1``; ``ep`` and ``etp`` that divide the
  experts and their width (MoE models); ``micro_batch * num_micro_batches * dp * fsdp == global_batch``; every
  recompute mode over all of a chunk's layers and over :data:`RECOMPUTE_LAYER_FRACTIONS` of them; ``vocab_parallel``
  where ``tp > 1``; ``reshard_after_forward=false`` and ``gradient_sync=last_micro_batch`` where FSDP shards and ``pp
  > 1`` (torchtitan's defaults there), ``pp_engine=torch`` where ``pp > 1``;
- pruned before pricing: each field's values the model refuses (probed through ``evaluate_many`` itself,
  so the reasons are the model's own), splits whose ``dp * fsdp`` does not divide the batch, ``tp`` and
  ``etp`` groups larger than a node unless ``within_node=False`` (their collectives run every layer, as
  trainers keep them on NVLink), and layouts whose parameters, master copy and optimizer
  states alone exceed the memory cap (those three are held at every moment, the base of
  ``ndcost.compose.memory._peak``, so this bound never drops a strategy that fits);
- the micro-batch bound: within a layout, micro-batch sizes are priced in rising order and the larger
  sizes of a strategy that does not fit are skipped (a larger ``micro_batch`` keeps ``micro_batch`` times
  the in-flight micro-batches, ``min(in_flight * micro_batch, local batch)`` under every built-in schedule,
  so the peak does not fall); ``exhaustive=True`` prices them all (``tests/test_search.py`` checks the two agree);
- dropped after pricing: rows ``evaluate_many`` refuses, and those that do not fit the cap on the resolver's rule
  (:func:`ndcost.resolver.fits_rule`: reserved bytes, or the allocated peak where reserved is not claimed).

Left out (documented, never guessed): other uneven ``pp_layers`` splits (a ``pp * vpp`` that divides the layers is
searched even; one that does not only under ``pp_splits="balanced"``, by the one split above), ZeRO with ``dp * cp
== 1`` and ``vocab_parallel`` or ``sp`` with ``tp == 1`` (each the same cost as without), dtypes, optimizers,
``moe_imbalance``, ``cp_rotate`` and ``ep_dispatcher`` (the strategy's defaults; the ring's rotation and the MoE
dispatcher are the trainer's settings: hold them, ``--hold cp_rotate=p2p,ep_dispatcher=deepep``). ``reserved_bytes``
is what the caching allocator simulation reserves (:mod:`ndcost.allocator`; ``None`` where not claimed). The cap is
the bytes a device's allocator may reserve (default the hardware's memory less its CUDA context,
``Hardware.usable_memory_bytes``). Both bounds above compare allocated bytes (without ``allocator_overhead``'s
guess) with it: they are below the reserved bytes the composition claims and the peak it judges otherwise, so
neither drops a strategy that fits.

``workers=N`` prices the chunks in N local processes; ``scheduler="tcp://..."`` on a Dask distributed
cluster (the ``dask`` extra). Either gives the single-process answer, whatever the chunks: ties in step
time are broken by peak bytes, then by enumeration order.
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost import manager
from ndcost.compose import sharding as sharding_rules
from ndcost.compose.placement import balanced_split
from ndcost.errors import InvalidValue, MissingExtra, NoValidStrategy, UnknownKey, Unpriced
from ndcost.values import (
    CP_ALGOS,
    DDP_BUCKET_ENGINES,
    MEMORY_CATEGORIES,
    RECOMPUTE,
    ZERO_FIELD_STAGES,
    Strategy,
    frozen_mapping,
    most_exposed,
)

__all__ = ["search", "search_grid", "held_fields", "Candidate", "Pruning", "SearchResult", "SearchPoints",
           "ProgressBar", "SearchSettings", "pareto_front", "plot_search", "RECOMPUTE_LAYER_FRACTIONS", "CHUNK_ROWS",
           "DEFAULT_TOP"]

GIB = 2 ** 30
DEFAULT_TOP = 10
PP_SPLITS = ("even", "balanced")  # SearchSettings.pp_splits
CHUNK_ROWS = 1 << 17  # strategies priced in one evaluate_many call (and sent to one worker)
# Besides every layer of a chunk, recompute this share of its first layers (Strategy.recompute_layers).
RECOMPUTE_LAYER_FRACTIONS: Tuple[float, ...] = (0.5,)
# Held at every moment a stage can peak at (compose/memory.py, _peak's base): a lower bound of the peak.
_PERSISTENT = tuple(MEMORY_CATEGORIES.index(c) for c in ("parameters", "master", "optimizer_states"))
_ALLOCATOR = MEMORY_CATEGORIES.index("allocator")  # allocator_overhead's guess, above the allocated bytes
_LAYOUT_FIELDS = ("dp", "fsdp", "cp", "tp", "pp", "vpp", "schedule", "pp_layers", "ep", "etp", "zero",
                  "vocab_parallel", "reshard_after_forward", "gradient_sync", "pp_engine")
_STRATEGY_COLUMNS = _LAYOUT_FIELDS + ("sp", "cp_algo", "micro_batch", "num_micro_batches", "recompute",
                                      "recompute_layers")


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class Candidate:
    """One strategy that runs and fits: its peak bytes a device and its step.

    ``reserved_bytes``: what PyTorch's caching allocator reserves (simulated; None where not claimed).
    ``train_seconds``, ``gpu_hours`` and ``cost_usd`` are set where the search was given the tokens
    to train (and a price a GPU-hour). ``exposed_by_group``: the step's exposed communication by the group
    whose collectives it waits for (``ndcost.values.EXPOSED_GROUPS``), seconds.
    """

    strategy: Strategy
    devices: int
    hardware: str
    peak_bytes: int
    step_seconds: float
    tokens_per_second: float
    mfu: float
    reserved_bytes: Optional[int] = None
    train_seconds: Optional[float] = None
    gpu_hours: Optional[float] = None
    cost_usd: Optional[float] = None
    exposed_by_group: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"strategy": str(self.strategy), "devices": self.devices, "hardware": self.hardware,
                               "peak_bytes": self.peak_bytes, "reserved_bytes": self.reserved_bytes,
                               "step_seconds": self.step_seconds, "tokens_per_second": self.tokens_per_second,
                               "mfu": self.mfu}
        if self.train_seconds is not None:
            out.update(train_seconds=self.train_seconds, gpu_hours=self.gpu_hours)
        if self.cost_usd is not None:
            out["cost_usd"] = self.cost_usd
        out.update({f"exposed_{group}_seconds": seconds for group, seconds in self.exposed_by_group.items()})
        return out

    @property
    def waits(self) -> str:
        """The group whose collectives expose the most of the step ("" where none exposes any)."""
        return most_exposed(self.exposed_by_group)


@attrs.frozen(kw_only=True)
class Pruning:
    """One step of the search that removed candidates: how many (of what) and one of its reasons."""

    step: str      # a field ("tp", "ep", "recompute", ...), "batch", "layout", "memory bound", "evaluation", ...
    removed: int
    of: str        # what was counted: "device splits", "layouts", "strategies" or a field's values
    reason: str


@attrs.frozen(kw_only=True, eq=False)
class SearchPoints:
    """Every priced (valid) strategy's peak GiB and step seconds (float32, for plots), and whether it fits."""

    peak_gib: np.ndarray
    step_seconds: np.ndarray
    fits: np.ndarray


@attrs.frozen(kw_only=True, eq=False)
class SearchResult:
    """A search of one (devices, hardware): the best candidates, fastest first, and what was pruned."""

    model: str
    devices: int
    hardware: str
    global_batch: int
    seq: int
    memory_cap_bytes: int
    candidates: Tuple[Candidate, ...]
    priced: int         # strategies handed to evaluate_many
    valid: int          # of those, the ones that run
    fitting: int        # of those, the ones within the cap
    pruning: Tuple[Pruning, ...]
    points: Optional[SearchPoints] = None
    tokens: Optional[int] = None

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


# ---------------------------------------------------------------------------
# input checks
# ---------------------------------------------------------------------------
def _positive_int(name: str, value: Any, example: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InvalidValue(f"{name}={value!r}: must be a positive whole number, for example {name}={example}")
    return int(value)


def _objects(values: Sequence[Any]) -> np.ndarray:
    """*values* as a 1-d object array (``pp_layers``: a split's text, or None for an even one)."""
    out = np.empty(len(values), dtype=object)
    out[:] = list(values)
    return out


def _item(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _divisors(n: int) -> List[int]:
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _hardware_of(name: Any):
    from ndcost.resolver import _hardware
    try:
        return _hardware(name)
    except UnknownKey:
        known = ", ".join(manager.registry().names("hardware"))
        raise UnknownKey(f"hardware {name!r} is not registered; use one of {known}, or a hardware spec YAML") \
            from None


# ---------------------------------------------------------------------------
# the space: probes, device splits, layouts
# ---------------------------------------------------------------------------
def _probe(model, hardware, cols: Mapping[str, Any]) -> Tuple[np.ndarray, np.ndarray]:
    """Which rows of a small batch the model refuses, and why (its own checks, through evaluate_many)."""
    result = model.evaluate_many(dict(cols), hardware=hardware)
    return np.asarray(result.valid, dtype=bool), np.asarray(result.reason)


def _allowed(model, hardware, field: str, values: Sequence[Any], seq: int, **extra: Any) -> Tuple[List[Any], str]:
    """The values of *field* the model accepts (others at their defaults) and the first refusal's reason."""
    cols = {field: list(values), "seq": seq, **{k: list(v) for k, v in extra.items()}}
    valid, reason = _probe(model, hardware, cols)
    refused = [str(r) for r, ok in zip(reason, valid, strict=True) if not ok]
    return [v for v, ok in zip(values, valid, strict=True) if ok], (refused[0] if refused else "")


def _note_values(pruning: List[Pruning], field: str, removed: int, reason: str) -> None:
    if removed:
        pruning.append(Pruning(step=field, removed=removed, of=f"{field} values", reason=reason))


def _join(left: Dict[str, np.ndarray], key: np.ndarray, right: Dict[str, np.ndarray], right_key: np.ndarray):
    """Every row of *left* paired with every row of *right* whose key equals its own (vectorized)."""
    order = np.argsort(right_key, kind="stable")
    sorted_key = right_key[order]
    lo = np.searchsorted(sorted_key, key, side="left")
    counts = np.searchsorted(sorted_key, key, side="right") - lo
    rows = np.repeat(np.arange(len(key)), counts)
    within = np.arange(len(rows)) - np.repeat(np.cumsum(counts) - counts, counts)
    picked = order[np.repeat(lo, counts) + within]
    out = {k: v[rows] for k, v in left.items()}
    out.update({k: v[picked] for k, v in right.items()})
    return out


def _cross(left: Dict[str, np.ndarray], right: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    n = len(next(iter(left.values())))
    m = len(next(iter(right.values())))
    out = {k: np.repeat(v, m) for k, v in left.items()}
    out.update({k: np.tile(v, n) for k, v in right.items()})
    return out


def _keep(cols: Dict[str, np.ndarray], mask: np.ndarray) -> Dict[str, np.ndarray]:
    return {k: v[mask] for k, v in cols.items()}


@attrs.frozen(kw_only=True)
class _Inner:
    """What a layout expands into: the options each worker needs, none of them a model object."""

    recompute_modes: Tuple[str, ...]
    fractions: Tuple[float, ...]
    cp_algos: Tuple[str, ...]
    sp_pairs: Tuple[int, ...]   # tp * (devices + 1) + cp of the (tp, cp) that allow sp
    devices: int
    global_batch: int
    num_layers: int


def _dominates_unpipelined(name: str, plain: str) -> bool:
    """Whether schedule *name* hides expert communication *plain* leaves exposed and, without pipelining, holds
    as many micro-batches as *plain* at every count (so it is never worse there)."""
    registry = manager.registry()
    variant, base = registry.get(f"schedule/{name}"), registry.get(f"schedule/{plain}")
    if not variant.overlaps_expert_communication or base.overlaps_expert_communication:
        return False
    counts = np.arange(1, 65)
    return bool(np.array_equal(np.asarray(variant.in_flight(1, 1, counts, 0, 0)),
                               np.asarray(base.in_flight(1, 1, counts, 0, 0))))


def _space(model, hardware, devices: int, global_batch: int, seq: int, fractions: Tuple[float, ...],
           pruning: List[Pruning], within_node: bool = True, pp_splits: str = "even",
           schedules: Tuple[str, ...] = ()) -> Tuple[Dict[str, np.ndarray], _Inner]:
    """The layouts (one row each, ``_LAYOUT_FIELDS``) worth pricing, and what each expands into; *schedules*, where
    given, the registered schedules searched (a layout without a pipeline is 1F1B's under any)."""
    names = model.names()
    allowed = [n for n in names["schedule"] if n in schedules or not schedules]  # 1f1b stands for no pipeline
    L = model.tables.num_layers
    divs = _divisors(devices)
    tp_ok, tp_why = _allowed(model, hardware, "tp", divs, seq)
    cp_ok, cp_why = _allowed(model, hardware, "cp", divs, seq)
    # pipeline layouts (pp, schedule, vpp, pp_layers) the model and its schedules accept (num_micro_batches ample):
    # even splits, and under "balanced" balanced_split's where pp * vpp (vpp 1 or 2) does not divide the layers
    # a schedule that is another's variant for expert parallelism (variant_of) only where ep > 1, below
    variants = {name: getattr(manager.registry().get(f"schedule/{name}"), "variant_of", "") for name in allowed}
    triples: List[Tuple[int, str, int, Optional[str]]] = [(1, name, 1, None) for name in names["schedule"]
                                                          if name == "1f1b" or (variants.get(name) == "1f1b"
                                                                                and model.tables.num_experts)]
    for pp in divs[1:]:
        chunks: List[Tuple[int, Optional[str]]] = ([(vpp, None) for vpp in _divisors(L // pp)] if L % pp == 0
                                                   else [(1, None)] if pp_splits == "even" else [])  # refused: why
        for vpp in (1, 2) if pp_splits == "balanced" else ():
            uneven = balanced_split(L, pp * vpp) if L % (pp * vpp) else None
            if uneven is not None:
                chunks.append((vpp, "/".join(map(str, uneven))))
        triples += [(pp, schedule, vpp, split) for schedule in allowed for vpp, split in chunks]
    pipe_pp = [t[0] for t in triples]
    pipe_rows = {"pp": np.array(pipe_pp), "schedule": np.array([t[1] for t in triples]),
                 "vpp": np.array([t[2] for t in triples]), "pp_layers": _objects([t[3] for t in triples])}
    valid, reason = _probe(model, hardware, dict(pipe_rows, seq=seq,
                                                 num_micro_batches=np.array([2 * t[0] * t[2] for t in triples])))
    pipes = {k: v[valid] for k, v in pipe_rows.items()}
    pp_ok = sorted(set(pipes["pp"].tolist()))
    pp_refused = [str(reason[i]) for i, p in enumerate(pipe_pp) if not valid[i] and p not in pp_ok]
    pp_refused += [f"pp={pp} is more stages than the {L} layers (each stage holds one or more)"
                   for pp in divs[1:] if pp not in pipe_pp]
    pp_why = pp_refused[0] if pp_refused else ""
    if pp_splits == "even" and any(L % pp for pp in divs[1:] if pp not in pp_ok and pp <= L):
        pp_why += ("; pp_splits='balanced' (--pp-splits balanced) also searches the pp a layer count does not "
                   "divide, cut by torchtitan's split (a longer search)")

    # the device splits dp * fsdp * cp * tp * pp == devices; each removed by the first constraint it breaks
    d = np.array(divs, dtype=np.int64)
    grid = np.stack(np.meshgrid(d, d, d, d, indexing="ij"), axis=-1).reshape(-1, 4)
    prod = grid.prod(axis=1)
    grid, prod = grid[devices % prod == 0], prod[devices % prod == 0]
    split = {"dp": grid[:, 0], "fsdp": grid[:, 1], "cp": grid[:, 2], "tp": grid[:, 3], "pp": devices // prod}
    alive = np.ones(len(prod), dtype=bool)
    node = int(hardware.nvlink_domain_devices)  # "within a node": on NVLink (a node, or a GB200 NVL72 rack)
    checks = [("tp", np.isin(split["tp"], tp_ok), tp_why),
              ("tp within a node", ~np.full(len(prod), within_node) | (split["tp"] <= node),
               f"tp over more than the {node} devices of a {hardware.name} NVLink domain (search across nodes "
               f"to keep it)"),
              ("pp", np.isin(split["pp"], pp_ok), pp_why),
              ("cp", np.isin(split["cp"], cp_ok), cp_why),
              ("batch", global_batch % (split["dp"] * split["fsdp"]) == 0,
               f"dp * fsdp must divide the global batch of {global_batch} sequences")]
    for step, ok, why in checks:
        removed = int((alive & ~ok).sum())
        if removed:
            if step == "batch":
                bad = (split["dp"] * split["fsdp"])[alive & ~ok].min()
                why = f"dp * fsdp = {bad} does not divide the global batch of {global_batch} sequences"
            pruning.append(Pruning(step=step, removed=removed, of="device splits", reason=why))
        alive &= ok
    split = _keep(split, alive)
    if not alive.any():
        return {}, _Inner(recompute_modes=(), fractions=(), cp_algos=(), sp_pairs=(), devices=devices,
                          global_batch=global_batch, num_layers=L)

    layouts = _join(split, split["pp"], {"schedule": pipes["schedule"], "vpp": pipes["vpp"],
                                         "pp_layers": pipes["pp_layers"]}, pipes["pp"])
    # experts: ep and etp the model accepts (dp set to make the ranks divisible), their product dividing the ranks
    if model.tables.num_experts:
        ep_ok, why = _allowed(model, hardware, "ep", divs, seq, dp=divs)
        _note_values(pruning, "ep", len(divs) - len(ep_ok), why)
        etp_ok, why = _allowed(model, hardware, "etp", divs, seq, dp=divs)
        _note_values(pruning, "etp", len(divs) - len(etp_ok), why)
    else:
        ep_ok, etp_ok = [1], [1]
    pairs = np.array([(e, t) for e in ep_ok for t in etp_ok], dtype=np.int64).reshape(-1, 2)
    layouts = _cross(layouts, {"ep": pairs[:, 0], "etp": pairs[:, 1]})
    ranks = layouts["dp"] * layouts["fsdp"] * layouts["cp"] * layouts["tp"]
    variant = np.isin(layouts["schedule"], [name for name, plain in variants.items() if plain])
    layouts = _keep(layouts, (ranks % (layouts["ep"] * layouts["etp"]) == 0) & ~(variant & (layouts["ep"] == 1)))
    # without pipelining, a variant that holds what its plain schedule holds and hides the all-to-alls it does not
    # (1f1b-a2a-overlap beside 1f1b) runs no slower in no more memory wherever ep > 1: the plain one is dropped there
    dominated = [plain for name, plain in variants.items() if plain and _dominates_unpipelined(name, plain)]
    beaten = (layouts["pp"] == 1) & (layouts["ep"] > 1) & np.isin(layouts["schedule"], dominated)
    if beaten.any():
        pruning.append(Pruning(step="dominated schedule", removed=int(beaten.sum()), of="layouts",
                               reason=f"schedule {dominated[0]} at pp=1 with ep > 1, where its variant holds as much "
                                      f"and hides its all-to-alls"))
        layouts = _keep(layouts, ~beaten)
    if within_node and (layouts["etp"] > node).any():
        pruning.append(Pruning(step="etp within a node", removed=int((layouts["etp"] > node).sum()), of="layouts",
                               reason=f"etp over more than the {node} devices of a {hardware.name} NVLink domain (its "
                                      f"all-gathers and reduce-scatters run every layer; search across nodes to "
                                      f"keep it)"))
        layouts = _keep(layouts, layouts["etp"] <= node)
    # ZeRO over dp * cp where FSDP is off (with one such rank it shards nothing); vocab_parallel with tp > 1
    layouts = _cross(layouts, {"zero": np.arange(4, dtype=np.int64)})
    layouts = _keep(layouts, (layouts["zero"] == 0) | ((layouts["fsdp"] == 1) & (layouts["dp"] * layouts["cp"] > 1)))
    layouts = _cross(layouts, {"vocab_parallel": np.array([False, True])})
    layouts = _keep(layouts, ~layouts["vocab_parallel"] | (layouts["tp"] > 1))
    # FSDP keeping each layer gathered from its forward to its backward where a pipeline runs (torchtitan's default)
    layouts = _cross(layouts, {"reshard_after_forward": np.array([True, False])})
    layouts = _keep(layouts, layouts["reshard_after_forward"] | ((layouts["fsdp"] > 1) & (layouts["pp"] > 1)))
    # and its gradients reduce-scattered once a step, as torch.distributed.pipelining's stages run FSDP
    layouts = _cross(layouts, {"gradient_sync": np.array(["auto", "last_micro_batch"])})
    layouts = _keep(layouts, (layouts["gradient_sync"] == "auto") | ((layouts["fsdp"] > 1) & (layouts["pp"] > 1)))
    # and the pipeline's receive buffers as torch.distributed.pipelining keeps them (torchtitan's engine)
    layouts = _cross(layouts, {"pp_engine": np.array(["auto", "torch"])})
    layouts = _keep(layouts, (layouts["pp_engine"] == "auto") | (layouts["pp"] > 1))

    # the options inside a layout
    modes = tuple(r for r in RECOMPUTE if r != "none")
    modes_ok, why = _allowed(model, hardware, "recompute", modes, seq)
    _note_values(pruning, "recompute", len(modes) - len(modes_ok), why)
    algos_ok, why = _allowed(model, hardware, "cp_algo", CP_ALGOS, seq, cp=[min(cp_ok[1:] or [1])] * len(CP_ALGOS))
    _note_values(pruning, "cp_algo", len(CP_ALGOS) - len(algos_ok), why)
    tp_cp = [(t, c) for t in tp_ok for c in cp_ok if t > 1]
    sp_pairs: Tuple[int, ...] = ()
    if tp_cp:
        ok, _ = _probe(model, hardware, {"tp": [t for t, _ in tp_cp], "cp": [c for _, c in tp_cp], "sp": True,
                                         "seq": seq})
        sp_pairs = tuple(t * (devices + 1) + c for (t, c), good in zip(tp_cp, ok, strict=True) if good)
    inner = _Inner(recompute_modes=("none",) + tuple(modes_ok), fractions=fractions, cp_algos=tuple(algos_ok),
                   sp_pairs=sp_pairs, devices=devices, global_batch=global_batch, num_layers=L)
    return layouts, inner


def _with_inner(layouts: Dict[str, np.ndarray], inner: _Inner, seq: int) -> Dict[str, np.ndarray]:
    """Every strategy of *layouts*: micro-batches, recompute, sp and cp_algo (vectorized, in layout order).

    Expanded as indices (layout, micro-batch, option, sp, algorithm); the layout's columns are gathered once.
    """
    n = len(layouts["dp"])
    local = inner.global_batch // (layouts["dp"] * layouts["fsdp"])
    distinct = [int(v) for v in np.unique(local).tolist()]
    table_key = np.concatenate([np.full(len(_divisors(v)), v) for v in distinct])
    table_mb = np.concatenate([_divisors(v) for v in distinct]).astype(np.int64)
    table_rank = np.concatenate([np.arange(len(_divisors(v))) for v in distinct])
    cols = _join({"_layout": np.arange(n)}, local, {"micro_batch": table_mb, "_mb_rank": table_rank}, table_key)

    def at(field: str) -> np.ndarray:
        return layouts[field][cols["_layout"]]

    # recompute: none; each mode over every layer (NaN: recompute_layers unset) and over each fraction of a chunk's
    options_mode, options_fraction = ["none"], [np.nan]
    for mode in inner.recompute_modes[1:]:
        options_mode += [mode] * (1 + len(inner.fractions))
        options_fraction += [np.nan, *inner.fractions]
    cols = _cross(cols, {"_option": np.arange(len(options_mode))})
    chunk_layers = inner.num_layers // (at("pp") * at("vpp"))
    with np.errstate(invalid="ignore"):
        layers = np.floor(np.array(options_fraction)[cols["_option"]] * chunk_layers)
    cols["recompute_layers"] = layers  # float: NaN is unset
    cols = _keep(cols, np.isnan(layers) | ((layers > 0) & (layers < chunk_layers)))
    cols = _cross(cols, {"sp": np.array([False, True])})
    pair = at("tp") * (inner.devices + 1) + at("cp")
    cols = _keep(cols, ~cols["sp"] | np.isin(pair, np.array(inner.sp_pairs, dtype=np.int64)))
    cols = _cross(cols, {"_algo": np.arange(len(inner.cp_algos))})
    cols = _keep(cols, (at("cp") > 1) | (np.array(inner.cp_algos)[cols["_algo"]] == "ring"))
    out = {k: at(k) for k in layouts}
    out.update(micro_batch=cols["micro_batch"], recompute_layers=cols["recompute_layers"], sp=cols["sp"],
               recompute=np.array(options_mode)[cols["_option"]], cp_algo=np.array(inner.cp_algos)[cols["_algo"]],
               seq=np.full(len(cols["sp"]), seq, dtype=np.int64), _layout=cols["_layout"], _mb_rank=cols["_mb_rank"])
    out["num_micro_batches"] = inner.global_batch // (out["dp"] * out["fsdp"] * out["micro_batch"])
    # the rows that differ only in micro_batch (and so num_micro_batches): one group, for the micro-batch bound
    out["_group"] = ((cols["_layout"] * len(options_mode) + cols["_option"]) * 2
                     + cols["sp"]) * len(inner.cp_algos) + cols["_algo"]
    return out


def _layout_bounds(model, hardware, layouts: Dict[str, np.ndarray], inner: _Inner, seq: int):
    """Each layout's validity (at its most micro-batches, no recompute, no sp) and its persistent bytes' bound."""
    probe = dict(layouts, micro_batch=1, seq=seq,
                 num_micro_batches=inner.global_batch // (layouts["dp"] * layouts["fsdp"]))
    result = model.evaluate_many(probe, hardware=hardware)
    bound = result.stage_bytes[:, :, list(_PERSISTENT)].sum(axis=2).max(axis=1)
    return np.asarray(result.valid, dtype=bool), np.asarray(result.reason), bound


# ---------------------------------------------------------------------------
# pricing chunks (in this process, in local processes or on a Dask cluster)
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True, eq=False)
class _Job:
    """One chunk of layouts to expand and price: picklable (the model and hardware by name)."""

    chunk: int
    model: Any            # a name or path resolve reads
    runtime: str
    census: str
    hardware: Any         # a name or spec YAML path
    layouts: Dict[str, np.ndarray]
    inner: _Inner
    seq: int
    cap_bytes: int
    top: int
    keep_points: bool
    exhaustive: bool
    held: Dict[str, Any]  # strategy fields every row holds (SearchSettings.held)


@attrs.frozen(kw_only=True, eq=False)
class _Summary:
    chunk: int
    rows: int                           # the chunk's strategies, priced or skipped
    skipped: int                        # by the micro-batch bound
    valid: int
    fitting: int
    min_peak_bytes: int                 # of the valid rows; -1 where none
    reasons: Tuple[Tuple[str, int], ...]
    top: Dict[str, np.ndarray]          # the chunk's best fitting rows: strategy columns, figures, "_row"
    points: Optional[Tuple[np.ndarray, np.ndarray, np.ndarray]]


_MODELS: Dict[Tuple[Any, str, str], Any] = {}


def held_by(strategy: Strategy) -> Dict[str, Any]:
    """The fields of *strategy* a search would hold rather than choose (neither a searched field nor ``seq``), where
    they differ from their defaults, as ``k=v`` texts: a trainer's file searched around keeps its precision."""
    fields = strategy.to_dict(defaults=False)
    return {k: Strategy.field_text(v) for k, v in fields.items() if k not in _STRATEGY_COLUMNS and k != "seq"}


def held_fields(fields: Any) -> Dict[str, Any]:
    """Strategy fields held for every candidate, as a strategy converts them; a searched field is refused."""
    fields = Strategy.named_fields(fields)
    if "seq" in fields:
        raise InvalidValue("held field seq: the search's sequence length is its own argument; give --seq (seq=) "
                           "and hold only other fields")
    searched = sorted(set(fields) & set(_STRATEGY_COLUMNS))
    if searched:
        raise InvalidValue(f"held fields {', '.join(searched)}: the search chooses them; hold only other fields "
                           f"(dtypes, optimizer, shard_mesh, offload_*, moe_imbalance ...)")
    return fields


class _Holding:
    """A CostModel whose every evaluate_many of columns holds *held*'s fields (a column each, broadcast);
    Strategy values (the candidates, which carry what they hold) are priced as they are."""

    def __init__(self, model: Any, held: Mapping[str, Any]):
        self.model, self.held = model, dict(held)

    def evaluate_many(self, strategies: Any, hardware: Any = None) -> Any:
        if not isinstance(strategies, Mapping):
            return self.model.evaluate_many(strategies, hardware=hardware)
        cols = {**self.held, **dict(strategies)}
        for name in set(self.held) & set(_HELD_ZERO_FIELDS):  # held where the row's ZeRO stage runs them
            cols[name] = np.where(_HELD_ZERO_FIELDS[name](cols), self.held[name], _DEFAULTS[name])
        return self.model.evaluate_many(cols, hardware=hardware)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


def _holding(model: Any, held: Mapping[str, Any]) -> Any:
    return _Holding(model, held) if held else model


def _model_for(job: _Job):
    key = (job.model, job.runtime, job.census)
    if key not in _MODELS:
        from ndcost.resolver import resolve
        _MODELS[key] = resolve(job.model, runtime=job.runtime, census=job.census)
    return _holding(_MODELS[key], job.held)


def _allocated_bytes(result: Any) -> np.ndarray:
    """Each row's most allocated bytes a stage (``allocator_overhead``'s guess left out): a lower bound of both
    what it reserves and its peak, that does not fall as ``micro_batch`` rises."""
    return (result.stage_peak_bytes - result.stage_bytes[:, :, _ALLOCATOR]).max(axis=1, initial=0)


def _price(job: _Job, model: Any = None) -> _Summary:
    """Expand one chunk of layouts, price it and keep what the merge needs (the best rows, counts, reasons)."""
    model = _model_for(job) if model is None else model
    cols = _with_inner(job.layouts, job.inner, job.seq)
    strategies = {k: v for k, v in cols.items() if not k.startswith("_")}
    # an even split's pp_layers is unset (None): a column of them only costs the batch a pass over its rows
    priced_cols = {k: v for k, v in strategies.items()
                   if k != "pp_layers" or any(split is not None for split in v)}
    n = len(cols["dp"])
    valid, peak = np.zeros(n, dtype=bool), np.zeros(n, dtype=np.int64)
    reserved = np.full(n, -1, dtype=np.int64)
    reason = np.full(n, "", dtype=object)
    times = {f: np.full(n, np.nan) for f in ("step_seconds", "tokens_per_second", "mfu")}
    priced = np.zeros(n, dtype=bool)
    _, group = np.unique(cols["_group"], return_inverse=True)
    group = group.reshape(-1)
    over = np.zeros(group.max() + 1 if n else 0, dtype=bool)  # groups a smaller micro-batch of which does not fit
    for rank in range(int(cols["_mb_rank"].max()) + 1 if n else 0):  # a loop over micro-batch sizes, not rows
        rows = np.flatnonzero((cols["_mb_rank"] == rank) & (job.exhaustive | ~over[group]))
        if not len(rows):
            continue
        result = model.evaluate_many({k: v[rows] for k, v in priced_cols.items()}, hardware=job.hardware)
        if result.time is None:
            unpriced = (result.provenance.get("time") or {}).get("unpriced", "no FLOPs source")
            raise Unpriced(f"the search ranks by step time, which is unpriced for {model.spec.name}: {unpriced}")
        priced[rows] = True
        valid[rows], peak[rows], reason[rows] = result.valid, result.peak_bytes, result.reason
        if result.reserved_bytes is not None:
            reserved[rows] = result.reserved_bytes
        for f in times:
            times[f][rows] = result.time[f]
        over[group[rows[result.valid & (_allocated_bytes(result) > job.cap_bytes)]]] = True
    skipped = int(n - priced.sum())
    valid &= priced
    step = times["step_seconds"]
    from ndcost.resolver import fits_rule
    fits, _ = fits_rule(valid, peak, reserved, job.cap_bytes)
    reasons: Tuple[Tuple[str, int], ...] = ()
    if not valid[priced].all():
        text, counts = np.unique(np.asarray(reason[priced & ~valid], dtype=str), return_counts=True)
        reasons = tuple(zip(text.tolist(), counts.tolist(), strict=True))
    rows = np.flatnonzero(fits)
    order = rows[np.lexsort((rows, peak[rows], step[rows]))][:job.top]
    top = {k: v[order] for k, v in strategies.items()}
    top.update(peak_bytes=peak[order], reserved_bytes=reserved[order], _row=order,
               **{f: times[f][order] for f in times})
    points = None
    if job.keep_points:
        points = ((peak[valid] / GIB).astype(np.float32), step[valid].astype(np.float32), fits[valid])
    return _Summary(chunk=job.chunk, rows=n, skipped=skipped, valid=int(valid.sum()), fitting=int(fits.sum()),
                    min_peak_bytes=int(peak[valid].min()) if valid.any() else -1, reasons=reasons, top=top,
                    points=points)


def _expansion(layouts: Dict[str, np.ndarray], inner: _Inner) -> np.ndarray:
    """The strategies each layout expands into (what :func:`_with_inner` makes of it, counted without it)."""
    local = inner.global_batch // (layouts["dp"] * layouts["fsdp"])
    distinct, index = np.unique(local, return_inverse=True)
    micro_batches = np.array([len(_divisors(int(v))) for v in distinct.tolist()])[index.reshape(-1)]
    chunk_layers = inner.num_layers // (layouts["pp"] * layouts["vpp"])
    partial = sum(((np.floor(f * chunk_layers) > 0) & (np.floor(f * chunk_layers) < chunk_layers)).astype(np.int64)
                  for f in inner.fractions)
    recompute = 1 + (len(inner.recompute_modes) - 1) * (1 + partial)
    pair = layouts["tp"] * (inner.devices + 1) + layouts["cp"]
    sp = 1 + np.isin(pair, np.array(inner.sp_pairs, dtype=np.int64))
    algos = np.where(layouts["cp"] > 1, len(inner.cp_algos), 1)
    return micro_batches * recompute * sp * algos


def _chunks(layouts: Dict[str, np.ndarray], inner: _Inner, rows: int) -> Tuple[List[Dict[str, np.ndarray]], int]:
    """Layouts cut so each chunk expands to about *rows* strategies; and the strategies in all."""
    ends = np.cumsum(_expansion(layouts, inner))
    cuts = np.searchsorted(ends, np.arange(rows, ends[-1], rows), side="right").tolist()
    edges = sorted(set([0] + cuts + [len(ends)]))
    return [{k: v[lo:hi] for k, v in layouts.items()} for lo, hi in zip(edges[:-1], edges[1:], strict=True)], \
        int(ends[-1])


def _run_jobs(jobs: List[_Job], model: Any, workers: int, scheduler: Optional[str],
              progress: Callable[[int], None]) -> List[_Summary]:
    """Each job's summary, in job order: here, in *workers* processes, or on the Dask cluster at *scheduler*."""
    out: List[Optional[_Summary]] = [None] * len(jobs)
    if scheduler:
        try:
            from distributed import Client, as_completed
        except ImportError:
            raise MissingExtra("--scheduler needs Dask distributed: pip install 'ndcost[dask]'") from None
        with Client(scheduler) as client:
            futures = client.map(_price, jobs, pure=False)
            for future in as_completed(futures):
                summary = future.result()
                out[summary.chunk] = summary
                progress(summary.rows)
    elif workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures import as_completed as completed
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for future in completed([pool.submit(_price, job) for job in jobs]):
                summary = future.result()
                out[summary.chunk] = summary
                progress(summary.rows)
    else:
        for i, job in enumerate(jobs):
            out[i] = _price(job, model)
            progress(out[i].rows)  # type: ignore[union-attr]  # just set
    return [s for s in out if s is not None]


# ---------------------------------------------------------------------------
# progress
# ---------------------------------------------------------------------------
class ProgressBar:
    """A one-line bar on *stream* (stderr), redrawn in place; silent where the stream is not a terminal."""

    def __init__(self, total: int, label: str, stream: Any = None, force: bool = False, width: int = 30):
        self.total, self.label, self.width = max(int(total), 1), label, width
        self.stream = sys.stderr if stream is None else stream
        self.enabled = force or bool(getattr(self.stream, "isatty", lambda: False)())
        self.done = 0
        self.start = time.monotonic()

    def update(self, rows: int) -> None:
        self.done += int(rows)
        if self.enabled:
            share = min(self.done / self.total, 1.0)
            filled = int(share * self.width)
            self.stream.write(f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {share:4.0%} "
                              f"{self.done:,} strategies {time.monotonic() - self.start:.0f} s")
            self.stream.flush()

    def close(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


# ---------------------------------------------------------------------------
# the search
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class SearchSettings:
    """How a search runs (the same for each (devices, hardware) it searches); see :func:`search`."""

    memory_cap_bytes: Optional[int] = None
    top: int = DEFAULT_TOP
    runtime: str = "hf-cuda"
    census: str = "auto"
    workers: int = 1
    scheduler: Optional[str] = None
    tokens: Optional[int] = None
    price_per_gpu_hour: Optional[float] = None
    keep_points: bool = False
    recompute_layer_fractions: Tuple[float, ...] = attrs.field(default=RECOMPUTE_LAYER_FRACTIONS, converter=tuple)
    progress: bool = True
    exhaustive: bool = False
    within_node: bool = True
    # "balanced": a pp * vpp that does not divide the layers is searched too, cut by balanced_split
    pp_splits: str = "even"
    # the registered schedules searched (every one where empty): a trainer's, such as torchtitan's without
    # Megatron-LM's all-to-all overlap
    schedules: Tuple[str, ...] = attrs.field(default=(), converter=lambda v: tuple(v or ()))
    chunk_rows: int = CHUNK_ROWS
    # strategy fields every candidate holds (a trainer's precision recipe, an optimizer): not searched
    held: Mapping[str, Any] = attrs.field(factory=dict, converter=lambda v: held_fields(v))

    def __attrs_post_init__(self):
        for name, example in (("top", "10"), ("workers", "4"), ("chunk_rows", "131072")):
            _positive_int(name, getattr(self, name), example)
        if self.pp_splits not in PP_SPLITS:
            raise InvalidValue(f"pp_splits={self.pp_splits!r}: expected one of {', '.join(PP_SPLITS)} (even: pp * vpp "
                               f"divides the layers; balanced: also torchtitan's split where it does not)")
        known = manager.registry().names("schedule")
        unknown = [name for name in self.schedules if name not in known]
        if unknown:
            raise InvalidValue(f"schedules {', '.join(unknown)}: not registered; the schedules are "
                               f"{', '.join(known)} (`ndcost list schedules`)")
        if self.tokens is not None:
            _positive_int("tokens", self.tokens, "1000000000000")
        if self.memory_cap_bytes is not None:
            _positive_int("memory_cap_bytes", self.memory_cap_bytes, str(80 * GIB))
        if self.price_per_gpu_hour is not None:
            if self.tokens is None:
                raise InvalidValue(f"a price a GPU-hour ({self.price_per_gpu_hour}) prices the tokens to train: "
                                   f"give tokens too (--tokens T)")
            if not self.price_per_gpu_hour >= 0:
                raise InvalidValue(f"price a GPU-hour {self.price_per_gpu_hour!r}: must be 0 or more US dollars")
        if any(not 0.0 < f < 1.0 for f in self.recompute_layer_fractions):
            raise InvalidValue(f"recompute_layer_fractions {self.recompute_layer_fractions}: each must lie "
                               f"strictly between 0 and 1")


def search(model: Any, *, devices: int, hardware: Any = "h200", global_batch: int, seq: int,
           **settings: Any) -> SearchResult:
    """The strategies for exactly *devices* devices of *hardware* that run and fit, fastest first.

    *model* is a name, path or ModelSpec (``resolve`` reads it) or a resolved CostModel (with
    ``workers`` or ``scheduler``: a name or path, which each worker resolves). *global_batch* is in
    sequences of *seq* tokens. *settings* are :class:`SearchSettings`' fields: ``memory_cap_bytes``
    (default the hardware's usable memory), ``top``, ``workers``, ``scheduler`` (a Dask address),
    ``tokens`` and ``price_per_gpu_hour``, ``keep_points`` (for :func:`plot_search`), ``exhaustive``
    (no micro-batch bound), ``within_node`` (tp and etp within a node), ... Raises NoValidStrategy
    where nothing runs and fits, naming what removed the last candidates.
    """
    return search_grid(model, devices=[devices], hardware=[hardware], global_batch=global_batch, seq=seq,
                       **settings)[0]


def search_grid(model: Any, *, devices: Iterable[int], hardware: Iterable[Any], global_batch: int, seq: int,
                **settings: Any) -> Tuple[SearchResult, ...]:
    """:func:`search` over every (devices, hardware) combination, in the order given (devices outer)."""
    unknown = sorted(set(settings) - {a.name for a in attrs.fields(SearchSettings)})
    if unknown:
        raise InvalidValue(f"search: unknown setting(s) {', '.join(unknown)}; settings: "
                           f"{', '.join(a.name for a in attrs.fields(SearchSettings))}")
    options = SearchSettings(**settings)
    devices = [_positive_int("devices", d, "8") for d in devices]
    hardware = list(hardware)
    if not devices or not hardware:
        raise InvalidValue("a search needs at least one device count and one hardware, for example devices=[8], "
                           "hardware=['h200']")
    global_batch = _positive_int("global_batch", global_batch, "1024")
    seq = _positive_int("seq", seq, "4096")
    hardware_specs = [_hardware_of(h) for h in hardware]

    from ndcost.resolver import CostModel, resolve
    if isinstance(model, CostModel):
        cost_model, reference = model, None
    else:
        cost_model = resolve(model, runtime=options.runtime, hardware=hardware_specs[0], census=options.census)
        reference = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
        if reference is not None:  # this process's jobs (and forked workers') reuse it rather than resolve again
            _MODELS[(reference, options.runtime, options.census)] = cost_model
    if (options.workers > 1 or options.scheduler) and reference is None:
        raise InvalidValue("workers and a Dask scheduler resolve the model themselves: give it by name or path "
                           f"(for example 'llama-3.1-8b'), not a {type(model).__name__}")
    return tuple(_search_one(_holding(cost_model, options.held), reference, n, hw_name, hw, global_batch, seq, options)
                 for n in devices for hw_name, hw in zip(hardware, hardware_specs, strict=True))


def _search_one(model, reference, devices: int, hw_name: Any, hw, global_batch: int, seq: int,
                options: SearchSettings) -> SearchResult:
    cap = options.memory_cap_bytes or int(hw.usable_memory_bytes)
    if cap > int(hw.usable_memory_bytes):
        warnings.warn(f"memory cap {cap / GIB:.1f} GiB is above what a {hw.name} can use ("
                      f"{int(hw.usable_memory_bytes) / GIB:.1f} GiB: its memory less the CUDA context): strategies "
                      f"listed as fitting may not run on it", stacklevel=3)
    pruning: List[Pruning] = []
    where = f"{model.spec.name} on {devices} {hw.name}"
    layouts, inner = _space(model, hw, devices, global_batch, seq, options.recompute_layer_fractions, pruning,
                            options.within_node, options.pp_splits, options.schedules)
    min_bound = -1
    if layouts:
        ok, reason, bound = _layout_bounds(model, hw, layouts, inner, seq)
        if not ok.all():
            text, counts = np.unique(reason[~ok].astype(str), return_counts=True)
            first = int(np.argmax(counts))
            pruning.append(Pruning(step="layout", removed=int((~ok).sum()), of="layouts", reason=str(text[first])))
        over = ok & (bound > cap)
        if over.any():
            min_bound = int(bound[over].min())
            pruning.append(Pruning(step="memory bound", removed=int(over.sum()), of="layouts",
                                   reason=f"parameters, master copy and optimizer states alone exceed "
                                          f"{cap / GIB:.1f} GiB (the least needs {min_bound / GIB:.1f} GiB)"))
        layouts = _keep(layouts, ok & ~over)
    summaries: List[_Summary] = []
    if layouts and len(layouts["dp"]):
        chunks, total = _chunks(layouts, inner, options.chunk_rows)
        jobs = [_Job(chunk=i, model=reference, runtime=options.runtime, census=options.census,
                     hardware=hw_name if isinstance(hw_name, str) else hw.name, layouts=c, inner=inner, seq=seq,
                     cap_bytes=cap, top=options.top, keep_points=options.keep_points,
                     exhaustive=options.exhaustive, held=dict(options.held)) for i, c in enumerate(chunks)]
        bar = ProgressBar(total, f"search {where}") if options.progress else None
        try:
            summaries = _run_jobs(jobs, model, options.workers, options.scheduler,
                                  bar.update if bar else (lambda rows: None))
        finally:
            if bar:
                bar.close()
    priced = sum(s.rows - s.skipped for s in summaries)
    skipped = sum(s.skipped for s in summaries)
    if skipped:
        pruning.append(Pruning(step="micro-batch bound", removed=skipped, of="strategies",
                               reason="a larger micro_batch of a strategy that does not fit (the peak does not fall "
                                      "as micro_batch rises)"))
    valid = sum(s.valid for s in summaries)
    fitting = sum(s.fitting for s in summaries)
    reasons: Dict[str, int] = {}
    for s in summaries:
        for message, count in s.reasons:
            reasons[message] = reasons.get(message, 0) + count
    if reasons:
        worst = max(reasons, key=lambda k: reasons[k])
        pruning.append(Pruning(step="evaluation", removed=priced - valid, of="strategies", reason=worst))
    peaks = [s.min_peak_bytes for s in summaries if s.min_peak_bytes >= 0]
    if valid > fitting:
        pruning.append(Pruning(step="memory", removed=valid - fitting, of="strategies",
                               reason=f"reserved bytes (or the allocated peak where reserved is not claimed) "
                                      f"above the cap of {cap / GIB:.1f} GiB"))
    if not fitting:
        raise NoValidStrategy(_nothing_message(where, global_batch, seq, cap, pruning, peaks, min_bound))
    candidates = _exposed_by_group(model, hw, _merge(summaries, options.top, devices, hw.name, options.tokens,
                                                     options.price_per_gpu_hour, options.held))
    points = None
    if options.keep_points:
        parts = [s.points for s in summaries if s.points is not None]
        points = SearchPoints(peak_gib=np.concatenate([p[0] for p in parts]),
                              step_seconds=np.concatenate([p[1] for p in parts]),
                              fits=np.concatenate([p[2] for p in parts]))
    return SearchResult(model=model.spec.name, devices=devices, hardware=hw.name, global_batch=global_batch,
                        seq=seq, memory_cap_bytes=cap, candidates=candidates, priced=priced, valid=valid,
                        fitting=fitting, pruning=tuple(pruning), points=points, tokens=options.tokens)


def _exposed_by_group(model: Any, hardware: Any, candidates: Tuple[Candidate, ...]) -> Tuple[Candidate, ...]:
    """*candidates* with their exposed communication by group, priced again as one batch (the chunks keep
    the step's figures alone)."""
    from ndcost.values import EXPOSED_GROUPS

    if not candidates:
        return candidates
    time = model.evaluate_many([c.strategy for c in candidates], hardware=hardware).time
    return tuple(attrs.evolve(c, exposed_by_group={g: float(time[f"exposed_{g}_seconds"][i]) for g in EXPOSED_GROUPS})
                 for i, c in enumerate(candidates))


def _nothing_message(where, global_batch, seq, cap, pruning: List[Pruning], peaks, min_bound) -> str:
    parts = [f"{p.step}: {p.reason} ({p.removed:,} {p.of})" for p in pruning if p.step not in ("memory bound",
                                                                                                "memory")]
    if peaks:
        parts.append(f"nothing fits in {cap / GIB:.1f} GiB: the smallest priced needs {min(peaks) / GIB:.1f} GiB")
    elif min_bound >= 0:
        parts.append(f"nothing fits in {cap / GIB:.1f} GiB: the smallest needs at least {min_bound / GIB:.1f} GiB "
                     f"for its parameters, master copy and optimizer states")
    return (f"no strategy for {where} with a global batch of {global_batch} sequences of {seq} tokens runs and "
            f"fits: " + "; ".join(parts) + "; change the devices, the batch or the memory cap")


# held fields that act only where a strategy has what they act on: a candidate they leave unchanged is written
# without them (its figures are the same; values.py's field docs say where each acts)
_HELD_ACTS_WHERE = {"cp_rotate": lambda f: f["cp"] > 1, "ep_dispatcher": lambda f: f["ep"] > 1,
                    "pp_return_outputs": lambda f: f["pp"] > 1 and f["pp_engine"] == "torch"}
# DeepSpeed's ZeRO fields, which a strategy refuses where its stage does not run them (the reduce bucket at ZeRO
# 1-3, the reuse distance and the live bound at ZeRO-3, none under PP): held only where it does, so a trainer's
# defaults (search --emit deepspeed) price every stage; written per candidate as _HELD_ACTS_WHERE's
def _field(fields: Mapping[str, Any], name: str) -> np.ndarray:
    """A field's column (or value) among *fields*, its default where they leave it out."""
    return np.asarray(fields.get(name, _DEFAULTS[name]))


def _runs_at(stages: Tuple[int, ...]) -> Callable[[Mapping[str, Any]], Any]:
    return lambda fields: np.isin(_field(fields, "zero"), stages) & (_field(fields, "pp") == 1)


_HELD_ZERO_FIELDS = {name: _runs_at(stages) for name, stages in ZERO_FIELD_STAGES.items()}
_HELD_ZERO_FIELDS["reduce_buckets"] = _HELD_ZERO_FIELDS["reduce_bucket_elements"]


def _acts_at_its_stage(rule: Callable[[Mapping[str, Any]], Any]) -> Callable[[Mapping[str, Any]], bool]:
    return lambda fields: bool(rule(fields))


_HELD_ACTS_WHERE.update({name: _acts_at_its_stage(rule) for name, rule in _HELD_ZERO_FIELDS.items()})
_DEFAULTS = Strategy().to_dict()


def training_cost(tokens: Optional[float], tokens_per_second: float, devices: int,
                  price_per_gpu_hour: Optional[float]) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """(seconds, GPU-hours, USD) to train *tokens* at *tokens_per_second* on *devices*, each None where not
    asked (no *tokens*; no price for the cost)."""
    if tokens is None:
        return None, None, None
    seconds = tokens / tokens_per_second
    gpu_hours = seconds * devices / 3600.0
    return seconds, gpu_hours, None if price_per_gpu_hour is None else gpu_hours * price_per_gpu_hour


def _one_change(strategy: Strategy) -> List[Strategy]:
    """The strategies one change from *strategy* that may hold less a device, on its devices and its tokens a step:
    another recompute mode (over every layer), a higher ZeRO stage, FSDP over the data-parallel ranks, SP and the
    vocabulary split where TP runs, half the micro-batch in twice the micro-batches, twice the TP, PP or CP ranks
    taken from the data-parallel ones (their micro-batches doubled to keep the batch), the activations or the
    optimizer offloaded, torch DDP's gradients as views of its buckets; DeepSpeed's one reduce bucket
    (``overlap_comm`` off), half of it, ZeRO-3 releasing every module after its use (no reuse distance, no
    prefetching) and stepping half the sub-group at a time; a foreach optimizer's fused twin (the built-ins'
    ``*_foreach``, whose step makes a state-sized temporary). Some may not run on a model (``evaluate_many`` says
    which)."""
    s = strategy
    changes: List[Dict[str, Any]] = [{"recompute": mode, "recompute_layers": None}
                                     for mode in ("selective", "core_attention", "full") if mode != s.recompute]
    if s.fsdp == 1:
        # ZeRO-3 holds one reduce bucket whatever overlap_comm says; FSDP none
        changes += [{"zero": stage, **({"reduce_buckets": 1} if stage == 3 else {})}
                    for stage in range(s.zero + 1, 4)]
        changes += [{"fsdp": s.dp, "dp": 1, "zero": 0, "reduce_bucket_elements": 0, "reduce_buckets": 1,
                     "reuse_distance_elements": 0, "live_parameters_elements": 0,
                     "sub_group_elements": 0}] if s.dp > 1 else []
    if s.tp > 1:
        changes += [{"sp": True}] if not s.sp else []
        changes += [{"vocab_parallel": True}] if not s.vocab_parallel else []
    if s.micro_batch % 2 == 0:
        changes.append({"micro_batch": s.micro_batch // 2, "num_micro_batches": 2 * s.num_micro_batches})
    ranks = "dp" if s.dp % 2 == 0 else "fsdp" if s.fsdp % 2 == 0 else None
    if ranks is not None:  # half the data-parallel ranks, each running twice the micro-batches
        fewer = {ranks: getattr(s, ranks) // 2, "num_micro_batches": 2 * s.num_micro_batches}
        changes += [{"tp": 2 * s.tp, **fewer}, {"pp": 2 * s.pp, "pp_layers": None, **fewer},
                    {"cp": 2 * s.cp, **fewer}]
    changes += [{"offload_activations": True}] if not s.offload_activations else []
    changes += [{"offload_optimizer": True}] if not s.offload_optimizer else []
    if s.ddp_engine in DDP_BUCKET_ENGINES and sharding_rules.runs_ddp(s):
        changes.append({"ddp_engine": "torch_bucket_view"})
    changes += [{"reduce_buckets": 1}] if s.reduce_buckets > 1 else []
    changes += [{"reduce_bucket_elements": s.reduce_bucket_elements // 2}] if s.reduce_bucket_elements > 1 else []
    changes += [{"reuse_distance_elements": 0}] if s.reuse_distance_elements else []
    changes += [{"live_parameters_elements": 0}] if s.live_parameters_elements else []
    changes += [{"sub_group_elements": s.sub_group_elements // 2}] if s.sub_group_elements > 1 else []
    changes += [{"optimizer": s.optimizer.removesuffix("_foreach")}] if s.optimizer.endswith("_foreach") else []
    out = []
    for change in changes:
        try:
            out.append(attrs.evolve(s, **change))
        except InvalidValue:  # a combination no strategy holds (Strategy says why; nothing to suggest)
            continue
    return out


def one_change_fits(model: Any, strategy: Strategy, *, hardware: Any = None,
                    top: int = 3) -> Tuple[Tuple[str, Candidate], ...]:
    """Up to *top* strategies one change from *strategy* (:func:`_one_change`) that run and fit where it may not,
    fastest first (the lower peak first among equal steps), each with its change as ``field=value,...``: what a
    planner whose strategy does not fit tries next, before a search. None (an empty tuple) where the model prices
    no step time (nothing to rank them by)."""
    alternatives = _one_change(strategy)
    if not alternatives:
        return ()
    hw = model.hardware if hardware is None else _hardware_of(hardware)
    result = model.evaluate_many(alternatives, hardware=hw)
    rows = np.flatnonzero(result.fits)
    if result.time is None or not len(rows):
        return ()
    step = result.time["step_seconds"]
    rows = rows[np.lexsort((result.peak_bytes[rows], step[rows]))][:top]
    reserved = result.reserved_bytes
    return tuple((alternatives[i].differences(strategy), Candidate(
        strategy=alternatives[i], devices=alternatives[i].devices, hardware=hw.name,
        peak_bytes=int(result.peak_bytes[i]), step_seconds=float(step[i]),
        tokens_per_second=float(result.time["tokens_per_second"][i]), mfu=float(result.time["mfu"][i]),
        reserved_bytes=None if reserved is None or reserved[i] < 0 else int(reserved[i])))
        for i in rows.tolist())


def _merge(summaries: List[_Summary], top: int, devices: int, hardware: str, tokens, price,
           held: Mapping[str, Any]) -> Tuple[Candidate, ...]:
    """The best *top* over every chunk, ordered as one process orders them (step, peak, chunk, row)."""
    parts = [s for s in summaries if len(s.top["_row"])]
    cols = {k: np.concatenate([s.top[k] for s in parts]) for k in parts[0].top}
    chunk = np.concatenate([np.full(len(s.top["_row"]), s.chunk) for s in parts])
    order = np.lexsort((cols["_row"], chunk, cols["peak_bytes"], cols["step_seconds"]))[:top]
    out = []
    for i in order.tolist():
        fields = {k: _item(cols[k][i]) for k in _STRATEGY_COLUMNS + ("seq",)}
        if np.isnan(fields["recompute_layers"]):
            fields["recompute_layers"] = None
        else:
            fields["recompute_layers"] = int(fields["recompute_layers"])
        tps = float(cols["tokens_per_second"][i])
        train, gpu_hours, cost = training_cost(tokens, tps, devices, price)
        acting = {k: v for k, v in held.items() if k not in _HELD_ACTS_WHERE or _HELD_ACTS_WHERE[k](fields)}
        out.append(Candidate(strategy=Strategy(**fields, **acting), devices=devices, hardware=hardware,
                             peak_bytes=int(cols["peak_bytes"][i]), step_seconds=float(cols["step_seconds"][i]),
                             reserved_bytes=int(cols["reserved_bytes"][i]) if cols["reserved_bytes"][i] >= 0 else None,
                             tokens_per_second=tps, mfu=float(cols["mfu"][i]), train_seconds=train,
                             gpu_hours=gpu_hours, cost_usd=cost))
    return tuple(out)


# ---------------------------------------------------------------------------
# the plot
# ---------------------------------------------------------------------------
def pareto_front(peak: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Indices of the points no other beats on both peak and step (lower is better), by rising peak."""
    order = np.lexsort((step, peak))
    best_so_far = np.minimum.accumulate(step[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = step[order][1:] < best_so_far[:-1]
    return order[keep]


def plot_search(results: Sequence[SearchResult], path: Any) -> None:
    """A PNG at *path*: step seconds against peak GiB a device for every valid strategy of each search,
    the Pareto front of those that fit marked and the chosen (fastest fitting) strategy labelled."""
    from ndcost.plots import pyplot, save

    plt = pyplot()
    n = len(results)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 4.8 * rows), squeeze=False)
    for ax, result in zip(axes.flat, results, strict=False):
        if result.points is None:
            raise InvalidValue("plot_search needs the points of every strategy: search with keep_points=True")
        p = result.points
        ax.scatter(p.peak_gib[~p.fits], p.step_seconds[~p.fits], s=2, c="0.8", rasterized=True,
                   label="does not fit")
        ax.scatter(p.peak_gib[p.fits], p.step_seconds[p.fits], s=2, c="tab:blue", rasterized=True, label="fits")
        fitting = np.flatnonzero(p.fits)
        front = fitting[pareto_front(p.peak_gib[fitting], p.step_seconds[fitting])]
        ax.plot(p.peak_gib[front], p.step_seconds[front], "-o", c="tab:red", ms=3, lw=1, label="Pareto front")
        ax.axvline(result.memory_cap_bytes / GIB, c="k", ls="--", lw=0.8, label="memory cap")
        best = result.best
        ax.scatter([best.peak_bytes / GIB], [best.step_seconds], marker="*", s=120, c="gold", edgecolors="k",
                   zorder=5, label="chosen")
        label = str(best.strategy).replace(f",seq={result.seq}", "").replace(f"seq={result.seq},", "")
        ax.annotate("\n".join(wrap_strategy(label, 40)), (best.peak_bytes / GIB, best.step_seconds), xytext=(10, 10),
                    textcoords="offset points", fontsize=7, bbox={"boxstyle": "round", "fc": "w", "alpha": 0.8})
        ax.set_yscale("log")
        ax.set_xlabel("peak memory per device (GiB, allocated)")
        ax.set_ylabel("step time (s)")
        ax.set_title(f"{result.model}, {result.devices} x {result.hardware}, batch {result.global_batch} x "
                     f"{result.seq}", fontsize=9)
        legend = ax.legend(fontsize=7, loc="upper right")
        for handle in legend.legend_handles:  # the scatter's 2-point dots and the star at one legible size
            if hasattr(handle, "set_sizes"):
                handle.set_sizes([24])
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.tight_layout()
    save(fig, path, dpi=110)


def wrap_strategy(text: str, width: int) -> List[str]:
    """A ``k=v,...`` strategy cut into lines of at most *width* characters, at its commas."""
    lines, line = [], ""
    for item in text.split(","):
        if line and len(line) + len(item) + 1 > width:
            lines.append(line + ",")
            line = item
        else:
            line = f"{line},{item}" if line else item
    return lines + [line]
