"""Per-device memory of a batch of strategies, for every pipeline stage, by category (numpy, no loop over layers).

A map of :func:`compose` (each step's docstring says what it counts and why):

- :func:`ndcost.compose.placement.place`: each rank's chunks, their layers and the recomputed ones;
- :func:`_in_flight`: the micro-batches each chunk keeps (the ``schedule/<name>`` plugins);
- :func:`_stage_parameters`, :func:`_persistent_bytes`: parameters, gradients, master copy, optimizer
  states, split as :mod:`ndcost.compose.sharding` says;
- :func:`_layer_activations`: one layer's kept and working bytes of each kind, one micro-batch;
- :func:`_stage_activations`: those over the stage's layers and micro-batches in flight;
- :func:`_output_layer`: the final norm, head and loss;
- :func:`_communication_buffers`: FSDP / ZeRO-3 gathers, SP / EP / CP buffers (DDP's buckets: :func:`_moments`);
- :func:`_pipeline_buffers`: ``pp_engine=torch``'s receive buffers, one a micro-batch of the step;
- :func:`_pipeline_outputs`: the stages' outputs ``pp_engine=torch`` holds to their backward (the last stage's all,
  and their merged copy, under ``pp_return_outputs``);
- :func:`_moments`, :func:`_peak`: the five moments a stage can peak at (``MOMENTS``), the largest;
- :func:`_reserved`: what PyTorch's caching allocator reserves for that peak (:mod:`ndcost.allocator`).

The resolver builds :class:`ModelTables` once a model and :class:`RecordTables` once a sequence
length; ``compose`` prices whole batches given as columns (:func:`ndcost.columns.encode`).
On an H200 (torch 2.11, Transformers, bf16, fused AdamW) this put the peak within 0.1 % of
``max_memory_allocated`` on the measured dense and MoE steps, less the cuBLAS workspaces and input
ids it does not count (``tests/test_resolver.py``, ``tests/test_resolver_moe_h200.py``).

Known limitations: a stage's working peak takes the largest over the kinds it holds rather than the
kind of its first or last layer; TP splits parameters evenly (row-parallel biases, MLA's replicated
down-projections too); activation records are used at the dtype they were taken in; the share of a
layer's gradients made by its working moment is the census's at TP 1; under sharded gradients and
accumulation a layer's transient gradients before they are added in are not counted (the
embedding's aside); the embedding's sort scratch is an upper bound (one row a token). FSDP under
``gradient_sync=last_micro_batch`` (PyTorch's pipeline stages, ``torch/distributed/pipelining/stage.py``
``backward_maybe_with_nosync``) holds the stage's gradients whole and its layers gathered from the first
backward to the step's reduce-scatter; the reduce-scatter's own moment (one parameter group's flat buffer
beside the rest) is not one of ``MOMENTS``.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.allocator import large_block_excess_bytes, packed_reserved_bytes
from ndcost.columns import DTYPE_BYTES, DTYPE_NAMES
from ndcost.compose import placement as placement_rules
from ndcost.compose import sharding as sharding_rules
from ndcost.compose import topology
from ndcost.compose.sharding import MATMUL_PARTS, REPLICATED_PARTS, ROUTED_PARTS, TP_PARTS
from ndcost.errors import InvalidValue, Unpriced
from ndcost.values import (
    CP_ALGOS,
    CP_ROTATES,
    DDP_BUCKET_ENGINES,
    DDP_ENGINES,
    DTYPES,
    LOSS_ENGINES,
    MEMORY_CATEGORIES,
    PARTS,
    PP_ENGINES,
    RECOMPUTE,
    deepspeed_bf16_optimizer,
)

CATEGORIES = MEMORY_CATEGORIES

# the K/V-passing rings: their blocks are the attention backward's working memory (_ring_attention_working)
RING_CP = np.array([a in ("ring", "colossal", "hybrid") for a in CP_ALGOS])


def ceil_div(x, d):
    """Exact integer ceiling of x / d on int64 arrays."""
    return -((-x) // d)


_FLOAT_MAX = float(np.finfo(np.float64).max)


def nan_to_zero(x):
    """``np.nan_to_num`` of a float64 array (NaN to 0, an infinity to the largest finite float) in two ufuncs,
    without ``nan_to_num``'s per-call Python work (it weighs on a batch of one strategy)."""
    zeroed = np.where(np.isnan(x), 0.0, x)
    if zeroed.size > 64:  # a batch: one pass, in place
        return np.clip(zeroed, -_FLOAT_MAX, _FLOAT_MAX, out=zeroed)
    return np.minimum(np.maximum(zeroed, -_FLOAT_MAX), _FLOAT_MAX)  # a few rows: without np.clip's Python wrapper


def _sum_in_order(terms, shape):
    """The sum of *terms* over its leading axis, term after term (a float sum the same to the bit as a loop
    adding each to zeros: ``np.sum`` may pair them otherwise); zeros of *shape* where there is none."""
    if len(terms) <= 1:  # none, or one kind in one chunk (a plain decoder without interleaving)
        return terms[0] if len(terms) else np.zeros(shape)
    return np.add.accumulate(terms, axis=0)[-1]


def _rows_where(condition, count: int, if_true, if_false):
    """``np.where(condition, if_true(), if_false())``, computing only the branch a row takes where every row
    takes the same one (a batch of one strategy always does); *count* is ``np.count_nonzero(condition)``.
    The branches have the result's shape (or broadcast to it)."""
    if count == 0:
        return if_false()
    if count == condition.size:
        return if_true()
    return np.where(condition, if_true(), if_false())


def _tp_share(batch: "_Batch", x, x_tp):
    """A record's per-token figure on one TP rank: ``x + x_tp / tp``, ``(x + x_tp) / tp`` under sp; (N, K)
    or (N,) as *x*."""
    t, sp = (batch.tp[:, None], batch.sp[:, None]) if np.ndim(x) == 2 else (batch.tp, batch.sp)
    return _rows_where(sp, batch.sp_rows, lambda: (x + x_tp) / t, lambda: x + x_tp / t)


def select(conditions, choices, default):
    """``np.select``: each entry from the first condition that holds, else *default*; as nested ``np.where``
    (``np.select`` broadcasts every argument first, which weighs on a batch of one strategy)."""
    out = default
    for condition, choice in zip(reversed(conditions), reversed(choices), strict=True):
        out = np.where(condition, choice, out)
    return out


# ---------------------------------------------------------------------------
# strategy-independent tables
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True, eq=False)
class ModelTables:
    """A model's layer stack and parameters as arrays over its kinds (built once per resolve)."""

    kinds: Tuple[str, ...]
    num_layers: int
    stack: placement_rules.LayerStack  # the non-MTP layers as runs of one kind
    mtp_counts: np.ndarray        # (K,): MTP layers of each kind (placed with the head where built)
    builds_mtp: bool
    tp_params: np.ndarray         # (K,): one layer's parameters split by TP
    replicated_params: np.ndarray  # (K,)
    routed_params: np.ndarray     # (K,)
    matmul_tp_params: np.ndarray  # (K,): of tp_params, those autocast copies
    matmul_replicated_params: np.ndarray  # (K,)
    embedding: int
    head: int                     # 0 where tied
    final_norm: int               # the final norm, and model-level tensors (``other``) held with the head
    tied: bool
    hidden_size: int
    heads: int
    kv_heads: int
    intermediate_size: Optional[int]
    vocab_size: int
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: Optional[int]
    linear_heads: Tuple[int, ...]
    is_moe: np.ndarray            # (K,) bool: the kind routes tokens to experts
    kv_elements_per_token: np.ndarray  # (K,): keys and values a token, all heads, TP 1 (0: no KV to gather)
    kv_params: np.ndarray         # (K,): of tp_params, the key and value projections (GQA; 0 for MLA, linear)
    q_elements_per_token: np.ndarray  # (K,): queries a token, all heads, TP 1 (0 where there is no KV to gather)
    # the attention takes K/V repeated to every query head (op_records.runtime_repeats_kv): kv_elements_per_token
    # is every query head's, which TP splits like the queries (none replicated beyond the KV heads)
    kv_repeated: bool = False
    # (K,): the copies of each KV head the attention takes (1: not repeated)
    kv_copies: np.ndarray = attrs.field(factory=lambda: np.ones(0, dtype=np.int64))
    # the layer collectives (resolver.LAYER_COLLECTIVE_OPS' keys) whose outputs recompute=selective keeps
    selective_kept_collectives: Tuple[str, ...] = ()
    # (K,): of tp_params and matmul_tp_params, the weights TP leaves whole on every rank (ndcost.work
    # tp_whole_parameters: MLA's down-projections); empty: none
    whole_params: np.ndarray = attrs.field(factory=lambda: np.zeros(0, dtype=np.int64))

    @classmethod
    def build(cls, spec, counts, builds_mtp: bool, kv_repeated: bool = False,
              selective_kept_collectives: Tuple[str, ...] = (),
              whole_params: Optional[Mapping[str, int]] = None) -> "ModelTables":
        """From a ModelSpec and the family's ParameterCount (``by_kind``, ``embedding``, ``head``, ``final_norm``);
        *kv_repeated* where the runtime's attention takes the keys and values repeated to every query head;
        *selective_kept_collectives* the layer collectives whose outputs the runtime's selective policy keeps;
        *whole_params* each kind's weights TP leaves whole (``ndcost.work.tp_whole_parameters``; none unstated)."""
        kinds = tuple(dict.fromkeys(g.kind for g in spec.layers))
        index = {k: i for i, k in enumerate(kinds)}
        stack = placement_rules.LayerStack.from_runs(kinds, [(g.kind, g.count) for g in spec.layers if not g.mtp])
        L = stack.num_layers
        mtp = np.zeros(len(kinds), dtype=np.int64)
        for g in spec.layers:
            if g.mtp:
                mtp[index[g.kind]] += g.count

        elements = int(counts.total) + int(counts.mtp)
        if elements > MAX_EXACT_BYTES:  # every element count below is then exact in int64 and float64
            raise InvalidValue(f"model {spec.name!r} has {elements:,} parameters, past {MAX_EXACT_BYTES:,} (2**53), "
                               f"the most ndcost prices exactly; check its widths (hidden_size={spec.hidden_size}) "
                               f"and layer counts")

        def parts(names):
            return np.array([sum(int(counts.by_kind.get(k, {}).get(p, 0)) for p in names) for k in kinds],
                            dtype=np.int64)

        known = set(TP_PARTS + REPLICATED_PARTS + ROUTED_PARTS)
        for k in kinds:
            unknown = set(counts.by_kind.get(k, {})) - known
            if unknown:
                raise ValueError(f"kind {k!r} has parameters in parts {sorted(unknown)} the resolver does not "
                                 f"place; parts are {', '.join(PARTS)}")
        missing = [k for k in kinds if k not in counts.by_kind]
        if missing:
            raise Unpriced(f"model {spec.name!r}: no parameters for layer kinds {missing} "
                           f"(the family's parameters() left them out)")
        head_dim = spec.resolved_head_dim
        kv_elems, q_elems, kv_copies = [], [], []
        for k in kinds:
            copies = 1
            if spec.kind(k).linear:
                kv_elems.append(0)
                q_elems.append(0)
            elif spec.kind(k).latent:  # a key and a value a query head already
                qk = (spec.qk_nope_head_dim or head_dim) + (spec.qk_rope_head_dim or 0)
                kv_elems.append(spec.num_attention_heads * (qk + (spec.v_head_dim or head_dim)))
                q_elems.append(spec.num_attention_heads * qk)
            else:
                kv_heads = spec.num_key_value_heads or spec.num_attention_heads
                # one KV head is repeated as a view at every TP degree (multi-query attention): no copy is kept
                copies = spec.num_attention_heads // kv_heads if kv_repeated and kv_heads > 1 else 1
                kv_elems.append(2 * kv_heads * copies * head_dim)
                q_elems.append(spec.num_attention_heads * head_dim)
            kv_copies.append(copies)
        routed = parts(ROUTED_PARTS)
        kv_params = []
        for k in kinds:
            if spec.kind(k).linear or spec.kind(k).latent or not spec.num_key_value_heads:
                kv_params.append(0)
            else:
                width = spec.num_key_value_heads * head_dim
                kv_params.append(2 * (spec.hidden_size * width + (width if spec.attention_bias else 0)))
        linear = tuple(x for x in (spec.linear_num_key_heads, spec.linear_num_value_heads) if x)
        return cls(
            kinds=kinds, num_layers=L, stack=stack, mtp_counts=mtp, builds_mtp=bool(builds_mtp),
            tp_params=parts(TP_PARTS), replicated_params=parts(REPLICATED_PARTS), routed_params=routed,
            matmul_tp_params=parts(tuple(p for p in MATMUL_PARTS if p in TP_PARTS)),
            matmul_replicated_params=parts(tuple(p for p in MATMUL_PARTS if p in REPLICATED_PARTS)),
            embedding=int(counts.embedding), head=int(counts.head),
            final_norm=int(counts.final_norm) + int(counts.other),
            tied=int(counts.head) == 0, hidden_size=spec.hidden_size, heads=spec.num_attention_heads,
            kv_heads=spec.num_key_value_heads or spec.num_attention_heads,
            intermediate_size=spec.intermediate_size, vocab_size=spec.vocab_size, num_experts=spec.num_experts or 0,
            experts_per_token=spec.num_experts_per_tok or 0, moe_intermediate_size=spec.moe_intermediate_size,
            linear_heads=linear, is_moe=routed > 0, kv_elements_per_token=np.array(kv_elems, dtype=np.float64),
            kv_params=np.minimum(np.array(kv_params, dtype=np.int64), parts(("attention",))),
            q_elements_per_token=np.array(q_elems, dtype=np.float64), kv_repeated=bool(kv_repeated),
            kv_copies=np.array(kv_copies, dtype=np.int64),
            selective_kept_collectives=tuple(selective_kept_collectives),
            whole_params=np.array([int((whole_params or {}).get(k, 0)) for k in kinds], dtype=np.int64))


def _nan(value):
    return np.nan if value is None else float(value)


# A record's figures restated for fp32 parameters under 16-bit autocast (KindRecord.autocast_<name>_per_token).
AUTOCAST_FIELDS = ("saved", "saved_tp", "working", "working_tp")


def _figure(recs, name: str, seq_index, batch: "_Batch") -> np.ndarray:
    """The record's figure *name* (``(N, K)`` or ``(N,)``), or its autocast one (``autocast_`` after any
    ``out_``) where the row runs fp32 parameters under autocast and the record has one."""
    values = recs[name][seq_index]
    if not batch.any_fp32_autocast:  # no row runs it (the common batch): the figures as they are
        return values
    autocast_name = name.replace("out_", "out_autocast_") if name.startswith("out_") else f"autocast_{name}"
    autocast_values = recs[autocast_name][seq_index]
    fp32_autocast = batch.fp32_autocast[:, None] if values.ndim == 2 else batch.fp32_autocast
    return np.where(fp32_autocast & ~np.isnan(autocast_values), autocast_values, values)


