"""What a kernel achieves on a device: GEMM efficiency by shape, attention by kernel and shape, elementwise
efficiency by size, launch costs.

A hardware file may state measured figures (``kernel_tables``, parsed and
validated by :func:`parse_kernel_tables`); where it does not, GEMMs take the
analytic prior of :func:`prior_gemm_efficiency`, an attention kernel the prior of
:func:`prior_attention_efficiency` where the file states the kernel's plateau
(else the constant ``efficiency.attention``), elementwise kernels the constant
``efficiency.memory`` and launches the round priors below. The time model
(:func:`ndcost.compose.time.layer_seconds`) reads this module through
:func:`gemm_efficiency`, :func:`attention_efficiency`,
:func:`elementwise_efficiency` (:func:`elementwise_efficiencies`) and :func:`launch_costs`, all vectorized over
numpy arrays. No torch.

Schema (docs/calibration.md, "Kernel tables")::

    kernel_tables:
      gemm:
        bf16: {m: [...], n: [...], k: [...], efficiency: [[[...]]]}  # achieved / dtype peak, len(m) x len(n) x len(k)
      gemm_shape:                                                    # measured elsewhere, read for its shape alone:
        bf16: {m: [...], n: [...], k: [...], efficiency: [[[...]]]}  # its best cell lands at efficiency.matmul
        source: "..."
      attention:                                                     # per kernel (flash, efficient, ...)
        flash:
          plateau: {forward: 0.35, backward: 0.24}                   # the prior's full-occupancy share of peak
          bf16:                                                      # measured rows, per dtype
            - {seq: 4096, heads: 32, head_dim: 128, causal: true, forward: 0.55, backward: 0.40}
          source: "..."
      sdpa_backends: [flash, efficient]                              # the order SDPA tries its backends
      elementwise: {bytes: [...], efficiency: [...]}                 # achieved / HBM bandwidth
      launch_seconds: 4.0e-6
      dispatch_seconds: 1.2e-5
      source: "..."
"""
from __future__ import annotations

import functools
import math
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidValue
from ndcost.values import DTYPES, capability_tuple

KERNEL_TABLE_KEYS = ("gemm", "gemm_shape", "attention", "sdpa_backends", "elementwise", "launch_seconds",
                     "dispatch_seconds", "source")
GEMM_AXES = ("m", "n", "k")
ATTENTION_ROW_KEYS = ("seq", "heads", "head_dim", "causal", "forward", "backward")
PASSES = ("forward", "backward")

# The output tile the prior quantizes on: CUTLASS's and cuBLAS's common 128 x 128 tensor-core tile
# (CUTLASS media/docs/efficient_gemm.md, "Hierarchical Structure": a threadblock computes one output tile).
GEMM_TILE = 128
# The "large square GEMM" whose prior lands exactly at the hardware's stated efficiency.matmul.
REFERENCE_GEMM = (8192, 8192, 8192)

# The query rows one thread block of an attention kernel takes: FlashAttention-2's kBlockM for head widths up
# to 128 (flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim64/128 on sm80+;
# PyTorch's flash backend vendors these kernels, aten/src/ATen/native/transformers/cuda/flash_attn); its grid is
# (query blocks, batch, heads). The prior assumes one resident block an SM (from memory, not read off the
# launch: where an SM holds two, the waves are half as many).
ATTENTION_QUERY_BLOCK = 128
SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math")
# PyTorch's default order (sdp_utils.cpp ``priority_order``: flash, efficient, math, cudnn; math never reached
# here, as efficient takes every dtype and width a model has). A hardware file's ``sdpa_backends`` states
# another where its torch prefers cuDNN (``check_prefer_cudnn_attention``, sm90 and sm100: from torch 2.9,
# pytorch/pytorch#162073, with cuDNN >= 9.9; from 2.10 above 9.15, which torch 2.11's wheels bundle).
DEFAULT_SDPA_BACKENDS = ("flash", "efficient")


