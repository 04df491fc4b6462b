"""What every priced row of a batch keeps, checked once where results are made (``CostModel.evaluate_many``).

Memory: every byte figure a non-negative integer at most ``MAX_EXACT_BYTES``
(exact in float64, where it is priced); each stage's categories sum to its
peak (at its moment, one of ``MOMENTS``); the top-level peak is the most any
stage holds; stages past the row's ``pp`` hold nothing. Time, where priced:
every figure finite, the step, its compute and the throughput positive,
the other components non-negative, MFU in (0, 1]. A row that breaks one is
made invalid with the invariant and its numbers as its reason, its figures
zeroed (time NaN): never returned as valid.
"""
from __future__ import annotations

from typing import Any, Dict, List

import attrs
import numpy as np

from ndcost.compose.memory import MAX_EXACT_BYTES, MOMENTS

__all__ = ["enforce"]

_POSITIVE_TIMES = ("step_seconds", "compute_seconds", "tokens_per_second")
_NON_NEGATIVE_TIMES = ("communication_seconds", "exposed_communication_seconds", "bubble_seconds",
                       "optimizer_seconds")


def _memory_breaks(result: Any, rows: np.ndarray) -> Dict[int, str]:
    """The broken memory invariant of each row of *rows* (valid rows) that breaks one."""
    stage_bytes, stage_peak = result.stage_bytes[rows], result.stage_peak_bytes[rows]
    peak, stages = result.peak_bytes[rows], result.num_stages[rows]
    sums = stage_bytes.sum(axis=2)  # within int64: every category is checked non-negative and the sums bounded
    negative = stage_bytes.min(axis=(1, 2), initial=0) < 0
    beyond = (peak > MAX_EXACT_BYTES) | (stage_peak.max(axis=1, initial=0) > MAX_EXACT_BYTES)
    mismatch = (sums != stage_peak).any(axis=1)
    top = peak != stage_peak.max(axis=1, initial=0)
    exists = np.arange(stage_peak.shape[1])[None, :] < stages[:, None]
    moment = ((result.stage_moment[rows] < 0) | (result.stage_moment[rows] >= len(MOMENTS))) & exists
    bad = negative | beyond | mismatch | top | moment.any(axis=1)
    out: Dict[int, str] = {}
    for j in np.flatnonzero(bad).tolist():  # the breaking rows alone (none, unless the composition errs)
        i = int(rows[j])
        if negative[j]:
            s, c = np.argwhere(stage_bytes[j] < 0)[0].tolist()
            out[i] = f"stage {s} holds {int(stage_bytes[j, s, c]):,} bytes of {result.categories[c]} (negative)"
        elif beyond[j]:
            out[i] = f"peak {int(peak[j]):,} bytes is past {MAX_EXACT_BYTES:,} (2**53), where bytes stop being exact"
        elif mismatch[j]:
            s = int(np.argmax(sums[j] != stage_peak[j]))
            out[i] = (f"stage {s}'s categories sum to {int(sums[j, s]):,} bytes but its peak is "
                      f"{int(stage_peak[j, s]):,}")
        elif top[j]:
            out[i] = f"the peak {int(peak[j]):,} bytes is not the most a stage holds ({int(stage_peak[j].max()):,})"
        else:
            out[i] = f"a stage's moment is none of {', '.join(MOMENTS)}"
    return out


def _time_breaks(time: Any, rows: np.ndarray) -> Dict[int, str]:
    """The broken time invariant of each row of *rows* that breaks one."""
    out: Dict[int, str] = {}
    checks: List[Any] = [(name, lambda v: v > 0.0, "positive") for name in _POSITIVE_TIMES]
    checks += [(name, lambda v: v >= 0.0, "non-negative") for name in _NON_NEGATIVE_TIMES]
    checks.append(("mfu", lambda v: (v > 0.0) & (v <= 1.0), "in (0, 1]"))
    for name, holds, wanted in checks:
        values = np.asarray(time[name])[rows]
        bad = ~(np.isfinite(values) & holds(values))
        for j in np.flatnonzero(bad).tolist():
            out.setdefault(int(rows[j]), f"{name} = {float(values[j])!r}, where it must be finite and {wanted}")
    return out


def enforce(result: Any) -> Any:
    """*result* (a ``BatchResult``) with every valid row that breaks an invariant made invalid, with its reason."""
    rows = np.flatnonzero(result.valid)
    if not len(rows):
        return result
    broken = _memory_breaks(result, rows)
    if result.time is not None:
        for i, why in _time_breaks(result.time, rows).items():
            broken.setdefault(i, why)
    if not broken:
        return result
    index = np.array(sorted(broken), dtype=np.int64)
    valid, reason = result.valid.copy(), result.reason.copy()
    valid[index] = False
    for i in index.tolist():
        reason[i] = (f"internal invariant broken: {broken[i]}; the row is not priced "
                     f"(please report the strategy and model)")
    for name in ("peak_bytes", "stage_bytes", "stage_peak_bytes", "stage_layers", "stage_moment", "peak_stage",
                 "layer_activation_bytes", "stage_kind_layers", "head_stage", "embedding_stage", "num_stages"):
        getattr(result, name)[index] = 0
    time = result.time
    if time is not None:
        time = dict(time)
        for name, values in time.items():
            if isinstance(values, np.ndarray):
                time[name] = values.copy()
                time[name][index] = np.nan
    return attrs.evolve(result, valid=valid, reason=reason, fits=result.fits & valid, time=time)
