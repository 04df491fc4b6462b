"""What a kernel achieves on a device: GEMM efficiency by shape, elementwise efficiency by size, launch costs.

A hardware file may state measured figures (``kernel_tables``, parsed and
validated by :func:`parse_kernel_tables`); where it does not, GEMMs take the
analytic prior of :func:`prior_gemm_efficiency`, elementwise kernels the
constant ``efficiency.memory`` and launches the round priors below. The time
model (:func:`ndcost.compose.time.layer_seconds`) reads this module through
:func:`gemm_efficiency`, :func:`elementwise_efficiency` and :func:`launch_costs`,
all vectorized over numpy arrays. No torch.

Schema (docs/calibration.md, "Kernel tables")::

    kernel_tables:
      gemm:
        bf16: {m: [...], n: [...], k: [...], efficiency: [[[...]]]}  # achieved / dtype peak, len(m) x len(n) x len(k)
      elementwise: {bytes: [...], efficiency: [...]}                 # achieved / HBM bandwidth
      launch_seconds: 4.0e-6
      dispatch_seconds: 1.2e-5
      source: "..."
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidValue
from ndcost.values import DTYPES

KERNEL_TABLE_KEYS = ("gemm", "elementwise", "launch_seconds", "dispatch_seconds", "source")
GEMM_AXES = ("m", "n", "k")

# The output tile the prior quantizes on: CUTLASS's and cuBLAS's common 128 x 128 tensor-core tile
# (CUTLASS media/docs/efficient_gemm.md, "Hierarchical Structure": a threadblock computes one output tile).
GEMM_TILE = 128
# The "large square GEMM" whose prior lands exactly at the hardware's stated efficiency.matmul.
REFERENCE_GEMM = (8192, 8192, 8192)

# Priors where a hardware states no launch figures. A CUDA kernel occupies the GPU for at least a few
# microseconds even when it does nothing (back-to-back empty kernels run at a few hundred thousand a second:
# an order-of-magnitude figure, not measured here). Dispatch is the host's work, not the device's (Python,
# Transformers' module calls, the dispatcher, autograd's recording, the launch call), so every device takes
# the one figure measured: ``ndcost calibrate`` fitted 39.2 us an op on the H200 host's eager Transformers
# layers (specs/hardware/h200.yaml, kernel_tables.source; docs/calibration.md).
PRIOR_LAUNCH_SECONDS = 2.0e-6
PRIOR_DISPATCH_SECONDS = 3.92e-5


@attrs.frozen(kw_only=True, eq=False)
class GemmTable:
    """Achieved / peak of one dtype's GEMMs on a log2 grid of (m, n, k), read trilinearly in log2 space."""

    log2_m: np.ndarray
    log2_n: np.ndarray
    log2_k: np.ndarray
    efficiency: np.ndarray  # (len(m), len(n), len(k))


@attrs.frozen(kw_only=True, eq=False)
class ElementwiseTable:
    """Achieved / HBM bandwidth of an elementwise kernel by the bytes it moves, linear in log2 bytes."""

    log2_bytes: np.ndarray
    efficiency: np.ndarray


@attrs.frozen(kw_only=True, eq=False)
class KernelTables:
    """A hardware's kernel tables; what a file leaves out is None (its prior applies)."""

    gemm: Mapping[str, GemmTable]
    elementwise: Optional[ElementwiseTable]
    launch_seconds: Optional[float]
    dispatch_seconds: Optional[float]
    source: str