def runtime_sdpa_backends(by_capability: Mapping[str, Tuple[str, ...]], compute_capability: Optional[str]
                          ) -> Tuple[str, ...]:
    """The order a runtime's own attention tries the kernels (``RuntimeProfile.attention_backends``: an order by
    the least CUDA compute capability it applies from) on a device of *compute_capability*: the entry of the
    greatest capability at most the device's; () where none applies or the device states none (SDPA's order, the
    hardware's ``kernel_tables.sdpa_backends``, applies)."""
    device = capability_tuple(compute_capability) if compute_capability is not None else None
    if device is None:
        return ()
    applies = [(least, order) for least, order in ((capability_tuple(c), order) for c, order in by_capability.items())
               if least is not None and least <= device]
    return tuple(max(applies)[1]) if applies else ()

# Priors where a hardware states no launch figures. A CUDA kernel occupies the GPU for at least a few
# microseconds even when it does nothing (back-to-back empty kernels run at a few hundred thousand a second:
# an order-of-magnitude figure, not measured here). Dispatch is the host's work, not the device's (Python,
# Transformers' module calls, the dispatcher, autograd's recording, the launch call), so every device takes
# the one figure measured: ``ndcost calibrate`` fitted 38.1 us an op on the H200 host's eager Transformers
# layers (specs/hardware/h200.yaml, kernel_tables.source; docs/calibration.md).
PRIOR_LAUNCH_SECONDS = 2.0e-6
PRIOR_DISPATCH_SECONDS = 3.81e-5


@attrs.frozen(kw_only=True, eq=False)
class GemmTable:
    """Achieved / peak of one dtype's GEMMs on a log2 grid of (m, n, k), read trilinearly in log2 space."""

    log2_m: np.ndarray
    log2_n: np.ndarray
    log2_k: np.ndarray
    efficiency: np.ndarray  # (len(m), len(n), len(k))
    best: float = attrs.field(init=False)

    @best.default
    def _best(self) -> float:
        return float(self.efficiency.max())


@attrs.frozen(kw_only=True, eq=False)
class ElementwiseTable:
    """Achieved / HBM bandwidth of an elementwise kernel by the bytes it moves, linear in log2 bytes."""

    log2_bytes: np.ndarray
    efficiency: np.ndarray


@attrs.frozen(kw_only=True, eq=False)
class AttentionCurve:
    """One (head_dim, causal, heads) slice of an attention table: efficiency by log2 seq, both passes."""

    head_dim: float
    causal: bool
    heads: float
    log2_seq: np.ndarray
    forward: np.ndarray
    backward: np.ndarray


@attrs.frozen(kw_only=True, eq=False)
class AttentionKernelTable:
    """An attention kernel's figures on a hardware: its measured curves per dtype, its prior's plateau
    (forward, backward achieved / peak at full occupancy; None where unstated) and their source.

    A backward's share counts its FLOPs as twice the forward's (``Q K^T`` and ``P V`` each twice), as the time
    model and ``benchmarks/measure_kernels.py`` do; FlashAttention's papers count 2.5 times (the scores
    recomputed: ``flops()`` in Dao-AILab/flash-attention benchmarks/benchmark_flash_attention.py), so their
    backward share is stated x 2 / 2.5."""

    curves: Mapping[str, Tuple[AttentionCurve, ...]]
    plateau: Optional[Tuple[float, float]]
    source: str


@attrs.frozen(kw_only=True, eq=False)
class KernelTables:
    """A hardware's kernel tables; what a file leaves out is None (its prior applies)."""

    gemm: Mapping[str, GemmTable]
    elementwise: Optional[ElementwiseTable]
    launch_seconds: Optional[float]
    dispatch_seconds: Optional[float]
    source: str
    attention: Mapping[str, AttentionKernelTable] = attrs.field(factory=dict)
    # GEMM tables measured on the same chip under another software stack or clock (gemm_shape): their shape
    # dependence alone, the best cell scaled to the file's efficiency.matmul
    gemm_shape: Mapping[str, GemmTable] = attrs.field(factory=dict)
    gemm_shape_source: str = ""
    sdpa_backends: Tuple[str, ...] = DEFAULT_SDPA_BACKENDS


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


def _fraction(owner: str, key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and 0 < value <= 1):
        raise InvalidValue(f"{owner}: kernel_tables.{key} = {value!r} is outside (0, 1] (achieved over peak)")
    return float(value)


