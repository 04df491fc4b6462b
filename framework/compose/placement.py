"""Where each layer runs: one placement of the stack onto pipeline ranks, read by memory and time.

The stack is cut into ``pp * vpp`` virtual stages, as ``pp_layers`` states
or as evenly as integers allow (``j * L // (pp * vpp)`` layers before stage
``j``: earlier stages one layer fewer where the layers do not divide, a case
the resolver refuses without ``pp_layers``). The registered
``schedule/<name>``'s ``virtual_stage`` says which virtual stage each rank's
chunk is (``plugins/schedules.py``). The first virtual stage holds the
embedding; the last the final norm, the head and the MTP layers. A chunk
recomputes its first ``recompute_layers`` layers (all where unset).
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.values import RECOMPUTE

__all__ = ["LayerStack", "Placement", "RankPlacement", "balanced_split", "place", "split_bounds", "weighted_split"]


@attrs.frozen(kw_only=True, eq=False)
class LayerStack:
    """A stack of layers as runs of consecutive same-kind layers: how many of each kind lie before any layer.

    Built from the runs (never one entry a layer), so a query costs a binary
    search over the runs, whatever the number of layers.
    """

    kinds: Tuple[str, ...]
    run_ends: np.ndarray     # (G + 1,) int64: layers before each run, then the total
    run_kind: np.ndarray     # (G,) int64: each run's kind
    run_prefix: np.ndarray   # (K, G + 1) int64: layers of each kind before each run

    @classmethod
    def from_runs(cls, kinds: Sequence[str], runs: Sequence[Tuple[str, int]]) -> "LayerStack":
        """From ``(kind, count)`` runs in stack order (a kind may come back in later runs)."""
        index = {kind: i for i, kind in enumerate(kinds)}
        run_kind = np.array([index[kind] for kind, _ in runs], dtype=np.int64)
        counts = np.array([count for _, count in runs], dtype=np.int64)
        run_ends = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        prefix = np.zeros((len(kinds), len(runs) + 1), dtype=np.int64)
        for i in range(len(kinds)):  # a loop over kinds, once per model
            prefix[i, 1:] = np.cumsum(np.where(run_kind == i, counts, 0))
        return cls(kinds=tuple(kinds), run_ends=run_ends, run_kind=run_kind, run_prefix=prefix)

    @property
    def num_layers(self) -> int:
        return int(self.run_ends[-1])

    @property
    def counts(self) -> np.ndarray:
        """(K,) int64: the stack's layers of each kind."""
        return self.run_prefix[:, -1]

    def before(self, n: np.ndarray) -> np.ndarray:
        """``(K,) + n.shape`` int64: layers of each kind among the first *n* (0 <= n <= the stack's layers)."""
        n = np.asarray(n, dtype=np.int64)
        kind = np.arange(len(self.kinds)).reshape((-1,) + (1,) * n.ndim)
        if len(self.run_kind) == 0:  # no layer outside the MTP ones
            return np.zeros((len(self.kinds),) + n.shape, dtype=np.int64)
        if len(self.run_kind) == 1:  # one run (a plain decoder stack): the layers of its kind, none of the others
            return np.where(kind == self.run_kind[0], n[None], 0)
        run = np.minimum(np.searchsorted(self.run_ends, n, side="right") - 1, len(self.run_kind) - 1)
        return self.run_prefix[:, run] + np.where(kind == self.run_kind[run][None], (n - self.run_ends[run])[None], 0)

    def kind_at(self, n: np.ndarray) -> np.ndarray:
        """``n.shape`` int64: the kind of layer *n* (0-based; past the stack the last run's, 0 without a run)."""
        n = np.asarray(n, dtype=np.int64)
        if len(self.run_kind) <= 1:  # one run (a plain decoder stack) or none: no search
            return np.full(n.shape, self.run_kind[0] if len(self.run_kind) else 0, dtype=np.int64)
        run = np.clip(np.searchsorted(self.run_ends, n, side="right") - 1, 0, len(self.run_kind) - 1)
        return self.run_kind[run]