@attrs.frozen(kw_only=True, eq=False)
class RecordTables:
    """The kind records' per-token figures at one sequence length, as arrays over the kinds (TP 1)."""

    seq: int
    saved: np.ndarray
    saved_tp: np.ndarray
    working: np.ndarray       # nan: unpriced
    working_tp: np.ndarray
    working_input: np.ndarray  # 1: the working figure leaves out the layer's input (no op saves it), 0: in it
    grad_share: np.ndarray     # share of the layer's parameter gradients made by the working moment
    selective: np.ndarray     # nan: unpriced
    selective_tp: np.ndarray
    dropped: np.ndarray       # core-attention recompute: bytes of attBMM, softmax, dropout
    dropped_tp: np.ndarray
    routed: np.ndarray        # the routed experts' bytes inside saved, and inside saved_tp
    routed_tp: np.ndarray
    routed_tokens: np.ndarray  # the routed bytes again: the part proportional to routed tokens alone,
    routed_width: np.ndarray   # and the part proportional to one expert's width (split by etp)
    # saved and working with fp32 parameters under 16-bit autocast (nan: not measured, the figures above apply)
    autocast_saved: np.ndarray
    autocast_saved_tp: np.ndarray
    autocast_working: np.ndarray
    autocast_working_tp: np.ndarray
    reserved_layer: np.ndarray  # the allocator's reserved above allocated bytes: a kept layer's (nan: not simulated)
    reserved_layer_tp: np.ndarray
    reserved_working: np.ndarray  # and the rest at a stage's working peak
    reserved_working_tp: np.ndarray
    reserved_selective_layer: np.ndarray  # the same under the selective checkpoint policy (nan: not simulated)
    reserved_selective_layer_tp: np.ndarray
    reserved_selective_working: np.ndarray
    reserved_selective_working_tp: np.ndarray
    reserved_core_attention_layer: np.ndarray  # and under core-attention recompute (nan: not simulated)
    reserved_core_attention_layer_tp: np.ndarray
    reserved_core_attention_working: np.ndarray
    reserved_core_attention_working_tp: np.ndarray
    autocast_reserved_layer: np.ndarray  # and with fp32 parameters under autocast (nan: not simulated)
    autocast_reserved_layer_tp: np.ndarray
    autocast_reserved_working: np.ndarray
    autocast_reserved_working_tp: np.ndarray
    # what a layer saves of the tensors its model hands every layer (KindRecord.shared_saved_per_token, summed
    # over names), per token of one sequence; and with fp32 parameters under autocast (nan: not measured)
    shared: np.ndarray
    autocast_shared: np.ndarray
    out_saved: float
    out_saved_tp: float
    out_working: float        # nan: unpriced
    out_working_tp: float
    out_autocast_saved: float  # nan: not measured
    out_autocast_saved_tp: float
    out_autocast_working: float
    out_autocast_working_tp: float
    out_reserved: float       # the output layer's reserved above allocated bytes (nan: not simulated)
    out_reserved_tp: float
    out_autocast_reserved: float  # the same with fp32 parameters under autocast (nan: not simulated)
    out_autocast_reserved_tp: float
    provenance: Mapping[str, Any] = attrs.field(factory=dict)
    # bytes of the compute dtype the figures are for: 2 (the census's and the formulas' 16-bit layers), or 4
    # (:meth:`widened`)
    compute_bytes: int = 2

    ROW_FIELDS = ("saved", "saved_tp", "working", "working_tp", "working_input", "grad_share", "selective",
                  "selective_tp", "dropped",
                  "dropped_tp", "routed", "routed_tp", "routed_tokens", "routed_width",
                  "autocast_saved", "autocast_saved_tp", "autocast_working", "autocast_working_tp", "reserved_layer",
                  "reserved_layer_tp", "reserved_working", "reserved_working_tp", "reserved_selective_layer",
                  "reserved_selective_layer_tp", "reserved_selective_working", "reserved_selective_working_tp",
                  "reserved_core_attention_layer", "reserved_core_attention_layer_tp",
                  "reserved_core_attention_working", "reserved_core_attention_working_tp",
                  "autocast_reserved_layer", "autocast_reserved_layer_tp", "autocast_reserved_working",
                  "autocast_reserved_working_tp", "shared", "autocast_shared")
    SCALAR_FIELDS = ("out_saved", "out_saved_tp", "out_working", "out_working_tp", "out_autocast_saved",
                     "out_autocast_saved_tp", "out_autocast_working", "out_autocast_working_tp", "out_reserved",
                     "out_reserved_tp", "out_autocast_reserved", "out_autocast_reserved_tp")

    @classmethod
    def build(cls, kinds: Sequence[str], seq: int, records: Mapping[str, Any], output: Any,
              selective_fallback: Optional[Mapping[str, Any]] = None,
              routed_share: Optional[Mapping[str, Tuple[float, float, float, float]]] = None,
              provenance: Optional[Mapping[str, Any]] = None) -> "RecordTables":
        """Arrays from ``{kind: KindRecord}`` and the output layer's KindRecord.

        *selective_fallback* gives ``{kind: KindRecord}`` whose selective
        figures stand in where a record has none (the formulas under a census);
        *routed_share* ``{kind: (in saved, in saved_tp, token part, width
        part)}`` per token gives a MoE kind's routed experts' bytes, which a
        record does not tell apart (imbalance scales them, etp splits the width).
        """
        missing = [k for k in kinds if k not in records]
        if missing:
            raise Unpriced(f"no activation record for layer kinds {missing} at seq {seq}")
        sel_fb = selective_fallback or {}
        routed_share = routed_share or {}
        cols: Dict[str, List[float]] = {f: [] for f in cls.ROW_FIELDS}
        core_ops = ("attBMM", "softmax", "dropout")
        for k in kinds:
            r = records[k]
            cols["saved"].append(float(r.saved_per_token))
            cols["saved_tp"].append(float(r.saved_tp_per_token))
            cols["working"].append(_nan(r.working_per_token))
            cols["working_tp"].append(_nan(r.working_tp_per_token) if r.working_per_token is not None else np.nan)
            # records before these figures (and the formulas) count the input and every gradient
            cols["working_input"].append(float(bool(r.working_input_per_token)))
            made = r.working_grad_share
            cols["grad_share"].append(1.0 if made is None else min(max(float(made), 0.0), 1.0))
            sel = r if r.selective_per_token is not None else sel_fb.get(k)
            cols["selective"].append(_nan(getattr(sel, "selective_per_token", None)))
            cols["selective_tp"].append(_nan(getattr(sel, "selective_tp_per_token", None)) if sel is not None
                                        and sel.selective_per_token is not None else np.nan)
            cols["dropped"].append(float(sum(r.ops.get(op, 0.0) for op in core_ops)))
            cols["dropped_tp"].append(float(sum(r.ops_tp.get(op, 0.0) for op in core_ops)))
            for name, figure in (("reserved_layer", "reserved_per_layer"), ("reserved_working", "reserved_working"),
                                 ("reserved_selective_layer", "reserved_selective_per_layer"),
                                 ("reserved_selective_working", "reserved_selective_working"),
                                 ("reserved_core_attention_layer", "reserved_core_attention_per_layer"),
                                 ("reserved_core_attention_working", "reserved_core_attention_working"),
                                 ("autocast_reserved_layer", "autocast_reserved_per_layer"),
                                 ("autocast_reserved_working", "autocast_reserved_working")):
                value, value_tp = (getattr(r, f"{figure}_per_token", None), getattr(r, f"{figure}_tp_per_token", None))
                cols[name].append(_nan(value if value_tp is not None else None))
                cols[f"{name}_tp"].append(_nan(value_tp if value is not None else None))
            share = routed_share.get(k, (0.0, 0.0, 0.0, 0.0))
            for name, value in zip(("routed", "routed_tp", "routed_tokens", "routed_width"), share, strict=False):
                cols[name].append(float(value))
            for name in AUTOCAST_FIELDS:
                cols[f"autocast_{name}"].append(_nan(getattr(r, f"autocast_{name}_per_token", None)))
            cols["shared"].append(float(sum(r.shared_saved_per_token.values())))
            cols["autocast_shared"].append(float(sum(r.autocast_shared_saved_per_token.values()))
                                           if r.autocast_saved_per_token is not None else np.nan)
        arrays = {f: np.array(v, dtype=np.float64) for f, v in cols.items()}
        arrays["selective_tp"] = np.where(np.isnan(arrays["selective"]), np.nan,
                                          np.nan_to_num(arrays["selective_tp"]))
        arrays["working_tp"] = np.where(np.isnan(arrays["working"]), np.nan, np.nan_to_num(arrays["working_tp"]))
        return cls(seq=int(seq), **arrays,  # type: ignore[arg-type]  # attrs plugin: **arrays holds only array fields
                   out_saved=float(output.saved_per_token), out_saved_tp=float(output.saved_tp_per_token),
                   out_working=_nan(output.working_per_token),
                   out_working_tp=0.0 if output.working_tp_per_token is None else float(output.working_tp_per_token),
                   out_autocast_saved=_nan(getattr(output, "autocast_saved_per_token", None)),
                   out_autocast_saved_tp=_nan(getattr(output, "autocast_saved_tp_per_token", None)),
                   out_autocast_working=_nan(getattr(output, "autocast_working_per_token", None)),
                   out_autocast_working_tp=_nan(getattr(output, "autocast_working_tp_per_token", None)),
                   out_reserved=_nan(output.reserved_working_per_token if output.reserved_working_tp_per_token
                                     is not None else None),
                   out_reserved_tp=_nan(output.reserved_working_tp_per_token),
                   out_autocast_reserved=_nan(output.autocast_reserved_working_per_token
                                              if output.autocast_reserved_working_tp_per_token is not None else None),
                   out_autocast_reserved_tp=_nan(output.autocast_reserved_working_tp_per_token),
                   provenance=dict(provenance or {}))

    # what widening scales: the kinds' byte figures by their sequence or TP ratio, the output layer's alike
    _WIDENED_SEQUENCE = ("saved", "working", "selective", "dropped", "routed", "routed_tokens", "routed_width",
                         "shared")
    _WIDENED_TP = ("saved_tp", "working_tp", "selective_tp", "dropped_tp", "routed_tp")

    def widened(self, ratios: Mapping[str, Tuple[float, float]], kinds: Sequence[str],
                output_ratios: Tuple[float, float], note: str) -> "RecordTables":
        """These figures for 4-byte (fp32) activations: each kind's byte figures times its ratio
        (``ratios[kind]``: the sequence part's, the TP part's; the output layer's *output_ratios*), the ratios
        of the formulas' bytes at 4-byte and at 2-byte activations. An estimate where a census measured the
        16-bit layer: its tensors of fixed dtype (fp32 statistics, integer indices) scale as the formulas' do.
        The autocast and reserved figures do not apply (nan: not measured, not simulated)."""
        seq_ratio = np.array([ratios[k][0] for k in kinds], dtype=np.float64)
        tp_ratio = np.array([ratios[k][1] for k in kinds], dtype=np.float64)
        out: Dict[str, Any] = {name: getattr(self, name) * seq_ratio for name in self._WIDENED_SEQUENCE}
        out.update({name: getattr(self, name) * tp_ratio for name in self._WIDENED_TP})
        for name in self.ROW_FIELDS:
            if name.startswith(("autocast_", "reserved_")):
                out[name] = np.full_like(seq_ratio, np.nan)
        for name in self.SCALAR_FIELDS:
            if "autocast" in name or "reserved" in name:
                out[name] = np.nan
        out.update(out_saved=self.out_saved * output_ratios[0], out_saved_tp=self.out_saved_tp * output_ratios[1],
                   out_working=self.out_working * output_ratios[0],
                   out_working_tp=self.out_working_tp * output_ratios[1])
        return attrs.evolve(self, **out, compute_bytes=4, provenance=dict(self.provenance, compute=note))

    def with_core_attention(self, kinds: Sequence[str],
                            dropped: Mapping[str, Tuple[float, float]]) -> "RecordTables":
        """The core-attention drop from *dropped* (``{kind: (bytes a token not split, split by TP)}``, the
        formulas' attention core), each share capped at what the record keeps of it; why, by kind capped, in
        the provenance's ``core_attention_capped``.

        The drop and the record may come from different estimators (the formulas beside a census or a
        hand-made record): a drop above what the record keeps would price negative activations, so the
        record's own bytes bound it (the whole share recomputed).
        """
        out = {"dropped": self.dropped.copy(), "dropped_tp": self.dropped_tp.copy()}
        capped: Dict[str, str] = {}
        for i, kind in enumerate(kinds):
            for name, kept in (("dropped", "saved"), ("dropped_tp", "saved_tp")):
                share, held = float(dropped[kind][name == "dropped_tp"]), float(getattr(self, kept)[i])
                out[name][i] = min(share, held)
                if share > held:
                    capped[kind] = (f"the formulas' attention core ({share:g} bytes a token in {kept}) exceeds "
                                    f"what the record keeps ({held:g}): all of it recomputed")
        provenance = dict(self.provenance, core_attention_capped=capped) if capped else self.provenance
        return attrs.evolve(self, **out, provenance=provenance)


def stack_records(tables: Sequence[RecordTables]) -> Dict[str, np.ndarray]:
    """``{field: (n_tables, K) or (n_tables,) array}`` over several tables (sequence lengths, compute widths)."""
    out = {f: np.stack([getattr(t, f) for t in tables]) for f in RecordTables.ROW_FIELDS}
    out.update({f: np.array([getattr(t, f) for t in tables], dtype=np.float64) for f in RecordTables.SCALAR_FIELDS})
    return out



@attrs.frozen(kw_only=True, eq=False)
class Composed:
    """compose()'s arrays: bytes by (row, stage, category), the peaks, and each stage's layers."""

    stage_bytes: np.ndarray      # (N, R, C) int64; stages past a row's pp hold 0
    stage_peak_bytes: np.ndarray  # (N, R) int64
    peak_bytes: np.ndarray       # (N,) int64
    peak_stage: np.ndarray       # (N,) int64
    stage_layers: np.ndarray     # (N, R) int64
    stage_moment: np.ndarray     # (N, R) int64: index into MOMENTS
    unpriced: Dict[str, np.ndarray]  # what a row used that nobody priced -> (N,) bool
    beyond_exact: np.ndarray     # (N,) bool: a figure not finite or past MAX_EXACT_BYTES (the row holds 0)
    layer_bytes: np.ndarray      # (N, K) int64: one layer of each kind keeps for one micro-batch
    stage_kind_layers: np.ndarray  # (N, R, K) int64: the stack's layers of each kind on each stage (no MTP)
    head_stage: np.ndarray       # (N,) int64: the stage holding the head
    embedding_stage: np.ndarray  # (N,) int64: the stage holding the embedding
    stage_host_bytes: np.ndarray  # (N, R) int64: host memory a device of each stage holds (offloading)
    host_bytes_per_node: np.ndarray  # (N,) int64: the most one node's devices hold on the host together
    stage_offloaded_activation_bytes: np.ndarray  # (N, R) int64: a micro-batch's activations copied each way
    stage_reserved_bytes: np.ndarray  # (N, R) int64: what the caching allocator reserves; -1 where not claimed
    reserved_unclaimed: np.ndarray    # (N,) int64: 0, or 1 + the index into RESERVED_UNCLAIMED of why not
    fp32_autocast: np.ndarray         # (N,) bool: fp32 parameters under 16-bit autocast (the records' autocast
                                      # figures where they state them, else their 16-bit ones)


# why a row's reserved bytes are not claimed (Composed.reserved_unclaimed - 1)
RESERVED_UNCLAIMED = (
    "no allocator simulation for some layer kind under this recompute mode (the census replays its events, "
    "plain and under the selective and core-attention policies; the formulas, op records and census records "
    "cached before it state none)",
    "fp32 parameters under autocast: the census's autocast pass is replayed for plain layers and full recompute, "
    "not for some layer kind here (or the output layer) nor under recompute=selective or core_attention",
    "fp32 activations (compute_dtype fp32): no allocation replay of fp32 layers (their records are the 16-bit "
    "ones widened)",
)

MOMENTS = ("output backward", "last layer backward", "end of backward", "embedding backward", "optimizer step")

# PyTorch's CUDA embedding backward (embedding_dense_backward_cuda) sorts the indices and sums each
# row's gradient in fp32 partial buffers above this many indices; at or below it, it adds in place.
EMBEDDING_SORT_MIN_TOKENS = 3072

# The bytes are priced in float64 and handed out as int64: below 2**53 every whole figure is exact in both;
# a row past it (or with a figure not finite) is flagged and holds 0, never cast (which would wrap).
MAX_EXACT_BYTES = 2 ** 53


def whole(x):
    """Bytes rounded up to whole bytes (a figure within 1e-3 of an integer is that integer)."""
    return np.ceil(np.asarray(x, dtype=np.float64) - 1e-3)


@attrs.frozen(kw_only=True, eq=False)
class _Batch:
    """The per-row figures every step reads, ``(N,)`` arrays."""

    tp: np.ndarray                 # float64
    tp_int: np.ndarray             # int64
    cp: np.ndarray                 # float64
    cp_int: np.ndarray             # int64
    sp: np.ndarray                 # bool
    tokens: np.ndarray             # a micro-batch's tokens on one CP rank
    compute_bytes: np.ndarray
    param_bytes: np.ndarray
    grad_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    master_bytes: np.ndarray
    autocast: np.ndarray           # bool: matmuls cast the weights (and the forward saves the copies)
    residual_bytes: np.ndarray     # the residual stream's dtype (a full-recompute layer's input)
    sharding: sharding_rules.Sharding
    fp32_autocast: np.ndarray      # bool: fp32 parameters (and residual stream) under bf16 or fp16 autocast
    any_fp32_autocast: bool        # some row runs it
    # the batch's recompute codes (by RECOMPUTE index): the steps skip a mode's terms where no row runs it
    recompute_used: Tuple[bool, ...]
    sp_rows: int                   # rows under sp (0 or N: one branch of a split by tp to compute)
    # bool, DDP's engine (ddp_engine) where it runs: every gradient in a buffer made before any backward (torch's
    # bucket views, Megatron-LM's grad buffer), or torch's buckets beside the gradients autograd makes
    gradient_buffer: np.ndarray
    ddp_buckets: np.ndarray
    # (N,) bytes of DeepSpeed ZeRO's reduce buckets (reduce_bucket_elements * reduce_buckets in param_dtype);
    # None where no row holds one
    reduce_bucket_bytes: Optional[np.ndarray]
    # (N,) bool: DeepSpeed's ZeRO optimizer (ddp_engine=deepspeed, zero 1-3, not offloaded, not its
    # BF16_Optimizer) or, at zero 0, its FP16_Optimizer steps on the device; None where no row runs its engine
    deepspeed_step: Optional[np.ndarray]