def _attention_rows(owner: str, key: str, rows: Any) -> Tuple[AttentionCurve, ...]:
    """A kernel's rows of one dtype, grouped by (head_dim, causal, heads) into curves over log2 seq."""
    if not isinstance(rows, (list, tuple)) or not rows:
        raise InvalidValue(f"{owner}: kernel_tables.{key} must be a non-empty list of rows "
                           f"{{{', '.join(ATTENTION_ROW_KEYS)}}}, got {rows!r}")
    groups: Dict[Tuple[float, bool, float], Dict[float, Tuple[float, float]]] = {}
    for i, row in enumerate(rows):
        where = f"{key}[{i}]"
        if not isinstance(row, Mapping) or sorted(row) != sorted(ATTENTION_ROW_KEYS):
            raise InvalidValue(f"{owner}: kernel_tables.{where} must state exactly {', '.join(ATTENTION_ROW_KEYS)}, "
                               f"got {sorted(row) if isinstance(row, Mapping) else row!r}")
        for name in ("seq", "heads", "head_dim"):
            v = row[name]
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidValue(f"{owner}: kernel_tables.{where}.{name} must be a positive integer, got {v!r}")
        if not isinstance(row["causal"], bool):
            raise InvalidValue(f"{owner}: kernel_tables.{where}.causal must be true or false, got {row['causal']!r}")
        curve = groups.setdefault((float(row["head_dim"]), row["causal"], float(row["heads"])), {})
        if float(row["seq"]) in curve:
            raise InvalidValue(f"{owner}: kernel_tables.{where} repeats seq {row['seq']} at head_dim "
                               f"{row['head_dim']}, heads {row['heads']}, causal {row['causal']}; state each once")
        curve[float(row["seq"])] = (_fraction(owner, f"{where}.forward", row["forward"]),
                                    _fraction(owner, f"{where}.backward", row["backward"]))
    out = []
    for (head_dim, causal, heads), points in sorted(groups.items()):
        seqs = sorted(points)
        out.append(AttentionCurve(head_dim=head_dim, causal=causal, heads=heads, log2_seq=np.log2(seqs),
                                  forward=np.array([points[q][0] for q in seqs]),
                                  backward=np.array([points[q][1] for q in seqs])))
    return tuple(out)


def _known_keys(owner: str, key: str, data: Mapping, known: Sequence[str], known_text: str) -> None:
    unknown = sorted(str(k) for k in data if k not in known)
    if unknown:
        raise InvalidValue(f"{owner}: kernel_tables{key} has unknown key(s) {', '.join(unknown)}; known: {known_text}")


def _source(owner: str, key: str, data: Mapping, what: str) -> str:
    source = data.get("source")
    if not isinstance(source, str) or not source.strip():
        raise InvalidValue(f"{owner}: kernel_tables{key}.source must say where {what}, got {source!r}")
    return source.strip()


def _attention(owner: str, data: Any) -> Dict[str, AttentionKernelTable]:
    if not isinstance(data, Mapping):
        raise InvalidValue(f"{owner}: kernel_tables.attention must map a kernel name (flash, efficient, ...) to its "
                           f"plateau, rows per dtype and source, got {data!r}")
    out = {}
    for kernel, entry in data.items():
        key = f"attention.{kernel}"
        if not isinstance(entry, Mapping):
            raise InvalidValue(f"{owner}: kernel_tables.{key} must be a mapping of plateau, source and dtypes, "
                               f"got {entry!r}")
        _known_keys(owner, f".{key}", entry, ("plateau", "source", *DTYPES),
                    f"plateau, source and the dtypes {', '.join(DTYPES)}")
        source = _source(owner, f".{key}", entry,
                         "its figures came from (the measurement, or the paper and figure of a plateau)")
        plateau = entry.get("plateau")
        if plateau is not None:
            if not isinstance(plateau, Mapping) or sorted(plateau) != sorted(PASSES):
                raise InvalidValue(f"{owner}: kernel_tables.{key}.plateau must state exactly forward and backward, "
                                   f"got {plateau!r}")
            plateau = tuple(_fraction(owner, f"{key}.plateau.{p}", plateau[p]) for p in PASSES)
        curves = {str(d): _attention_rows(owner, f"{key}.{d}", rows) for d, rows in entry.items() if d in DTYPES}
        if plateau is None and not curves:
            raise InvalidValue(f"{owner}: kernel_tables.{key} states neither a plateau nor rows; give one or drop it")
        out[str(kernel)] = AttentionKernelTable(curves=curves, plateau=plateau, source=source)
    return out