def weighted_split(layers: int, stages: int, first: int = 1, last: int = 1) -> Optional[Tuple[int, ...]]:
    """Layers of each stage as torchtitan's ``generate_llm_fqn_per_model_part`` assigns them, or None.

    The embedding counts as *first* layers and the head as *last*
    (torchtitan/distributed/pipeline_parallel.py): ``L + first + last``
    spread evenly, the earlier stages one more where they do not divide,
    the first and last stages that much lighter. None where a stage would
    be empty or the weights exceed a stage's share.
    """
    if stages < 1:
        return None
    each, extra = divmod(layers + first + last, stages)
    if each == 0 or first > each or last > each:
        return None
    split, placed = [], 0
    for stage in range(stages):  # a loop over stages, once per split
        share = each + (1 if stage < extra else 0) - (first if stage == 0 else last if stage == stages - 1 else 0)
        split.append(max(0, min(share, layers - placed)))
        placed += split[-1]
    return tuple(split) if placed == layers and 0 not in split else None


def balanced_split(layers: int, stages: int) -> Optional[Tuple[int, ...]]:
    """The split ndcost proposes where ``stages`` does not divide ``layers``: torchtitan's with the
    embedding and the head one layer each (:func:`weighted_split`), else without them; None where
    there are more stages than layers."""
    return weighted_split(layers, stages, 1, 1) or weighted_split(layers, stages, 0, 0)


def split_bounds(splits: Sequence[Optional[Sequence[int]]]) -> Optional[np.ndarray]:
    """Each row's ``pp_layers`` as cumulative stage bounds ``(N, W)``, ``-1`` past them and on rows without one.

    None where no row states a split (the common case pays nothing).
    """
    if all(split is None for split in splits):
        return None
    distinct: Dict[Any, int] = {}
    index = np.array([distinct.setdefault(None if split is None else tuple(split), len(distinct))
                      for split in splits], dtype=np.int64)  # a dict lookup a row; the bounds once a split
    width = max(len(split) for split in distinct if split is not None) + 1
    table = np.full((len(distinct), width), -1, dtype=np.int64)
    for split, row in distinct.items():
        if split is not None:
            table[row, :len(split) + 1] = np.concatenate([[0], np.cumsum(split)])
    return table[index]


@attrs.frozen(kw_only=True, eq=False)
class Placement:
    """Each (row, rank, chunk)'s virtual stage and layers; ``K`` leads the per-kind arrays."""

    virtual_stage: np.ndarray  # (N, R, V) int64 (0 where the chunk does not exist)
    exists: np.ndarray         # (N, R, V) bool: rank < pp and chunk < vpp
    stack_layers: np.ndarray   # (K, N, R, V) int64: the stack's layers of each kind (no MTP)
    layers: np.ndarray         # (K, N, R, V) int64: with the MTP layers on the head's chunk
    recomputed: np.ndarray     # (K, N, R, V) int64: of the stack's layers, those the chunk recomputes
    first: np.ndarray          # (N, R, V) bool: the chunk is the first virtual stage (the embedding)
    last: np.ndarray           # (N, R, V) bool: the chunk is the last virtual stage (final norm, head, MTP)
    first_kind: np.ndarray     # (N, R, V) int64: the kind of the chunk's first layer (its received input's reader)

    @functools.cached_property
    def has_embedding(self) -> np.ndarray:
        """(N, R) bool: the rank holds the embedding (made once, read-only: memory and time read it often)."""
        return read_only(self.first.any(axis=2))

    @functools.cached_property
    def has_head(self) -> np.ndarray:
        """(N, R) bool: the rank holds the final norm and the head (made once, read-only)."""
        return read_only(self.last.any(axis=2))

    @functools.cached_property
    def head_everywhere(self) -> bool:
        """Every rank holds the head (one stage: a step skips its choice by rank)."""
        return bool(np.logical_and.reduce(self.has_head, axis=None))

    @functools.cached_property
    def embedding_everywhere(self) -> bool:
        """Every rank holds the embedding."""
        return bool(np.logical_and.reduce(self.has_embedding, axis=None))

    @functools.cached_property
    def rank_kind_layers(self) -> np.ndarray:
        """(K, N, R) int64: each rank's layers of each kind over its chunks, MTP ones with the head (read-only)."""
        return read_only(self.layers.sum(axis=3))

    @functools.cached_property
    def plain(self) -> np.ndarray:
        """(K, N, R, V) int64: each chunk's layers that do not recompute (read-only)."""
        return read_only(self.layers - self.recomputed)

    @functools.cached_property
    def rank_kind_split(self) -> np.ndarray:
        """(K, 2, N, R) int64: each rank's layers of each kind over its chunks that do not recompute, then those
        that do (read-only)."""
        return read_only(np.concatenate((self.plain.sum(axis=3)[:, None], self.recomputed.sum(axis=3)[:, None]),
                                         axis=1))

    @functools.cached_property
    def holds_kind(self) -> np.ndarray:
        """(K, N, R) bool: the rank holds a layer of the kind, MTP ones with the head (read-only)."""
        return read_only(self.rank_kind_layers > 0)

    @functools.cached_property
    def holds_split(self) -> np.ndarray:
        """(K, 2, N, R) bool: the rank holds a layer of the kind that does not recompute, one that does (read-only)."""
        return read_only(self.rank_kind_split > 0)

    @functools.cached_property
    def held_splits(self) -> Tuple[Tuple[int, int], ...]:
        """The ``(kind, 0 plain or 1 recomputed)`` pairs of :attr:`holds_split` some row's rank holds, in order:
        a step looping over the kinds skips those none holds (a plain stack has one kind, unrecomputed)."""
        held = np.logical_or.reduce(self.holds_split.reshape(self.holds_split.shape[:2] + (-1,)), axis=2)
        kinds, splits = np.nonzero(held)
        return tuple(zip(kinds.tolist(), splits.tolist(), strict=True))

    @functools.cached_property
    def recomputes(self) -> bool:
        """Some chunk recomputes a layer."""
        return bool(np.count_nonzero(self.recomputed))

    @property
    def head_rank(self) -> np.ndarray:
        """(N,) int64: the rank holding the head."""
        return np.argmax(self.has_head, axis=1)

    def rank_layers(self, with_mtp: bool = True) -> np.ndarray:
        """(N, R, K) int64: each rank's layers of each kind over its chunks."""
        return (self.layers if with_mtp else self.stack_layers).sum(axis=3).transpose(1, 2, 0)