def _batch(cols: Mapping[str, Any]) -> _Batch:
    """Dtype widths, tokens a rank and the sharding of each row.

    Under autocast (a compute dtype other than the parameters', no FSDP /
    ZeRO-3 mixed precision) the residual stream runs in the parameters' dtype.
    """
    cp = cols["cp"].astype(np.float64)
    compute_bytes, param_bytes = DTYPE_BYTES[cols["compute_dtype"]], DTYPE_BYTES[cols["param_dtype"]]
    shard = sharding_rules.sharding(cols)
    autocast = (cols["compute_dtype"] != cols["param_dtype"]) & ~shard.sharded["parameters"]
    autocast_rows = int(np.count_nonzero(autocast))
    fp32_autocast = autocast & (param_bytes == 4) & (compute_bytes == 2) if autocast_rows else autocast
    mode = cols["recompute"]
    if len(mode) != 1:
        used = (np.bincount(mode, minlength=len(RECOMPUTE)) > 0).tolist()
    else:  # one strategy: its mode alone
        code = mode.item()
        used = [code == other for other in range(len(RECOMPUTE))]
    return _Batch(tp=cols["tp"].astype(np.float64), tp_int=np.asarray(cols["tp"], dtype=np.int64), cp=cp,
                  cp_int=np.asarray(cols["cp"], dtype=np.int64), sp=np.asarray(cols["sp"], dtype=bool),
                  tokens=cols["micro_batch"].astype(np.float64) * cols["seq"].astype(np.float64) / cp,
                  compute_bytes=compute_bytes, param_bytes=param_bytes,
                  grad_bytes=DTYPE_BYTES[cols["grad_dtype"]], optimizer_bytes=DTYPE_BYTES[cols["optimizer_dtype"]],
                  master_bytes=DTYPE_BYTES[cols["master_dtype"]], autocast=autocast,
                  residual_bytes=_rows_where(autocast, autocast_rows, lambda: param_bytes, lambda: compute_bytes),
                  sharding=shard, fp32_autocast=fp32_autocast,
                  any_fp32_autocast=autocast_rows > 0 and bool(np.count_nonzero(fp32_autocast)),
                  recompute_used=tuple(used), sp_rows=int(np.count_nonzero(cols["sp"])),
                  **_ddp_engine(shard.ddp, cols["ddp_engine"]),
                  reduce_bucket_bytes=(cols["reduce_bucket_elements"] * cols["reduce_buckets"] * param_bytes
                                       if np.count_nonzero(cols["reduce_bucket_elements"]) else None),
                  deepspeed_step=_deepspeed_step(cols))


_DEEPSPEED_ENGINE = DDP_ENGINES.index("deepspeed")


def _deepspeed_step(cols: Mapping[str, Any]) -> Optional[np.ndarray]:
    """``_Batch.deepspeed_step``: the rows whose step DeepSpeed's ZeRO optimizer runs on the device, or at ZeRO 0
    its FP16_Optimizer (16-bit parameters and gradients alike; bf16 under its pipeline runs the BF16_Optimizer:
    deepspeed/runtime/engine.py ``_do_optimizer_sanity_check``)."""
    engine = cols["ddp_engine"] == _DEEPSPEED_ENGINE
    if not np.count_nonzero(engine):
        return None
    on_device = ~np.asarray(cols["offload_optimizer"], dtype=bool)
    param, zero = cols["param_dtype"], cols["zero"]
    bf16 = param == DTYPE_NAMES.index("bf16")
    zero_optimizer = (zero >= 1) & ~deepspeed_bf16_optimizer(zero, bf16, cols["grad_dtype"] == DTYPE_NAMES.index(
        "fp32"), on_device)
    fp16_optimizer = ((zero == 0) & (cols["fsdp"] == 1) & (DTYPE_BYTES[param] == 2) & (cols["grad_dtype"] == param)
                      & ~(bf16 & (cols["pp"] > 1)))
    return engine & on_device & (zero_optimizer | fp16_optimizer)


# by ddp_engine code: PyTorch's DDP buckets, made when it wraps the model, beside the gradients
# (gradient_as_bucket_view=False, its default); the gradients as views of them, or Megatron-LM's contiguous grad
# buffer (megatron/core/distributed/param_and_grad_buffer.py), whole from the first backward; DeepSpeed's engine
# at ZeRO 0-1 reduces autograd's gradients at the accumulation boundary
_DDP_BUCKETS = np.isin(np.array(DDP_ENGINES), DDP_BUCKET_ENGINES)
_GRADIENT_BUFFER = np.isin(np.array(DDP_ENGINES), ("torch_bucket_view", "megatron"))
for _table in (_DDP_BUCKETS, _GRADIENT_BUFFER):
    _table.setflags(write=False)


def _ddp_engine(ddp: np.ndarray, engine: np.ndarray) -> Dict[str, np.ndarray]:
    """``_Batch``'s ``gradient_buffer`` and ``ddp_buckets`` of the rows *ddp* marks (no row: *ddp* twice)."""
    if not np.count_nonzero(ddp):
        return {"gradient_buffer": ddp, "ddp_buckets": ddp}
    return {"gradient_buffer": ddp & _GRADIENT_BUFFER[engine], "ddp_buckets": ddp & _DDP_BUCKETS[engine]}


@attrs.frozen(kw_only=True, eq=False)
class _InFlight:
    """The micro-batches each chunk keeps at its rank's peak (``held``, the schedule's), and what the steps read
    of them with the placement, each made once when first read (read-only: one strategy's are kept)."""

    held: np.ndarray               # (N, R, V) int64
    passes: np.ndarray             # (N,) int64: the backward passes each rank runs a step (num_micro_batches * vpp)
    where: placement_rules.Placement

    @functools.cached_property
    def as_float(self) -> np.ndarray:
        return placement_rules.read_only(self.held.astype(np.float64))

    @functools.cached_property
    def keeps(self) -> np.ndarray:
        """(N, R, V) bool: the chunk keeps a micro-batch."""
        return placement_rules.read_only(self.held > 0)

    @functools.cached_property
    def per_rank(self) -> np.ndarray:
        """(N, R) int64: over the rank's chunks."""
        return placement_rules.read_only(np.add.reduce(self.held, axis=2))

    @functools.cached_property
    def accumulating(self) -> np.ndarray:
        """(N, R) bool: the rank has run a backward before its last (it holds every gradient)."""
        return placement_rules.read_only(self.passes[:, None] > self.per_rank)

    @functools.cached_property
    def on_head(self) -> np.ndarray:
        """(N, R) int64: those of the chunk holding the head."""
        return placement_rules.read_only(np.add.reduce(np.where(self.where.last, self.held, 0), axis=2))

    @functools.cached_property
    def plain_layers(self) -> np.ndarray:
        """(K, N, R) int64: each kind's layers that do not recompute times their chunk's micro-batches."""
        return placement_rules.read_only(np.add.reduce(self.where.plain * self.held, axis=3))

    @functools.cached_property
    def recomputed_layers(self) -> np.ndarray:
        """(K, N, R) int64: and those that recompute."""
        return placement_rules.read_only(np.add.reduce(self.where.recomputed * self.held, axis=3))

    @functools.cached_property
    def recomputed(self) -> np.ndarray:
        """(N, R) int64: the recomputing layers times their chunk's micro-batches, over the kinds."""
        return placement_rules.read_only(np.add.reduce(self.recomputed_layers, axis=0))


_HELD_ONE_ROW: Dict[Tuple[int, int], Tuple[placement_rules.Placement, _InFlight]] = {}


def _in_flight(cols: Mapping[str, Any], schedules: Sequence[Any], where: placement_rules.Placement) -> _InFlight:
    """The micro-batches whose activations each chunk keeps at its rank's peak (the schedule's); for one
    strategy kept with its placement (:func:`ndcost.compose.placement.place` keeps that per layout), read-only."""
    if len(cols["pp"]) != 1:
        return _InFlight(held=_held(cols, schedules, where), passes=cols["num_micro_batches"] * cols["vpp"],
                         where=where)
    key = (id(where), int(cols["num_micro_batches"][0]))  # with the placement, every field _held reads
    hit = _HELD_ONE_ROW.get(key)
    if hit is None or hit[0] is not where:
        flight = _InFlight(held=placement_rules.read_only(_held(cols, schedules, where)),
                           passes=placement_rules.read_only(cols["num_micro_batches"] * cols["vpp"]), where=where)
        if len(_HELD_ONE_ROW) >= placement_rules.ONE_ROW_KEPT:
            _HELD_ONE_ROW.clear()
        hit = _HELD_ONE_ROW[key] = (where, flight)
    return hit[1]


def _held(cols: Mapping[str, Any], schedules: Sequence[Any], where: placement_rules.Placement) -> np.ndarray:
    pp, vpp, m = (cols[k].astype(np.int64)[:, None, None] for k in ("pp", "vpp", "num_micro_batches"))
    n, ranks, chunks = where.exists.shape
    rank, chunk = np.arange(ranks)[None, :, None], np.arange(chunks)[None, None, :]
    held = np.zeros((n, ranks, chunks), dtype=np.int64)
    for code, schedule in enumerate(schedules):  # a loop over the schedules a batch uses
        rows = cols["schedule"] == code
        if np.count_nonzero(rows):
            found = np.asarray(schedule.in_flight(pp, vpp, m, rank, chunk), dtype=np.int64)
            held = np.where(rows[:, None, None], found, held)
    return np.where(where.exists, np.maximum(held, 0), 0)


@attrs.frozen(kw_only=True, eq=False)
class _StageParameters:
    """Parameter elements on each device, by what holds them (``(N, R)`` unless noted)."""

    layer_dense: np.ndarray         # (K, N): one layer's parameters split by TP (and replicated ones)
    layer_routed: np.ndarray        # (K, N): one layer's routed experts split by ep * etp
    dense: np.ndarray               # the stage's dense parameters, embedding, final norm and head
    routed: np.ndarray
    copies: np.ndarray              # the weights the stage's matmuls read (autocast copies them)
    embedding: np.ndarray           # (N,): the embedding's share of one TP rank
    vocab_split: np.ndarray         # (N,): tp under vocab_parallel, else 1
    head_extra: np.ndarray          # the head's parameters where not counted with the embedding
    head: np.ndarray                # (N,): the head's weight, one TP rank's (the embedding's where tied)
    head_gradient: np.ndarray       # the head's gradient (a tied head's is the embedding's)
    embedding_gradient: np.ndarray  # the embedding's own (a tied one's comes with the head's)


def _stage_parameters(model: ModelTables, batch: _Batch, cols, where: placement_rules.Placement) -> _StageParameters:
    """Each stage's parameter elements: its layers, the embedding on the first virtual stage, final norm and head on
    the last.

    Attention, feed-forward and shared experts are split by ``tp`` (KV
    projections by ``min(tp, kv_heads)``: TP beyond the KV heads replicates
    them, as Megatron does), routed experts by ``ep * etp``, embedding and
    head by ``tp`` under ``vocab_parallel``; a tied head is the embedding,
    counted once per holder. For one strategy kept by the model, its placement and the columns it reads,
    read-only (a search's strategies share them where they differ in dp, cp, dtypes, the micro-batches ...).
    """
    if len(batch.tp_int) != 1:
        return _stage_parameters_rows(model, batch, cols, where)
    key = (id(model), id(where), *(cols[name].item() for name in _PARAMETERS_READ))
    hit = _PARAMETERS_ONE_ROW.get(key)
    if hit is None or hit[0] is not model or hit[1] is not where:
        params = _stage_parameters_rows(model, batch, cols, where)
        for field in attrs.fields(_StageParameters):
            getattr(params, field.name).setflags(write=False)
        if len(_PARAMETERS_ONE_ROW) >= placement_rules.ONE_ROW_KEPT:
            _PARAMETERS_ONE_ROW.clear()
        hit = _PARAMETERS_ONE_ROW[key] = (model, where, params)
    return hit[2]


# every column _stage_parameters reads beside its placement (tp through _Batch): a one-row key missing one would
# hand a strategy another's parameters
_PARAMETERS_READ = ("tp", "ep", "etp", "vocab_parallel")
_PARAMETERS_ONE_ROW: Dict[Tuple[Any, ...], Tuple[ModelTables, placement_rules.Placement, _StageParameters]] = {}


def _stage_parameters_rows(model: ModelTables, batch: _Batch, cols,
                           where: placement_rules.Placement) -> _StageParameters:
    ti, layers = batch.tp_int, where.rank_kind_layers
    ep_etp = (cols["ep"] * cols["etp"]).astype(np.int64)
    kv_split = np.minimum(ti, model.kv_heads)
    # (K, N): the kinds at once
    whole = model.whole_params[:, None]  # held whole by every TP rank
    layer_dense = (ceil_div((model.tp_params - model.kv_params)[:, None] - whole, ti) + whole
                   + ceil_div(model.kv_params[:, None], kv_split) + model.replicated_params[:, None])
    layer_routed = ceil_div(model.routed_params[:, None], ep_etp)
    layer_copies = (ceil_div(model.matmul_tp_params[:, None] - whole, ti) + whole
                    + model.matmul_replicated_params[:, None] + layer_routed)
    dense = np.add.reduce(layers * layer_dense[:, :, None], axis=0)
    routed = np.add.reduce(layers * layer_routed[:, :, None], axis=0)
    copies = np.add.reduce(layers * layer_copies[:, :, None], axis=0)
    vocab_split = np.where(cols["vocab_parallel"].astype(bool), ti, 1)
    embedding = ceil_div(np.int64(model.embedding), vocab_split)
    head = ceil_div(np.int64(model.embedding if model.tied else model.head), vocab_split)
    has_embedding, has_head = where.has_embedding, where.has_head
    head_extra = np.where(has_head & ~(has_embedding & model.tied), head[:, None], 0)
    dense = (dense + np.where(has_embedding, embedding[:, None], 0) + head_extra
             + np.where(has_head, model.final_norm, 0))
    return _StageParameters(
        layer_dense=layer_dense, layer_routed=layer_routed, dense=dense, routed=routed,
        copies=copies + head_extra,  # the head's matmul reads its weight (the embedding's where tied)
        embedding=embedding, vocab_split=vocab_split, head_extra=head_extra, head=head,
        head_gradient=head_extra + np.where(has_head & has_embedding & model.tied, embedding[:, None], 0),
        embedding_gradient=np.where(has_embedding & ~model.tied, embedding[:, None], 0))


_SHARDED_INDEX = {name: i for i, name in enumerate(sharding_rules.SHARDED_FROM_ZERO)}


