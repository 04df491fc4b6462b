"""Per-device memory of a batch of strategies, for every pipeline stage, by category: numpy, no loops over layers.

The resolver builds two kinds of tables once: :class:`ModelTables` (a model's
layer order as per-kind prefix counts, its parameters by kind and part) when
it resolves a model, and :class:`RecordTables` (the kind records' per-token
figures) once per sequence length. :func:`compose` then prices a whole batch
of strategies, given as columns of numpy arrays (see ``FIELDS``), with array
arithmetic over the axes (row, rank, chunk, kind); the only Python loops run
over the few chunks, kinds, moments and schedules, never over layers or rows.

What a stage holds (bytes per device, categories of ``MEMORY_CATEGORIES``):

- parameters, gradients, master copy, optimizer states: the stage's layers
  (prefix counts at its virtual stages' bounds), embedding on the first
  virtual stage, final norm and head on the last (a tied head is the
  embedding: counted once per holder). Attention, feed-forward and shared
  experts are split by ``tp``; norms, router and other parts are replicated;
  routed experts are split by ``ep * etp``; embedding and head by ``tp``
  under ``vocab_parallel``. ZeRO (over ``dp * cp``) or FSDP2 (over
  ``fsdp * cp``) shards optimizer states and master (zero >= 1), gradients
  (zero >= 2) and parameters (zero 3, fsdp); routed experts over the
  expert-data-parallel part of that group. Under autocast (compute dtype
  other than the parameters', no FSDP/ZeRO-3 mixed precision) the matmul
  weights' compute-dtype copies the forward saves count with the parameters.
- activations: per layer and micro-batch of ``micro_batch * seq / cp``
  tokens, the kind record's ``saved + saved_tp / tp`` (under ``sp``
  ``(saved + saved_tp) / tp``); routed bytes scaled by ``moe_imbalance`` and
  their width split by ``etp``; under ring, Colossal-AI or hybrid CP the
  gathered keys and values of the other ``cp - 1`` ranks (seed 003's
  ``kv_shards`` rule; Ulysses and linear-attention layers gather none).
  Recompute applies to the first ``recompute_layers`` layers of each virtual
  stage: ``full`` keeps the layer's input (``h`` elements a token in the
  residual stream's dtype, split by tp under sp), ``selective`` the record's
  selective figure, ``core_attention`` drops the ops attBMM, softmax and
  dropout. Multiplied by the micro-batches the schedule keeps in flight.
- working: the backward's peak over what is kept (record ``working`` less
  what the layer keeps), the embedding backward's arriving gradient and
  scratch, or the optimizer step's temporaries.
- output: the output layer's (final norm, head, loss with fp32 logits) kept
  bytes per micro-batch in flight and its backward peak; the vocabulary part
  split by tp only under ``vocab_parallel``.
- communication: parameters all-gathered (in the compute dtype) and
  gradients before their reduce-scatter. FSDP2 (``fsdp``) keeps the root's
  parameters (embedding, final norm, head) gathered from the forward's start
  to the backward's end (the root is not resharded after forward) and the
  head's gradient whole until the root's reduce-scatter at the backward's
  end; a layer's backward adds it and the next layer (prefetched) gathered
  and its gradient. ZeRO-3 gathers one module at a time, root or layer. Plus
  the largest of SP's gathered layer input, EP's dispatch and combine
  buffers and CP's KV blocks in flight (TP without SP all-reduces in place:
  no buffer).
- allocator: ``allocator_overhead`` times the rest.

The peak of a stage is the largest of five moments: the first backward of
the output layer (all activations kept, no gradient yet: the head's is made
after the loss's peak), of the stage's last layer (the head's gradient
made), the end of the last backward (every gradient but the embedding's,
which comes after the first layer's backward, the other micro-batches'
activations, one layer's full working), the embedding's backward (every
gradient, the gradient arriving from the first layer, PyTorch CUDA's fp32
sums by row above 3072 indices where the runtime is CUDA's) and the
optimizer step (every gradient). A layer's working figure is the census's:
the activations live where activations and gradients together peak, the
layer's input left out where no op saves it (a full-recompute layer's
backward adds the input its checkpoint keeps), with the share of the
layer's gradients made by then (on a first backward with whole gradients
the layer moments count that share of its gradients, not all). A rank that
has already run a backward (more forwards than it keeps in flight) holds
every gradient throughout. The device's peak is the largest stage's. On an
H200 (torch 2.11, Transformers, bf16, fused AdamW) this put setup (a)'s peak
within 0.1 % of ``max_memory_allocated`` for a Llama-3.1-8B at 4096 tokens
(+0.080 % plain, -0.011 % with full recompute) and a 4-layer Qwen3-MoE at
2048 (+0.013 %, -0.017 %), less the cuBLAS workspaces (two streams) and
input ids it does not count.

Known limitations: a stage's working peak takes the largest over the kinds
it holds rather than the kind of its first or last layer; parameters split
by TP are split evenly (biases of row-parallel layers, MLA's replicated
down-projections are split too); activation records are used at the dtype they were taken in.
Where tp exceeds the KV heads (replicated, as Megatron does), a rank keeps
one KV head's projections and keys and values. The share of a layer's
gradients made by its working moment is the census's at TP 1 and the
sequence it measured (more tokens a micro-batch can move the moment); under
sharded gradients (ZeRO-2, FSDP) and accumulation every gradient of the
layer is counted, and a layer's transient gradients before they are added
in are not (the embedding's aside). The embedding's sort scratch is an
upper bound (one row a token: real text repeats tokens).
"""
from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.values import DTYPES, MEMORY_CATEGORIES, PARTS, RECOMPUTE, CP_ALGOS