def _sdpa_backends(owner: str, value: Any) -> Tuple[str, ...]:
    if value is None:
        return DEFAULT_SDPA_BACKENDS
    if (not isinstance(value, (list, tuple)) or not value or len(set(map(str, value))) != len(value)
            or any(v not in SDPA_BACKENDS for v in value)):
        raise InvalidValue(f"{owner}: kernel_tables.sdpa_backends must list SDPA's backends in the order its torch "
                           f"tries them, each once, from {', '.join(SDPA_BACKENDS)}; got {value!r}")
    return tuple(value)


def _gemm_tables(owner: str, name: str, data: Any) -> Dict[str, GemmTable]:
    """``kernel_tables.<name>`` (gemm or gemm_shape): a dtype's table each."""
    if not isinstance(data, Mapping):
        raise InvalidValue(f"{owner}: kernel_tables.{name} must map a dtype (bf16, ...) to its table, got {data!r}")
    tables = {}
    for dtype, table in data.items():
        key = f"{name}.{dtype}"
        if dtype not in DTYPES:
            raise InvalidValue(f"{owner}: kernel_tables.{key}: {dtype!r} is not a dtype; known: {', '.join(DTYPES)}")
        if not isinstance(table, Mapping) or sorted(table) != sorted(GEMM_AXES + ("efficiency",)):
            raise InvalidValue(f"{owner}: kernel_tables.{key} must state exactly m, n, k and efficiency, got "
                               f"{sorted(table) if isinstance(table, Mapping) else table!r}")
        axes = [_axis(owner, f"{key}.{axis}", table[axis]) for axis in GEMM_AXES]
        values = _fractions(owner, f"{key}.efficiency", table["efficiency"], tuple(len(a) for a in axes))
        tables[str(dtype)] = GemmTable(log2_m=axes[0], log2_n=axes[1], log2_k=axes[2], efficiency=values)
    return tables


def parse_kernel_tables(owner: str, data: Any) -> KernelTables:
    """A hardware file's ``kernel_tables`` checked and read; errors name *owner* and the key."""
    if not isinstance(data, Mapping):
        raise InvalidValue(f"{owner}: kernel_tables must be a mapping of {', '.join(KERNEL_TABLE_KEYS)}, got {data!r}")
    _known_keys(owner, "", data, KERNEL_TABLE_KEYS, ", ".join(KERNEL_TABLE_KEYS))
    source = _source(owner, "", data, "the figures came from (the measurement and device, or 'prior: ...' with its "
                                      "derivation)")
    tables = _gemm_tables(owner, "gemm", data.get("gemm") or {})
    shape_data = data.get("gemm_shape") or {}
    if not isinstance(shape_data, Mapping):
        raise InvalidValue(f"{owner}: kernel_tables.gemm_shape must map a dtype to its table, and source to where "
                           f"they were measured, got {shape_data!r}")
    shape_source = _source(owner, ".gemm_shape", shape_data, "its GEMMs were measured (the table, its commit, "
                                                             "the device)") if shape_data else ""
    shape_tables = _gemm_tables(owner, "gemm_shape", {k: v for k, v in shape_data.items() if k != "source"})
    elementwise = data.get("elementwise")
    table_e = None
    if elementwise is not None:
        if not isinstance(elementwise, Mapping) or sorted(elementwise) != ["bytes", "efficiency"]:
            raise InvalidValue(f"{owner}: kernel_tables.elementwise must state exactly bytes and efficiency, got "
                               f"{elementwise!r}")
        axis = _axis(owner, "elementwise.bytes", elementwise["bytes"])
        table_e = ElementwiseTable(log2_bytes=axis, efficiency=_fractions(
            owner, "elementwise.efficiency", elementwise["efficiency"], (len(axis),)))
    return KernelTables(gemm=tables, gemm_shape=shape_tables, gemm_shape_source=shape_source, elementwise=table_e,
                        launch_seconds=_seconds(owner, "launch_seconds", data.get("launch_seconds")),
                        dispatch_seconds=_seconds(owner, "dispatch_seconds", data.get("dispatch_seconds")),
                        source=source, attention=_attention(owner, data.get("attention") or {}),
                        sdpa_backends=_sdpa_backends(owner, data.get("sdpa_backends")))


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


