"""Pipeline schedules: which rank holds each virtual stage, and how many micro-batches' activations it keeps.

A schedule is a plugin registered as ``schedule/<name>``: an object with the
methods of :class:`Schedule`, each vectorized over a batch of strategies
(numpy arrays that broadcast: ``pp``, ``vpp`` and ``m`` shaped like the
batch, ``rank`` and ``chunk`` with trailing axes). A layout a schedule does
not model (virtual stages under plain 1F1B, DualPipeV without exactly two
chunks) is refused by name with the numbers, never approximated.

Built in:

- ``1f1b`` (PipeDream-Flush, Megatron's non-interleaved schedule): stage
  ``s`` of ``p`` holds ``min(p - s, m)`` micro-batches at its peak.
- ``interleaved`` (Megatron's interleaved 1F1B with ``vpp`` model chunks per
  rank, virtual stage ``c * p + r`` on rank ``r``): rank ``r`` runs
  ``(p - r - 1) * 2 + (v - 1) * g`` warm-up forwards and one more before its
  first backward; forward ``i`` runs chunk ``(i // g) % v``, ``g`` the
  micro-batches a round: ``p`` where ``m`` is a multiple of it (Megatron-LM
  refuses other counts), ``m // max(1, m // p)`` in torch's Interleaved1F1B,
  which refuses ``m`` not a multiple of its rounds (so does this schedule).
  Rank 0 thus holds ``p * v + p - 1`` chunk-micro-batches at ``m >= p``,
  Megatron's memory factor ``1 + (p - 1) / (p * v)`` of ``p`` micro-batches
  of ``L / p`` layers; with fewer micro-batches than ranks every forward runs
  before the first backward.
- ``gpipe``: every forward before any backward, ``m`` micro-batches.
- ``interleaved-a2a-overlap`` and ``1f1b-a2a-overlap``: Megatron-LM's EP
  all-to-all overlap (``--overlap-moe-expert-parallel-comm``, the "combined
  1F1B" of megatron/core/pipeline_parallel/combined_1f1b.py): each steady-state
  step runs one micro-batch's forward beside another's backward, layer by
  layer, so each one's dispatch and combine run under the other's compute.
  Interleaved, the warm-up runs one more forward
  (schedules.py ``get_pp_rank_microbatches``: "we schedule one extra
  micro-batch forward step before the 1f1b stages"): one more
  chunk-micro-batch held. Without pipelining (pp = 1, Megatron's
  ``combined_1f1b_schedule_for_no_pipelining``) the backward of micro-batch
  ``i`` frees its layers from the last as the forward of ``i + 1`` fills them
  from the first: one micro-batch held, as 1F1B. Megatron needs virtual
  stages with pp > 1, so ``1f1b-a2a-overlap`` refuses pp > 1; both refuse full recomputation, as Megatron-LM's
  TransformerConfig asserts (``refuses_recompute``).
- ``dualpipev`` (DeepSeek's V-shaped cut-in-half DualPipe, ``DualPipeV.step``
  in deepseek-ai/DualPipe ``dualpipe/dualpipev.py``): ``2 p`` stages on ``p``
  ranks, rank ``r`` holding stages ``r`` and ``2 p - 1 - r``; it needs
  ``m >= 2 p`` (the step asserts it). Rank ``r`` runs ``2 (p - r - 1)``
  forwards of chunk 0, then ``r + 1`` pairs of chunk 0 and chunk 1 forwards,
  ``p - r - 1`` (backward, weight, forward) of chunk 1, and its peak comes with
  the first forward of the main loop: ``2 p - r`` micro-batches of chunk 0 and
  ``r + 1`` of chunk 1 at once, ``PP + 1 = 2 p + 1`` stage-micro-batches as
  DeepSeek's table says. Bubble: DeepSeek's ``(PP / 2 - 1)(F&B + B - 3 W)``
  a chunk with ``PP = 2 p``, ``F&B = F + B`` (the overlap hides communication,
  not compute), ``B = 2 F`` and ``W = F`` (the zero-bubble split:
  backward-for-weights as long as the forward), i.e. ``2 (p - 1)`` chunk
  forwards, ``(p - 1) / 3`` of a rank's forward and backward.

Known limitations: the counts are those at the moment a rank's total first
peaks. Under ``interleaved`` the chunks trade micro-batches in the steady
state at the same total (p = 2, v = 2, m = 4: rank 0 holds [3, 2], later
[4, 1]), so uneven ``pp_layers`` may peak at a split not counted; under
``dualpipev`` each chunk's maximum falls at that one moment.
"""
from __future__ import annotations