CATEGORIES = MEMORY_CATEGORIES
_C = {name: i for i, name in enumerate(CATEGORIES)}

# Parts split by tensor parallelism, replicated over it, and split by ep * etp.
TP_PARTS = ("attention", "ffn", "shared")
REPLICATED_PARTS = ("norm", "router", "other", "mtp", "embedding", "head")
ROUTED_PARTS = ("routed",)
# Parts whose weights a matmul reads (autocast casts and saves a copy of these).
MATMUL_PARTS = ("attention", "ffn", "shared", "router", "other", "mtp", "routed")

DTYPE_NAMES = tuple(DTYPES)
DTYPE_BYTES = np.array([DTYPES[d] for d in DTYPE_NAMES] + [0], dtype=np.float64)  # last: "none"
GATHERING_CP = np.array([a in ("ring", "colossal", "hybrid") for a in CP_ALGOS])


def ceil_div(x, d):
    """Exact integer ceiling of x / d on int64 arrays."""
    return -((-x) // d)


# ---------------------------------------------------------------------------
# strategy-independent tables
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True, eq=False)
class ModelTables:
    """A model's layer stack and parameters as arrays over its kinds (built once per resolve)."""

    kinds: Tuple[str, ...]
    num_layers: int
    prefix: np.ndarray            # (K, L + 1): layers of kind k among the first n
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
    num_experts: int
    experts_per_token: int
    moe_intermediate_size: Optional[int]
    linear_heads: Tuple[int, ...]
    is_moe: np.ndarray            # (K,) bool: the kind routes tokens to experts
    kv_elements_per_token: np.ndarray  # (K,): keys and values a token, all heads, TP 1 (0: no KV to gather)
    kv_params: np.ndarray         # (K,): of tp_params, the key and value projections (GQA; 0 for MLA, linear)

    @classmethod
    def build(cls, spec, counts, builds_mtp: bool) -> "ModelTables":
        """From a ModelSpec and the family's ParameterCount (``by_kind``, ``embedding``, ``head``, ``final_norm``)."""
        kinds = tuple(dict.fromkeys(g.kind for g in spec.layers))
        index = {k: i for i, k in enumerate(kinds)}
        order = np.array([index[k] for k in spec.layer_kinds(include_mtp=False)], dtype=np.int64)
        L = len(order)
        prefix = np.zeros((len(kinds), L + 1), dtype=np.int64)
        for i in range(len(kinds)):  # a loop over kinds, once per resolve
            prefix[i, 1:] = np.cumsum(order == i)
        mtp = np.zeros(len(kinds), dtype=np.int64)
        for g in spec.layers:
            if g.mtp:
                mtp[index[g.kind]] += g.count

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
            from ndcost.errors import Unpriced
            raise Unpriced(f"model {spec.name!r}: no parameters for layer kinds {missing} "
                           f"(the family's parameters() left them out)")
        head_dim = spec.resolved_head_dim
        kv_elems = []
        for k in kinds:
            if spec.kind(k).linear:
                kv_elems.append(0)
            elif spec.kind(k).latent:
                qk = (spec.qk_nope_head_dim or head_dim) + (spec.qk_rope_head_dim or 0)
                kv_elems.append(spec.num_attention_heads * (qk + (spec.v_head_dim or head_dim)))
            else:
                kv_elems.append(2 * (spec.num_key_value_heads or spec.num_attention_heads) * head_dim)
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
            kinds=kinds, num_layers=L, prefix=prefix, mtp_counts=mtp, builds_mtp=bool(builds_mtp),
            tp_params=parts(TP_PARTS), replicated_params=parts(REPLICATED_PARTS), routed_params=routed,
            matmul_tp_params=parts(tuple(p for p in MATMUL_PARTS if p in TP_PARTS)),
            matmul_replicated_params=parts(tuple(p for p in MATMUL_PARTS if p in REPLICATED_PARTS)),
            embedding=int(counts.embedding), head=int(counts.head),
            final_norm=int(counts.final_norm) + int(getattr(counts, "other", 0) or 0),
            tied=int(counts.head) == 0, hidden_size=spec.hidden_size, heads=spec.num_attention_heads,
            kv_heads=spec.num_key_value_heads or spec.num_attention_heads,
            intermediate_size=spec.intermediate_size, num_experts=spec.num_experts or 0,
            experts_per_token=spec.num_experts_per_tok or 0, moe_intermediate_size=spec.moe_intermediate_size,
            linear_heads=linear, is_moe=routed > 0, kv_elements_per_token=np.array(kv_elems, dtype=np.float64),
            kv_params=np.minimum(np.array(kv_params, dtype=np.int64), parts(("attention",))))


