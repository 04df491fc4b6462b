"""What every priced row of a batch keeps, checked once where results are made (``CostModel.evaluate_many``).

Memory: every byte figure a non-negative integer at most ``MAX_EXACT_BYTES``
(exact in float64, where it is priced); each stage's categories sum to its
peak (at its moment, one of ``MOMENTS``); the top-level peak is the most any
stage holds; stages past the row's ``pp`` hold nothing. Host memory: the
top-level ``host_bytes`` is the most any stage's device holds there, and a
node holds at least that (``host_bytes_per_node``). Time, where priced:
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
from ndcost.values import EXPOSED_GROUPS

__all__ = ["enforce"]

_POSITIVE_TIMES = ("step_seconds", "compute_seconds", "tokens_per_second")
_NON_NEGATIVE_TIMES = ("communication_seconds", "exposed_communication_seconds", "bubble_seconds",
                       "optimizer_seconds", "offload_seconds", "exposed_offload_seconds") + tuple(
    f"exposed_{group}_seconds" for group in EXPOSED_GROUPS)


def _memory_breaks(result: Any, valid: np.ndarray) -> Dict[int, str]:
    """The broken memory invariant of each valid row that breaks one.

    Read on the whole arrays (an invalid row holds 0, which keeps every identity), never a copy of them.
    """
    stage_bytes, stage_peak, peak = result.stage_bytes, result.stage_peak_bytes, result.peak_bytes
    moments = result.stage_moment
    none = np.zeros(len(peak), dtype=bool)
    # each check one pass over the batch, finding its rows only where it fails somewhere (the ufuncs' reductions,
    # without the array methods' Python wrappers: they weigh on a batch of one strategy)
    least, greatest = np.minimum.reduce, np.maximum.reduce
    negative = (stage_bytes < 0).any(axis=(1, 2)) if stage_bytes.size and least(stage_bytes, axis=None) < 0 else none
    sums = stage_bytes.sum(axis=2)  # within int64: non-negative categories of rows within bound
    mismatch = none if np.logical_and.reduce(sums == stage_peak, axis=None) else (sums != stage_peak).any(axis=1)
    most = greatest(stage_peak, axis=1, initial=0)
    beyond = (peak > MAX_EXACT_BYTES) | (most > MAX_EXACT_BYTES)
    top = peak != most
    moment = none  # a stage past a row's pp, or an invalid row, holds moment 0
    if moments.size and (least(moments, axis=None) < 0 or greatest(moments, axis=None) >= len(MOMENTS)):
        moment = ((moments < 0) | (moments >= len(MOMENTS))).any(axis=1)
    host, stage_host, node_host = result.host_bytes, result.stage_host_bytes, result.host_bytes_per_node
    host_broken = none
    if np.count_nonzero(host) or np.count_nonzero(stage_host) or np.count_nonzero(node_host):  # offloading rows
        host_broken = ((stage_host < 0).any(axis=1) | (host != stage_host.max(axis=1, initial=0))
                       | (node_host < host) | (node_host > MAX_EXACT_BYTES))
    bad = valid & (negative | beyond | mismatch | top | moment | host_broken)
    out: Dict[int, str] = {}
    # the breaking rows alone (none, unless the composition errs)
    for i in np.flatnonzero(bad).tolist() if np.count_nonzero(bad) else ():
        if negative[i]:
            s, c = np.argwhere(stage_bytes[i] < 0)[0].tolist()
            out[i] = f"stage {s} holds {int(stage_bytes[i, s, c]):,} bytes of {result.categories[c]} (negative)"
        elif beyond[i]:
            out[i] = f"peak {int(peak[i]):,} bytes is past {MAX_EXACT_BYTES:,} (2**53), where bytes stop being exact"
        elif mismatch[i]:
            s = int(np.argmax(sums[i] != stage_peak[i]))
            out[i] = (f"stage {s}'s categories sum to {int(sums[i, s]):,} bytes but its peak is "
                      f"{int(stage_peak[i, s]):,}")
        elif top[i]:
            out[i] = f"the peak {int(peak[i]):,} bytes is not the most a stage holds ({int(most[i]):,})"
        elif host_broken[i]:
            out[i] = (f"host bytes {int(host[i]):,} a device and {int(node_host[i]):,} a node, stages "
                      f"{', '.join(f'{int(b):,}' for b in stage_host[i])}: a device's must be the most a stage "
                      f"holds, a node's at least that and at most {MAX_EXACT_BYTES:,}, none negative")
        else:
            out[i] = f"a stage's moment is none of {', '.join(MOMENTS)}"
    return out


def _time_breaks(time: Any, valid: np.ndarray) -> Dict[int, str]:
    """The broken time invariant of each valid row that breaks one (an invalid row's time is NaN)."""
    out: Dict[int, str] = {}
    # every figure checked at once (one array, a row a figure); the rows are named only where one fails
    figures = np.array([time[name] for name in _POSITIVE_TIMES + _NON_NEGATIVE_TIMES + ("mfu",)], dtype=np.float64)
    positive, non_negative, mfu = figures[:len(_POSITIVE_TIMES)], figures[len(_POSITIVE_TIMES):-1], figures[-1]
    holds = (np.logical_and.reduce(np.isfinite(figures), axis=0) & np.logical_and.reduce(positive > 0.0, axis=0)
             & np.logical_and.reduce(non_negative >= 0.0, axis=0) & (mfu > 0.0) & (mfu <= 1.0))
    if not np.count_nonzero(valid & ~holds):
        return out
    checks: List[Any] = [(name, lambda v: v > 0.0, "positive") for name in _POSITIVE_TIMES]
    checks += [(name, lambda v: v >= 0.0, "non-negative") for name in _NON_NEGATIVE_TIMES]
    checks.append(("mfu", lambda v: (v > 0.0) & (v <= 1.0), "in (0, 1]"))
    for name, holds, wanted in checks:
        values = np.asarray(time[name])
        for i in np.flatnonzero(valid & ~(np.isfinite(values) & holds(values))).tolist():
            out.setdefault(i, f"{name} = {float(values[i])!r}, where it must be finite and {wanted}")
    return out


def enforce(result: Any) -> Any:
    """*result* (a ``BatchResult``) with every valid row that breaks an invariant made invalid, with its reason."""
    valid = np.asarray(result.valid, dtype=bool)
    if not np.count_nonzero(valid):
        return result
    broken = _memory_breaks(result, valid)
    if result.time is not None:
        for i, why in _time_breaks(result.time, valid).items():
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
                 "layer_activation_bytes", "stage_kind_layers", "head_stage", "embedding_stage", "num_stages",
                 "stage_host_bytes", "host_bytes", "host_bytes_per_node", "stage_offloaded_activation_bytes"):
        getattr(result, name)[index] = 0
    for name in ("stage_reserved_bytes", "reserved_bytes"):
        if getattr(result, name) is not None:
            getattr(result, name)[index] = -1
    time = result.time
    if time is not None:
        time = dict(time)
        for name, values in time.items():
            if isinstance(values, np.ndarray):
                time[name] = values.copy()
                time[name][index] = np.nan
    basis = result.fits_basis
    if basis is not None:
        basis = basis.copy()
        basis[index] = ""
    return attrs.evolve(result, valid=valid, reason=reason, fits=result.fits & valid, fits_basis=basis, time=time)