def _persistent_bytes(params: _StageParameters, batch: _Batch, cols, states_per_parameter,
                      step_temporaries_per_parameter) -> Dict[str, np.ndarray]:
    """Bytes a device holds of each persistent category, its gradients' parts and the optimizer's temporaries.

    Each category is split over the data-parallel ranks as
    :mod:`ndcost.compose.sharding` says (ZeRO stage or FSDP; routed experts
    over their expert-data-parallel group). Under autocast the matmul
    weights' compute-dtype copies the forward saves count with the parameters.
    """
    dense_ways, routed_ways = batch.sharding.category_ways
    # (C, N, R): the parameter elements of each category of SHARDED_FROM_ZERO this device holds
    elements = ceil_div(params.dense, dense_ways[:, :, None])
    if np.count_nonzero(params.routed):  # (a dense model's stages hold no routed experts: 0 elements)
        elements = elements + ceil_div(params.routed, routed_ways[:, :, None])
    parameters, gradients, master, states = (elements[_SHARDED_INDEX[name]] for name in
                                             ("parameters", "gradients", "master", "optimizer_states"))
    grad_bytes = batch.grad_bytes[:, None]
    # the head's and the embedding's own gradients: no routed part
    root = ceil_div(np.concatenate((params.head_gradient[None], params.embedding_gradient[None])),
                    dense_ways[_SHARDED_INDEX["gradients"]][:, None]) * grad_bytes
    optimizer = cols["optimizer"]
    parameter_bytes = parameters * batch.param_bytes[:, None]
    autocast_rows = int(np.count_nonzero(batch.autocast))
    if autocast_rows:  # the copies autocast makes (a row without them adds 0, left out: exact, bytes are not -0.0)
        parameter_bytes = parameter_bytes + _rows_where(batch.autocast[:, None], autocast_rows,
                                                        lambda: params.copies * batch.compute_bytes[:, None], lambda: 0)
    out = {
        "parameters": parameter_bytes,
        "gradients": gradients * grad_bytes,
        "master": master * batch.master_bytes[:, None],
        "optimizer_states": states * (states_per_parameter[optimizer] * batch.optimizer_bytes)[:, None],
        "step_temporaries": states * (step_temporaries_per_parameter[optimizer] * batch.optimizer_bytes)[:, None],
        "head_gradients": root[0],
        "embedding_gradients": root[1],
        "optimizer_shard_elements": states,  # the parameters this device's optimizer steps
    }
    if batch.deepspeed_step is not None:
        out.update(_deepspeed_step_bytes(batch.deepspeed_step, params, batch, cols, states, out["step_temporaries"],
                                         dense_ways[_SHARDED_INDEX["gradients"]][:, None]))
    if np.count_nonzero(batch.sharding.defers_reduce):  # read by _moments where some row defers
        # under gradient_sync=last_micro_batch FSDP2 accumulates each gradient unsharded (FSDPParam.
        # unsharded_accumulated_grad, in the reduce dtype: torchtitan's mixed_precision_reduce, ndcost's grad_dtype)
        out.update(gradients_whole=(params.dense + params.routed) * grad_bytes,
                   head_gradients_whole=params.head_gradient * grad_bytes,
                   embedding_gradients_whole=params.embedding_gradient * grad_bytes)
    return out


# the dtype DeepSpeed takes a gradient's norm in where the device has it: fp64 (deepspeed/runtime/zero/utils.py
# get_norm_dtype), and its ZeRO optimizers' fp32 partition's (single_partition_of_fp32_groups,
# fp32_partitioned_groups_flat)
_NORM_BYTES, _FP32_BYTES = 8.0, 4.0


def _deepspeed_step_bytes(steps: np.ndarray, params: _StageParameters, batch: _Batch, cols, partition,
                          step_temporaries, gradient_ways) -> Dict[str, np.ndarray]:
    """``step_temporaries`` and ``step_gradients`` ``(N, R)`` bytes where DeepSpeed's ZeRO optimizer or, at ZeRO 0,
    its FP16_Optimizer steps (the rows *steps* marks: ``_Batch.deepspeed_step``).

    The ZeRO optimizer's step (deepspeed/runtime/zero/stage_1_and_2.py, stage3.py ``step``) first takes the norm
    of each of the partition's gradient pieces in fp64, one at a time (``get_grad_norm_direct``: the largest
    piece counted is the embedding's or head's, at ZeRO-3 its shard); then copies the partition's gradients flat
    in their dtype and that copy to fp32 (freed flat; at ZeRO-3 a sub-group of ``sub_group_elements`` at a
    time), which the optimizer steps with. ZeRO-1 has freed every gradient but its partition's at the boundary's
    reduction. The FP16_Optimizer (deepspeed/runtime/fp16/fused_optimizer.py, the one a fused Adam gets, as the
    config's Adam and AdamW are) copies each gradient to fp32 and flattens the copies: 8 bytes a parameter.
    Measured on DeepSpeed 0.19.8 (tests/test_deepspeed_zero.py). Left out: a larger layer tensor than the
    embedding (Transformers' fused expert weights), several parameter groups (each copied alone: the largest
    is counted as the whole), a partition of one tensor (no flat copy), a sub-group's overshoot, the unfused
    FP16 optimizer a client's own optimizer gets (its copies a parameter at a time), the copies' time.
    """
    rows, zero = steps[:, None], cols["zero"][:, None]
    sub_group = cols["sub_group_elements"][:, None]
    chunk = np.where((zero == 3) & (sub_group > 0), np.minimum(partition, sub_group), partition)
    grad = batch.grad_bytes[:, None]
    # ZeRO: flat in their dtype, then fp32 (.to(fp32) of fp32 copies nothing); FP16_Optimizer: fp32, then flat
    copied = chunk * np.where(zero == 0, 2 * _FP32_BYTES, grad + np.where(grad != _FP32_BYTES, _FP32_BYTES, 0.0))
    stepping = chunk * _FP32_BYTES + step_temporaries
    root = np.maximum(params.head_gradient, params.embedding_gradient)
    piece = np.minimum(np.where(zero == 3, ceil_div(root, gradient_ways), root), partition)
    temporaries = np.maximum(np.maximum(copied, stepping), _NORM_BYTES * piece)
    return {"step_temporaries": np.where(rows, temporaries, step_temporaries),
            "step_gradients": np.where(rows & (zero == 1), partition * grad, 0.0)}


@attrs.frozen(kw_only=True, eq=False)
class _LayerActivations:
    """One layer of each kind, one micro-batch, ``(N, K)`` bytes: kept, and its backward's peak."""

    keep_plain: np.ndarray        # kept by a layer that does not recompute
    keep_recomputed: np.ndarray   # kept by a layer that recomputes (the strategy's recompute)
    working_plain: np.ndarray     # the backward's peak of a plain layer
    working_recomputed: np.ndarray
    excess_plain: np.ndarray      # the backward's peak over what the layer keeps
    excess_recomputed: np.ndarray
    unpriced_working: np.ndarray  # (N,) bool
    unpriced_selective: np.ndarray  # (N,) bool
    shared: np.ndarray            # what a layer saves of the tensors its model hands every layer, once a stage
    kept: np.ndarray              # whole bytes a layer keeps under the row's recompute (nan: unpriced)
    beyond_exact: np.ndarray      # (N,) bool: some kind's kept bytes not finite or past MAX_EXACT_BYTES
    reserved: "_LayerReserved"    # what the caching allocator reserves beyond them (_reserved)


@attrs.frozen(kw_only=True, eq=False)
class _LayerReserved:
    """What the caching allocator reserves beyond one layer's bytes of each kind, one micro-batch: the census's
    replays (:func:`_reserved`), ``(K, N)``, the kinds leading as the placement's counts."""

    unpriced: np.ndarray  # bool: no replay of a kept layer's or of the working peak's
    layer: np.ndarray     # a kept layer's excess (0 where unpriced)
    working: np.ndarray   # the working peak's (0 where unpriced)
    # the same under the row's selective or core-attention policy, for its recomputed layers (arrays); None where
    # no row runs one
    policy_unpriced: Any = None
    policy_layer: Any = None
    policy_working: Any = None

    def arrays(self) -> List[np.ndarray]:
        return [x for x in (self.unpriced, self.layer, self.working, self.policy_unpriced, self.policy_layer,
                            self.policy_working) if x is not None]


def _replay_figure(recs, seq_index, batch: "_Batch", name: str, autocast_name: Optional[str] = None) -> np.ndarray:
    """The record's allocator figure *name*, or the autocast pass's replay (*autocast_name*) where the row runs
    fp32 parameters under it."""
    values = recs[name][seq_index]
    if autocast_name is None or not batch.any_fp32_autocast:
        return values
    fp32_autocast = batch.fp32_autocast
    return np.where(fp32_autocast[:, None] if values.ndim == 2 else fp32_autocast, recs[autocast_name][seq_index],
                    values)


def _layer_reserved(recs, seq_index, cols, batch: "_Batch") -> _LayerReserved:
    """Each kind's replays' figures a layer and micro-batch of the row's tokens, split by tp as the records say."""
    def row(name, autocast_name=None):
        return _replay_figure(recs, seq_index, batch, name, autocast_name)

    def at_tp(x, x_tp):  # (K, N): the kinds lead, as the placement's counts
        return (batch.tokens[:, None] * _tp_share(batch, x, x_tp)).T

    per_layer = at_tp(row("reserved_layer", "autocast_reserved_layer"),
                      row("reserved_layer_tp", "autocast_reserved_layer_tp"))
    working = at_tp(row("reserved_working", "autocast_reserved_working"),
                    row("reserved_working_tp", "autocast_reserved_working_tp"))
    out = _LayerReserved(unpriced=np.isnan(per_layer) | np.isnan(working), layer=nan_to_zero(per_layer),
                         working=nan_to_zero(working))
    used = batch.recompute_used
    if not (used[RECOMPUTE.index("core_attention")] or used[RECOMPUTE.index("selective")]):
        return out
    core = cols["recompute"] == RECOMPUTE.index("core_attention")

    def policy(name):
        if not used[RECOMPUTE.index("core_attention")]:
            return row(f"reserved_selective_{name}")
        return np.where(core[:, None], row(f"reserved_core_attention_{name}"), row(f"reserved_selective_{name}"))

    sel_layer, sel_working = at_tp(policy("layer"), policy("layer_tp")), at_tp(policy("working"),
                                                                                policy("working_tp"))
    return attrs.evolve(out, policy_unpriced=np.isnan(sel_layer) | np.isnan(sel_working),
                        policy_layer=nan_to_zero(sel_layer), policy_working=nan_to_zero(sel_working))


def _ring_attention_working(model: ModelTables, cols, batch: _Batch, kv_split) -> np.ndarray:
    """(N, K) bytes a token of the rank's share that a ring's attention backward holds beyond one layer without CP.

    No ring keeps the other ranks' keys and values for the backward: each saves the rank's own share and
    passes the blocks again (torch's ring attention: the SDPA op dispatched on DTensors, autograd saving its
    local q, k, v; Transformer Engine's ``AttnFuncWithCPAndKVP2P`` one block the size of the rank's own,
    ``AttnFuncWithCPAndKVAllGather`` the local k, v; Colossal-AI's ``RingAttention`` the local q, k, v:
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py,
    colossalai/shardformer/layer/attn.py).

    With B the rank's own keys and values (compute dtype), F them in fp32 and Q32 its queries in fp32, at
    the kernel call of the backward's step (torch/distributed/tensor/experimental/_context_parallel/
    _attention.py, ``_templated_ring_attention_backward``, ``convert_to_f32``; the inputs are transposed
    views, so the ``contiguous()`` copies are real): the dK/dV ring (``_AllToAllRotater`` always) holds the
    block it received, the concatenation it sends and the next block, 3 F, from the second step on; the dQ
    accumulator is Q32. Under ``cp_rotate=allgather`` the ``_AllGatherRotater``'s buffer holds all ``cp``
    blocks and the step's send concatenation one more: (cp + 1) B + 3 F + Q32. Under ``p2p`` the current
    block, its send copy and the next, min(cp, 3) B + 3 F + Q32 (at cp = 2 the last step sends none).
    Hybrid is Transformer Engine's a2a+p2p (``AttnFuncWithCPAndKVP2P.backward``): two KV/dKV buffers and
    dq in the compute dtype, 4 B + Q, whatever the rotation. Colossal-AI's ``RingAttention.backward``: two
    K/V buffers (its stacked own block and the next), two fp32 dK/dV buffers and the fp32 dq, 2 B + 2 F +
    Q32 (one ring; its double ring's inter-ring block left out).

    Left out: the forward's own buffers (no moment of ``MOMENTS`` is in a forward; torch's forward holds
    less than its backward, (cp + 2) B at most under all-gather; Transformer Engine's p2p forward keeps every
    block it received, cp B, to its end, more than its backward's 4 B + Q at a large cp), the load-balanced
    steps' ``_partial_update`` copies made after the kernel, and Transformer Engine's figures for ``ring``
    (its p2p backward holds 4 B + Q, its all-gather about 2 cp B: the gathered K/V and the whole dK/dV):
    ``ring`` is priced as torch runs it. The layer's backward peak is taken at its attention's backward, an
    upper bound where another part of the layer peaks higher.
    """
    algo, cp = cols["cp_algo"], batch.cp[:, None]
    rings = RING_CP[algo] & (batch.cp_int > 1)
    if not np.count_nonzero(rings):
        return np.zeros((len(algo), len(model.kinds)))
    kv = model.kv_elements_per_token[None, :] / kv_split[:, None]
    queries = model.q_elements_per_token[None, :] / batch.tp[:, None]
    compute = batch.compute_bytes[:, None]
    torch_ring = 3 * kv * 4.0 + queries * 4.0 + kv * compute * np.where(
        (cols["cp_rotate"] == CP_ROTATES.index("p2p"))[:, None], np.minimum(cp, 3.0), cp + 1.0)
    transformer_engine = (4 * kv + queries) * compute
    colossal = 2 * kv * compute + 2 * kv * 4.0 + queries * 4.0
    per_token = select([(algo == CP_ALGOS.index("hybrid"))[:, None], (algo == CP_ALGOS.index("colossal"))[:, None]],
                       [transformer_engine, colossal], default=torch_ring)
    return np.where(rings[:, None], per_token, 0.0)


def _layer_activations(model: ModelTables, recs, seq_index, cols, batch: _Batch) -> _LayerActivations:
    """Each kind's kept and working bytes for one layer and micro-batch of ``micro_batch * seq / cp`` tokens.

    The record's ``saved + saved_tp / tp`` (``(saved + saved_tp) / tp``
    under ``sp``); routed bytes scaled by ``moe_imbalance``, their width split
    by ``etp``; under ring, Colossal-AI or hybrid CP nothing of the other
    ranks' keys and values (the ring's blocks and gradient accumulators are the working figure's,
    :func:`_ring_attention_working`).
    Recompute: ``full`` keeps the layer's input (``h`` elements a token in the
    residual dtype, split by tp under sp), ``selective`` the record's
    selective figure, ``core_attention`` drops attBMM, softmax and dropout.
    The working figure is the census's backward peak; a full-recompute
    layer's backward adds the input its checkpoint keeps where the figure
    leaves it out (no op of the layer saves it). What the model hands every layer (the rotary tables) is
    the stage's, not in these (``shared``, bytes a layer saves of it for one micro-batch).
    """
    if len(seq_index) != 1:
        return _layer_activations_rows(model, recs, seq_index, cols, batch)
    # one row (one strategy): kept a model, records and the columns it reads, with the row's autocast (the
    # sharding's: :func:`_batch`), read-only (a search's strategies share it where they differ in dp, pp, ep ...)
    key = (id(model), id(recs), int(seq_index[0]), bool(batch.autocast[0]),
           *(np.asarray(cols[name]).item() for name in _LAYER_READ))
    hit = _LAYER_ONE_ROW.get(key)
    if hit is None or hit[0] is not model or hit[1] is not recs:
        layer = _layer_activations_rows(model, recs, seq_index, cols, batch)
        for array in [getattr(layer, field.name) for field in attrs.fields(_LayerActivations)
                      if field.name != "reserved"] + layer.reserved.arrays():
            array.setflags(write=False)
        if len(_LAYER_ONE_ROW) >= placement_rules.ONE_ROW_KEPT:
            _LAYER_ONE_ROW.clear()
        hit = _LAYER_ONE_ROW[key] = (model, recs, layer)
    return hit[2]


# every column _layer_activations reads (itself, through _Batch, _ring_attention_working and _layer_reserved) beside
# the autocast:
# a one-row key missing one would hand a strategy another's figures
_LAYER_READ = ("tp", "cp", "sp", "micro_batch", "seq", "compute_dtype", "param_dtype", "recompute", "cp_algo",
               "cp_rotate", "etp", "moe_imbalance")
_LAYER_ONE_ROW: Dict[Tuple[Any, ...], Tuple[ModelTables, Any, "_LayerActivations"]] = {}