def _nan(value):
    return np.nan if value is None else float(value)


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
    out_saved: float
    out_saved_tp: float
    out_working: float        # nan: unpriced
    out_working_tp: float
    provenance: Mapping[str, Any] = attrs.field(factory=dict)

    ROW_FIELDS = ("saved", "saved_tp", "working", "working_tp", "working_input", "grad_share", "selective",
                  "selective_tp", "dropped",
                  "dropped_tp", "routed", "routed_tp", "routed_tokens", "routed_width")
    SCALAR_FIELDS = ("out_saved", "out_saved_tp", "out_working", "out_working_tp")

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
            from ndcost.errors import Unpriced
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
            cols["working_input"].append(float(bool(getattr(r, "working_input_per_token", None))))
            made = getattr(r, "working_grad_share", None)
            cols["grad_share"].append(1.0 if made is None else min(max(float(made), 0.0), 1.0))
            sel = r if r.selective_per_token is not None else sel_fb.get(k)
            cols["selective"].append(_nan(getattr(sel, "selective_per_token", None)))
            cols["selective_tp"].append(_nan(getattr(sel, "selective_tp_per_token", None)) if sel is not None
                                        and sel.selective_per_token is not None else np.nan)
            cols["dropped"].append(float(sum(r.ops.get(op, 0.0) for op in core_ops)))
            cols["dropped_tp"].append(float(sum(r.ops_tp.get(op, 0.0) for op in core_ops)))
            share = routed_share.get(k, (0.0, 0.0, 0.0, 0.0))
            for name, value in zip(("routed", "routed_tp", "routed_tokens", "routed_width"), share):
                cols[name].append(float(value))
        arrays = {f: np.array(v, dtype=np.float64) for f, v in cols.items()}
        arrays["selective_tp"] = np.where(np.isnan(arrays["selective"]), np.nan,
                                          np.nan_to_num(arrays["selective_tp"]))
        arrays["working_tp"] = np.where(np.isnan(arrays["working"]), np.nan, np.nan_to_num(arrays["working_tp"]))
        return cls(seq=int(seq), **arrays,
                   out_saved=float(output.saved_per_token), out_saved_tp=float(output.saved_tp_per_token),
                   out_working=_nan(output.working_per_token),
                   out_working_tp=0.0 if output.working_tp_per_token is None else float(output.working_tp_per_token),
                   provenance=dict(provenance or {}))


def stack_records(tables: Sequence[RecordTables]) -> Dict[str, np.ndarray]:
    """``{field: (n_seq, K) or (n_seq,) array}`` over several sequence lengths."""
    out = {f: np.stack([getattr(t, f) for t in tables]) for f in RecordTables.ROW_FIELDS}
    out.update({f: np.array([getattr(t, f) for t in tables], dtype=np.float64) for f in RecordTables.SCALAR_FIELDS})
    return out


# ---------------------------------------------------------------------------
# the strategy columns
# ---------------------------------------------------------------------------
# Columns compose() reads, each an array over the batch: ints, bools, and codes
# (dtype codes index DTYPE_NAMES, with len(DTYPE_NAMES) for "none"; recompute
# codes index RECOMPUTE; cp_algo codes CP_ALGOS; schedule and optimizer codes
# index the names compose() is given).
INT_FIELDS = ("dp", "fsdp", "tp", "pp", "vpp", "cp", "ep", "etp", "zero", "micro_batch", "num_micro_batches",
              "seq", "recompute_layers")
BOOL_FIELDS = ("sp", "vocab_parallel")
FLOAT_FIELDS = ("moe_imbalance", "allocator_overhead")
CODE_FIELDS = ("cp_algo", "schedule", "recompute", "optimizer", "param_dtype", "compute_dtype", "grad_dtype",
               "optimizer_dtype", "master_dtype")


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
    layer_bytes: np.ndarray      # (N, K) int64: one layer of each kind keeps for one micro-batch
    stage_kind_layers: np.ndarray  # (N, R, K) int64: the stack's layers of each kind on each stage (no MTP)
    head_stage: np.ndarray       # (N,) int64: the stage holding the head


MOMENTS = ("output backward", "last layer backward", "end of backward", "embedding backward", "optimizer step")

# PyTorch's CUDA embedding backward (embedding_dense_backward_cuda) sorts the indices and sums each
# row's gradient in fp32 partial buffers above this many indices; at or below it, it adds in place.
EMBEDDING_SORT_MIN_TOKENS = 3072


