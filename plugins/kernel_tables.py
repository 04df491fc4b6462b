"""Kernel tables fitted from measured kernels or from a user's torch.profiler trace (docs/calibration.md).

A hardware's ``kernel_tables`` (schema: :func:`ndcost.plugins.calibration.check_kernel_tables`) hold the
GEMM efficiency (achieved / the dtype's peak) on an (m, n, k) log2 grid per dtype, the attention kernels'
forward and backward efficiency by (seq, heads, head_dim, causal) rows per kernel and dtype, the elementwise
efficiency (achieved / HBM bandwidth) by bytes a kernel moves, the GPU's floor per kernel and the host's
eager dispatch per op. Two sources give points to fit them on:

- ``benchmarks/measure_kernels.py``'s JSON (:func:`read_kernel_measurements`): a sweep over the grid itself,
  and SDPA's backends timed by shape (its ``sdpa`` section: each shape a row of its backend's table);
- a Chrome trace of ``torch.profiler`` with ``record_shapes=True`` (:func:`read_trace`): each
  ``aten::mm`` / ``addmm`` / ``matmul`` / ``bmm`` with its "Input Dims", timed by the CUDA kernels it
  launched (matched by "External id", or the launch's correlation id) or, on a CPU-only trace, by its own
  duration; elementwise ops by the bytes their inputs and output hold.

:func:`fit_kernel_tables` bins each point to the grid node nearest in log2 space (clamped to the grid) and
sets a cell with points to their total ideal seconds over their total measured seconds (so a long kernel
weighs as its time does); a cell without points keeps the hardware's current table, else the scalar
``matmul`` / ``memory`` efficiency. What it leaves out: a point between nodes is priced as its nearest
node's shape; a batched GEMM (``bmm``) is binned as one GEMM of ``batch * m`` rows; the elementwise bytes
count every tensor input once and the output once (a broadcast input is counted at its own size).
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost import kernels
from ndcost.errors import InvalidValue
from ndcost.kernels import GEMM_AXES
from ndcost.plugins.calibration import check_kernel_tables
from ndcost.specio import read_text

DEFAULT_GEMM_GRID = {"m": (256, 1024, 4096, 16384), "n": (1024, 4096, 16384), "k": (1024, 4096, 16384)}
DEFAULT_ELEMENTWISE_BYTES = (65536, 1048576, 16777216, 268435456)
MEASUREMENTS_FORMAT = "ndcost-kernel-measurements"

GEMM_OPS = ("aten::mm", "aten::addmm", "aten::matmul", "aten::bmm")
# Elementwise ops whose bytes the trace's input shapes give: every tensor input read once and one output of
# the inputs' broadcast shape written; copy_ writes into its first input (read nothing from it).
ELEMENTWISE_OPS = ("aten::add", "aten::add_", "aten::sub", "aten::sub_", "aten::mul", "aten::mul_", "aten::div",
                   "aten::div_", "aten::neg", "aten::exp", "aten::rsqrt", "aten::sigmoid", "aten::tanh",
                   "aten::silu", "aten::relu", "aten::gelu", "aten::copy_")
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# "Input type" as the profiler names a tensor's dtype (c10/core/ScalarType.h's C++ type names), for the peak
# of the GEMM dtype and the bytes of an element.
TRACE_DTYPES = {"float": ("fp32", 4), "double": ("fp64", 8), "c10::BFloat16": ("bf16", 2), "BFloat16": ("bf16", 2),
                "c10::Half": ("fp16", 2), "Half": ("fp16", 2), "c10::Float8_e4m3fn": ("fp8", 1),
                "c10::Float8_e5m2": ("fp8", 1), "long int": ("int64", 8), "int": ("int32", 4),
                "short int": ("int16", 2), "signed char": ("int8", 1), "unsigned char": ("uint8", 1),
                "bool": ("bool", 1)}
MIN_TIMELINE_PAIRS = 8  # fewer kernel pairs than this fit no launch floor or dispatch figure (noise)


@attrs.frozen(kw_only=True)
class GemmPoint:
    """One timed GEMM: ``batch`` products of (m x k) by (k x n) in *dtype*."""

    m: int
    n: int
    k: int
    dtype: str
    seconds: float
    batch: int = 1
    op: str = "aten::mm"

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@attrs.frozen(kw_only=True)
class ElementwisePoint:
    """One timed elementwise kernel moving ``bytes`` (read plus written)."""

    bytes: int
    seconds: float
    op: str = "copy"


@attrs.frozen(kw_only=True)
class AttentionPoint:
    """One timed attention kernel (an SDPA backend) on batch 1: its forward, and its forward and backward."""

    kernel: str
    seq: int
    heads: int
    head_dim: int
    causal: bool
    forward_seconds: float
    forward_backward_seconds: float
    dtype: str = "bf16"

    @property
    def forward_flops(self) -> float:
        """``Q K^T`` and ``P V`` at the pairs the time model counts: ``s (s + 1) / 2`` causal, else ``s^2``
        (ndcost.work.causal_pairs); the backward twice these."""
        pairs = self.seq * (self.seq + 1) / 2 if self.causal else self.seq * self.seq
        return 4.0 * self.heads * self.head_dim * pairs


@attrs.frozen(kw_only=True)
class KernelPoints:
    """What a source measured: GEMM and elementwise points, the launch floor and dispatch figures (with the
    samples behind each: kernels timed, or a trace's kernel pairs; 0 where none), the grids it swept
    (measurements only) and what it passed over."""

    source: str
    device: str                                   # "cuda" (a GPU ran them) or "cpu"
    gemm: Tuple[GemmPoint, ...] = ()
    elementwise: Tuple[ElementwisePoint, ...] = ()
    launch_seconds: Optional[float] = None
    launch_samples: int = 0
    dispatch_seconds: Optional[float] = None
    dispatch_samples: int = 0
    gemm_grids: Mapping[str, Mapping[str, Tuple[int, ...]]] = attrs.field(factory=dict)
    elementwise_bytes: Optional[Tuple[int, ...]] = None
    skipped: Mapping[str, int] = attrs.field(factory=dict)   # why -> how many ops
    hardware: Optional[str] = None                           # the hardware the source names (measurements)
    attention: Tuple[AttentionPoint, ...] = ()


@attrs.frozen(kw_only=True)
class KernelTableFit:
    """The fitted ``kernel_tables``, each fitted cell with its points, prior and figure, and the fit's error."""

    hardware: str
    tables: Mapping[str, Any]                       # plain dicts, lists and numbers, as the YAML holds them
    cells: Tuple[Mapping[str, Any], ...]
    scalars: Mapping[str, Mapping[str, Any]]        # launch_seconds / dispatch_seconds: prior, fitted, samples
    errors: Mapping[str, Mapping[str, Any]]         # gemm / elementwise: points, rms_log_error_prior / _fitted
    points: KernelPoints

    def to_dict(self) -> Dict[str, Any]:
        return {"hardware": self.hardware, "source": self.points.source, "device": self.points.device,
                "points": {"gemm": len(self.points.gemm), "elementwise": len(self.points.elementwise),
                           "attention": len(self.points.attention)},
                "skipped": dict(self.points.skipped), "cells": [dict(c) for c in self.cells],
                "scalars": {k: dict(v) for k, v in self.scalars.items()},
                "errors": {k: dict(v) for k, v in self.errors.items()}, "kernel_tables": self.tables}


# ---------------------------------------------------------------------------
# the fit
# ---------------------------------------------------------------------------
def fit_kernel_tables(points: KernelPoints, hardware, current: Optional[Mapping[str, Any]] = None
                      ) -> KernelTableFit:
    """*hardware*'s kernel tables fitted on *points*, from *current* (its tables, or None).

    A GEMM dtype's grid is the one the points were swept on, else the current table's, else
    :data:`DEFAULT_GEMM_GRID`; the elementwise grid likewise. A cell's prior is the current table at its
    node (interpolated where the grids differ), else what the time model reads from the current
    ``gemm_shape`` there, else the hardware's scalar efficiency. Points of a dtype the hardware states no peak
    for are passed over (counted in ``skipped``). A cell fitted above 1 is refused.
    """
    from ndcost.compose import time as time_model

    current = dict(current or {})
    check_kernel_tables(current, f"hardware {hardware.name!r}")
    scalar, _ = time_model.efficiencies(hardware)
    tables: Dict[str, Any] = {k: v for k, v in current.items() if k != "source"}
    gemm_tables = dict(current.get("gemm", {}))
    cells: List[Dict[str, Any]] = []
    errors: Dict[str, Dict[str, Any]] = {}
    skipped = dict(points.skipped)
    by_dtype: Dict[str, List[GemmPoint]] = {}
    for p in points.gemm:
        by_dtype.setdefault(p.dtype, []).append(p)
    rms_prior: List[float] = []
    rms_fitted: List[float] = []
    for dtype, found in sorted(by_dtype.items()):
        if dtype not in hardware.peak_flops_per_second:
            skipped[f"{dtype} matmuls (hardware {hardware.name!r} states no {dtype} peak)"] = len(found)
            continue
        peak = hardware.peak_flops(dtype)
        grid = points.gemm_grids.get(dtype) or (gemm_tables[dtype] if dtype in gemm_tables else DEFAULT_GEMM_GRID)
        axes = [np.asarray(grid[a], dtype=float) for a in GEMM_AXES]
        nodes = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
        prior = (interpolate(gemm_tables[dtype], nodes) if dtype in gemm_tables
                 else _shape_prior(hardware, current, dtype, nodes, scalar["matmul"])
                 ).reshape([len(a) for a in axes])
        shapes = np.array([[p.batch * p.m, p.n, p.k] for p in found], dtype=float)
        ideal = np.array([p.flops / peak for p in found])
        measured = np.array([p.seconds for p in found])
        index = tuple(_nearest(axis, shapes[:, j]) for j, axis in enumerate(axes))
        fitted = _fit_cells(prior, index, ideal, measured, f"gemm {dtype}", cells,
                            lambda cell, d=dtype, a=axes: {"dtype": d, **{n: int(a[j][cell[j]])
                                                                          for j, n in enumerate(GEMM_AXES)}})
        new = {a: [int(v) for v in grid[a]] for a in GEMM_AXES}
        gemm_tables[dtype] = {**new, "efficiency": fitted.tolist()}
        table_prior = current.get("gemm", {}).get(dtype) or {**new, "efficiency": prior.tolist()}
        rms_prior += list(np.log(ideal / interpolate(table_prior, shapes) / measured))
        rms_fitted += list(np.log(ideal / interpolate(gemm_tables[dtype], shapes) / measured))
    if rms_prior:
        errors["gemm"] = _errors(rms_prior, rms_fitted)
    if gemm_tables:
        tables["gemm"] = gemm_tables
    if points.elementwise:
        grid_bytes = points.elementwise_bytes or tuple(current.get("elementwise", {}).get("bytes", ())) \
            or DEFAULT_ELEMENTWISE_BYTES
        axis = np.asarray(grid_bytes, dtype=float)
        prior = (_interpolate_1d(current["elementwise"], axis) if "elementwise" in current
                 else np.full(len(axis), scalar["memory"]))
        moved = np.array([p.bytes for p in points.elementwise], dtype=float)
        ideal = moved / float(hardware.hbm_bytes_per_second)
        measured = np.array([p.seconds for p in points.elementwise])
        fitted = _fit_cells(prior, (_nearest(axis, moved),), ideal, measured, "elementwise", cells,
                            lambda cell: {"dtype": "elementwise", "bytes": int(axis[cell[0]])})
        tables["elementwise"] = {"bytes": [int(b) for b in grid_bytes], "efficiency": fitted.tolist()}
        table_prior = current.get("elementwise") or {"bytes": grid_bytes, "efficiency": prior.tolist()}
        errors["elementwise"] = _errors(np.log(ideal / _interpolate_1d(table_prior, moved) / measured),
                                        np.log(ideal / _interpolate_1d(tables["elementwise"], moved) / measured))
    if points.attention:
        tables["attention"] = _fit_attention(points, hardware, current, scalar, cells, errors, skipped)
    scalars = {}
    for key, value, samples in (("launch_seconds", points.launch_seconds, points.launch_samples),
                                ("dispatch_seconds", points.dispatch_seconds, points.dispatch_samples)):
        prior_value = current.get(key)
        if value is not None:
            tables[key] = float(value)
        scalars[key] = {"prior": prior_value, "fitted": tables.get(key), "samples": samples}
    tables["source"] = points.source
    check_kernel_tables(tables, f"the tables fitted for hardware {hardware.name!r}")
    return KernelTableFit(hardware=hardware.name, tables=as_plain(tables), cells=tuple(cells), scalars=scalars,
                          errors=errors, points=attrs.evolve(points, skipped=skipped))


def _fit_attention(points: KernelPoints, hardware, current: Mapping[str, Any], scalar: Mapping[str, float],
                   cells: List[Dict[str, Any]], errors: Dict[str, Dict[str, Any]], skipped: Dict[str, int]
                   ) -> Dict[str, Any]:
    """The ``attention`` tables: *current*'s with a row for each shape timed, its forward efficiency the
    points' total ideal forward seconds over their total measured, its backward's likewise (a timing's
    backward seconds its forward and backward less its forward; the backward's FLOPs twice the forward's).
    A shape's prior is what the time model read there before (the kernel's rows, its plateau's prior, else
    ``efficiency.attention``). A shape whose backward took no time is skipped, counted in *skipped*."""
    tables = {str(name): dict(entry) for name, entry in (current.get("attention") or {}).items()}
    before = kernels.parse_kernel_tables(f"hardware {hardware.name!r}", {**current, "source": "current"})
    groups: Dict[Tuple[Any, ...], List[AttentionPoint]] = {}
    for p in points.attention:
        if p.dtype not in hardware.peak_flops_per_second:
            why = f"{p.dtype} attention kernels (hardware {hardware.name!r} states no {p.dtype} peak)"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        groups.setdefault((p.kernel, p.dtype, p.seq, p.heads, p.head_dim, p.causal), []).append(p)
    logs_prior: List[float] = []
    logs_fitted: List[float] = []
    for (kernel, dtype, seq, heads, head_dim, causal), found in sorted(groups.items()):
        peak = hardware.peak_flops(dtype)
        ideal_f = np.array([p.forward_flops / peak for p in found])
        measured_f = np.array([p.forward_seconds for p in found])
        measured_b = np.array([p.forward_backward_seconds - p.forward_seconds for p in found])
        label = f"attention {kernel} {dtype} seq {seq}, heads {heads}, head_dim {head_dim}, causal {causal}"
        if (measured_b <= 0).any():  # one shape's noise (a busy device, a tiny kernel) costs that shape alone
            why = ("attention shapes whose forward and backward timed no longer than the forward alone (noise: "
                   "rerun benchmarks/measure_kernels.py on an idle device)")
            skipped[why] = skipped.get(why, 0) + len(found)
            continue
        fitted = (ideal_f.sum() / measured_f.sum(), 2.0 * ideal_f.sum() / measured_b.sum())
        for what, value in zip(("forward", "backward"), fitted, strict=True):
            if not 0.0 < value <= 1.0:
                raise InvalidValue(f"{label}: its {len(found)} point(s) ran the {what} at {value:.3f} of the peak, "
                                   f"above 1: the hardware's peak is too low for what was measured; check --hardware")
        prior = [float(v) for v in kernels.attention_efficiency(
            hardware, before, kernel, dtype, seq, heads, head_dim, causal,
            stated=(scalar["attention"], scalar["attention_backward"]))]
        cells.append({"dtype": dtype, "kernel": kernel, "seq": seq, "heads": heads, "head_dim": head_dim,
                      "causal": causal, "points": len(found), "prior": prior[0], "fitted": float(fitted[0]),
                      "prior_backward": prior[1], "fitted_backward": float(fitted[1])})
        entry = tables.setdefault(kernel, {})
        key = (seq, heads, head_dim, causal)
        rows = [r for r in entry.get(dtype, ()) if (r["seq"], r["heads"], r["head_dim"], r["causal"]) != key]
        entry[dtype] = sorted(rows + [{"seq": seq, "heads": heads, "head_dim": head_dim, "causal": causal,
                                       "forward": float(fitted[0]), "backward": float(fitted[1])}],
                              key=lambda r: (r["head_dim"], r["causal"], r["heads"], r["seq"]))
        old = entry.get("source")
        entry["source"] = points.source if old in (None, points.source) else f"{points.source}; before: {old}"
        ideal_b = 2.0 * ideal_f
        logs_prior += list(np.log(ideal_f / prior[0] / measured_f)) + list(np.log(ideal_b / prior[1] / measured_b))
        logs_fitted += (list(np.log(ideal_f / fitted[0] / measured_f))
                        + list(np.log(ideal_b / fitted[1] / measured_b)))
    if logs_prior:
        errors["attention"] = _errors(logs_prior, logs_fitted)
    return tables


def _fit_cells(prior: np.ndarray, index: Tuple[np.ndarray, ...], ideal: np.ndarray, measured: np.ndarray,
               what: str, cells: List[Dict[str, Any]], label) -> np.ndarray:
    """*prior* with each cell that points fall in set to their total ideal over total measured seconds."""
    ideal_sum, measured_sum, count = np.zeros(prior.shape), np.zeros(prior.shape), np.zeros(prior.shape, dtype=int)
    np.add.at(ideal_sum, index, ideal)
    np.add.at(measured_sum, index, measured)
    np.add.at(count, index, 1)
    fitted = prior.copy()
    hit = count > 0
    fitted[hit] = ideal_sum[hit] / measured_sum[hit]
    for cell in zip(*np.nonzero(hit), strict=True):
        if not 0.0 < fitted[cell] <= 1.0:
            raise InvalidValue(f"{what} cell {label(cell)}: its {int(count[cell])} point(s) ran at "
                               f"{fitted[cell]:.3f} of the peak, above 1: the hardware's peak is too low for "
                               f"what was measured; check --hardware")
        cells.append({**label(cell), "points": int(count[cell]), "prior": float(prior[cell]),
                      "fitted": float(fitted[cell])})
    return fitted


def _errors(prior: Sequence[float], fitted: Sequence[float]) -> Dict[str, Any]:
    def rms(values):
        return math.sqrt(sum(v * v for v in values) / len(values))
    return {"points": len(prior), "rms_log_error_prior": rms(prior), "rms_log_error_fitted": rms(fitted)}


def _nearest(axis: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Each value's nearest grid node in log2 space (outside the grid, its end; halfway, the lower node)."""
    return np.abs(np.log2(values)[:, None] - np.log2(axis)[None, :]).argmin(axis=1)


def _shape_prior(hardware, current: Mapping[str, Any], dtype: str, nodes: np.ndarray, stated: float) -> np.ndarray:
    """The efficiency the time model reads at each (m, n, k) of *nodes* from the current ``gemm_shape`` table of
    *dtype* (:func:`ndcost.kernels.gemm_efficiency`), else *stated* at every node."""
    if dtype not in (current.get("gemm_shape") or {}):
        return np.full(len(nodes), stated)
    tables = kernels.parse_kernel_tables(hardware.name, {"gemm_shape": current["gemm_shape"], "source": "current"})
    return np.asarray(kernels.gemm_efficiency(hardware, tables, dtype, nodes[:, 0], nodes[:, 1], nodes[:, 2],
                                              stated=stated), dtype=float)


def interpolate(table: Mapping[str, Any], shapes: np.ndarray) -> np.ndarray:
    """A GEMM table's efficiency at each (m, n, k) row of *shapes*: the time model's own reading
    (:func:`ndcost.kernels.table_gemm_efficiency`) of a table not checked yet (a fit's cells may pass 1)."""
    axes = [np.log2(np.asarray(table[axis], dtype=float)) for axis in GEMM_AXES]
    gemm = kernels.GemmTable(log2_m=axes[0], log2_n=axes[1], log2_k=axes[2],
                             efficiency=np.asarray(table["efficiency"], dtype=float))
    return kernels.table_gemm_efficiency(gemm, shapes[:, 0], shapes[:, 1], shapes[:, 2])


def _interpolate_1d(table: Mapping[str, Any], moved: np.ndarray) -> np.ndarray:
    """An elementwise table's efficiency at *moved* bytes, as the time model reads it."""
    elementwise = kernels.ElementwiseTable(log2_bytes=np.log2(np.asarray(table["bytes"], dtype=float)),
                                           efficiency=np.asarray(table["efficiency"], dtype=float))
    tables = kernels.KernelTables(gemm={}, elementwise=elementwise, launch_seconds=None, dispatch_seconds=None,
                                  source="")
    return kernels.elementwise_efficiency(tables, moved, stated=1.0)


def as_plain(value: Any) -> Any:
    """*value* as plain dicts, lists, ints and floats (for JSON and YAML)."""
    if isinstance(value, Mapping):
        return {str(k): as_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [as_plain(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


# ---------------------------------------------------------------------------
# benchmarks/measure_kernels.py's JSON
# ---------------------------------------------------------------------------
def read_kernel_measurements(path: str) -> KernelPoints:
    """The points of a ``benchmarks/measure_kernels.py`` JSON (its raw timings; its own tables are not read)."""
    return kernel_points_from_measurements(_read_json(path, "kernel measurements"), path)


def kernel_points_from_measurements(doc: Any, path: str) -> KernelPoints:
    """The points of measure_kernels.py's document *doc* (read from *path*, named in errors)."""
    if not isinstance(doc, Mapping) or doc.get("format") != MEASUREMENTS_FORMAT:
        raise InvalidValue(f"{path} is not the output of benchmarks/measure_kernels.py (no \"format\": "
                           f"\"{MEASUREMENTS_FORMAT}\"); for a torch.profiler trace use --trace")
    try:
        gemm, grids = [], {}
        for dtype, entry in doc.get("gemm", {}).items():
            grids[dtype] = {a: tuple(int(v) for v in entry["grid"][a]) for a in GEMM_AXES}
            gemm += [GemmPoint(m=int(t["m"]), n=int(t["n"]), k=int(t["k"]), dtype=dtype,
                               seconds=_seconds(t["seconds"], f"gemm {dtype} {t['m']}x{t['n']}x{t['k']}"), op="mm")
                     for t in entry["timings"]]
        elementwise = doc.get("elementwise", {})
        points = tuple(ElementwisePoint(bytes=int(t["bytes"]), seconds=_seconds(t["seconds"], f"{t['op']} "
                                                                                f"{t['bytes']} bytes"), op=t["op"])
                       for t in elementwise.get("timings", ()))
        attention = tuple(
            AttentionPoint(kernel=str(t["backend"]), seq=int(t["seq"]), heads=int(t["heads"]),
                           head_dim=int(t["head_dim"]), causal=bool(t["causal"]), dtype=str(t.get("dtype", "bf16")),
                           forward_seconds=_seconds(t["forward_seconds"], f"sdpa {t['backend']} seq {t['seq']}"),
                           forward_backward_seconds=_seconds(t["forward_backward_seconds"],
                                                             f"sdpa {t['backend']} seq {t['seq']} backward"))
            for t in doc.get("sdpa", {}).get("timings", ()))
        launch, dispatch = doc.get("launch", {}), doc.get("dispatch", {})
        return KernelPoints(attention=attention,
            source=f"benchmarks/measure_kernels.py on {doc.get('device_name', doc.get('device'))}, "
                   f"torch {doc.get('torch')} ({path})",
            device=str(doc.get("device")), gemm=tuple(gemm), elementwise=points, gemm_grids=grids,
            elementwise_bytes=tuple(int(b) for b in elementwise["bytes"]) if points else None,
            launch_seconds=_optional_seconds(launch.get("launch_seconds"), "launch_seconds"),
            launch_samples=int(launch.get("kernels", 0)),
            dispatch_seconds=_optional_seconds(dispatch.get("dispatch_seconds"), "dispatch_seconds"),
            dispatch_samples=int(dispatch.get("ops", 0)), hardware=doc.get("hardware"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, InvalidValue):
            raise
        raise InvalidValue(f"{path}: malformed kernel measurements ({type(exc).__name__}: {exc}); rerun "
                           f"benchmarks/measure_kernels.py to write it again") from None


def _seconds(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise InvalidValue(f"{what}: seconds must be a positive finite number, got {value!r}")
    return float(value)


def _optional_seconds(value: Any, what: str) -> Optional[float]:
    return None if value is None else _seconds(value, what)


def _read_json(path: str, what: str) -> Any:
    """The JSON document at *path*; gzipped where it ends ``.gz`` (torch.profiler's tensorboard_trace_handler)."""
    if str(path).endswith(".gz"):
        import gzip
        try:
            with gzip.open(path, "rt", encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            raise InvalidValue(f"{what} {path}: cannot read it as gzipped UTF-8 text ({exc})") from None
    else:
        text = read_text(path, what)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidValue(f"{what} {path} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}): "
                           f"truncated, or not the file it was written to") from None
    except RecursionError:
        raise InvalidValue(f"{what} {path}: JSON nested too deeply to read") from None


# ---------------------------------------------------------------------------
# a torch.profiler Chrome trace
# ---------------------------------------------------------------------------
def read_trace(path: str) -> KernelPoints:
    """The GEMM and elementwise points, launch floor and dispatch figures of a ``torch.profiler`` Chrome trace.

    An op counted is the innermost GEMM op (``aten::matmul`` runs ``aten::mm``: the ``mm`` counts) and the
    outermost elementwise op outside any GEMM; it is timed by the device events (``"cat": "kernel"``,
    ``gpu_memcpy``, ``gpu_memset``) of it and the ops under it, matched by ``args["External id"]`` or, where
    a kernel lacks one, through its launch's ``args.correlation``; on a trace without device events, by
    its own CPU duration. Where a GPU ran, the launch floor is the 5th percentile of the start-to-start
    period of consecutive kernels on a stream whose second was already launched when the first ended (the
    GPU fed back to back), and the dispatch figure the median start-to-start period of consecutive launch
    calls on a host thread where the GPU had finished the first's kernel before the second launch (the host
    the bottleneck): an estimate that includes the Python between ops. Fewer than
    :data:`MIN_TIMELINE_PAIRS` such pairs fit neither.
    """
    doc = _read_json(path, "trace")
    events = doc.get("traceEvents") if isinstance(doc, Mapping) else doc
    if not isinstance(events, list) or not all(isinstance(e, Mapping) for e in events):
        raise InvalidValue(f"{path} is not a Chrome trace (expected {{\"traceEvents\": [...]}} as "
                           f"torch.profiler's export_chrome_trace writes)")
    try:
        ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "operator")]
        device = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_CATEGORIES]
        launches = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver")
                    and "Launch" in str(e.get("name"))]
        return _points_from_events(path, ops, device, launches)
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, InvalidValue):
            raise
        raise InvalidValue(f"{path}: malformed trace event ({type(exc).__name__}: {exc}); pass the file "
                           f"torch.profiler's export_chrome_trace wrote") from None


def _points_from_events(path: str, ops: List[Mapping[str, Any]], device: List[Mapping[str, Any]],
                        launches: List[Mapping[str, Any]]) -> KernelPoints:
    gemm_ops = [i for i, e in enumerate(ops) if e.get("name") in GEMM_OPS]
    if not gemm_ops:
        raise InvalidValue(f"{path}: the trace holds no matmul ({', '.join(GEMM_OPS)}): profile the steps that "
                           f"run them, with torch.profiler's CPU activity")
    if not any("Input Dims" in ops[i].get("args", {}) for i in gemm_ops):
        raise InvalidValue(f"{path}: the trace's matmuls carry no \"Input Dims\": profile with "
                           f"torch.profiler.profile(record_shapes=True)")
    parent = _parents(ops)
    is_gemm = [e.get("name") in GEMM_OPS for e in ops]
    gemm_below = [False] * len(ops)   # a GEMM op runs under this one
    for i in gemm_ops:
        j = parent[i]
        while j is not None and not gemm_below[j]:
            gemm_below[j] = True
            j = parent[j]

    def ancestors(i):
        j = parent[i]
        while j is not None:
            yield j
            j = parent[j]

    counted = {i for i in gemm_ops if not gemm_below[i]}
    counted |= {i for i, e in enumerate(ops) if e.get("name") in ELEMENTWISE_OPS
                and not any(is_gemm[j] or ops[j].get("name") in ELEMENTWISE_OPS for j in ancestors(i))}
    owner = {}  # an op's counted self or nearest counted ancestor
    for i in range(len(ops)):
        owner[i] = i if i in counted else next((j for j in ancestors(i) if j in counted), None)
    by_external = {e["args"]["External id"]: i for i, e in enumerate(ops) if "External id" in e.get("args", {})}
    launch_external = {e["args"]["correlation"]: e["args"].get("External id") for e in launches
                       if "correlation" in e.get("args", {})}
    device_seconds: Dict[int, float] = {}
    for kernel in device:
        args = kernel.get("args", {})
        external = args.get("External id", launch_external.get(args.get("correlation")))
        op = by_external.get(external)
        counted_op = owner[op] if op is not None else None
        if counted_op is not None:
            device_seconds[counted_op] = device_seconds.get(counted_op, 0.0) + float(kernel["dur"]) * 1e-6
    gpu = bool(device)
    skipped: Dict[str, int] = {}
    gemm: List[GemmPoint] = []
    elementwise: List[ElementwisePoint] = []
    for i in sorted(counted):
        e = ops[i]
        seconds = device_seconds.get(i) if gpu else float(e["dur"]) * 1e-6
        if seconds is None or seconds <= 0:
            why = "ops without a device event matched" if gpu else "ops of zero duration"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        args = e.get("args", {})
        if is_gemm[i]:
            point = _gemm_point(e["name"], args.get("Input Dims"), args.get("Input type"), seconds)
            if point is None:
                skipped["matmuls without readable shapes"] = skipped.get("matmuls without readable shapes", 0) + 1
            else:
                gemm.append(point)
        else:
            moved = _elementwise_bytes(e["name"], args.get("Input Dims"), args.get("Input type"))
            if moved is None:
                skipped["elementwise ops without readable shapes"] = \
                    skipped.get("elementwise ops without readable shapes", 0) + 1
            else:
                elementwise.append(ElementwisePoint(bytes=moved, seconds=seconds, op=e["name"]))
    launch, launch_pairs, dispatch, dispatch_pairs = _timeline(device, launches) if gpu else (None, 0, None, 0)
    return KernelPoints(source=f"torch.profiler trace {path}", device="cuda" if gpu else "cpu", gemm=tuple(gemm),
                        elementwise=tuple(elementwise), launch_seconds=launch, launch_samples=launch_pairs,
                        dispatch_seconds=dispatch, dispatch_samples=dispatch_pairs, skipped=skipped)


def _parents(ops: List[Mapping[str, Any]]) -> List[Optional[int]]:
    """Each op's enclosing op on its thread (the Chrome trace nests by time), None for a top-level one."""
    parent: List[Optional[int]] = [None] * len(ops)
    threads: Dict[Tuple[Any, Any], List[int]] = {}
    for i, e in enumerate(ops):
        threads.setdefault((e.get("pid"), e.get("tid")), []).append(i)
    for members in threads.values():
        members.sort(key=lambda i: (float(ops[i]["ts"]), -float(ops[i]["dur"])))
        stack: List[int] = []
        for i in members:
            start = float(ops[i]["ts"])
            while stack and float(ops[stack[-1]]["ts"]) + float(ops[stack[-1]]["dur"]) <= start:
                stack.pop()
            parent[i] = stack[-1] if stack else None
            stack.append(i)
    return parent


def _gemm_point(name: str, dims: Any, types: Any, seconds: float) -> Optional[GemmPoint]:
    """(m, n, k, batch, dtype) of a GEMM op from its "Input Dims" and "Input type"; None where unreadable."""
    try:
        first = 1 if name == "aten::addmm" else 0        # addmm(bias, mat1, mat2, beta, alpha)
        a, b = [list(map(int, d)) for d in dims[first:first + 2]]
        dtype = TRACE_DTYPES.get(types[first], (None,))[0]
    except (TypeError, ValueError, IndexError):
        return None
    if dtype is None or not a or not b:
        return None
    a = [1] + a if len(a) == 1 else a                      # a vector operand of matmul is one row / column
    b = b + [1] if len(b) == 1 else b
    if a[-1] != b[-2]:
        return None
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
    if min(a[-2], b[-1], a[-1], batch) <= 0:
        return None
    return GemmPoint(m=a[-2], n=b[-1], k=a[-1], batch=batch, dtype=dtype, seconds=seconds, op=name)


def _elementwise_bytes(name: str, dims: Any, types: Any) -> Optional[int]:
    """Bytes an elementwise op reads and writes, from its tensor inputs (a 0-d one, a scalar, aside)."""
    try:
        tensors = [(list(map(int, d)), TRACE_DTYPES[t][1]) for d, t in zip(dims, types, strict=False)
                   if isinstance(d, list) and d and t in TRACE_DTYPES]
    except (TypeError, ValueError):
        return None
    if not tensors:
        return None
    read = sum(math.prod(shape) * size for shape, size in tensors)
    if name == "aten::copy_":
        return read
    rank = max(len(shape) for shape, _ in tensors)
    padded = [[1] * (rank - len(shape)) + shape for shape, _ in tensors]
    out = math.prod(max(column) for column in zip(*padded, strict=True))
    return read + out * tensors[0][1]


def _consecutive(events: List[Mapping[str, Any]]):
    """Each pair of events one after the other on the same stream or thread (``pid``, ``tid``), by start time."""
    lanes: Dict[Tuple[Any, Any], List[Mapping[str, Any]]] = {}
    for e in events:
        lanes.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for members in lanes.values():
        members.sort(key=lambda e: float(e["ts"]))
        yield from zip(members, members[1:], strict=False)


def _timeline(device: List[Mapping[str, Any]], launches: List[Mapping[str, Any]]
              ) -> Tuple[Optional[float], int, Optional[float], int]:
    """The launch floor and dispatch seconds of a GPU timeline, and the pairs behind each (see read_trace)."""
    kernels = [e for e in device if e.get("cat") == "kernel"]
    launch_end = {e["args"]["correlation"]: float(e["ts"]) + float(e["dur"]) for e in launches
                  if "correlation" in e.get("args", {})}
    kernel_end = {e["args"]["correlation"]: float(e["ts"]) + float(e["dur"]) for e in kernels
                  if "correlation" in e.get("args", {})}
    fed = [(float(second["ts"]) - float(first["ts"])) * 1e-6 for first, second in _consecutive(kernels)
           if (queued := launch_end.get(second.get("args", {}).get("correlation"))) is not None
           and queued <= float(first["ts"]) + float(first["dur"])]
    starved = [(float(second["ts"]) - float(first["ts"])) * 1e-6 for first, second in _consecutive(launches)
               if (done := kernel_end.get(first.get("args", {}).get("correlation"))) is not None
               and done <= float(second["ts"])]
    launch = float(np.percentile(fed, 5)) if len(fed) >= MIN_TIMELINE_PAIRS else None
    dispatch = float(np.median(starved)) if len(starved) >= MIN_TIMELINE_PAIRS else None
    return launch, len(fed), dispatch, len(starved)