@attrs.frozen(kw_only=True, eq=False)
class RankPlacement:
    """What the time model reads of a placement: each rank's layers of each kind, and its embedding and head."""

    layers: np.ndarray         # (N, R, K) int64, the MTP layers on the head's rank
    has_embedding: np.ndarray  # (N, R) bool
    has_head: np.ndarray       # (N, R) bool

    @classmethod
    def of(cls, placement: Placement) -> "RankPlacement":
        return cls(layers=placement.rank_layers(), has_embedding=placement.has_embedding,
                   has_head=placement.has_head)

    @classmethod
    def from_stages(cls, stack_layers: np.ndarray, embedding_stage: np.ndarray, head_stage: np.ndarray,
                    mtp_counts: np.ndarray) -> "RankPlacement":
        """From a placement already made (the memory composition's, as a BatchResult carries it):
        *stack_layers* ``(N, R, K)`` without MTP, the ranks holding the embedding and the head."""
        ranks = np.arange(stack_layers.shape[1])[None, :]
        has_head = ranks == np.asarray(head_stage)[:, None]
        layers = stack_layers + has_head[:, :, None] * np.asarray(mtp_counts, dtype=np.int64)[None, None, :]
        return cls(layers=layers, has_embedding=ranks == np.asarray(embedding_stage)[:, None], has_head=has_head)


def read_only(array: Any) -> np.ndarray:
    """*array* as a numpy array no one can write (what the one-strategy caches hand out)."""
    out = np.asarray(array)
    out.setflags(write=False)
    return out


def _virtual_stages(cols: Mapping[str, Any], schedules: Sequence[Any], ranks: int, chunks: int):
    """(N, R, V) virtual stage of each rank's chunk, by each row's schedule (a loop over schedules)."""
    pp, vpp = cols["pp"].astype(np.int64), cols["vpp"].astype(np.int64)
    n = len(pp)
    rank = np.arange(ranks)[None, :, None]
    chunk = np.arange(chunks)[None, None, :]
    pp3, vpp3 = pp[:, None, None], vpp[:, None, None]
    exists = (rank < pp3) & (chunk < vpp3)
    stage = np.zeros((n, ranks, chunks), dtype=np.int64)
    for code, schedule in enumerate(schedules):
        rows = cols["schedule"] == code
        if rows.any():
            found = np.asarray(schedule.virtual_stage(pp3, vpp3, rank, chunk), dtype=np.int64)
            stage = np.where(rows[:, None, None], found, stage)
    stage = np.where(exists, np.clip(stage, 0, (pp * vpp - 1)[:, None, None]), 0)
    return stage, exists