from typing import Any, List, Tuple

import attrs
import numpy as np

from ndcost.hookspecs import hookimpl

Refusal = Tuple[Any, str]  # (boolean mask over the batch, message template formatted with pp, vpp, m)


@attrs.frozen(kw_only=True)
class Schedule:
    """A pipeline schedule; subclasses say where chunks live and what each rank holds."""

    name: str
    description: str = ""
    # the schedule runs one micro-batch's expert all-to-alls under another's compute (DualPipeV's
    # overlapped forward and backward chunks); the time model then counts only what exceeds that compute
    overlaps_expert_communication: bool = False
    # the schedule this one runs as where nothing is expert-parallel (ep = 1): the two price alike there, so a
    # search tries this one only with ep > 1
    variant_of: str = ""
    # recompute modes the trainer running this schedule refuses beside it (the resolver refuses such rows)
    refuses_recompute: Tuple[str, ...] = ()

    def refusals(self, pp, vpp, m) -> List[Refusal]:
        """Layouts this schedule does not model: ``[(mask, template)]``; the template names the constraint."""
        return []

    def virtual_stage(self, pp, vpp, rank, chunk):
        """The virtual stage (model order, 0 first) that rank ``rank`` holds as its chunk ``chunk``."""
        return chunk * pp + rank

    def in_flight(self, pp, vpp, m, rank, chunk):
        """Micro-batches of chunk ``chunk`` whose activations rank ``rank`` keeps at its peak."""
        raise NotImplementedError

    def bubble_stage_steps(self, pp, vpp, m):
        """Idle time of a rank in units of one micro-batch's forward and backward through one rank's layers."""
        return (pp - 1) / vpp


def _no_chunks(name: str, pp, vpp) -> Refusal:
    return (vpp > 1, f"schedule {name} does not model virtual pipeline stages (vpp={{vpp}}); "
                     f"use schedule=interleaved (or dualpipev with vpp=2), or set vpp=1")


@attrs.frozen(kw_only=True)
class OneFOneB(Schedule):
    """PipeDream-Flush 1F1B: stage s of p holds ``min(p - s, m)`` micro-batches."""

    def refusals(self, pp, vpp, m):
        return [_no_chunks(self.name, pp, vpp)]

    def in_flight(self, pp, vpp, m, rank, chunk):
        return np.minimum(pp - rank, m)


@attrs.frozen(kw_only=True)
class OneFOneBA2AOverlap(Schedule):
    """Megatron-LM's combined 1F1B without pipelining: one micro-batch held, its all-to-alls under the other's
    compute."""

    def refusals(self, pp, vpp, m):
        return [(pp > 1, f"schedule {self.name} runs without pipelining (pp={{pp}}); Megatron-LM's all-to-all "
                         "overlap needs virtual stages with pp > 1: use schedule=interleaved-a2a-overlap with vpp >= 2"),
                _no_chunks(self.name, pp, vpp)]

    def in_flight(self, pp, vpp, m, rank, chunk):
        return np.minimum(1, m) + 0 * (pp + rank + chunk)


@attrs.frozen(kw_only=True)
class GPipe(Schedule):
    """GPipe: all forwards, then all backwards; every stage holds all ``m`` micro-batches."""

    def refusals(self, pp, vpp, m):
        return [_no_chunks(self.name, pp, vpp)]

    def in_flight(self, pp, vpp, m, rank, chunk):
        return m + 0 * (pp + rank + chunk)

    def bubble_stage_steps(self, pp, vpp, m):
        return pp - 1.0