def _axis(owner: str, key: str, value: Any) -> np.ndarray:
    if not isinstance(value, (list, tuple)) or not value:
        raise InvalidValue(f"{owner}: kernel_tables.{key} must be a non-empty list of positive numbers, got {value!r}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise InvalidValue(f"{owner}: kernel_tables.{key} holds {v!r}; its values are positive numbers")
    axis = np.asarray(value, dtype=np.float64)
    if np.any(np.diff(axis) <= 0):
        raise InvalidValue(f"{owner}: kernel_tables.{key} must be strictly increasing, got {list(value)!r}")
    return np.log2(axis)


def _fractions(owner: str, key: str, value: Any, shape: Tuple[int, ...]) -> np.ndarray:
    try:
        array = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InvalidValue(f"{owner}: kernel_tables.{key} must be nested lists of numbers of shape "
                           f"{' x '.join(map(str, shape))}") from None
    if array.shape != shape:
        raise InvalidValue(f"{owner}: kernel_tables.{key} has shape {' x '.join(map(str, array.shape)) or 'scalar'}; "
                           f"its axes make it {' x '.join(map(str, shape))}")
    bad = ~(np.isfinite(array) & (array > 0) & (array <= 1))
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidValue(f"{owner}: kernel_tables.{key}{list(where)} = {float(array[where])!r} is outside (0, 1] "
                           f"(achieved over peak)")
    array.setflags(write=False)
    return array


def _seconds(owner: str, key: str, value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidValue(f"{owner}: kernel_tables.{key} must be a number of seconds >= 0, got {value!r}")
    return float(value)


def parse_kernel_tables(owner: str, data: Any) -> KernelTables:
    """A hardware file's ``kernel_tables`` checked and read; errors name *owner* and the key."""
    if not isinstance(data, Mapping):
        raise InvalidValue(f"{owner}: kernel_tables must be a mapping of {', '.join(KERNEL_TABLE_KEYS)}, got {data!r}")
    unknown = sorted(str(k) for k in data if k not in KERNEL_TABLE_KEYS)
    if unknown:
        raise InvalidValue(f"{owner}: kernel_tables has unknown key(s) {', '.join(unknown)}; "
                           f"known: {', '.join(KERNEL_TABLE_KEYS)}")
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise InvalidValue(f"{owner}: kernel_tables.source must say where the figures came from (the measurement "
                           f"and device, or 'prior: ...' with its derivation), got {source!r}")
    gemm = data.get("gemm") or {}
    if not isinstance(gemm, Mapping):
        raise InvalidValue(f"{owner}: kernel_tables.gemm must map a dtype (bf16, ...) to its table, got {gemm!r}")
    tables = {}
    for dtype, table in gemm.items():
        key = f"gemm.{dtype}"
        if not isinstance(table, Mapping) or sorted(table) != sorted(GEMM_AXES + ("efficiency",)):
            raise InvalidValue(f"{owner}: kernel_tables.{key} must state exactly m, n, k and efficiency, got "
                               f"{sorted(table) if isinstance(table, Mapping) else table!r}")
        axes = [_axis(owner, f"{key}.{name}", table[name]) for name in GEMM_AXES]
        values = _fractions(owner, f"{key}.efficiency", table["efficiency"], tuple(len(a) for a in axes))
        tables[str(dtype)] = GemmTable(log2_m=axes[0], log2_n=axes[1], log2_k=axes[2], efficiency=values)
    elementwise = data.get("elementwise")
    table_e = None
    if elementwise is not None:
        if not isinstance(elementwise, Mapping) or sorted(elementwise) != ["bytes", "efficiency"]:
            raise InvalidValue(f"{owner}: kernel_tables.elementwise must state exactly bytes and efficiency, got "
                               f"{elementwise!r}")
        axis = _axis(owner, "elementwise.bytes", elementwise["bytes"])
        table_e = ElementwiseTable(log2_bytes=axis, efficiency=_fractions(
            owner, "elementwise.efficiency", elementwise["efficiency"], (len(axis),)))
    return KernelTables(gemm=tables, elementwise=table_e,
                        launch_seconds=_seconds(owner, "launch_seconds", data.get("launch_seconds")),
                        dispatch_seconds=_seconds(owner, "dispatch_seconds", data.get("dispatch_seconds")),
                        source=source.strip())


# ---------------------------------------------------------------------------
# lookups
# ---------------------------------------------------------------------------
def _cell(log2_axis: np.ndarray, values) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lower and upper grid index and the weight of the upper one, clamped at the edges (log2 space)."""
    x = np.clip(np.log2(values), log2_axis[0], log2_axis[-1])
    if len(log2_axis) == 1:
        zero = np.zeros(np.shape(x), dtype=np.int64)
        return zero, zero, np.zeros(np.shape(x))
    lo = np.clip(np.searchsorted(log2_axis, x, side="right") - 1, 0, len(log2_axis) - 2)
    return lo, lo + 1, (x - log2_axis[lo]) / (log2_axis[lo + 1] - log2_axis[lo])


def table_gemm_efficiency(table: GemmTable, m, n, k) -> np.ndarray:
    """The table's efficiency at (m, n, k): trilinear in (log2 m, log2 n, log2 k), clamped at the grid's edges."""
    (m0, m1, tm), (n0, n1, tn), (k0, k1, tk) = (_cell(table.log2_m, m), _cell(table.log2_n, n),
                                                _cell(table.log2_k, k))
    e = table.efficiency
    out = 0.0
    for mi, wm in ((m0, 1.0 - tm), (m1, tm)):
        for ni, wn in ((n0, 1.0 - tn), (n1, tn)):
            for ki, wk in ((k0, 1.0 - tk), (k1, tk)):
                out = out + e[mi, ni, ki] * (wm * wn * wk)
    return np.asarray(out)


def _shape_factor(m, n, k, sm_count: Optional[int], bytes_per_flop: float, element_bytes: float,
                  groups: Any = 1.0) -> Any:
    tiles = groups * np.ceil(m / GEMM_TILE) * np.ceil(n / GEMM_TILE)
    slots = np.ceil(tiles / sm_count) * sm_count if sm_count else tiles  # whole waves of tiles
    waves = groups * m * n / (slots * GEMM_TILE * GEMM_TILE)
    intensity = 2.0 * m * n * k / (element_bytes * (m * k + k * n + m * n))
    return waves * np.minimum(1.0, intensity * bytes_per_flop)  # intensity / ridge, the ridge peak / HBM


def prior_gemm_efficiency(m, n, k, *, stated: float, sm_count: Optional[int], peak_flops_per_second: float,
                          hbm_bytes_per_second: float, element_bytes: float, groups=1.0) -> np.ndarray:
    """The analytic prior of a GEMM's efficiency, ``(m x k) @ (k x n)``, vectorized: no measurement behind it.

    ``f(m, n, k) = waves x roof``, normalized so :data:`REFERENCE_GEMM` lands at *stated* (the hardware's
    ``efficiency.matmul``, fitted on large GEMMs), and capped at 1:

    - waves: the output is cut into ``GEMM_TILE`` x ``GEMM_TILE`` tiles, one streaming multiprocessor
      a tile at a time; ``T = ceil(m / 128) ceil(n / 128)`` tiles run in ``ceil(T / sm_count)`` waves,
      so the useful share of the SM-tile slots is ``m n / (ceil(T / sm_count) sm_count 128^2)`` (tile
      and wave quantization together; without ``sm_count``, tile quantization alone); a grouped GEMM of
      *groups* equal problems (the experts of one rank) schedules all their tiles in one grid;
    - roof: the roofline on arithmetic intensity ``I = 2 m n k / (bytes (m k + k n + m n))`` (A and B
      read once, C written once), ``min(1, I / ridge)`` with ``ridge = peak / HBM bandwidth``.

    Left out: split-K and stream-K schedules and the other tile shapes a library picks for awkward
    shapes (the prior is pessimistic there), L2 reuse, the epilogue, clock changes under load.
    """
    bytes_per_flop = np.float64(hbm_bytes_per_second) / np.float64(peak_flops_per_second)  # inf, not an error
    m, n, k = (np.asarray(v, dtype=np.float64) for v in (m, n, k))
    reference = _shape_factor(*REFERENCE_GEMM, sm_count, bytes_per_flop, element_bytes)
    return np.minimum(1.0, stated * _shape_factor(m, n, k, sm_count, bytes_per_flop, element_bytes, groups) / reference)


def gemm_efficiency(hardware: Any, tables: Optional[KernelTables], dtype: str, m, n, k, *, stated: float,
                    groups=1.0) -> np.ndarray:
    """Achieved / peak of *dtype* GEMMs at (m, n, k): the hardware's table for the dtype (one problem's
    shape: *groups* is the prior's only), else the prior."""
    table = tables.gemm.get(dtype) if tables is not None else None
    if table is not None:
        return table_gemm_efficiency(table, m, n, k)
    return prior_gemm_efficiency(m, n, k, stated=stated, sm_count=hardware.sm_count,
                                 peak_flops_per_second=hardware.peak_flops(dtype),
                                 hbm_bytes_per_second=float(hardware.hbm_bytes_per_second),
                                 element_bytes=float(DTYPES[dtype]), groups=groups)


def elementwise_efficiency(tables: Optional[KernelTables], bytes_per_kernel, *, stated: float):
    """Achieved / HBM bandwidth of elementwise kernels moving *bytes_per_kernel*: the table, else *stated*."""
    if tables is None or tables.elementwise is None:
        return stated
    table = tables.elementwise
    x = np.log2(np.maximum(np.asarray(bytes_per_kernel, dtype=np.float64), 1.0))
    return np.interp(x, table.log2_bytes, table.efficiency)


def launch_costs(tables: Optional[KernelTables]) -> Tuple[float, float, str]:
    """(launch_seconds, dispatch_seconds, where they came from): the hardware's tables, else the priors."""
    launch = tables.launch_seconds if tables is not None else None
    dispatch = tables.dispatch_seconds if tables is not None else None
    source = ("kernel_tables" if launch is not None and dispatch is not None else
              "prior" if launch is None and dispatch is None else "kernel_tables and prior")
    return (PRIOR_LAUNCH_SECONDS if launch is None else launch,
            PRIOR_DISPATCH_SECONDS if dispatch is None else dispatch, source)