def _layer_activations_rows(model: ModelTables, recs, seq_index, cols, batch: _Batch) -> _LayerActivations:
    def row(name):
        return _figure(recs, name, seq_index, batch) if name in AUTOCAST_FIELDS else recs[name][seq_index]

    t = batch.tp

    def at_tp(x, x_tp):
        return _tp_share(batch, x, x_tp)

    imbalance = cols["moe_imbalance"].astype(np.float64)[:, None]
    routed_tokens, routed_width = row("routed_tokens"), row("routed_width")
    plain_per_token = at_tp(row("saved") - row("routed"), row("saved_tp") - row("routed_tp"))
    routed_one: Any = 0.0  # no routed figure (no MoE kind): imbalance scales nothing
    if np.count_nonzero(routed_tokens) or np.count_nonzero(routed_width):
        etp = cols["etp"].astype(np.float64)[:, None]
        # routed tokens a rank's experts process: its own (split by tp under sp), gathered over the etp group
        routed_one = (_rows_where(batch.sp[:, None], batch.sp_rows, lambda: etp / t[:, None], lambda: 1.0)
                      * (routed_tokens + routed_width / etp))
        plain_per_token = plain_per_token + imbalance * routed_one
    # the K/V a rank's attention takes: repeated to every query head, split by tp as the queries are
    kv_split = batch.tp_int if model.kv_repeated else np.minimum(batch.tp_int, model.kv_heads)
    # keys and values replicated where TP exceeds the KV heads: a rank keeps 1/kv_heads of them, not 1/tp
    replicated_kv: Any = 0.0  # no row's tp exceeds them: 1 / kv_split - 1 / tp is 0
    if not model.kv_repeated and np.count_nonzero(batch.tp_int > model.kv_heads):
        replicated_kv = np.where(model.kv_params[None, :] > 0, model.kv_elements_per_token[None, :]
                                 * batch.compute_bytes[:, None] * (1.0 / kv_split - 1.0 / t)[:, None], 0.0)
    elif model.kv_repeated and np.count_nonzero(batch.tp_int >= model.kv_heads):
        # TP at or past the KV heads leaves a rank one: repeating one head is a view (the reshape of its expand
        # copies nothing), so the kernel saves that head alone, not its copies (1/tp of the repeated K/V)
        one_head = model.kv_elements_per_token / (model.kv_heads * model.kv_copies)
        replicated_kv = np.where((model.kv_params[None, :] > 0) & (batch.tp_int >= model.kv_heads)[:, None],
                                 (one_head[None, :] - model.kv_elements_per_token[None, :] / t[:, None])
                                 * batch.compute_bytes[:, None], 0.0)
    tokens = batch.tokens[:, None]
    keep_plain = tokens * (plain_per_token + replicated_kv)
    mode, used = cols["recompute"], batch.recompute_used
    full_code, selective_code, core_code = (RECOMPUTE.index(name) for name in ("full", "selective", "core_attention"))
    full_input = (model.hidden_size * batch.residual_bytes
                  / _rows_where(batch.sp, batch.sp_rows, lambda: t, lambda: 1.0))[:, None]
    per_token_by_mode = {  # what a recomputing layer keeps a token, by mode (only the modes some row runs)
        full_code: lambda: np.broadcast_to(full_input, plain_per_token.shape),
        selective_code: lambda: at_tp(row("selective"), row("selective_tp")) + replicated_kv + _kept_collectives(
            model, batch),
        core_code: lambda: plain_per_token - at_tp(row("dropped"), row("dropped_tp")) + replicated_kv}
    modes = [code for code in (full_code, selective_code, core_code) if used[code]]
    if used.count(True) == 1:  # every row runs one mode
        per_token = per_token_by_mode[modes[0]]() if modes else plain_per_token + replicated_kv
    else:
        per_token = select([(mode == code)[:, None] for code in modes], [per_token_by_mode[code]() for code in modes],
                           default=plain_per_token + replicated_kv)
    keep_recomputed = tokens * per_token
    working = row("working")
    unpriced_working = np.isnan(working)
    working_plain = tokens * (nan_to_zero(at_tp(working, row("working_tp"))) + (imbalance - 1.0) * routed_one
                              + replicated_kv + _ring_attention_working(model, cols, batch, kv_split))
    if np.count_nonzero(unpriced_working):  # no working figure: the larger of what the layer keeps
        working_plain = np.where(unpriced_working, np.maximum(keep_plain, keep_recomputed), working_plain)
    working_recomputed = working_plain
    if used[full_code]:  # the input a full checkpoint keeps, where the working figure leaves it out
        full = (mode == full_code)[:, None]
        working_recomputed = working_plain + np.where(full, tokens * full_input * row("working_input"), 0.0)
    keep_recomputed_priced = nan_to_zero(keep_recomputed)
    plain_rows = mode == RECOMPUTE.index("none")
    kept = whole(_rows_where(plain_rows[:, None], int(np.count_nonzero(plain_rows)), lambda: keep_plain,
                             lambda: keep_recomputed_priced))
    return _LayerActivations(
        kept=kept, beyond_exact=~np.logical_and.reduce(kept <= MAX_EXACT_BYTES, axis=1),
        reserved=_layer_reserved(recs, seq_index, cols, batch),
        keep_plain=keep_plain, keep_recomputed=keep_recomputed_priced, working_plain=working_plain,
        working_recomputed=working_recomputed, excess_plain=np.maximum(working_plain - keep_plain, 0.0),
        excess_recomputed=np.maximum(working_recomputed - keep_recomputed, 0.0),
        unpriced_working=np.logical_or.reduce(unpriced_working, axis=1),
        unpriced_selective=(mode == selective_code) & np.logical_or.reduce(np.isnan(keep_recomputed), axis=1)
        if used[selective_code]
        else np.zeros(len(mode), dtype=bool),
        # one row of position ids: the sequence on this CP rank, whatever the micro-batch (Transformers' model
        # makes them so where the caller passes none)
        shared=(cols["seq"].astype(np.float64) / batch.cp)[:, None] * _figure(recs, "shared", seq_index, batch))


def _kept_collectives(model: ModelTables, batch: _Batch):
    """``(N, 1)`` bytes a token a selective checkpoint keeps of the layer's collectives beyond its record's (which
    measures the layer unsharded): under SP two reduce-scatters' outputs, the attention's and the MLP's, ``h``
    elements a token split by tp, where the policy keeps them (torchtitan's ``_save_list``). Left out: the
    all-to-alls' outputs a policy keeps under EP (HyperParallel's)."""
    if "reduce_scatter" not in model.selective_kept_collectives or not batch.sp_rows:
        return 0.0
    sharded = batch.sp & (batch.tp_int > 1)
    return np.where(sharded, 2.0 * model.hidden_size * batch.compute_bytes / batch.tp, 0.0)[:, None]


@attrs.frozen(kw_only=True, eq=False)
class _StageActivations:
    """A stage's activations over its layers and micro-batches, and its layers' backward moments, ``(N, R)``."""

    activations: np.ndarray      # every micro-batch in flight
    one_micro_batch: np.ndarray  # the micro-batch whose backward runs
    excess: np.ndarray           # the last layer's backward peak over what it keeps
    working_layer: np.ndarray    # one layer's whole working figure at the end of the backward
    made_last: np.ndarray        # the layer's gradients made at the last layer's backward peak
    pending_end: np.ndarray      # the layer's gradients not yet made at the first layer's
    accumulating: np.ndarray     # bool: the rank holds every gradient (a backward ran before, or a buffer holds them)
    # what save_on_cpu's copies (one a layer's save) of the tables the model hands every layer add over the
    # one storage a micro-batch that activations count
    shared_copies_extra: np.ndarray


def _stage_activations(layer: _LayerActivations, where: placement_rules.Placement, flight: _InFlight,
                       params: _StageParameters, batch: _Batch, grad_share) -> _StageActivations:
    """Activations of every chunk's layers times the micro-batches it keeps, and the kind whose backward peaks.

    What the model hands every layer and they save (the rotary tables) is one storage a chunk and
    micro-batch in flight, whatever the recompute (a checkpoint keeps it as its input): the largest of its
    kinds' figures (kinds taking different tables, as Gemma 3's local and global rotary, count the
    largest alone). A layer's backward peaks with the record's share of its own gradients
    made: on a first backward with whole gradients the moments count that
    share (sharded gradients: the buffers hold the layer's whole gradient;
    accumulating: every gradient exists already). The kind whose backward
    holds the most decides.
    """
    held, held_float = flight.held, flight.as_float
    n, ranks = held.shape[:2]
    # a rank that has run a backward before holds every gradient, as one whose gradients live in a buffer made
    # before any backward (DDP's bucket views, Megatron-LM's grad buffer)
    accumulating = (flight.accumulating | batch.gradient_buffer[:, None] if np.count_nonzero(batch.gradient_buffer)
                    else flight.accumulating)
    share_rows = ~accumulating & batch.sharding.whole_gradients[:, None]
    out: Dict[str, np.ndarray] = {}
    # (K, N, R, V), the kinds and chunks at once (never a layer): one micro-batch of each chunk's layers; the
    # sums run kind by kind, chunk by chunk (as a loop would, to the bit)
    micro_batch = where.plain * layer.keep_plain.T[:, :, None, None]
    if where.recomputes:  # (a recomputing layer's keep is finite: without one the term adds zeros)
        micro_batch = micro_batch + where.recomputed * layer.keep_recomputed.T[:, :, None, None]
    out["activations"] = _sum_in_order(_chunks_by_kind(held_float * micro_batch), (n, ranks))
    out["one_micro_batch"] = _sum_in_order(_chunks_by_kind(np.where(flight.keeps, micro_batch, 0.0)), (n, ranks))
    # (K, N, R): each kind's gradients made by its layer's working moment and those still to come
    layer_grads = ((params.layer_dense + params.layer_routed) * batch.grad_bytes)[:, :, None]
    made_by_kind = np.where(share_rows, grad_share.T[:, :, None] * layer_grads, 0.0)
    pending_by_kind = np.where(share_rows, layer_grads, 0.0) - made_by_kind
    zeros = np.zeros((n, ranks))
    out.update(excess=zeros, made_last=zeros, working_layer=zeros, pending_end=zeros)
    best_last: Any = -np.inf  # the best score yet, each rank's once a kind is held
    best_end: Any = -np.inf
    # (N, K): each kind's figure a row, plain layers', recomputed ones'
    excess_by_split, working_by_split = ((layer.excess_plain, layer.excess_recomputed),
                                         (layer.working_plain, layer.working_recomputed))
    # a loop over the kinds and splits some rank holds, never layers: the first whose backward holds the most
    pairs = where.held_splits
    for i, (k, split) in enumerate(pairs):
        made, pending, present = made_by_kind[k], pending_by_kind[k], where.holds_split[k, split]
        excess, working = excess_by_split[split][:, k, None], working_by_split[split][:, k, None]
        score = excess + made
        later = present & (score > best_last)
        out["excess"], out["made_last"] = np.where(later, excess, out["excess"]), np.where(later, made,
                                                                                           out["made_last"])
        score_end = working - pending
        later_end = present & (score_end > best_end)
        out["working_layer"] = np.where(later_end, working, out["working_layer"])
        out["pending_end"] = np.where(later_end, pending, out["pending_end"])
        if i + 1 < len(pairs):  # (the last pair's best is read by none)
            best_last, best_end = np.where(later, score, best_last), np.where(later_end, score_end, best_end)
    out["shared_copies_extra"] = zeros
    if np.count_nonzero(layer.shared):  # the tensors the model hands every layer: one storage a chunk and micro-batch
        per_kind = layer.shared.T[:, :, None, None]  # (K, N, 1, 1)
        shared = np.where(where.layers > 0, per_kind, 0.0).max(axis=0)  # (N, R, V)
        copies = (where.layers * per_kind).sum(axis=0)
        in_flight = np.where(flight.keeps, shared, 0.0)
        out["shared_copies_extra"] = (held_float * (copies - shared)).sum(axis=2)
        out["activations"] = out["activations"] + (held_float * shared).sum(axis=2)
        out["one_micro_batch"] = out["one_micro_batch"] + in_flight.sum(axis=2)
        # the first layer's backward still holds its micro-batch's (freed once it has run)
        out["working_layer"] = out["working_layer"] + in_flight.max(axis=2)
    out["one_micro_batch"] = np.minimum(out["one_micro_batch"], out["activations"])
    return _StageActivations(accumulating=accumulating, **out)


def _chunks_by_kind(x):
    """(K, N, R, V) -> (K * V, N, R): a kind's chunks one after another."""
    return x.transpose(0, 3, 1, 2).reshape((-1,) + x.shape[1:3])


# The backward peak of the trainer's cross-entropy loss, in bytes a logit (16-bit logits, fp32 softmax): the
# output records' vocabulary part is torch's F.cross_entropy on fp32 logits (Transformers' ForCausalLMLoss,
# torchtitan's loss without loss parallelism), whose log_softmax keeps its fp32 output and whose backward holds
# it with the incoming and the outgoing fp32 gradients: 12. torch's loss_parallel (vocab_parallel at tp > 1;
# torch/distributed/tensor/parallel/loss.py) runs log_softmax as separate ops and nll_loss's backward as
# zeros_like, exp, their sum and the product beside the kept output: 16. Megatron-LM's
# vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py, fused or not, at any tp)
# works in place on its fp32 copy of the logits, the gradient cast to 16 bits beside it: 6. Each keeps 4.
# The loss under torch.compile (loss_engine=compiled): Inductor's min-cut partitioner keeps the 16-bit logits
# and a row's logsumexp (the fp32 cast and the softmax are recomputed, fused), and the backward writes the
# 16-bit gradient in one kernel: keeps 2, peaks at 4 (tests/test_loss_engine.py measures both on torch).
_LOSS_PEAK_BYTES_PER_LOGIT = {"records": 12, "loss_parallel": 16, "megatron": 6, "compiled": 4}
_LOSS_KEPT_BYTES_PER_LOGIT = {"records": 4, "compiled": 2}
_MEGATRON_LOSS = LOSS_ENGINES.index("megatron")
_COMPILED_LOSS = LOSS_ENGINES.index("compiled")


def _loss_shifts(model: ModelTables, cols, batch: _Batch):
    """(N,) bytes a token, before any split, that the trainer's loss (``loss_engine``) keeps and peaks above
    the records' F.cross_entropy (the vocabulary parts of the output layer's saved and working figures)."""
    engine = np.asarray(cols["loss_engine"])
    megatron, compiled = engine == _MEGATRON_LOSS, engine == _COMPILED_LOSS
    loss_parallel = ~megatron & ~compiled & np.asarray(cols["vocab_parallel"], dtype=bool) & (batch.tp > 1)
    peak = _LOSS_PEAK_BYTES_PER_LOGIT
    per_logit = select([megatron, compiled, loss_parallel], [peak["megatron"], peak["compiled"],
                                                            peak["loss_parallel"]], peak["records"])
    kept = _LOSS_KEPT_BYTES_PER_LOGIT
    kept_shift = np.where(compiled, kept["compiled"] - kept["records"], 0) * float(model.vocab_size)
    return kept_shift, (per_logit - peak["records"]) * float(model.vocab_size)


def _output_layer(model: ModelTables, recs, seq_index, cols, batch: _Batch, where: placement_rules.Placement,
                  flight: _InFlight):
    """(N, R) bytes of the output layer (final norm, head, loss with fp32 logits) on the head's stage.

    Kept bytes per micro-batch in flight and its backward peak, the trainer's
    loss's (:func:`_loss_shifts`); the vocabulary part split by tp only
    under ``vocab_parallel``. Returns ``{"at_loss": the output backward moment's
    bytes, "others": the other micro-batches' kept bytes, "later_at_loss",
    "later_others": the same once one micro-batch's backward has run (0 where the
    head's chunk holds one)}`` and which rows' output working figure is unpriced.
    """
    vocab_parallel, tokens = np.asarray(cols["vocab_parallel"], dtype=bool), batch.tokens
    vocab_rows = int(np.count_nonzero(vocab_parallel))

    def at_tp(x, x_tp):
        return _rows_where(vocab_parallel, vocab_rows, lambda: _tp_share(batch, x, x_tp), lambda: x + x_tp)

    def row(name):
        return _figure(recs, f"out_{name}", seq_index, batch)

    out_working = row("working")
    kept_shift, peak_shift = _loss_shifts(model, cols, batch)
    keep = tokens * at_tp(row("saved"), row("saved_tp") + kept_shift)
    unpriced = np.isnan(out_working)
    peak = _rows_where(unpriced, int(np.count_nonzero(unpriced)), lambda: keep,
                       lambda: tokens * at_tp(nan_to_zero(out_working), row("working_tp") + peak_shift))
    others = np.maximum(flight.on_head - 1, 0) * keep[:, None]
    at_loss = others + np.maximum(peak, keep)[:, None]
    several = flight.on_head > 1
    if not where.head_everywhere:
        several = several & where.has_head
        others, at_loss = (np.where(where.has_head, x, 0.0) for x in (others, at_loss))
    return {"at_loss": at_loss, "others": others, "later_at_loss": np.where(several, at_loss - keep[:, None], 0.0),
            "later_others": np.where(several, others - keep[:, None], 0.0)}, unpriced