def _below_grid(table: GemmTable, m, n) -> np.ndarray:
    """The share of its least ``m`` and ``n`` an output narrower than a measured grid's keeps: such a GEMM still
    runs the least's output tiles and reads the same weights (one wave, or the weights' read), so it takes the
    least's time for its fewer FLOPs. (A fitted ``gemm`` table clamps instead: its edge cells were fitted on the
    points beyond them.)"""
    return (np.minimum(1.0, np.asarray(m, dtype=np.float64) / 2.0 ** table.log2_m[0])
            * np.minimum(1.0, np.asarray(n, dtype=np.float64) / 2.0 ** table.log2_n[0]))


def _roof(m, n, k, bytes_per_flop: float, element_bytes: float) -> Any:
    """The roofline on arithmetic intensity: ``min(1, I / ridge)``, ``I = 2 m n k / (bytes (m k + k n + m n))`` (A
    and B read once, C written once) and the ridge the peak over HBM bandwidth."""
    intensity = 2.0 * m * n * k / (element_bytes * (m * k + k * n + m * n))
    return np.minimum(1.0, intensity * bytes_per_flop)


def _shape_factor(m, n, k, sm_count: Optional[int], bytes_per_flop: float, element_bytes: float,
                  groups: Any = 1.0) -> Any:
    tiles = groups * np.ceil(m / GEMM_TILE) * np.ceil(n / GEMM_TILE)
    slots = np.ceil(tiles / sm_count) * sm_count if sm_count else tiles  # whole waves of tiles
    waves = groups * m * n / (slots * GEMM_TILE * GEMM_TILE)
    roof = _roof(m, n, k, bytes_per_flop, element_bytes)
    # the tile-quantized compute time plus the memory time beyond the ideal compute's: each factor alone where
    # the other is 1, and a skinny GEMM's time its weights' read, not the product's m^2 fall
    return 1.0 / (1.0 / waves + 1.0 / roof - 1.0)


@functools.lru_cache(maxsize=256)
def _reference_shape_factor(sm_count: Optional[int], bytes_per_flop: float, element_bytes: float) -> Any:
    """:data:`REFERENCE_GEMM`'s shape factor on a device (a few scalars' arithmetic: made once a device and dtype)."""
    return _shape_factor(*REFERENCE_GEMM, sm_count, bytes_per_flop, element_bytes)


def prior_gemm_efficiency(m, n, k, *, stated: Any, sm_count: Optional[int], peak_flops_per_second: float,
                          hbm_bytes_per_second: float, element_bytes: float, groups=1.0) -> np.ndarray:
    """The analytic prior of a GEMM's efficiency, ``(m x k) @ (k x n)``, vectorized: no measurement behind it.

    ``1 / f(m, n, k) = 1 / waves + 1 / roof - 1`` (the tile-quantized compute time plus the memory time beyond
    the ideal compute's: either factor alone where the other is 1), normalized so :data:`REFERENCE_GEMM` lands
    at *stated* (the hardware's ``efficiency.matmul``, fitted on large GEMMs), and capped at 1:

    - waves: the output is cut into ``GEMM_TILE`` x ``GEMM_TILE`` tiles, one streaming multiprocessor
      a tile at a time; ``T = ceil(m / 128) ceil(n / 128)`` tiles run in ``ceil(T / sm_count)`` waves,
      so the useful share of the SM-tile slots is ``m n / (ceil(T / sm_count) sm_count 128^2)`` (tile
      and wave quantization together; without ``sm_count``, tile quantization alone); a grouped GEMM of
      *groups* equal problems (the experts of one rank) schedules all their tiles in one grid;
    - roof: the roofline on arithmetic intensity ``I = 2 m n k / (bytes (m k + k n + m n))`` (A and B
      read once, C written once), ``min(1, I / ridge)`` with ``ridge = peak / HBM bandwidth``.

    The rows run in whole tiles: a GEMM is priced as its rows padded to them (:func:`_padded_rows`), its
    FLOPs the useful share, so fewer rows never take longer (the memory beyond the ideal compute's, priced at
    the padded rows, does not shrink as the useful compute grows within a tile).

    Left out: split-K and stream-K schedules and the other tile shapes a library picks for awkward
    shapes (the prior is pessimistic there), L2 reuse, the epilogue, clock changes under load.
    """
    bytes_per_flop = np.float64(hbm_bytes_per_second) / np.float64(peak_flops_per_second)  # inf, not an error
    m, n, k = (np.asarray(v, dtype=np.float64) for v in (m, n, k))
    rows, share = _padded_rows(m)
    reference = _reference_shape_factor(sm_count, bytes_per_flop, element_bytes)
    return share * np.minimum(1.0, stated * _shape_factor(rows, n, k, sm_count, bytes_per_flop, element_bytes,
                                                          groups) / reference)