@attrs.frozen(kw_only=True)
class Interleaved(Schedule):
    """Megatron's interleaved 1F1B over ``vpp`` chunks a rank (virtual stage ``c * p + r`` on rank r)."""

    def refusals(self, pp, vpp, m):
        rounds = np.maximum(m // np.maximum(pp, 1), 1)
        return [(vpp < 2, f"schedule {self.name} needs vpp >= 2 model chunks per rank (vpp={{vpp}}); "
                          "use schedule=1f1b for one chunk"),
                (pp < 2, f"schedule {self.name} needs pp >= 2 (pp={{pp}}); use pp=1 with schedule=1f1b"),
                ((vpp >= 2) & (pp >= 2) & (m % rounds != 0),
                 f"schedule {self.name} runs its micro-batches in rounds of equal size: num_micro_batches={{m}} is "
                 "not a multiple of its rounds, max(1, num_micro_batches // pp) (torch's Interleaved1F1B refuses "
                 "it; Megatron-LM needs a multiple of pp={pp}); give a multiple of pp")]

    # forwards a rank runs before its first backward beyond Megatron's warm-up: the one that precedes it
    extra_forwards: int = 1

    def bubble_stage_steps(self, pp, vpp, m):
        """``(p - 1) / v`` from ``m = p`` micro-batches on; with fewer, each chunk's forwards (and backwards) wait
        for the first micro-batch to cross all ``p`` ranks, so the step is the chain ``p`` plus the other
        micro-batches' ``(m - 1) / v`` behind it: ``p - m + (m - 1) / v`` idle, 1F1B's ``p - 1`` at ``m = 1``."""
        k = np.minimum(m, pp)
        return (pp - k) + (k - 1) / vpp

    def in_flight(self, pp, vpp, m, rank, chunk):
        """The forwards before the rank's first backward, each chunk's: the forwards run in groups of ``g`` micro-
        batches a chunk, ``g = m // max(1, m // p)`` (torch's Interleaved1F1B ``microbatches_per_round``; ``p``
        where ``m`` is a multiple of it, Megatron-LM's), ``(v - 1) g + 2 (p - r - 1)`` of them the warm-up."""
        group = m // np.maximum(m // pp, 1)
        held = np.minimum((pp - rank - 1) * 2 + (vpp - 1) * group + self.extra_forwards, m * vpp)
        cycle = group * vpp
        full, rest = held // cycle, held % cycle
        count = full * group + np.clip(rest - chunk * group, 0, group)
        return np.minimum(count, m)


@attrs.frozen(kw_only=True)
class DualPipeV(Schedule):
    """DeepSeek's DualPipeV: two chunks a rank in a V (stages r and 2p-1-r); rank r keeps ``2p - r`` + ``r + 1``."""

    def refusals(self, pp, vpp, m):
        return [(vpp != 2, "schedule dualpipev places exactly two chunks on each rank (a V); "
                           "set vpp=2 (got vpp={vpp})"),
                (m < 2 * pp, "schedule dualpipev needs num_micro_batches >= 2 * pp (DualPipeV's step asserts "
                             "it); got num_micro_batches={m} with pp={pp}: raise num_micro_batches or lower pp")]

    def virtual_stage(self, pp, vpp, rank, chunk):
        return np.where(chunk == 0, rank, 2 * pp - 1 - rank)

    def in_flight(self, pp, vpp, m, rank, chunk):
        # at the first forward of the main loop: 2p - r of chunk 0 (the arm going down), r + 1 of chunk 1
        return np.minimum(np.where(chunk == 0, 2 * pp - rank, rank + 1), m)

    def bubble_stage_steps(self, pp, vpp, m):
        # (p - 1)(F&B + B - 3W) a chunk = 2 (p - 1) chunk forwards; a rank's forward and backward is 6 of them
        return (pp - 1) / 3.0


BUILTIN = (
    OneFOneB(name="1f1b", description="PipeDream-Flush 1F1B: stage s of p holds min(p - s, m) micro-batches"),
    Interleaved(name="interleaved", description="Megatron's interleaved 1F1B with vpp model chunks per rank"),
    Interleaved(name="interleaved-a2a-overlap", overlaps_expert_communication=True, extra_forwards=2,
                variant_of="interleaved", refuses_recompute=("full",),
                description="Megatron's interleaved 1F1B under --overlap-moe-expert-parallel-comm: one more "
                            "warm-up forward, each step's all-to-alls under another micro-batch's compute"),
    OneFOneBA2AOverlap(name="1f1b-a2a-overlap", overlaps_expert_communication=True, variant_of="1f1b",
                       refuses_recompute=("full",),
                       description="Megatron's combined 1F1B without pipelining (pp=1) under "
                                   "--overlap-moe-expert-parallel-comm: all-to-alls under another micro-batch's "
                                   "compute"),
    GPipe(name="gpipe", description="GPipe: all forwards then all backwards; m micro-batches held"),
    DualPipeV(name="dualpipev", overlaps_expert_communication=True,
              description="DeepSeek's DualPipeV: V-shaped two chunks per rank, 2p + 1 held, m >= 2p"),
)


@hookimpl
def ndcost_register(register):
    for schedule in BUILTIN:
        register(f"schedule/{schedule.name}", schedule)