def _communication_buffers(model: ModelTables, params: _StageParameters, batch: _Batch, cols,
                           where: placement_rules.Placement, layers: np.ndarray):
    """(N, R) buffer bytes at the output backward, the last layer's backward and the end of the backward.

    FSDP2 (``fully_shard`` per layer and at the root) gathers the root's
    parameters (embedding, final norm, head) at the forward's start and keeps
    them to the backward's end (the root's ``reshard_after_forward`` is
    False); the head's gradient stays whole until the root's reduce-scatter,
    the embedding's is made last; a layer's backward holds it and the next
    layer (prefetched) gathered, and its gradient before the reduce-scatter.
    ZeRO-2 holds, as FSDP, the head's and one layer's gradients whole before
    their reduce-scatter (none beside DeepSpeed's reduce bucket, which holds
    them). ZeRO-3 gathers one module at a time, root or layer, and under
    ``reuse_distance_elements`` keeps the last layers gathered from their
    forward to their backward (:func:`_reuse_kept`). Under FSDP with
    ``reshard_after_forward=false`` a layer keeps its gathered parameters
    from its forward to its backward, where FSDP2's post-backward reshards
    it: at the loss and the last layer's backward the stage holds all its
    layers gathered (the prefetched one among them), at the first layer's
    one layer, as with resharding. Under ``gradient_sync=last_micro_batch``
    (``set_reshard_after_backward(False)``) no backward reshards: at the last
    layer's backward and the end the stage holds all its layers gathered
    (with ``reshard_after_forward=true`` exact where a backward follows a
    backward, GPipe's; an upper bound by the layers a forward just resharded
    under 1F1B), and no gradient waits in a reduce-scatter buffer. Plus the largest of
    SP's gathered layer input, EP's dispatch and combine buffers and CP's KV
    blocks in flight under Ulysses (a ring's are the layer's working figure's; TP without SP all-reduces in
    place: no buffer) at the layers' moments; at the output backward, where no layer runs, SP's gathered
    input of the head alone. No layer runs beside it under the EP overlap either: Megatron-LM's combined 1F1B
    pairs the output's backward with the other micro-batch's embedding forward (``backward_postprocess``
    beside ``forward_preprocess``, megatron/core/models/common/model_chunk_schedule_plan.py).
    """
    n, ranks = params.dense.shape
    t, sp, tokens = batch.tp, batch.sp, batch.tokens
    activation_buffers = np.zeros((n, ranks))  # each below where some row holds it (bytes are never negative)
    tp_rows = sp & (batch.tp_int > 1)
    if np.count_nonzero(tp_rows):
        tp_buffer = np.where(tp_rows, tokens * model.hidden_size * batch.compute_bytes, 0.0)
        activation_buffers = np.maximum(activation_buffers, tp_buffer[:, None])
    output_buffers = activation_buffers  # the output backward's: SP's alone (the others below make new arrays)
    ep_rows = cols["ep"] > 1
    if np.count_nonzero(model.is_moe) and np.count_nonzero(ep_rows):
        moe_on_rank = (layers * model.is_moe[:, None, None]).sum(axis=0) > 0
        ep_buffer = np.where(moe_on_rank & ep_rows[:, None],
                             (2 * tokens * model.experts_per_token * model.hidden_size * batch.compute_bytes
                              * cols["moe_imbalance"] / np.where(sp, t, 1.0))[:, None], 0.0)
        activation_buffers = np.maximum(activation_buffers, ep_buffer)
    # the rings' blocks are their attention's working memory (_ring_attention_working), not a standing buffer
    cp_rows = (batch.cp_int > 1) & ~RING_CP[cols["cp_algo"]]
    if np.count_nonzero(cp_rows):
        kv_max = model.kv_elements_per_token.max() if len(model.kinds) else 0.0
        cp_buffer = np.where(cp_rows, 2 * tokens * kv_max * batch.compute_bytes / t, 0.0)
        activation_buffers = np.maximum(activation_buffers, cp_buffer[:, None])
    gathers = batch.sharding.sharded["parameters"]
    # ZeRO-2: a layer's gradient whole until its reduce-scatter, as FSDP's (DeepSpeed's reduce bucket holds them)
    waits = batch.sharding.sharded["gradients"] & ~gathers
    if batch.reduce_bucket_bytes is not None:
        waits = waits & (batch.reduce_bucket_bytes == 0)
    if not np.count_nonzero(gathers) and not np.count_nonzero(waits):  # the activations' buffers alone
        return output_buffers, activation_buffers, activation_buffers
    compute, grad = batch.compute_bytes[:, None], batch.grad_bytes[:, None]
    on_rank = layers > 0  # (K, N, R)
    largest = np.maximum.reduce(np.where(on_rank, (params.layer_dense + params.layer_routed)[:, :, None], 0), axis=0,
                                initial=0)
    head_grad_whole = params.head_gradient * grad
    waiting = head_grad_whole + largest * grad  # the root's and one layer's gradients before their reduce-scatter
    # ZeRO-2's at the three moments: none at the loss, then as FSDP's (the embedding's own gradient last)
    zero2 = (0.0, waiting, head_grad_whole + np.maximum(largest * grad, params.embedding_gradient * grad))
    running = (output_buffers, activation_buffers, activation_buffers)
    if not np.count_nonzero(gathers):
        return tuple(np.where(waits[:, None], z, 0.0) + r for z, r in zip(zero2, running, strict=True))
    layer_gathered = _gathered_layer_bytes(model, params, batch, cols)[:, :, None]  # (K, N, 1) bytes
    root = (np.where(where.has_embedding, params.embedding[:, None], 0) + params.head_extra
            + np.where(where.has_head, model.final_norm, 0))
    zero3_buffer = np.maximum(largest, root) * (compute + grad)
    fsdp_rows = int(np.count_nonzero(batch.sharding.fsdp))
    if fsdp_rows:
        largest_gathered = np.maximum.reduce(np.where(on_rank, layer_gathered, 0.0), axis=0, initial=0.0)
        gathered_root = root * compute
        fsdp2, keeps = batch.sharding.fsdp[:, None], batch.sharding.keeps_gathered[:, None]
        defers = batch.sharding.defers_reduce[:, None]
        two_layers = np.minimum(np.add.reduce(layers, axis=0), 2)
        gathered_layers = largest_gathered * two_layers
        at_end_layers = head_grad_whole + np.maximum(largest_gathered + largest * grad,
                                                     params.embedding_gradient * grad)
        if np.count_nonzero(keeps) or np.count_nonzero(defers):
            # every layer of the stage gathered, kept since its forward or a backward
            stage_layers = (layers * layer_gathered).sum(axis=0)
            gathered_layers = np.where(keeps | defers, stage_layers, gathered_layers)
            at_end_layers = np.where(defers, stage_layers, at_end_layers)
        # under gradient_sync=last_micro_batch no gradient waits in a reduce-scatter buffer: the gradients hold them
        at_moments = [gathered_root + np.where(keeps, gathered_layers, 0),
                      gathered_root + gathered_layers + np.where(defers, 0.0, waiting), gathered_root + at_end_layers]
        if fsdp_rows < n:  # the others' ZeRO-3 buffer
            at_moments = [np.where(fsdp2, buffer, zero3_buffer) for buffer in at_moments]
    else:  # ZeRO-3 alone gathers one module at a time
        at_moments = [zero3_buffer] * 3
    if np.count_nonzero(cols["reuse_distance_elements"]):  # ZeRO-3's last layers kept gathered across the turn
        at_loss, at_last = _reuse_kept(model, params, cols)
        at_moments = [at_moments[0] + at_loss * compute, at_moments[1] + at_last * compute, at_moments[2]]
    live = cols["live_parameters_elements"]
    if np.count_nonzero(live):  # what ZeRO-3's prefetcher keeps gathered, up to the live parameters
        stage = params.dense + params.routed  # one stage (pp=1): its layers, embedding, head and final norm
        first = (params.layer_dense + params.layer_routed)[model.stack.run_kind[0]][:, None]
        held = (stage, stage - params.head[:, None] - model.final_norm, first + params.embedding[:, None])
        module = np.maximum(largest, root) * grad  # the running module's gradient, as without it
        at_moments = [np.where((live > 0)[:, None], np.maximum(buffer, np.minimum(live[:, None], h) * compute + module),
                               buffer) for buffer, h in zip(at_moments, held, strict=True)]
    return tuple(np.where(gathers[:, None], buffer, np.where(waits[:, None], z, 0.0)) + r
                 for buffer, z, r in zip(at_moments, zero2, running, strict=True))


_RERUN_MODULES = np.isin(np.array(RECOMPUTE), ("full", "selective"))  # the recomputes that rerun a layer's modules


def _reuse_kept(model: ModelTables, params: _StageParameters, cols) -> Tuple[np.ndarray, np.ndarray]:
    """(N, 1) parameter elements DeepSpeed's ZeRO-3 keeps gathered from their forward to their backward under
    ``reuse_distance_elements`` D, at the loss and at the last layer's backward (that layer, running, left out).

    partitioned_param_coordinator.py ``__params_to_release`` keeps a module's parameters where the step's
    trace reaches their next use before gathering D elements more. With T the head's and final norm's
    elements, A the layers' after layer j and B those of them whose modules rerun (``recompute`` full or
    selective: each such layer's backward gathers it twice), a module of layer j with ``a`` of its layer's
    elements after it is reused after ``2a + 2T + 2A + B`` elements, and one of a rerun layer after about
    ``P_j + 2T + 2A + B`` (its rerun gathers the layer before the module's own use): a layer whose modules do
    not rerun is kept as the tail of ``(D - 2T - 2A - B) / 2`` of its elements, a rerun one whole where its
    distance is under D. The head's own distance is 0: always kept, where it is gathered anyway (the root).
    One stage (pp=1), one chunk; layers the kinds' per-rank elements (tp, ep splits).
    """
    n = len(cols["tp"])
    at_loss, at_last = np.zeros((n, 1)), np.zeros((n, 1))
    rows = np.flatnonzero(cols["reuse_distance_elements"] > 0)
    stack = model.stack
    layer_kind = np.repeat(stack.run_kind, np.diff(stack.run_ends))  # (L,), once per call: never a layer loop
    per_layer = (params.layer_dense + params.layer_routed)[layer_kind][:, rows].T.astype(np.float64)  # (M, L)
    count = np.where(cols["recompute_layers"][rows] < 0, stack.num_layers, cols["recompute_layers"][rows])
    reruns = _RERUN_MODULES[cols["recompute"][rows]][:, None] & (np.arange(stack.num_layers)[None, :]
                                                                 < count[:, None])

    def after(x):  # each layer's sum over the layers after it
        return np.cumsum(x[:, ::-1], axis=1)[:, ::-1] - x

    base = ((2 * (params.head[rows] + model.final_norm))[:, None] + 2 * after(per_layer)
            + after(np.where(reruns, per_layer, 0)))
    distance = cols["reuse_distance_elements"][rows].astype(np.float64)[:, None]
    kept = np.where(reruns, np.where(per_layer + base < distance, per_layer, 0.0),
                    np.clip((distance - base) / 2, 0.0, per_layer))
    at_loss[rows, 0] = np.floor(kept.sum(axis=1))
    at_last[rows, 0] = np.floor(kept[:, :-1].sum(axis=1))
    return at_loss, at_last


_TORCH_ENGINE = PP_ENGINES.index("torch")


def _stage_boundary(model: ModelTables, batch: _Batch) -> np.ndarray:
    """(N,) bytes of a stage boundary a micro-batch: ``[micro_batch, seq / cp, hidden]`` in the residual stream's
    dtype, the sequence split by tp under sp (what one pipeline stage hands the next)."""
    return whole(model.hidden_size * batch.residual_bytes * batch.tokens / np.where(batch.sp, batch.tp, 1.0))


def _pipeline_buffers(model: ModelTables, recs, seq_index, cols, batch: _Batch, where: placement_rules.Placement,
                      flight: _InFlight) -> Optional[List[np.ndarray]]:
    """(N, R) bytes of ``pp_engine=torch``'s receive buffers at each of ``MOMENTS``; None where no row runs it.

    ``torch/distributed/pipelining/stage.py``: ``_setup_forward_recv_info`` gives each local stage but the
    first a receive buffer per input for every micro-batch of the step, ``_create_grad_recv_info`` each but
    the last one per output gradient; the schedule makes them once (``schedules.py``
    ``_initialize_pp_stages``) and ``clear_runtime_states`` clears only their ``.grad``: they are held at
    every moment, the optimizer step's included. Each is a stage boundary, ``[micro_batch, seq / cp, hidden]``
    in the residual stream's dtype, the sequence split by tp under sp (torchtitan's TP plan hands blocks
    plain local tensors sharded on the sequence: ``torchtitan/models/llama3/infra/parallelize.py``).
    They are communication: the engine allocates them to receive into, whichever micro-batch runs. Between
    two stages on one rank (a V schedule, DualPipeV) ``set_local_fwd_input`` and ``set_local_bwd_input`` put
    the neighbour's tensor in the buffer's place, kept as long: the same bytes.
    A received buffer is the micro-batch's input itself (``_retrieve_recv_activations`` returns
    ``info.buffer.requires_grad_()``, no copy): where the chunk's first layer keeps its input (an op saves
    it: the record's ``working_input`` is 0, or a full or selective checkpoint keeps it) the activations
    count it already for the micro-batches in flight (at the end of the backward, those but the one whose
    backward runs), and at the last layer's backward the working figure holds the arriving gradient (the
    census tracks it, ``plugins/census/measure.py``) on a rank without the head: those bytes come off here.
    The input gradient a stage sends is freed after its send (``_backward.py`` ``stage_backward`` clears
    ``.grad``): not counted. Left out: the working figure's own copy of the input at the end of the backward
    (an upper bound by one boundary), under ``offload_activations`` the in-flight layer's on the device, and
    that a schedule run once per accumulation step (torchtitan under PP) holds its own micro-batches'
    buffers, not ``num_micro_batches`` (an upper bound by the accumulation steps, as the schedules' one flush).
    """
    rows = np.asarray(cols["pp_engine"]) == _TORCH_ENGINE
    if not np.count_nonzero(rows):
        return None
    held = flight.held
    n = held.shape[0]
    torch_rows = (rows & (cols["pp"] > 1))[:, None, None]
    boundary = _stage_boundary(model, batch)
    receives = where.exists & ~where.first & torch_rows  # (N, R, V): the chunk receives its input
    returns = where.exists & ~where.last & torch_rows    # and its output's gradient
    per_chunk = (cols["num_micro_batches"].astype(np.float64) * boundary)[:, None]
    buffers = per_chunk * (receives.sum(axis=2) + returns.sum(axis=2))
    mode = cols["recompute"]
    keeps_input = (mode == RECOMPUTE.index("full")) | (mode == RECOMPUTE.index("selective"))
    first_kind = where.first_kind.reshape(n, -1)
    saved = np.take_along_axis(recs["working_input"][seq_index], first_kind, axis=1).reshape(held.shape) == 0
    checkpointed = (where.recomputed.sum(axis=0) > 0) & keeps_input[:, None, None]  # a chunk redoes its first layers
    aliased = (receives & (saved | checkpointed) & (where.layers.sum(axis=0) > 0)
               & ~np.asarray(cols["offload_activations"], dtype=bool)[:, None, None])
    in_flight = (held * aliased).sum(axis=2) * boundary[:, None]
    others = (np.maximum(held - 1, 0) * aliased).sum(axis=2) * boundary[:, None]
    arriving = np.where(~where.has_head & torch_rows[:, :, 0] & (flight.per_rank > 0), boundary[:, None], 0.0)
    return [buffers - in_flight, buffers - in_flight - arriving, buffers - others, buffers - others, buffers]