def _padded_rows(m) -> Tuple[np.ndarray, np.ndarray]:
    """A GEMM's rows padded to whole ``GEMM_TILE`` tiles, and the share of them it uses: a tile computes its
    rows whether the problem fills them or not, and reads the same weights."""
    rows = GEMM_TILE * np.ceil(np.asarray(m, dtype=np.float64) / GEMM_TILE)
    return rows, m / rows


def gemm_efficiency(hardware: Any, tables: Optional[KernelTables], dtype: str, m, n, k, *, stated: Any,
                    groups=1.0) -> np.ndarray:
    """Achieved / peak of *dtype* GEMMs at (m, n, k), *groups* equal problems in one grid (an expert each): the
    hardware's table for the dtype (one problem's shape: *groups* is the others' only); else its ``gemm_shape``
    table's shape dependence, the table's best cell at *stated*; else the prior (*stated*: a float, or an array
    broadcasting against the shapes, GEMMs of different stated figures priced at once).

    From ``gemm_shape`` (below its grid, :func:`_below_grid`), *groups* problems each pad their rows to whole
    ``GEMM_TILE`` tiles (:func:`_padded_rows`: ``r`` rows, ``m / r`` of them used) and read their own weights:
    as in the prior, they run as one GEMM of ``groups x r`` rows does, plus the weights' reads beyond that merged
    GEMM's, ``1 / f = (1 / f_merged(groups x r) + 1 / roof(r) - 1 / roof(groups x r)) x r / m`` (:func:`_roof`):
    a problem of fewer rows never takes longer. Left out: a grouped kernel's own tile choices (smaller tiles for
    short groups) and its scheduling of ragged groups.
    """
    table = tables.gemm.get(dtype) if tables is not None else None
    if table is not None:
        return table_gemm_efficiency(table, m, n, k)
    shape = tables.gemm_shape.get(dtype) if tables is not None else None
    if shape is None:
        return prior_gemm_efficiency(m, n, k, stated=stated, sm_count=hardware.sm_count,
                                     peak_flops_per_second=hardware.peak_flops(dtype),
                                     hbm_bytes_per_second=float(hardware.hbm_bytes_per_second),
                                     element_bytes=float(DTYPES[dtype]), groups=groups)
    m, n, k, groups = (np.asarray(v, dtype=np.float64) for v in (m, n, k, groups))
    if np.all(groups == 1.0):
        return np.minimum(1.0, np.asarray(stated) * table_gemm_efficiency(shape, m, n, k) / shape.best
                          * _below_grid(shape, m, n))
    roof = functools.partial(_roof, n=n, k=k, bytes_per_flop=float(hardware.hbm_bytes_per_second)
                             / hardware.peak_flops(dtype), element_bytes=float(DTYPES[dtype]))
    padded, share = _padded_rows(m)
    rows, share = np.where(groups == 1.0, m, padded), np.where(groups == 1.0, 1.0, share)
    merged = table_gemm_efficiency(shape, rows * groups, n, k) / shape.best * _below_grid(shape, rows * groups, n)
    grouped = share / (1.0 / merged + 1.0 / roof(rows) - 1.0 / roof(rows * groups))
    return np.minimum(1.0, np.asarray(stated) * grouped)


# The runtimes' attention kernel names (specs/runtimes/*.yaml ``attention``, the registered attention_kernel/<name>)
# whose figures another kernel_tables entry holds: Transformers' flash_attention_2 runs the flash-attn package's
# FlashAttention-2 kernels, the ones PyTorch's SDPA flash backend vendors.
ATTENTION_KERNEL_ALIASES = {"flash_attention_2": "flash"}