ONE_ROW_KEPT = 1024  # one-row placements kept (by pipeline layout); the cache is emptied when full
_ONE_ROW: Dict[Tuple[Any, ...], Tuple[LayerStack, Sequence[Any], "Placement"]] = {}


def place(stack: LayerStack, cols: Mapping[str, Any], schedules: Sequence[Any],
          mtp_counts: Optional[np.ndarray] = None, pp_bounds: Optional[np.ndarray] = None) -> Placement:
    """Place a batch's stacks: *stack* the model's :class:`LayerStack`, *cols* the strategy columns.

    *schedules* are the schedule plugins by code (``cols["schedule"]``);
    *mtp_counts* ``(K,)`` the MTP layers of each kind placed with the head;
    *pp_bounds* the rows' explicit splits (:func:`split_bounds`), or None.
    A batch of one strategy (``CostModel.evaluate``) is placed once per pipeline layout (the few fields a
    placement reads) and stack, its arrays read-only.
    """
    if len(cols["pp"]) != 1:
        return _place(stack, cols, schedules, mtp_counts, pp_bounds)
    none = int(cols["recompute"][0]) == RECOMPUTE.index("none")
    # every field _place reads is in the key: a field it comes to read must be added here too
    key = (id(stack), id(schedules), int(cols["pp"][0]), int(cols["vpp"][0]), int(cols["schedule"][0]), none,
           None if none else int(cols["recompute_layers"][0]),
           None if pp_bounds is None else tuple(pp_bounds[0].tolist()),
           None if mtp_counts is None else tuple(np.asarray(mtp_counts).tolist()))
    hit = _ONE_ROW.get(key)
    if hit is not None and hit[0] is stack and hit[1] is schedules:
        return hit[2]
    placed = _place(stack, cols, schedules, mtp_counts, pp_bounds)
    for field in attrs.fields(Placement):
        getattr(placed, field.name).setflags(write=False)
    if len(_ONE_ROW) >= ONE_ROW_KEPT:
        _ONE_ROW.clear()
    _ONE_ROW[key] = (stack, schedules, placed)
    return placed


def _place(stack: LayerStack, cols: Mapping[str, Any], schedules: Sequence[Any],
           mtp_counts: Optional[np.ndarray], pp_bounds: Optional[np.ndarray]) -> Placement:
    pp, vpp = cols["pp"].astype(np.int64), cols["vpp"].astype(np.int64)
    n, num_layers = len(pp), stack.num_layers
    stages = pp * vpp
    vstage, exists = _virtual_stages(cols, schedules, int(pp.max()), int(vpp.max()))
    bounds = np.minimum(np.arange(int(stages.max()) + 1)[None, :], stages[:, None]) * num_layers // stages[:, None]
    if pp_bounds is not None:  # rows with an explicit split: cumulative bounds, -1 elsewhere
        given = np.full(bounds.shape, -1, dtype=np.int64)
        width = min(pp_bounds.shape[1], bounds.shape[1])
        given[:, :width] = pp_bounds[:, :width]
        bounds = np.where(given[:, :1] >= 0, np.where(given >= 0, given, num_layers), bounds)
    start = np.take_along_axis(bounds, vstage.reshape(n, -1), axis=1).reshape(vstage.shape)
    end = np.take_along_axis(bounds, (vstage + 1).reshape(n, -1), axis=1).reshape(vstage.shape)
    start, end = np.where(exists, start, 0), np.where(exists, end, 0)
    recompute_layers = np.where(cols["recompute"] == RECOMPUTE.index("none"), 0,
                                np.where(cols["recompute_layers"] < 0, num_layers, cols["recompute_layers"]))
    recompute_end = start + np.minimum(recompute_layers[:, None, None], end - start)
    first = exists & (vstage == 0)
    last = exists & (vstage == (stages - 1)[:, None, None])
    before_start = stack.before(start)
    stack_layers = stack.before(end) - before_start
    layers = stack_layers
    if mtp_counts is not None and np.any(mtp_counts):
        layers = stack_layers + np.where(last[None], np.asarray(mtp_counts, dtype=np.int64)[:, None, None, None], 0)
    return Placement(virtual_stage=vstage, exists=exists, stack_layers=stack_layers, layers=layers,
                     recomputed=stack.before(recompute_end) - before_start, first=first, last=last,
                     first_kind=stack.kind_at(start))