def _pipeline_outputs(model: ModelTables, cols, batch: _Batch, where: placement_rules.Placement,
                      flight: _InFlight, step_temporaries) -> Optional[Dict[str, List[np.ndarray]]]:
    """(N, R) bytes of the stages' outputs ``pp_engine=torch`` holds, by category (``activations``: the chunks
    that send theirs on; ``output``: the last stage's), at each of ``MOMENTS``; None where no row runs it.

    ``torch/distributed/pipelining/stage.py``: ``forward_one_chunk`` keeps each micro-batch's output in
    ``fwd_cache`` until ``backward_one_chunk`` pops it, whose local reference holds it through the stage's
    backward: a stage boundary a micro-batch in flight on a chunk that sends its output to another rank (one
    handed to a chunk of the same rank, a V schedule's, is that chunk's received input: ``_pipeline_buffers``).
    The last stage's output is the head's 16-bit logits, a micro-batch's tokens by the vocabulary (split by tp
    under ``vocab_parallel``): its micro-batches in flight hold theirs, and under ``pp_return_outputs`` every
    micro-batch's (the step's last output backward, and after), which ``forward_one_chunk`` also appends to
    ``output_chunks`` (emptied only at the next step's start) for ``schedules.py`` ``step()`` to return as
    ``_merge_outputs``' concatenated copy (torchtitan discards it, so it is freed before the optimizer step).
    The compiled loss keeps the logits itself for the micro-batches whose loss backward has not run
    (``_output_layer`` counts those): not counted twice. The merge's copy is counted at the optimizer step, whose
    moment stands for both: the optimizer's temporaries or the copy, whichever is larger, beside the kept outputs.
    """
    rows = (np.asarray(cols["pp_engine"]) == _TORCH_ENGINE) & (cols["pp"] > 1)
    if not np.count_nonzero(rows):
        return None
    # the chunks sending their output to another rank's: not the last, and no chunk of theirs is the next stage
    stage = where.virtual_stage
    local_next = ((stage[:, :, :, None] + 1 == stage[:, :, None, :]) & where.exists[:, :, None, :]).any(axis=3)
    sends = where.exists & ~where.last & ~local_next & rows[:, None, None]
    sent = (flight.held * sends).sum(axis=2) * _stage_boundary(model, batch)[:, None]
    split = np.where(np.asarray(cols["vocab_parallel"], dtype=bool), batch.tp, 1.0)
    output = np.where(rows, batch.tokens * float(model.vocab_size) / split * batch.compute_bytes, 0.0)[:, None]
    returned = np.asarray(cols["pp_return_outputs"], dtype=bool)[:, None]
    every = cols["num_micro_batches"].astype(np.float64)[:, None] * output  # (N, 1): output_chunks at the end
    on_head = flight.on_head.astype(np.float64)
    alive = np.where(returned, every, on_head * output)
    keeps_logits = (np.asarray(cols["loss_engine"]) == _COMPILED_LOSS)[:, None]
    at_loss = alive - np.where(keeps_logits, on_head * output, 0.0)
    after = alive - np.where(keeps_logits, np.maximum(on_head - 1.0, 0.0) * output, 0.0)
    merged = np.where(returned, every + np.maximum(every - step_temporaries, 0.0), 0.0)
    head = where.has_head
    return {"activations": [sent, sent, sent, sent, np.zeros(sent.shape)],
            "output": [np.where(head, x, 0.0) for x in (at_loss, after, after, after, merged)]}


def _gathered_layer_bytes(model: ModelTables, params: "_StageParameters", batch: _Batch, cols) -> np.ndarray:
    """``(K, N)`` bytes of one layer's parameters as FSDP gathers them on one TP rank: at the compute
    width, but under ``float8_all_gather`` (FSDP2, torchao ``WeightWithDynamicFloat8CastTensor``) the Float8
    linears' weights (the TP-split parts: attention projections, dense and shared MLP, their biases with them)
    at one byte an element."""
    compute = batch.compute_bytes
    fp8 = np.asarray(cols["float8_all_gather"], dtype=bool) & batch.sharding.fsdp
    whole_layer = params.layer_dense + params.layer_routed
    linears = params.layer_dense - model.replicated_params[:, None]
    return np.where(fp8, linears * DTYPES["fp8"] + (whole_layer - linears) * compute, whole_layer * compute)


def _offload_states(persistent, batch: _Batch, cols) -> Tuple[Dict[str, np.ndarray], Dict[str, np.ndarray]]:
    """The persistent bytes left on the device under ``offload_optimizer`` / ``offload_params``, and the host's.

    ``offload_optimizer`` (ZeRO-Offload, arXiv:2101.06840 section 4; Megatron-LM ``--optimizer-cpu-offload``):
    the master copy, the optimizer states and the step's temporaries leave the device; the host holds them
    and a copy of the gradients of the device's optimizer shard, which the CPU step reads (in ``grad_dtype``).
    ``offload_params`` (FSDP2 ``CPUOffloadPolicy``, torch/distributed/fsdp/_fully_shard/_fsdp_api.py;
    ZeRO-Infinity ``offload_param``, arXiv:2104.07857): the device's parameter and gradient shards move to
    the host; the device keeps the gathered working copies the communication category counts (the
    resolver refuses it unless FSDP or ZeRO-3 gathers them). Left out: the pinned staging buffers of the
    copies, a layer's shard copied in before its gather, and that ZeRO-Offload frees the device's gradients
    once copied (they are counted as the device keeps them, as Megatron-LM's main-grad buffer does: an upper
    bound for DeepSpeed, which also keeps its host copy in fp32 whatever ``grad_dtype``). Returns the
    device's persistent dict and the host's ``{"persistent", "step"}`` ``(N, R)`` bytes.
    """
    optimizer, params = (np.asarray(cols[name], dtype=bool) for name in ("offload_optimizer", "offload_params"))
    if not (np.count_nonzero(optimizer) or np.count_nonzero(params)):
        zeros = np.zeros(np.shape(persistent["parameters"]))
        return persistent, {"persistent": zeros, "step": zeros}
    optimizer, params = optimizer[:, None], params[:, None]
    moved = dict(persistent)
    for name in ("master", "optimizer_states", "step_temporaries"):
        moved[name] = np.where(optimizer, 0, persistent[name])
    for name in ("parameters", "gradients", "head_gradients", "embedding_gradients"):
        moved[name] = np.where(params, 0, persistent[name])
    gradient_copy = persistent["optimizer_shard_elements"] * batch.grad_bytes[:, None]
    host = (np.where(params, persistent["parameters"] + persistent["gradients"], 0)
            + np.where(optimizer, persistent["master"] + persistent["optimizer_states"], 0)
            + np.where(optimizer & ~params, gradient_copy, 0))
    return moved, {"persistent": whole(host), "step": whole(np.where(optimizer, persistent["step_temporaries"], 0))}


def _offload_activations(moments, stage: _StageActivations, layer: _LayerActivations,
                         where: placement_rules.Placement, cols, host_states):
    """The moments with ``offload_activations``' saved activations moved to the host; the host's bytes.

    ``torch.autograd.graph.save_on_cpu`` around the layers copies every tensor they save to the host as it
    is saved and back when the backward reads it: the device keeps the layer in flight's (the largest of
    one micro-batch's layer keeps on the stage) at the last layer's backward, none at the other moments
    (a layer's backward working figure holds its own), while the host holds every micro-batch's. The
    output layer's (head and loss) saved tensors stay on the device. Returns the moments, each stage's host
    bytes ``(N, R)`` (the persistent ones, then the larger of the step's temporaries and the activations:
    the step runs once the backward has freed them) and a micro-batch's activation bytes a stage copies
    each way (the time model's traffic). Left out: the pinned staging and the copy stream's events.
    """
    rows = np.asarray(cols["offload_activations"], dtype=bool)
    zeros = np.zeros(stage.activations.shape)
    if not np.count_nonzero(rows):
        return moments, host_states["persistent"] + host_states["step"], zeros
    plain, recomputed = where.rank_kind_split[:, 0], where.rank_kind_split[:, 1]  # (K, N, R) each
    in_flight, per_micro_batch = zeros, zeros
    # save_on_cpu copies every save, so each layer's of the tables the model hands every layer is its own copy
    # (torch/autograd/graph.py, save_on_cpu's pack_to_cpu): the host holds them once a layer, not a stage
    for k in range(plain.shape[0]):  # a loop over kinds, never layers
        keep_plain, keep_recomputed = layer.keep_plain[:, k][:, None], layer.keep_recomputed[:, k][:, None]
        shared = layer.shared[:, k][:, None]
        in_flight = np.maximum(in_flight, np.maximum(np.where(plain[k] > 0, keep_plain + shared, 0.0),
                                                     np.where(recomputed[k] > 0, keep_recomputed + shared, 0.0)))
        per_micro_batch = (per_micro_batch + plain[k] * keep_plain + recomputed[k] * keep_recomputed
                           + (plain[k] + recomputed[k]) * shared)
    offloaded = rows[:, None]
    on_device = [zeros, whole(np.minimum(stage.activations, in_flight))] + [zeros] * (len(moments) - 2)
    moments = [dict(m, activations=np.where(offloaded, kept, m["activations"]))
               for m, kept in zip(moments, on_device, strict=True)]
    host_activations = np.where(offloaded, whole(stage.activations + stage.shared_copies_extra), 0.0)
    return (moments, host_states["persistent"] + np.maximum(host_states["step"], host_activations),
            np.where(offloaded, whole(per_micro_batch), 0.0))