def _sdpa_accepts(backend: str, dtype: str, head_dim: int, value_head_dim: int,
                  compute_capability: Optional[str] = None) -> bool:
    """Whether SDPA's *backend* takes these inputs (aten/src/ATen/native/transformers/cuda/sdp_utils.cpp)."""
    low_precision = dtype in ("bf16", "fp16")                   # check_dtypes_low_precision
    if backend == "cudnn":                                      # check_cudnn_tensor_shapes: head_dim_limit
        limit = 256 if compute_capability == "9.0" else 128     # Hopper's 256 with cuDNN >= 9.10
        return low_precision and 0 < head_dim <= limit and 0 < value_head_dim <= limit
    if backend == "flash":                                      # check_head_dim_size_flash
        return low_precision and head_dim == value_head_dim and 0 < head_dim <= 256
    return backend in ("efficient", "math")


def attention_kernel(runtime_kernel: str, dtype: str, head_dim: int, value_head_dim: int,
                     sdpa_backends: Tuple[str, ...] = DEFAULT_SDPA_BACKENDS,
                     compute_capability: Optional[str] = None) -> str:
    """The ``kernel_tables.attention`` entry a layer's attention runs: the runtime's kernel, for SDPA the
    first of *sdpa_backends* that takes the inputs, as PyTorch's ``select_sdp_backend`` picks.

    cuDNN and flash take fp16 / bf16 only; flash q, k and v of one head width of at most 256 (so an fp32 row
    or MLA's 192-wide queries over 128-wide values run the efficient kernel unless cuDNN takes them), cuDNN
    widths of at most 128, 256 on Hopper (``compute_capability`` 9.0: cuDNN >= 9.10, which every torch that
    prefers cuDNN there bundles). Left out: the widths' multiple-of-8 checks, Blackwell's 192 / 128 exception
    (cuDNN >= 9.11), the sm80+ checks (every CUDA hardware file ndcost ships is an A100 or later) and masks that
    disable flash.
    """
    if runtime_kernel == "sdpa":
        return next((b for b in sdpa_backends
                     if _sdpa_accepts(b, dtype, head_dim, value_head_dim, compute_capability)), "math")
    return ATTENTION_KERNEL_ALIASES.get(runtime_kernel, runtime_kernel)


def table_attention_efficiency(curves: Tuple[AttentionCurve, ...], seq, batch_heads, head_dim, causal
                               ) -> Tuple[np.ndarray, np.ndarray]:
    """(forward, backward) efficiency of measured *curves* at each (seq, batch x heads, head_dim, causal).

    The curve read is the nearest head_dim (log2; exact where measured), then the same causality where measured,
    then the nearest heads (log2) to the kernel's batch x heads (the measurements run batch 1; the kernel's grid
    spans both alike); along it, linear in log2 seq, clamped at its ends.
    """
    seq, batch_heads, head_dim, causal = np.broadcast_arrays(
        np.asarray(seq, dtype=np.float64), np.asarray(batch_heads, dtype=np.float64),
        np.asarray(head_dim, dtype=np.float64), np.asarray(causal, dtype=bool))
    x = np.log2(np.maximum(seq, 1.0))
    cost = np.stack([np.abs(np.log2(np.maximum(head_dim, 1.0)) - math.log2(c.head_dim)) * 1e6
                     + (causal != c.causal) * 1e3
                     + np.abs(np.log2(np.maximum(batch_heads, 1.0)) - math.log2(c.heads)) for c in curves])
    pick = cost.argmin(axis=0)
    forward, backward = np.empty(seq.shape), np.empty(seq.shape)
    for i, c in enumerate(curves):  # a loop over the table's curves
        at = pick == i
        forward[at] = np.interp(x[at], c.log2_seq, c.forward)
        backward[at] = np.interp(x[at], c.log2_seq, c.backward)
    return forward, backward