def compose(model: ModelTables, recs: Mapping[str, np.ndarray], seq_index: np.ndarray, cols: Mapping[str, Any],
            schedules: Sequence[Any], states_per_parameter: np.ndarray,
            step_temporaries_per_parameter: np.ndarray, out: Optional[np.ndarray] = None,
            embedding_sort_scratch: bool = False) -> Composed:
    """Price every row of *cols* (all rows valid): see the module docstring for what is counted.

    *embedding_sort_scratch*: the runtime's embedding backward is PyTorch's CUDA kernel, which above
    ``EMBEDDING_SORT_MIN_TOKENS`` indices sums each row's gradient in an fp32 ``[rows, h]`` scratch.

    *out*, where given, is the ``(N, R, C)`` int64 array (a view of the
    caller's) that ``stage_bytes`` is written into, saving a copy of the
    batch's largest array.
    """
    f64 = np.float64
    p = cols["pp"].astype(np.int64)
    v = cols["vpp"].astype(np.int64)
    N = len(p)
    R, V, K = int(p.max()), int(v.max()), len(model.kinds)
    L = model.num_layers
    t = cols["tp"].astype(f64)
    ti = cols["tp"].astype(np.int64)
    cp = cols["cp"].astype(f64)
    sp = cols["sp"].astype(bool)
    m = cols["num_micro_batches"].astype(np.int64)
    tokens = cols["micro_batch"].astype(f64) * cols["seq"].astype(f64) / cp  # (N,) per micro-batch per rank
    cbytes = DTYPE_BYTES[cols["compute_dtype"]]
    pbytes = DTYPE_BYTES[cols["param_dtype"]]
    gbytes = DTYPE_BYTES[cols["grad_dtype"]]
    obytes = DTYPE_BYTES[cols["optimizer_dtype"]]
    mbytes = DTYPE_BYTES[cols["master_dtype"]]
    fsdp = cols["fsdp"].astype(np.int64)
    zero = cols["zero"].astype(np.int64)
    sharded_params = (zero == 3) | (fsdp > 1)
    autocast = (cols["compute_dtype"] != cols["param_dtype"]) & ~sharded_params
    # the residual stream (a full-recompute layer's input) runs in the parameters' dtype under autocast
    resid_bytes = np.where(autocast, pbytes, cbytes)

    # -- where each rank's chunks sit and how many micro-batches they keep ---------------------
    rank = np.arange(R)[None, :, None]
    chunk = np.arange(V)[None, :][:, None, :]
    P3, V3, M3 = p[:, None, None], v[:, None, None], m[:, None, None]
    exists = (rank < P3) & (chunk < V3)
    vstage = np.zeros((N, R, V), dtype=np.int64)
    held = np.zeros((N, R, V), dtype=np.int64)
    code = cols["schedule"]
    for i, schedule in enumerate(schedules):  # a loop over the schedules a batch uses
        rows = code == i
        if not rows.any():
            continue
        vs = np.asarray(schedule.virtual_stage(P3, V3, rank, chunk), dtype=np.int64)
        fl = np.asarray(schedule.in_flight(P3, V3, M3, rank, chunk), dtype=np.int64)
        vstage = np.where(rows[:, None, None], np.broadcast_to(vs, (N, R, V)), vstage)
        held = np.where(rows[:, None, None], np.broadcast_to(fl, (N, R, V)), held)
    nv = p * v
    vstage = np.where(exists, np.clip(vstage, 0, (nv - 1)[:, None, None]), 0)
    held = np.where(exists, np.maximum(held, 0), 0)

    # -- the layers of each virtual stage: bounds from pp_layers or an even split --------------
    J = int(nv.max())
    j = np.arange(J + 1)[None, :]
    per = (L // nv)[:, None]
    bounds = np.minimum(j, nv[:, None]) * per
    if cols.get("pp_bounds") is not None:  # rows with an explicit split: (N, J+1) cumulative, -1 elsewhere
        explicit = cols["pp_bounds"]
        width = explicit.shape[1]
        given = np.full((N, J + 1), -1, dtype=np.int64)
        given[:, :min(width, J + 1)] = explicit[:, :J + 1]
        bounds = np.where(given[:, :1] >= 0, np.where(given >= 0, given, L), bounds)
    start = np.take_along_axis(bounds, vstage.reshape(N, -1), axis=1).reshape(N, R, V)
    end = np.take_along_axis(bounds, (vstage + 1).reshape(N, -1), axis=1).reshape(N, R, V)
    start = np.where(exists, start, 0)
    end = np.where(exists, end, 0)
    nrec = np.where(cols["recompute"] == RECOMPUTE.index("none"), 0,
                    np.where(cols["recompute_layers"] < 0, L, cols["recompute_layers"]))
    rec_end = start + np.minimum(nrec[:, None, None], end - start)
    first = exists & (vstage == 0)
    last = exists & (vstage == (nv - 1)[:, None, None])
    # counts[k]: (N, R, V) layers of kind k on each chunk; rec[k]: of those, recomputed
    counts = [model.prefix[k][end] - model.prefix[k][start] for k in range(K)]
    on_rank_stack = [c.sum(axis=2) for c in counts]  # (N, R): the stack's layers, MTP aside (the time model's)
    on_rank = on_rank_stack
    if model.builds_mtp:
        counts = [c + np.where(last, model.mtp_counts[k], 0) for k, c in enumerate(counts)]
        on_rank = [c.sum(axis=2) for c in counts]  # (N, R)
    rec = [model.prefix[k][rec_end] - model.prefix[k][start] for k in range(K)]
    plain = [c - r for c, r in zip(counts, rec)]
    stage_layers = sum(on_rank) if K else np.zeros((N, R), dtype=np.int64)

    # -- parameters by device ------------------------------------------------------------------
    ep_etp = (cols["ep"] * cols["etp"]).astype(np.int64)
    # TP beyond the KV heads replicates them: a rank keeps one KV head's projections and activations
    kv_split = np.minimum(ti, model.kv_heads)
    layer_dense = [ceil_div(np.int64(model.tp_params[k] - model.kv_params[k]), ti)
                   + ceil_div(np.int64(model.kv_params[k]), kv_split) + model.replicated_params[k] for k in range(K)]
    layer_routed = [ceil_div(np.int64(model.routed_params[k]), ep_etp) for k in range(K)]
    layer_copies = [ceil_div(np.int64(model.matmul_tp_params[k]), ti) + model.matmul_replicated_params[k]
                    + layer_routed[k] for k in range(K)]
    dense = sum(on_rank[k] * layer_dense[k][:, None] for k in range(K))
    routed = sum(on_rank[k] * layer_routed[k][:, None] for k in range(K))
    copies = sum(on_rank[k] * layer_copies[k][:, None] for k in range(K))
    vocab_split = np.where(cols["vocab_parallel"].astype(bool), ti, 1)
    emb = ceil_div(np.int64(model.embedding), vocab_split)
    head_params = model.embedding if model.tied else model.head
    head = ceil_div(np.int64(head_params), vocab_split)
    has_emb = first.any(axis=2)
    has_head = last.any(axis=2)
    head_extra = np.where(has_head & ~(has_emb & model.tied), head[:, None], 0)
    dense = dense + np.where(has_emb, emb[:, None], 0) + head_extra + np.where(has_head, model.final_norm, 0)
    copies = copies + head_extra  # the head's matmul reads its weight (the embedding's where tied)
    head_grad = head_extra + np.where(has_head & has_emb & model.tied, emb[:, None], 0)

    dp, cpi = cols["dp"].astype(np.int64), cols["cp"].astype(np.int64)
    shard_dense = np.where(fsdp > 1, fsdp * cpi, np.where(zero > 0, dp * cpi, 1))
    group = shard_dense * ti
    shard_routed = np.where(group % ep_etp == 0, np.maximum(group // ep_etp, 1), 1)

    def per_device(dense_el, routed_el, sharded):
        sd, sr = shard_dense[:, None], shard_routed[:, None]
        return np.where(sharded[:, None], ceil_div(dense_el, sd) + ceil_div(routed_el, sr), dense_el + routed_el)

    params_el = per_device(dense, routed, sharded_params)
    grads_el = per_device(dense, routed, (zero >= 2) | (fsdp > 1))
    states_el = per_device(dense, routed, (zero >= 1) | (fsdp > 1))
    head_grad_el = per_device(head_grad, np.zeros_like(head_grad), (zero >= 2) | (fsdp > 1))
    emb_grad = np.where(has_emb & ~model.tied, emb[:, None], 0)  # a tied embedding's gradient comes with the head's
    emb_grad_el = per_device(emb_grad, np.zeros_like(emb_grad), (zero >= 2) | (fsdp > 1))

    parameters = params_el * pbytes[:, None] + np.where(autocast[:, None], copies * cbytes[:, None], 0)
    gradients = grads_el * gbytes[:, None]
    master = states_el * mbytes[:, None]
    spp = states_per_parameter[cols["optimizer"]]
    optimizer_states = states_el * (spp * obytes)[:, None]
    step_temporaries = states_el * (step_temporaries_per_parameter[cols["optimizer"]] * obytes)[:, None]
    head_gradients = head_grad_el * gbytes[:, None]
    embedding_gradients = emb_grad_el * gbytes[:, None]

    # -- activations per layer of each kind, one micro-batch ------------------------------------
    def rec_rows(name):
        return recs[name][seq_index]  # (N, K) or (N,)

    def at_tp(x, x_tp):
        return np.where(sp[:, None], (x + x_tp) / t[:, None], x + x_tp / t[:, None])

    saved, saved_tp = rec_rows("saved"), rec_rows("saved_tp")
    routed_b, routed_tp = rec_rows("routed"), rec_rows("routed_tp")
    etp = cols["etp"].astype(f64)[:, None]
    imbalance = cols["moe_imbalance"].astype(f64)[:, None]
    # routed tokens a rank's experts process: its own (split by tp under sp), gathered over the etp group
    routed_tokens = np.where(sp[:, None], etp / t[:, None], 1.0)
    routed_one = routed_tokens * (rec_rows("routed_tokens") + rec_rows("routed_width") / etp)
    routed_working_extra = (imbalance - 1.0) * routed_one
    plain_per_token = at_tp(saved - routed_b, saved_tp - routed_tp) + imbalance * routed_one
    gathers = GATHERING_CP[cols["cp_algo"]] & (cpi > 1)
    gathered = np.where(gathers[:, None], (cp[:, None] - 1) * model.kv_elements_per_token[None, :]
                        * cbytes[:, None] / kv_split[:, None], 0.0)
    # keys and values replicated where TP exceeds the KV heads: a rank keeps 1/kv_heads of them, not 1/tp
    replicated_kv = np.where(model.kv_params[None, :] > 0, model.kv_elements_per_token[None, :] * cbytes[:, None]
                             * (1.0 / kv_split - 1.0 / t)[:, None], 0.0)
    gathered = gathered + replicated_kv
    T = tokens[:, None]
    keep_plain = T * (plain_per_token + gathered)
    mode = cols["recompute"]
    full_input = (model.hidden_size * resid_bytes / np.where(sp, t, 1.0))[:, None] * np.ones((1, K))
    selective = at_tp(rec_rows("selective"), rec_rows("selective_tp"))
    core = plain_per_token - at_tp(rec_rows("dropped"), rec_rows("dropped_tp"))
    rec_per_token = np.select([(mode == RECOMPUTE.index("full"))[:, None],
                               (mode == RECOMPUTE.index("selective"))[:, None],
                               (mode == RECOMPUTE.index("core_attention"))[:, None]],
                              [full_input, selective + gathered, core + gathered], default=plain_per_token + gathered)
    keep_rec = T * rec_per_token
    working_rec = rec_rows("working")
    unpriced_working = np.isnan(working_rec).any(axis=1)
    working_full = T * (np.nan_to_num(at_tp(working_rec, rec_rows("working_tp"))) + routed_working_extra + gathered)
    working_full = np.where(np.isnan(working_rec), np.maximum(keep_plain, keep_rec), working_full)
    excess_plain = np.maximum(working_full - keep_plain, 0.0)
    # a full-recompute layer's backward holds the input its checkpoint kept besides the working figure
    # where that figure leaves the input out (no op of the layer saves it: the census's convention)
    working_rec_layer = working_full + np.where((mode == RECOMPUTE.index("full"))[:, None],
                                                T * full_input * rec_rows("working_input"), 0.0)
    excess_rec = np.maximum(working_rec_layer - keep_rec, 0.0)
    unpriced_selective = (mode == RECOMPUTE.index("selective")) & np.isnan(keep_rec).any(axis=1)
    keep_rec = np.nan_to_num(keep_rec)

    held_total = held.sum(axis=2)
    forwards = (m * v)[:, None] * np.ones((1, R), dtype=np.int64)
    accumulating = forwards > held_total
    # a layer's backward peaks with a share of its own gradients made (the record's): on a first backward
    # with whole gradients the moments count that share, not all of them (sharded gradients: the
    # communication buffers hold the layer's whole gradient; accumulating: every gradient exists already)
    share_rows = ~accumulating & ((zero < 2) & (fsdp == 1))[:, None]
    grad_share = rec_rows("grad_share")
    held_f = held.astype(f64)
    activations = np.zeros((N, R))
    one_micro_batch = np.zeros((N, R))
    excess = np.zeros((N, R))
    working_layer = np.zeros((N, R))
    made_last = np.zeros((N, R))      # the layer's gradients made at the last layer's backward peak
    pending_end = np.zeros((N, R))    # the layer's gradients not yet made at the first layer's
    best_last = np.full((N, R), -np.inf)
    best_end = np.full((N, R), -np.inf)
    for k in range(K):  # a loop over kinds and chunks, never layers
        for c in range(V):
            pk, rk = plain[k][:, :, c], rec[k][:, :, c]
            mb = pk * keep_plain[:, k][:, None] + rk * keep_rec[:, k][:, None]
            activations = activations + held_f[:, :, c] * mb
            one_micro_batch = one_micro_batch + np.where(held[:, :, c] > 0, mb, 0.0)
        present_plain = sum(plain[k][:, :, c] for c in range(V)) > 0
        present_rec = sum(rec[k][:, :, c] for c in range(V)) > 0
        layer_grads = ((layer_dense[k] + layer_routed[k]) * gbytes)[:, None]
        made = np.where(share_rows, grad_share[:, k][:, None] * layer_grads, 0.0)
        pending = np.where(share_rows, layer_grads, 0.0) - made
        for present, ex, work in ((present_plain, excess_plain, working_full), (present_rec, excess_rec,
                                                                                working_rec_layer)):
            ex, work = ex[:, k][:, None], work[:, k][:, None]
            later = present & (ex + made > best_last)  # the kind whose backward holds the most decides
            excess, made_last = np.where(later, ex, excess), np.where(later, made, made_last)
            best_last = np.where(later, ex + made, best_last)
            later = present & (work - pending > best_end)
            working_layer, pending_end = np.where(later, work, working_layer), np.where(later, pending, pending_end)
            best_end = np.where(later, work - pending, best_end)
    one_micro_batch = np.minimum(one_micro_batch, activations)

    # -- the output layer ------------------------------------------------------------------------
    vp = cols["vocab_parallel"].astype(bool)
    out_saved, out_saved_tp = rec_rows("out_saved"), rec_rows("out_saved_tp")
    out_work, out_work_tp = rec_rows("out_working"), rec_rows("out_working_tp")

    def out_at_tp(x, x_tp):
        return np.where(vp, np.where(sp, (x + x_tp) / t, x + x_tp / t), x + x_tp)

    out_keep = tokens * out_at_tp(out_saved, out_saved_tp)
    unpriced_out = np.isnan(out_work)
    out_peak = np.where(unpriced_out, out_keep, tokens * out_at_tp(np.nan_to_num(out_work), out_work_tp))
    head_held = np.where(last, held, 0).sum(axis=2)
    others_out = np.where(has_head, np.maximum(head_held - 1, 0) * out_keep[:, None], 0.0)
    out_backward = np.where(has_head, others_out + np.maximum(out_peak, out_keep)[:, None], 0.0)

    # -- communication buffers --------------------------------------------------------------------
    largest = np.zeros((N, R), dtype=np.int64)
    for k in range(K):
        largest = np.maximum(largest, np.where(on_rank[k] > 0, (layer_dense[k] + layer_routed[k])[:, None], 0))
    root = np.where(has_emb, emb[:, None], 0) + head_extra + np.where(has_head, model.final_norm, 0)
    c2, g2 = cbytes[:, None], gbytes[:, None]
    # FSDP2 (fully_shard per layer and at the root): the root's parameters (embedding, final norm, head) are
    # gathered at the forward's start and kept to the backward's end (the root's reshard_after_forward is
    # False); the head's gradient stays whole until the root's reduce-scatter at the backward's end, the
    # embedding's is made last; a layer's backward holds it and the next layer (prefetched) gathered, and
    # its gradient before the reduce-scatter. ZeRO-3 gathers one module at a time, root or layer.
    gathered_root = root * c2
    two_layers = np.minimum(stage_layers, 2)
    head_grad_whole = head_grad * g2
    zero3_buffer = np.maximum(largest, root) * (c2 + g2)
    fsdp2 = (fsdp > 1)[:, None]
    fsdp_loss = np.where(fsdp2, gathered_root, zero3_buffer)
    fsdp_last = np.where(fsdp2, gathered_root + head_grad_whole + largest * (two_layers * c2 + g2), zero3_buffer)
    fsdp_end = np.where(fsdp2, gathered_root + head_grad_whole + np.maximum(largest * (c2 + g2), emb_grad * g2),
                        zero3_buffer)
    unsharded = sharded_params[:, None]
    tp_buffer = np.where(sp & (ti > 1), tokens * model.hidden_size * cbytes, 0.0)
    moe_on_rank = sum(on_rank[k] * int(model.is_moe[k]) for k in range(K)) > 0 if K else np.zeros((N, R), bool)
    ep_buffer = np.where(moe_on_rank & (cols["ep"] > 1)[:, None],
                         (2 * tokens * model.experts_per_token * model.hidden_size * cbytes
                          * cols["moe_imbalance"] / np.where(sp, t, 1.0))[:, None], 0.0)
    kv_max = model.kv_elements_per_token.max() if K else 0.0
    cp_buffer = np.where(cpi > 1, 2 * tokens * kv_max * cbytes / t, 0.0)
    activation_buffers = np.maximum(np.maximum(tp_buffer[:, None], ep_buffer), cp_buffer[:, None])
    comm_loss, comm_last, comm_end = (np.where(unsharded, buffer, 0.0) + activation_buffers
                                      for buffer in (fsdp_loss, fsdp_last, fsdp_end))

    # -- the moments ------------------------------------------------------------------------------
    def whole(x):
        return np.ceil(np.asarray(x, dtype=f64) - 1e-3)

    zeros = np.zeros((N, R))
    grads_all = whole(gradients)
    # a first backward makes the head's gradient after the loss's peak, the embedding's after the first
    # layer's; a rank that has run a backward before holds every gradient throughout
    grads_loss = np.where(accumulating, grads_all, 0.0)
    # under FSDP2 a layer's gradient is sharded after its backward, the root's (head, embedding) at the end
    root_late = np.where(fsdp2, whole(head_gradients), 0.0)
    grads_first = np.where(accumulating, grads_all, whole(head_gradients) - root_late)
    grads_last = np.where(accumulating, grads_all, grads_all - whole(embedding_gradients) - root_late)
    others_out = whole(others_out)
    # the embedding's backward, last: every other gradient made (under FSDP2 the root's whole in the
    # buffers), the gradient arriving from the first layer (the whole sequence of the rank's tokens: SP
    # gathers it, a vocabulary-parallel embedding takes it all), the CUDA kernel's fp32 sums by row (one
    # row a distinct index at most) and, where a gradient exists already (accumulation, a tied head's),
    # the new one before it is added in
    grads_emb = np.where(fsdp2 & ~accumulating, grads_last, grads_all)
    vocab_rows = ceil_div(np.int64(model.embedding // max(model.hidden_size, 1)), vocab_split)
    sort_rows = np.where(tokens > EMBEDDING_SORT_MIN_TOKENS, np.minimum(tokens, vocab_rows), 0.0)
    emb_whole = np.where((zero < 2) & (fsdp == 1), emb * gbytes, 0.0)[:, None]
    emb_working = ((tokens * model.hidden_size * cbytes
                    + (4.0 * model.hidden_size * sort_rows if embedding_sort_scratch else 0.0))[:, None]
                   + np.where(accumulating | model.tied, emb_whole, 0.0))
    persistent = {"parameters": whole(parameters), "master": whole(master),
                  "optimizer_states": whole(optimizer_states)}
    held_still = whole(activations)
    moments = [
        dict(gradients=grads_loss, activations=held_still, working=zeros, output=whole(out_backward),
             communication=whole(comm_loss)),
        dict(gradients=whole(grads_first + made_last), activations=held_still, working=whole(excess),
             output=others_out, communication=whole(comm_last)),
        dict(gradients=whole(grads_last - pending_end), activations=whole(activations - one_micro_batch),
             working=whole(working_layer),
             output=others_out, communication=whole(comm_end)),
        dict(gradients=grads_emb, activations=whole(activations - one_micro_batch), working=whole(emb_working),
             output=others_out, communication=whole(comm_end)),
        dict(gradients=grads_all, activations=zeros, working=whole(step_temporaries), output=zeros,
             communication=zeros),
    ]
    base = persistent["parameters"] + persistent["master"] + persistent["optimizer_states"]
    overhead = cols["allocator_overhead"].astype(f64)[:, None]
    totals = []
    for i, moment in enumerate(moments):
        other = base
        for name in ("gradients", "activations", "working", "output", "communication"):  # a fixed order
            other = other + moment[name]
        if overhead.any():
            allocator = np.ceil(overhead * other - 1e-3)
            total = other + allocator
        else:  # the common case: no allocator overhead asked for, nothing to add
            allocator, total = zeros, other
        moment["allocator"] = allocator
        if i == 0:
            total = np.where(has_head, total, -1.0)  # the output layer's moment exists on its holder only
        if i == 3:
            total = np.where(has_emb, total, -1.0)  # and the embedding's on its own
        totals.append(total)
    best_total, best_index = totals[0], np.zeros((N, R), dtype=np.int64)
    for i in range(1, len(totals)):  # the first of equal moments wins
        later = totals[i] > best_total
        best_index[later] = i
        best_total = np.maximum(best_total, totals[i])
    # every category is whole and non-negative by construction: written once, straight into int64
    stage_bytes = np.empty((N, R, len(CATEGORIES)), dtype=np.int64) if out is None else out
    for c, name in enumerate(CATEGORIES):
        stage_bytes[:, :, c] = persistent[name] if name in persistent else \
            np.choose(best_index, [m[name] for m in moments])
    stage_peak = np.maximum(best_total, 0).astype(np.int64)
    stage_exists = np.arange(R)[None, :] < p[:, None]
    if not stage_exists.all():  # rows of fewer stages than the batch's most: their extra stages hold nothing
        stage_bytes[~stage_exists] = 0
        stage_peak[~stage_exists] = 0
        stage_layers = np.where(stage_exists, stage_layers, 0)
    peak_stage = np.argmax(stage_peak, axis=1)
    peak = stage_peak[np.arange(N), peak_stage]
    stack_layers = np.empty((N, R, K), dtype=np.int64)
    for k in range(K):
        stack_layers[:, :, k] = on_rank_stack[k]
    return Composed(stage_bytes=stage_bytes, stage_peak_bytes=stage_peak, peak_bytes=peak, peak_stage=peak_stage,
                    stage_layers=stage_layers, stage_moment=best_index,
                    layer_bytes=np.ceil(np.where((mode == RECOMPUTE.index("none"))[:, None], keep_plain, keep_rec)
                                        - 1e-3).astype(np.int64),
                    unpriced={"working": unpriced_working, "output working": unpriced_out,
                              "selective": unpriced_selective},
                    stage_kind_layers=stack_layers, head_stage=np.argmax(has_head, axis=1))