def _moments(model: ModelTables, persistent, params: _StageParameters, stage: _StageActivations, outputs,
             buffers, batch: _Batch, cols, embedding_sort_scratch: bool) -> List[Dict[str, np.ndarray]]:
    """The non-persistent categories at each of ``MOMENTS``, whole bytes ``(N, R)``; *outputs*: the output
    layer's bytes (:func:`_output_layer`).

    The output layer's first backward (activations kept, no gradient yet: the
    head's comes after the loss's peak); the stage's last layer's (the head's
    gradient made); the end of the backward (every gradient but the
    embedding's, the other micro-batches' activations, one layer's working);
    the embedding's backward (every gradient, the gradient arriving from the
    first layer, PyTorch CUDA's fp32 sums by row above
    ``EMBEDDING_SORT_MIN_TOKENS`` indices); the optimizer step. A rank that
    has run a backward before holds every gradient throughout, as one whose
    gradients live in a buffer made before any backward (``ddp_engine``
    ``torch_bucket_view`` or ``megatron``); PyTorch DDP's own buckets
    (``ddp_engine=torch``) hold every gradient again, communication at every
    moment. DeepSpeed ZeRO's reduce bucket (``reduce_bucket_elements``) is
    communication from a backward's first gradient: at ZeRO-1 to the
    accumulation boundary (a later micro-batch's loss holds it), at ZeRO-2 to
    that backward's end, at ZeRO-3 at every moment. Under FSDP2 a
    layer's gradient is sharded after its backward, the root's at the end,
    but under ``gradient_sync=last_micro_batch`` every gradient is held whole
    (in ``grad_dtype``) to the step's reduce-scatter: the optimizer step holds
    the shards. A rank holding several micro-batches before its first backward
    (GPipe's every stage, 1F1B's first ones where the micro-batches are no more
    than the stages) runs the next micro-batch's backward holding every gradient
    and one micro-batch's activations and outputs fewer: the output and last
    layer's backward moments are those where they hold more (the pipeline's
    buffers as at the first); an upper bound under virtual stages, where that
    backward has made its own chunk's gradients alone.
    """
    accumulating, hidden = stage.accumulating, model.hidden_size
    zeros = np.zeros(accumulating.shape)
    defers = batch.sharding.defers_reduce[:, None]
    fsdp2 = batch.sharding.fsdp[:, None] & ~defers  # a layer's gradient reduce-scattered after its backward

    defer_rows = int(np.count_nonzero(defers))

    def held(name):  # a gradient category as the backward holds it
        return whole(_rows_where(defers, defer_rows, lambda: persistent[f"{name}_whole"], lambda: persistent[name]))

    grads_all, head_grads = held("gradients"), held("head_gradients")
    accumulating_ranks = int(np.count_nonzero(accumulating))

    def unless_accumulating(fresh):  # np.where(accumulating, grads_all, fresh), fresh made only where some rank is
        return _rows_where(accumulating, accumulating_ranks, lambda: grads_all, fresh)

    fsdp_rows = np.count_nonzero(fsdp2)
    if fsdp_rows:
        root_late = np.where(fsdp2, head_grads, 0.0)
        grads_first = unless_accumulating(lambda: head_grads - root_late)
        grads_last = unless_accumulating(lambda: grads_all - held("embedding_gradients") - root_late)
    else:  # no root gradient comes late (subtracting zero is exact: left out)
        grads_first = unless_accumulating(lambda: head_grads)
        grads_last = unless_accumulating(lambda: grads_all - held("embedding_gradients"))
    # the embedding's arriving gradient is the rank's whole sequence (SP gathers it); where a gradient exists
    # already (accumulation, a tied head's) the new one is held before it is added in
    tokens = batch.tokens
    embedding_input = tokens * hidden * batch.compute_bytes
    if embedding_sort_scratch:
        vocab_rows = ceil_div(np.int64(model.embedding // max(hidden, 1)), params.vocab_split)
        sort_rows = np.where(tokens > EMBEDDING_SORT_MIN_TOKENS, np.minimum(tokens, vocab_rows), 0.0)
        embedding_input = embedding_input + 4.0 * hidden * sort_rows
    embedding_whole = np.where(batch.sharding.whole_gradients, params.embedding * batch.grad_bytes, 0.0)[:, None]
    embedding_working = embedding_input[:, None] + (embedding_whole if model.tied else _rows_where(
        accumulating, accumulating_ranks, lambda: embedding_whole, lambda: 0.0))
    kept = whole(stage.activations)
    others_kept = whole(stage.activations - stage.one_micro_batch)
    made: Dict[int, np.ndarray] = {}  # the moments' buffers are often one array: made whole once
    at_loss, at_last, at_end = (made[id(b)] if id(b) in made else made.setdefault(id(b), whole(b)) for b in buffers)
    buckets = zeros  # torch DDP's buckets: every gradient again, from the model's wrapping on
    if np.count_nonzero(batch.ddp_buckets):
        buckets = np.where(batch.ddp_buckets[:, None], grads_all, 0.0)
        at_loss, at_last, at_end = (b + buckets for b in (at_loss, at_last, at_end))
    if batch.reduce_bucket_bytes is not None:  # DeepSpeed ZeRO's: made at a backward's first gradient
        bucket, zero = batch.reduce_bucket_bytes[:, None], cols["zero"][:, None]
        # ZeRO-1 keeps it to the boundary's reduction (a later micro-batch's loss holds it), ZeRO-3 for the run
        at_loss = at_loss + np.where((zero == 3) | ((zero == 1) & accumulating), bucket, 0.0)
        at_last, at_end = at_last + bucket, at_end + bucket
        buckets = buckets + np.where(zero == 3, bucket, 0.0)
    others = whole(outputs["others"])
    at_output = dict(gradients=_rows_where(accumulating, accumulating_ranks, lambda: grads_all, lambda: zeros),
                     activations=kept, working=zeros, output=whole(outputs["at_loss"]), communication=at_loss)
    at_layer = dict(gradients=whole(grads_first + stage.made_last), activations=kept, working=whole(stage.excess),
                    output=others, communication=at_last)
    later = ~accumulating & (stage.activations > stage.one_micro_batch)  # several micro-batches, no backward yet
    if np.count_nonzero(later):
        def worse(first, after):  # the moment whose bytes are more, where the next backward may hold more
            more = later & (sum(after.values()) > sum(first.values()))
            return {name: np.where(more, after[name], value) for name, value in first.items()}
        at_output = worse(at_output, dict(gradients=grads_all, activations=others_kept, working=zeros,
                                          output=whole(outputs["later_at_loss"]), communication=at_loss))
        at_layer = worse(at_layer, dict(gradients=grads_all, activations=others_kept, working=whole(stage.excess),
                                        output=whole(outputs["later_others"]), communication=at_last))
    return [
        at_output,
        at_layer,
        dict(gradients=whole(grads_last - stage.pending_end), activations=others_kept,
             working=whole(stage.working_layer), output=others, communication=at_end),
        dict(gradients=np.where(fsdp2 & ~accumulating, grads_last, grads_all) if fsdp_rows else grads_all,
             activations=others_kept,
             working=whole(embedding_working), output=others, communication=at_end),
        dict(gradients=_step_gradients(persistent, batch, cols, grads_all, defer_rows), activations=zeros,
             working=whole(persistent["step_temporaries"]),
             output=zeros, communication=buckets),
    ]


def _step_gradients(persistent, batch: _Batch, cols, grads_all, defer_rows: int) -> np.ndarray:
    """The gradients the optimizer step holds: the shards where FSDP deferred its reduce-scatter to it, the
    partition's alone under DeepSpeed's ZeRO-1 (:func:`_deepspeed_step_bytes`), else what the backward ended with."""
    held = whole(persistent["gradients"]) if defer_rows else grads_all
    if batch.deepspeed_step is None:
        return held
    return np.where((batch.deepspeed_step & (cols["zero"] == 1))[:, None], whole(persistent["step_gradients"]), held)


# the categories a moment holds, in the order _peak sums them; their places in CATEGORIES
_MOMENT_CATEGORIES = ("gradients", "activations", "working", "output", "communication")
_MOMENT_CATEGORY_INDEX = tuple(CATEGORIES.index(name) for name in _MOMENT_CATEGORIES)


def _peak(persistent, moments, where: placement_rules.Placement, cols, out: Optional[np.ndarray],
          beyond: np.ndarray):
    """Each stage's bytes by category at its largest moment (the first of equal ones), and that moment.

    ``allocator_overhead`` times the rest is added as ``allocator``; the output
    layer's moment exists on the head's stage only, the embedding's on its own.
    Rows whose largest moment is not finite or passes ``MAX_EXACT_BYTES`` are
    set in *beyond* ``(N,)`` and hold 0.
    """
    base = persistent["parameters"] + persistent["master"] + persistent["optimizer_states"]
    overhead = np.asarray(cols["allocator_overhead"], dtype=np.float64)[:, None]
    any_overhead = bool(np.count_nonzero(overhead))
    totals, allocators = [], []
    for i, moment in enumerate(moments):  # a loop over the five moments (a batch reads each array once)
        total = base
        for name in _MOMENT_CATEGORIES:  # a fixed order
            total = total + moment[name]
        if any_overhead:
            allocators.append(np.ceil(overhead * total - 1e-3))
            total = total + allocators[-1]
        if i == 0 and not where.head_everywhere:
            total = np.where(where.has_head, total, -1.0)
        if i == 3 and not where.embedding_everywhere:
            total = np.where(where.has_embedding, total, -1.0)
        totals.append(total)
    # the first largest moment, as the loop keeping the first of strictly larger ones (a NaN ends it)
    best_total, best_index = totals[0], np.zeros(base.shape, dtype=np.int64)
    for i in range(1, len(totals)):
        best_index[totals[i] > best_total] = i
        best_total = np.maximum(best_total, totals[i])
    beyond |= ~np.logical_and.reduce(best_total <= MAX_EXACT_BYTES, axis=1)  # NaN compares False: flagged too
    if np.count_nonzero(beyond):  # categories are non-negative: none of a row within bound passes it
        kept_rows = ~beyond[:, None]
        persistent = {name: np.where(kept_rows, value, 0.0) for name, value in persistent.items()}
        moments = [{name: np.where(kept_rows, m[name], 0.0) for name in _MOMENT_CATEGORIES} for m in moments]
        allocators = [np.where(kept_rows, value, 0.0) for value in allocators]
        best_total = np.where(kept_rows, best_total, 0.0)
    # every category is whole and non-negative by construction: written once, straight into int64
    stage_bytes = np.empty(base.shape + (len(CATEGORIES),), dtype=np.int64) if out is None else out
    for name in ("parameters", "master", "optimizer_states"):
        stage_bytes[:, :, CATEGORIES.index(name)] = persistent[name]
    for name, category in zip(_MOMENT_CATEGORIES, _MOMENT_CATEGORY_INDEX, strict=True):  # the largest moment's
        stage_bytes[:, :, category] = best_index.choose([m[name] for m in moments])  # np.choose without its wrapper
    stage_bytes[:, :, CATEGORIES.index("allocator")] = best_index.choose(allocators) if any_overhead else 0
    return stage_bytes, np.maximum(best_total, 0).astype(np.int64), best_index


# the categories _reserved holds as one large block each
_BLOCK_CATEGORIES = np.array([CATEGORIES.index(name) for name in ("parameters", "master", "optimizer_states",
                                                                   "gradients", "communication")])


def _reserved(model: ModelTables, recs, seq_index, cols, batch: _Batch, where: placement_rules.Placement,
              flight: _InFlight, layer: "_LayerActivations", stage_bytes, stage_peak, stage_exists):
    """(N, R) bytes the caching allocator reserves for each stage's peak (-1: not claimed), and why not (N,).

    The peak's allocated bytes (``allocator_overhead``'s guess replaced) plus what the allocator
    reserves beyond them: parameters, master copy, optimizer states, gradients, the output layer's and
    the communication buffers each as one large block (2 MiB multiples; per-tensor rounding, under 2 MiB
    a tensor, is left out); each kept layer's steady excess and, once, the working peak's (the census's
    replay of its events, :func:`ndcost.allocator.stack_excess`; a selective or core-attention recompute
    layer's from the replay of that policy's passes), of the kind whose figure is largest; on the head's
    stage the output layer's own (its replay alone, split by tp under ``vocab_parallel``); a full-recompute
    layer's kept input as packed into segments (:func:`ndcost.allocator.packed_reserved_bytes`, as if
    allocated alone). The layers' excess is added whichever moment the stage peaks at (the allocator keeps
    its segments cached to the optimizer step) and never below zero. Under fp32 parameters and autocast
    the figures are the census's autocast pass's replays. Offloading: the persistent blocks offloaded are
    off the device already (their bytes are 0); under ``offload_activations`` the kept layers' excess and
    the packed inputs go (what they save leaves the device as it is saved, and the blocks it freed are
    reused by the next layer), the working peak's stays. Left out: the excess scales per token from the
    census's sequence length (a segment's rounding does not), and ``moe_imbalance``, CP's gathered keys
    and values and ``etp`` do not change it.
    """
    fp32_autocast, any_fp32_autocast = batch.fp32_autocast, batch.any_fp32_autocast
    mode = cols["recompute"]
    used = batch.recompute_used
    policed = (mode == RECOMPUTE.index("core_attention")) | (mode == RECOMPUTE.index("selective"))
    any_policed = used[RECOMPUTE.index("core_attention")] or used[RECOMPUTE.index("selective")]
    figures = layer.reserved  # (K, N) each kind's replays' figures
    n, ranks = stage_peak.shape
    # (K, N, R) over the kinds at once, never a layer: their layers on each rank, and those times the
    # micro-batches each chunk holds
    present, redone = where.holds_kind, where.holds_split[:, 1]
    redone_held = flight.recomputed_layers
    missing = present & figures.unpriced[:, :, None]
    if any_policed:  # a policy's recomputed layers: its replays' figures
        by_policy = policed[None, :, None] & redone
        missing |= by_policy & figures.policy_unpriced[:, :, None]
    vocab_parallel = np.asarray(cols["vocab_parallel"], dtype=bool)
    x = _replay_figure(recs, seq_index, batch, "out_reserved", "out_autocast_reserved")
    x_tp = _replay_figure(recs, seq_index, batch, "out_reserved_tp", "out_autocast_reserved_tp")
    output = batch.tokens * _rows_where(vocab_parallel, int(np.count_nonzero(vocab_parallel)),
                                        lambda: _tp_share(batch, x, x_tp), lambda: x + x_tp)
    output_unknown = np.isnan(output)
    if not where.head_everywhere:  # the head's stage's
        output_unknown = np.logical_or.reduce(where.has_head & output_unknown[:, None], axis=1)
    unknown = np.logical_or.reduce(missing, axis=(0, 2)) | output_unknown
    if any_fp32_autocast:  # under fp32 autocast the policies' passes (run with bf16 parameters) are not the run's
        autocast_unknown = fp32_autocast & (unknown | (policed & np.logical_or.reduce(flight.recomputed > 0,
                                                                                          axis=1)))
        unclaimed = np.where(unknown & ~fp32_autocast, 1, np.where(autocast_unknown, 2, 0))
    else:
        unclaimed = unknown.astype(np.int64)
    unclaimed = np.where(unknown & (batch.compute_bytes == 4), 3, unclaimed)  # the widened tables claim none
    unclaimed_rows = int(np.count_nonzero(unclaimed))
    if unclaimed_rows == n:  # no row's claimed (no replay of some kind's, as the formulas')
        return np.full((n, ranks), -1, dtype=np.int64), unclaimed
    plain = flight.plain_layers
    kept = plain * figures.layer[:, :, None]
    as_plain = present
    if any_policed:
        as_plain = present & ~(by_policy & (plain == 0))
        by_policy_kept = np.where(policed[None, :, None], redone_held * figures.policy_layer[:, :, None], 0.0)
        # each kind's plain layers, then its policy's: the order of the sum over kinds
        kept = np.concatenate((kept[:, None], by_policy_kept[:, None]), axis=1).reshape((-1, n, ranks))
    most = np.where(as_plain, figures.working[:, :, None], -np.inf)
    if any_policed:
        most = np.concatenate((most, np.where(by_policy, figures.policy_working[:, :, None], -np.inf)))
    activations = _sum_in_order(kept, (n, ranks))
    # the working peak's excess: the largest of a plain (or fully recomputed) layer's and a policy's
    working_most = np.maximum.reduce(most, axis=0, initial=-np.inf)
    output = nan_to_zero(output)[:, None]
    if not where.head_everywhere:
        output = np.where(where.has_head, output, 0.0)
    layers = activations
    if used[RECOMPUTE.index("full")]:  # a full-recompute layer's kept input, as packed into segments
        full, recomputed = (mode == RECOMPUTE.index("full"))[:, None], flight.recomputed
        split = np.where(batch.sp, batch.tp, 1.0)
        input_bytes = whole(model.hidden_size * batch.residual_bytes * batch.tokens / split).astype(np.int64)[:, None]
        packed = packed_reserved_bytes(recomputed, np.maximum(input_bytes, 1)) - recomputed * input_bytes
        layers = layers + np.where(full & (recomputed > 0), packed, 0)
    offloaded = np.asarray(cols["offload_activations"], dtype=bool)[:, None]
    layers = _rows_where(offloaded, int(np.count_nonzero(offloaded)), lambda: 0.0, lambda: layers)
    layers = layers + np.where(np.isfinite(working_most), working_most, 0.0) + output
    # each held as one large block
    blocks = np.add.reduce(large_block_excess_bytes(stage_bytes[:, :, _BLOCK_CATEGORIES]), axis=2)
    allocated = stage_peak - stage_bytes[:, :, CATEGORIES.index("allocator")]
    reserved = allocated + blocks + whole(np.maximum(layers, 0.0)).astype(np.int64)
    if stage_exists is not None:
        reserved = np.where(stage_exists, reserved, 0)
    if unclaimed_rows:
        reserved = np.where((unclaimed > 0)[:, None], -1, reserved)
    return reserved, unclaimed


def compose(model: ModelTables, recs: Mapping[str, np.ndarray], seq_index: np.ndarray, cols: Mapping[str, Any],
            schedules: Sequence[Any], states_per_parameter: np.ndarray,
            step_temporaries_per_parameter: np.ndarray, out: Optional[np.ndarray] = None,
            embedding_sort_scratch: bool = False, devices_per_node: int = 8) -> Composed:
    """Price every row of *cols* (all rows valid): the module docstring maps the steps.

    *schedules* and *states_per_parameter* / *step_temporaries_per_parameter*
    are indexed by the ``schedule`` and ``optimizer`` codes;
    *embedding_sort_scratch*: the runtime's embedding backward is PyTorch's
    CUDA kernel (fp32 ``[rows, h]`` sums above ``EMBEDDING_SORT_MIN_TOKENS``
    indices); *out*, where given, is the ``(N, R, C)`` int64 array
    ``stage_bytes`` is written into (a view of the caller's: no copy);
    *devices_per_node* (the hardware's) groups the devices for ``host_bytes_per_node``.
    """
    batch = _batch(cols)
    mtp = model.mtp_counts if model.builds_mtp else None
    where = placement_rules.place(model.stack, cols, schedules, mtp_counts=mtp, pp_bounds=cols.get("pp_bounds"))
    held = _in_flight(cols, schedules, where)
    layers = where.rank_kind_layers  # (K, N, R): each rank's layers, MTP ones with the head
    params = _stage_parameters(model, batch, cols, where)
    persistent = _persistent_bytes(params, batch, cols, states_per_parameter, step_temporaries_per_parameter)
    persistent, host_states = _offload_states(persistent, batch, cols)
    layer = _layer_activations(model, recs, seq_index, cols, batch)
    stage = _stage_activations(layer, where, held, params, batch, recs["grad_share"][seq_index])
    outputs, unpriced_output = _output_layer(model, recs, seq_index, cols, batch, where, held)
    buffers = _communication_buffers(model, params, batch, cols, where, layers)
    moments = _moments(model, persistent, params, stage, outputs, buffers, batch, cols, embedding_sort_scratch)
    received = _pipeline_buffers(model, recs, seq_index, cols, batch, where, held)
    if received is not None:
        moments = [dict(m, communication=m["communication"] + extra)
                   for m, extra in zip(moments, received, strict=True)]
    outputs = _pipeline_outputs(model, cols, batch, where, held, moments[-1]["working"])
    if outputs is not None:
        moments = [dict(m, **{name: m[name] + whole(by_moment[i]) for name, by_moment in outputs.items()})
                   for i, m in enumerate(moments)]
    moments, host_bytes, offloaded_activations = _offload_activations(moments, stage, layer, where, cols,
                                                                      host_states)
    kept = {name: whole(persistent[name]) for name in ("parameters", "master", "optimizer_states")}
    layer_keep = layer.kept
    beyond = layer.beyond_exact.copy()  # (more rows are set below)
    host_per_node = np.zeros(len(beyond))
    if np.count_nonzero(host_bytes):  # NaN or past 2**53 flags the row below
        host_per_node = topology.worst_node_total(
            np.where(np.isfinite(host_bytes), host_bytes, MAX_EXACT_BYTES), batch.sharding.replicas * batch.tp_int,
            cols["pp"], devices_per_node)
        beyond |= ~(host_bytes <= MAX_EXACT_BYTES).all(axis=1) | ~(host_per_node < MAX_EXACT_BYTES)
    stage_bytes, stage_peak, best_moment = _peak(kept, moments, where, cols, out, beyond)
    any_beyond = bool(np.count_nonzero(beyond))

    def kept_rows(x):  # int64, 0 on the rows beyond exact bytes
        return (np.where(beyond[:, None] if x.ndim == 2 else beyond, 0.0, x) if any_beyond else x).astype(np.int64)

    host_bytes, offloaded_activations = kept_rows(host_bytes), kept_rows(offloaded_activations)
    stage_layers = np.add.reduce(layers, axis=0)
    pp = cols["pp"]
    stage_exists = None  # None: every row has the batch's stages (one strategy always has)
    if len(pp) > 1 and not (pp == stage_peak.shape[1]).all():
        # rows of fewer stages than the batch's most: their extra stages hold nothing
        stage_exists = np.arange(stage_peak.shape[1])[None, :] < pp.astype(np.int64)[:, None]
        stage_bytes[~stage_exists] = 0
        stage_peak[~stage_exists] = 0
        stage_layers = np.where(stage_exists, stage_layers, 0)
        host_bytes[~stage_exists] = 0
        offloaded_activations[~stage_exists] = 0
    peak_stage = stage_peak.argmax(axis=1)
    stage_reserved, unclaimed = _reserved(model, recs, seq_index, cols, batch, where, held, layer, stage_bytes,
                                          stage_peak, stage_exists)
    return Composed(stage_reserved_bytes=stage_reserved, reserved_unclaimed=unclaimed, stage_bytes=stage_bytes,
                    stage_peak_bytes=stage_peak,
                    peak_bytes=np.maximum.reduce(stage_peak, axis=1), peak_stage=peak_stage,  # the argmax's
                    stage_layers=stage_layers, stage_moment=best_moment,
                    layer_bytes=kept_rows(layer_keep),  # NaN rows are beyond
                    unpriced={"working": layer.unpriced_working, "output working": unpriced_output,
                              "selective": layer.unpriced_selective}, beyond_exact=beyond,
                    stage_kind_layers=where.rank_layers(with_mtp=False), head_stage=where.head_rank,
                    embedding_stage=where.has_embedding.argmax(axis=1), stage_host_bytes=host_bytes,
                    host_bytes_per_node=kept_rows(host_per_node),
                    stage_offloaded_activation_bytes=offloaded_activations, fp32_autocast=batch.fp32_autocast)