def prior_attention_efficiency(seq, batch_heads, *, plateau: float, sm_count: Optional[int]) -> np.ndarray:
    """The analytic prior of a fused attention kernel's efficiency: ``plateau x waves``, vectorized.

    The kernel's grid is ``batch x heads x ceil(seq / 128)`` query blocks (:data:`ATTENTION_QUERY_BLOCK`), one
    an SM at a time; they run in ``ceil(blocks / sm_count)`` waves, so the busy share of the SM slots is
    ``blocks / (ceil(blocks / sm_count) sm_count)`` (1 without ``sm_count``). *plateau* is the kernel's share of
    the peak on a full device (the hardware file's, from the kernel's paper). Left out: each block's fixed
    prologue and epilogue against its loop over key blocks (short sequences run below the plateau even at full
    waves), the causal mask's diagonal blocks, and the imbalance of causal blocks' unequal loops within a wave.
    """
    return plateau * _query_block_waves(seq, batch_heads, sm_count)


def _query_block_waves(seq, batch_heads, sm_count: Optional[int]) -> np.ndarray:
    blocks = np.asarray(batch_heads, dtype=np.float64) * np.ceil(np.asarray(seq, dtype=np.float64)
                                                                 / ATTENTION_QUERY_BLOCK)
    if not sm_count:
        return np.ones(blocks.shape)
    return blocks / (np.ceil(blocks / sm_count) * sm_count)


def attention_efficiency(hardware: Any, tables: Optional[KernelTables], kernel: str, dtype: str, seq, batch_heads,
                         head_dim, causal, *, stated: Tuple[float, float]) -> Tuple[Any, Any]:
    """(forward, backward) achieved / peak of attention *kernel* (a ``kernel_tables.attention`` name, see
    :func:`attention_kernel`) on *seq*-long query blocks of *batch_heads* heads: the kernel's measured curves for
    *dtype*, else the prior on its plateau, else *stated* (``efficiency.attention``, ``attention_backward``, as
    scalars); arrays broadcast against the inputs."""
    entry = tables.attention.get(kernel) if tables is not None else None
    if entry is not None and dtype in entry.curves:
        return table_attention_efficiency(entry.curves[dtype], seq, batch_heads, head_dim, causal)
    if entry is not None and entry.plateau is not None:
        waves = _query_block_waves(seq, batch_heads, hardware.sm_count)
        return entry.plateau[0] * waves, entry.plateau[1] * waves
    return stated


def attention_source(tables: Optional[KernelTables], kernel: str, dtype: str) -> str:
    """Where :func:`attention_efficiency` takes *kernel*'s figures for *dtype* from (for the provenance)."""
    entry = tables.attention.get(kernel) if tables is not None else None
    if entry is not None and dtype in entry.curves:
        return f"kernel_tables.attention.{kernel}.{dtype} ({entry.source})"
    if entry is not None and entry.plateau is not None:
        return (f"prior: query-block waves x kernel_tables.attention.{kernel}.plateau "
                f"{entry.plateau[0]:g} / {entry.plateau[1]:g} ({entry.source})")
    return "efficiency.attention / attention_backward"


def elementwise_efficiency(tables: Optional[KernelTables], bytes_per_kernel, *, stated: float):
    """Achieved / HBM bandwidth of elementwise kernels moving *bytes_per_kernel*: the table, else *stated*."""
    return elementwise_efficiencies(tables, bytes_per_kernel, stated=(stated, stated))[0]


def elementwise_efficiencies(tables: Optional[KernelTables], bytes_per_kernel, *, stated: Tuple[float, float]):
    """:func:`elementwise_efficiency` of a forward's and a backward's kernels of the same size, *stated* theirs
    (``efficiency.memory``, ``memory_backward``): the table (one lookup, both alike), else *stated*."""
    if tables is None or tables.elementwise is None:
        return stated
    table = tables.elementwise
    x = np.log2(np.maximum(np.asarray(bytes_per_kernel, dtype=np.float64), 1.0))
    efficiency = np.interp(x, table.log2_bytes, table.efficiency)
    return efficiency, efficiency


def launch_costs(tables: Optional[KernelTables]) -> Tuple[float, float, str]:
    """(launch_seconds, dispatch_seconds, where they came from): the hardware's tables, else the priors."""
    launch = tables.launch_seconds if tables is not None else None
    dispatch = tables.dispatch_seconds if tables is not None else None
    source = ("kernel_tables" if launch is not None and dispatch is not None else
              "prior" if launch is None and dispatch is None else "kernel_tables and prior")
    return (PRIOR_LAUNCH_SECONDS if launch is None else launch,
            PRIOR_DISPATCH_SECONDS if dispatch is None else dispatch, source)
