"""A training step's seconds for a batch of strategies: numpy arrays in and out, no loop over layers or rows.

A map of :func:`step_time` (each step's docstring says what it prices and why):

- :func:`ndcost.compose.placement.place`: each rank's layers of each kind (the memory model's placement);
- :func:`layer_seconds`: compute, a roofline per op class for one layer and micro-batch;
- :func:`_layer_communication`: TP, CP and EP collectives of a layer, and what of them is exposed;
- :func:`_embedding_and_head`: the embedding, head and loss;
- :func:`_data_parallel`: FSDP / ZeRO-3 gathers and scatters, the step's gradient and parameter collectives,
  over the groups :mod:`ndcost.compose.sharding` names;
- :func:`_pipeline`: the sends and the schedule's bubble; :func:`_optimizer_seconds`: the optimizer step;
- :func:`_offload_seconds`: offloading's host-device copies and the CPU optimizer step.

``step = compute + exposed communication + bubble + optimizer + exposed offload``, each on the busiest pipeline rank;
``mfu`` is the model FLOPs (the forward's and the backward's, no recompute) over the step, the devices and the
compute dtype's peak. Columns are the memory model's (:func:`ndcost.columns.encode`), the
schedules and optimizer states by code, as :func:`ndcost.compose.memory.compose` receives them.
Collectives are the registered ``collective/<name>`` plugins; :data:`OVERLAP_RULES` say what each hides.

Known limitations: the CPU (but a CPU optimizer's step, eager dispatch of the layers' kernels and activation
checkpointing's host work) and the data loader are not priced; the embedding's, head's, loss's and optimizer's
launches are not counted; groups of different kinds sharing a link do not contend; the vocabulary-parallel
loss's small all-reduces are not priced; Colossal-AI's and hybrid CP (``cp_algo``) exchange as ring's does (their
double ring and all-to-all stage not priced apart); moe imbalance scales the busiest rank's routed
work and all-to-all volume.
"""
from __future__ import annotations

import functools
import inspect
import math
import weakref
from typing import Any, Callable, Dict, Hashable, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost import columns, kernels, manager
from ndcost.columns import DTYPE_BYTES, DTYPE_NAMES
from ndcost.compose import placement as placement_rules
from ndcost.compose import sharding as sharding_rules
from ndcost.compose.memory import nan_to_zero
from ndcost.compose.topology import group_link
from ndcost.errors import InvalidValue, Unpriced
from ndcost.values import (
    CP_ALGOS,
    CP_ROTATES,
    CPU_ADAM_PARAMETERS_PER_SECOND,
    EP_DISPATCHERS,
    EXPOSED_GROUPS,
    FLOAT8_RECIPES,
    FSDP_ENGINES,
    GRADIENT_SYNC,
    LOSS_ENGINES,
    RECOMPUTE,
    Hardware,
    TimeBreakdown,
    frozen_mapping,
)
from ndcost.work import (
    GEMM_CLASSES,
    GEMM_SPLITS,
    NORM_ELEMENTS,
    ModelWork,
    causal_pairs,
    tp_whole_parameters,
    window_pairs,
)

__all__ = ["CHUNK_ROWS", "TIME_FIELDS", "DEFAULT_EFFICIENCY", "EFFICIENCY_KEYS", "OVERLAP_RULES", "COLLECTIVES",
           "TimeArrays", "efficiencies", "strategy_columns", "layer_seconds", "step_time", "attach",
           "expected_parts_reached"]

CHUNK_ROWS = 1 << 16  # strategies priced at once (the per-rank arrays are rows x ranks x kinds)
_MEGATRON_FSDP = FSDP_ENGINES.index("megatron")
_COMPILED_LOSS = LOSS_ENGINES.index("compiled")
TIME_FIELDS = ("step_seconds", "tokens_per_second", "mfu", "compute_seconds", "communication_seconds",
               "exposed_communication_seconds", "bubble_seconds", "optimizer_seconds", "offload_seconds",
               "exposed_offload_seconds") + tuple(f"exposed_{group}_seconds" for group in EXPOSED_GROUPS)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")

# Priors for a hardware whose YAML states no efficiency: round figures of what well-tuned kernels
# reach on current GPUs, used only until `ndcost calibrate` fits the device's own.
DEFAULT_EFFICIENCY: Mapping[str, float] = frozen_mapping({
    "matmul": 0.75, "matmul_backward": 0.70, "matmul_fp8": 0.75,
    "attention": 0.60, "attention_backward": 0.45,
    "linrec": 0.30, "linrec_backward": 0.25,
    "memory": 0.70, "memory_backward": 0.70,
    "collective_within_node": 0.80, "collective_across_nodes": 0.85,
})
EFFICIENCY_KEYS = tuple(DEFAULT_EFFICIENCY)
# The figure a key the YAML leaves out takes before the prior: a class's forward for its backward, and the compute
# dtype's GEMMs for the Float8 linears' (fp8 GEMMs at the share of their peak the compute dtype's reach of its own)
_STATED_IN_PLACE = {"matmul_fp8": "matmul"}

# Each use of a collective and what the step counts of it as exposed (added to the step), in provenance:
# - tp: TP all-reduces (all-gathers and reduce-scatters under SP), two a layer each pass; no TP overlap assumed,
#   but under async_tp (torch._inductor.config._micro_pipeline_tp: torch/_inductor/fx_passes/micro_pipeline_tp.py
#   makes an all-gather + matmul or matmul + reduce-scatter one op of torch/distributed/_symmetric_memory/
#   __init__.py) a fused collective's shards are pulled while the matmul's other pieces run (_async_tp).
# - cp_ring: torch's ring attention under its default all-gather rotation (torch/distributed/tensor/experimental/
#   _context_parallel/_attention.py): the K/V all-gather hides behind the first step's kernel, each pass; the
#   backward's fp32 K/V gradients, sent on after each step, behind the next step's kernel, the last exposed.
# - cp_ulysses: the all-to-alls of queries, keys, values and the output (their gradients in the backward).
# - ep: dispatch and combine all-to-alls, and where etp > 1 the expert-TP all-gather and reduce-scatter between
#   them (Megatron-LM's alltoall dispatcher); a schedule with overlaps_expert_communication (DualPipeV, DeepSeek-V3
#   technical report arXiv:2412.19437 section 3.2.1; Megatron-LM's combined 1F1B, plugins/schedules.py) hides
#   them behind the other micro-batch's compute.
# - dp_grad: gradient all-reduce (reduce-scatter under ZeRO >= 1) over dp * fsdp * cp, once a step, bucketed
#   behind the last micro-batch's backward (PyTorch DDP's reducer); ZeRO-2 once a micro-batch, behind its backward
#   (DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py reduces its buckets every micro-step); a shard's replicas
#   (HSDP's) reduce it.
# - dp_param: ZeRO 1/2's all-gather of the updated parameters, behind the next step's first forward.
# - fsdp: FSDP / ZeRO-3 gathers and reduce-scatters a layer at a time as FSDP2 schedules them (_fsdp: one layer
#   prefetched, torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py): each gather behind the previous
#   layer's pass, each reduce-scatter behind the next layer's backward (no backward gather under
#   reshard_after_forward=false); the root's gather and scatter, the first gather and the last scatter exposed.
#   Under gradient_sync=last_micro_batch (torch.distributed.pipelining's stage backward) the stage's reduce-scatter
#   runs once, after its last backward, the compute stream waiting for it (_fsdp_state.py
#   _root_post_backward_final_callback): exposed.
# - pp: activation and gradient sends, hidden in the steady state; 2 (p * v - 1) on the fill and drain path.
# - offload_*: host-device copies over the device's host link (Hardware.host_to_device_bytes_per_second), each
#   direction its own: save_on_cpu's copies hide behind the pass's compute; FSDP2's CPUOffloadPolicy copies a
#   shard in before its all-gather and out after its reduce-scatter, prefetched as the gathers; ZeRO-Offload
#   (arXiv:2101.06840 section 4.1) overlaps the gradients' copy out with the backward, while the CPU step and
#   the updated parameters' copy in wait for each other (its optional one-step delayed update is not priced).
OVERLAP_RULES: Mapping[str, str] = {
    "tp": "exposed: none overlapped; under async_tp torch's micro-pipelined collective matmuls "
          "(torch/distributed/_symmetric_memory/__init__.py _pipelined_all_gather_and_consume, "
          "_pipelined_produce_and_all2all; the pairs torch/_inductor/fx_passes/micro_pipeline_tp.py fuses): SP's "
          "all-gathers before and reduce-scatters after the TP-split matmuls, the backward's output-gradient "
          "all-gathers and single-matmul input-gradient reduce-scatters, each op tp pieces of M / tp rows, "
          "c + (tp - 1) max(c, x) (c a piece's matmuls, x a shard's NVLink pull) plus the local shard's copy or "
          "the partials' sum, exposed beyond the same matmuls unfused; the rest exposed",
    "cp_ring": "torch's ring attention (_context_parallel/_attention.py, ALL_GATHER rotation): each pass's K/V "
               "all-gather overlapped with its first step's kernel; the backward's fp32 K/V gradient sends, one a "
               "step, each with the next step's backward kernel, the last exposed; the excess is exposed",
    "cp_ulysses": "exposed: none overlapped",
    "ep": "the dispatch's and combine's all-to-alls over EP, with the expert-TP all-gather and reduce-scatter "
          "between them where etp > 1: exposed, except under a schedule running two micro-batches' passes "
          "together (dualpipev, interleaved-a2a-overlap, 1f1b-a2a-overlap): overlapped with the layer's compute "
          "of the pass",
    "dp_grad": "overlapped with the last micro-batch's backward (ZeRO-2's, and DDP's under "
               "gradient_sync=every_micro_batch, with each micro-batch's); the excess is exposed; after FSDP's "
               "deferred reduce-scatter (gradient_sync=last_micro_batch) exposed",
    "dp_param": "overlapped with the next step's first forward; the excess is exposed",
    "fsdp": "FSDP2's one-layer prefetch: each layer's gather overlapped with the previous layer's compute of the "
            "pass, each reduce-scatter with the next layer's backward, per layer (the excess exposed); the root's "
            "gather and scatter, a pass's first gather and the backward's last reduce-scatter exposed; under "
            "gradient_sync=last_micro_batch one reduce-scatter a step after the last backward, exposed, and the "
            "layers gathered once a step under reshard_after_forward=false",
    "pp": "overlapped in the steady state; 2 (p * v - 1) sends on the fill and drain path are exposed",
    "offload_activations": "copies out in the forward, back in the backward, overlapped with that pass's compute; "
                           "the excess is exposed",
    "offload_params": "parameter shards in before each pass's gathers, gradient shards out after the backward's "
                      "reduce-scatters, overlapped with the pass's compute; the excess is exposed",
    "offload_optimizer": "gradients out overlapped with the last micro-batch's backward (the excess exposed); "
                         "the CPU step and the updated parameters' copy in are exposed",
}


def efficiencies(hardware: Hardware) -> Tuple[Dict[str, float], Dict[str, str]]:
    """The hardware's efficiency per key, and where each came from (its YAML or the prior).

    A ``<class>_backward`` the YAML leaves out takes the YAML's forward figure
    for that class before the prior, ``matmul_fp8`` its ``matmul``; a figure outside (0, 1] is refused.
    """
    stated = dict(hardware.efficiency or {})
    unknown = sorted(set(stated) - set(EFFICIENCY_KEYS))
    if unknown:
        raise InvalidValue(f"hardware {hardware.name!r}: unknown efficiency key(s) {', '.join(unknown)}; "
                           f"known: {', '.join(EFFICIENCY_KEYS)}")
    values: Dict[str, float] = {}
    sources: Dict[str, str] = {}
    for key in EFFICIENCY_KEYS:
        forward = key[:-len("_backward")] if key.endswith("_backward") else _STATED_IN_PLACE.get(key)
        if key in stated:
            values[key], sources[key] = float(stated[key]), f"hardware/{hardware.name}"
        elif forward and forward in stated:
            values[key], sources[key] = float(stated[forward]), f"hardware/{hardware.name} ({forward})"
        else:
            values[key], sources[key] = DEFAULT_EFFICIENCY[key], "prior (uncalibrated)"
        if not 0.0 < values[key] <= 1.0:
            raise InvalidValue(f"hardware {hardware.name!r}: efficiency {key} = {values[key]} is outside (0, 1]")
    return values, sources


@attrs.frozen(kw_only=True)
class TimeArrays:
    """The time model's results for a batch: one array a TimeBreakdown field, plus the provenance."""

    step_seconds: np.ndarray
    tokens_per_second: np.ndarray
    mfu: np.ndarray
    compute_seconds: np.ndarray
    communication_seconds: np.ndarray
    exposed_communication_seconds: np.ndarray
    bubble_seconds: np.ndarray
    optimizer_seconds: np.ndarray
    offload_seconds: np.ndarray
    exposed_offload_seconds: np.ndarray
    exposed_tp_seconds: np.ndarray
    exposed_cp_seconds: np.ndarray
    exposed_ep_seconds: np.ndarray
    exposed_fsdp_seconds: np.ndarray
    exposed_dp_seconds: np.ndarray
    exposed_pp_seconds: np.ndarray
    provenance: Mapping[str, str] = attrs.field(converter=frozen_mapping)
    detail: Mapping[str, np.ndarray] = attrs.field(factory=dict, converter=frozen_mapping, repr=False)

    def __len__(self) -> int:
        return len(self.step_seconds)

    def breakdown(self, i: int) -> TimeBreakdown:
        """Strategy *i*'s :class:`TimeBreakdown`."""
        return TimeBreakdown(provenance=self.provenance,
                             **{name: float(getattr(self, name)[i]) for name in TIME_FIELDS})

    def to_columns(self) -> Dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in TIME_FIELDS}


# ---------------------------------------------------------------------------
# strategies as the memory model's columns
# ---------------------------------------------------------------------------
def registry_names() -> Dict[str, Tuple[str, ...]]:
    """The categorical fields' names (codes index them), as the resolver passes them."""
    return columns.category_names(manager.registry())


def strategy_columns(strategies: Any, names: Optional[Mapping[str, Sequence[str]]] = None) -> Dict[str, np.ndarray]:
    """Strategies (Strategy values, or a mapping of field -> values) as compose's columns, ``pp_bounds`` included.

    Converted by :func:`ndcost.columns.encode` with the
    registry's names; a strategy it refuses, or one without ``seq``, is an error.
    """
    batch = columns.encode(strategies, names or registry_names())
    bad = batch.invalid()
    if bad.any():
        raise InvalidValue(f"strategy {int(np.argmax(bad))}: {batch.reason_array()[int(np.argmax(bad))]}")
    cols = dict(batch.cols)
    if np.any(cols["seq"] < 1):
        raise InvalidValue("the time model needs every strategy's seq; set seq=... in the strategy")
    cols["pp_bounds"] = None if batch.pp_layers is None else placement_rules.split_bounds(batch.pp_layers)
    return cols


def _peak_flops(hardware: Hardware, compute_dtype: np.ndarray) -> np.ndarray:
    """(N,) the hardware's peak FLOP/s in each row's compute dtype (a loop over the dtypes used)."""
    codes = np.asarray(compute_dtype, dtype=np.int64)
    if len(codes) == 1:  # one strategy's dtype: no table
        return np.full(1, hardware.peak_flops(DTYPE_NAMES[codes.item()]))
    found = distinct(codes)[0].tolist()
    if len(found) == 1:  # one dtype: no table
        return np.full(len(codes), hardware.peak_flops(DTYPE_NAMES[found[0]]))
    table = np.full(len(DTYPE_NAMES), np.nan)
    for code in found:
        table[code] = hardware.peak_flops(DTYPE_NAMES[code])
    return table[codes]


_COLLECTIVES_MADE: Dict[str, Any] = {}


def _collectives() -> Dict[str, Any]:
    """The registered ``collective/<name>`` plugins' ``seconds`` functions, each taking the link's keywords
    (``nodes``, ``nvls_efficiency``: :func:`ndcost.compose.topology.group_link`'s); one written before them
    (four arguments only) is called without them. Made again only once the registry resolves again (its
    ``generation``): reading the signatures weighs on a batch of one strategy."""
    registry = manager.registry()
    made = _COLLECTIVES_MADE.get("made")
    if made is None or made[0] is not registry or made[1] != registry.generation:
        wrapped = {name: _with_link_keywords(registry.get(f"collective/{name}").seconds) for name in COLLECTIVES}
        made = _COLLECTIVES_MADE["made"] = (registry, registry.generation, wrapped)
    return dict(made[2])


_LINK_KEYWORDS = ("nodes", "nvls_efficiency")


def _with_link_keywords(seconds: Callable[..., Any]) -> Callable[..., Any]:
    try:
        parameters = inspect.signature(seconds).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the four arguments only
        parameters = ()  # type: ignore[assignment]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters) or \
            set(_LINK_KEYWORDS) <= {p.name for p in parameters}:
        return seconds

    def four_arguments(message_bytes, group_size, bytes_per_second, latency_seconds, **_link):
        return seconds(message_bytes, group_size, bytes_per_second, latency_seconds)

    return four_arguments


_DERIVED: Dict[Tuple[Hashable, int], Tuple[Any, Any]] = {}


def _derived(tag: Hashable, obj: Any, make: Callable[[Any], Any]) -> Any:
    """``make(obj)``, made once per object and kept while it lives (by identity, *tag* naming what it is):
    what the time model derives from a frozen :class:`ModelWork` or :class:`Hardware`, which no strategy changes."""
    key = (tag, id(obj))
    hit = _DERIVED.get(key)
    if hit is not None and hit[0]() is obj:
        return hit[1]
    value = make(obj)

    def forget(ref, key=key, cache=_DERIVED):  # the cache bound now: at interpreter exit globals are gone
        if cache.get(key, (None,))[0] is ref:
            del cache[key]

    _DERIVED[key] = (weakref.ref(obj, forget), value)
    return value


def _kind_arrays(model: ModelWork) -> Mapping[str, np.ndarray]:
    """The kinds' work as ``(K,)`` arrays (read-only, made once a ModelWork)."""
    return _derived("kind_arrays", model, _make_kind_arrays)


def _make_kind_arrays(model: ModelWork) -> Mapping[str, np.ndarray]:
    fields = ("attention_mm_flops_per_token", "other_mm_flops_per_token", "routed_mm_flops_per_token",
              "score_flops_per_pair", "window", "linrec_flops_per_token", "elementwise_elements_per_token",
              "replicated_elements_per_token", "dense_parameters", "routed_parameters", "replicated_parameters",
              "query_elements_per_token", "kv_elements_per_token", "kv_copies", "experts_per_token",
              "attention_heads", "attention_head_dim", "attention_value_head_dim", "extra_keys_per_token",
              "forward_only_attention_mm_flops_per_token", "forward_only_other_mm_flops_per_token",
              "forward_only_routed_mm_flops_per_token", "forward_only_score_flops_per_pair",
              "forward_only_linrec_flops_per_token", "forward_only_elementwise_elements_per_token",
              "forward_only_replicated_elements_per_token", "unfused_rotary_elements_per_token")
    out = {f: np.array([float(getattr(model.work[k], f)) for k in model.kinds]) for f in fields}
    out["has_attention"] = np.array([model.work[k].has_attention for k in model.kinds])
    out["launches_per_layer"] = np.array([float(model.work[k].launches_per_layer) for k in model.kinds])
    out["launches_per_token"] = np.array([float(model.work[k].launches_per_token) for k in model.kinds])
    # the forward's elementwise kernels: all but a kernel a GEMM and the attention kernel (at least one)
    out["elementwise_launches"] = np.maximum(1.0, out["launches_per_layer"] - out["has_attention"] - np.array(
        [float(sum(g.count for g in model.work[k].gemms)) for k in model.kinds]))
    out.update(_gemm_arrays(model))
    out["class_mm_flops_per_token"] = np.stack([out[f"{c}_mm_flops_per_token"] for c in GEMM_CLASSES], axis=-1)
    out["class_forward_only_mm_flops_per_token"] = np.stack(
        [out[f"forward_only_{c}_mm_flops_per_token"] for c in GEMM_CLASSES], axis=-1)
    # the share of each kind's scores FLOPs its backward repeats (1: all of them)
    out["backward_score_share"] = 1.0 - np.divide(out["forward_only_score_flops_per_pair"],
                                                  out["score_flops_per_pair"], out=np.zeros(len(model.kinds)),
                                                  where=out["score_flops_per_pair"] > 0)
    out["has_forward_only"] = np.array(any(np.count_nonzero(out[f]) for f in fields if f.startswith("forward_only")))
    out["parameters_by_part"] = np.stack([out[f"{part}_parameters"] for part in ("dense", "replicated", "routed")])
    for name in ("recomputed_attention_mm_share", "recomputed_other_mm_share",
                 "recomputed_scores_share") + _LOW_PRECISION_WORK:
        out[name] = np.array([np.nan if getattr(model.work[k], name) is None else float(getattr(model.work[k], name))
                              for k in model.kinds])
    if model.complex_rotary:  # torch.compile leaves a complex rotary's kernels as they are (RuntimeProfile.rotary)
        out["compiled_elementwise_elements_per_token"] = (out["compiled_elementwise_elements_per_token"]
                                                          + out["unfused_rotary_elements_per_token"])
    # the attention's output elements a token (ring CP merges them): its heads' values, else the queries'
    out["attention_output_elements_per_token"] = np.where(
        out["attention_heads"] > 0, out["attention_heads"] * out["attention_value_head_dim"],
        out["query_elements_per_token"])
    # the kinds whose selective recompute the census measured (its shares of the matmuls)
    out["selective_measured"] = ~np.isnan(out["recomputed_attention_mm_share"]) & ~np.isnan(
        out["recomputed_other_mm_share"])
    for array in out.values():
        array.setflags(write=False)
    return frozen_mapping(out)


# the KindWork figures float8 and compile read (NaN where an estimator left them unstated)
_LOW_PRECISION_WORK = ("float8_mm_flops_per_token", "float8_input_elements_per_token",
                       "float8_output_elements_per_token", "compiled_elementwise_elements_per_token",
                       "compiled_replicated_elements_per_token", "float8_routed_input_elements_per_token",
                       "float8_routed_output_elements_per_token", "float8_fused_input_elements_per_token",
                       "float8_gathered_input_elements_per_token", "float8_gathered_output_elements_per_token")


def float8_refusal(hardware: Hardware) -> Optional[str]:
    """Why *hardware* cannot price ``float8`` (it states no fp8 peak), or None."""
    if "fp8" in hardware.peak_flops_per_second:
        return None
    return (f"float8: hardware {hardware.name!r} states no fp8 peak (it states "
            f"{', '.join(hardware.peak_flops_per_second)}); torchao's Float8Linear needs FP8 tensor cores (NVIDIA "
            f"SM89 or later, AMD MI300): use float8=none, or a hardware file stating peak_flops_per_second.fp8")


def _stated(model: ModelWork, k: Mapping[str, np.ndarray], names: Sequence[str], rows: np.ndarray, field: str):
    """Refuse pricing *field* (``float8=...``, ``compile=true``) where a kind's estimator left one of its
    KindWork figures *names* unstated."""
    if np.count_nonzero(rows):
        for name in names:
            missing = [kind for kind, value in zip(model.kinds, k[name], strict=True) if np.isnan(value)]
            if missing:
                raise Unpriced(f"{field}: the FLOPs estimator of layer kind(s) {', '.join(missing)} states no "
                               f"{name} (KindWork), which prices it; price without {field} or with an estimator "
                               f"stating it")


def _float8_linears(model: ModelWork, k: Mapping[str, np.ndarray], rows: "_Rows", cols: Mapping[str, Any],
                    split: np.ndarray):
    """Under ``float8``: each kind's Linear FLOPs priced at the fp8 peak ``(N, K)``, the bytes the casts move
    in the forward and the backward ``(N, K)`` (one layer, one micro-batch, one device), and where the routed
    experts' grouped GEMMs run in fp8 too ``(N, 1)`` (``float8_experts``).

    A cast (torchao ``hp_tensor_to_float8_dynamic``) reads its high-precision tensor for the amax, then reads it
    again and writes it as fp8: ``2 w + 1`` bytes an element at the compute width ``w``. A linear casts its
    input and weight in the forward, and in the backward its output gradient twice (for the input's gradient and
    the weight's), its weight and its saved input again (torchao ``matmul_with_hp_or_float8_args``). rowwise
    casts the backward's second uses along the other axis, through a transposed copy (``2 w`` bytes an element
    more; its row scales, vectors, left out). Activations and weights a TP rank holds are cast where tensorwise's
    Float8 TP styles cast before SP's all-gather (``float8_tensor_parallel.py``); otherwise (rowwise, or no SP)
    each linear casts the inputs and output gradients it reads gathered. Under
    ``float8_all_gather`` (FSDP2) the weight shard is cast before each gather and the gathered weight is fp8
    already: the matmuls cast no weight. Under ``float8_experts`` each routed copy's input and output gradient
    and the rank's expert weights are cast alike (torchao's ``_scaled_grouped_mm`` path), the copies as many as
    the busiest expert rank receives. Under Transformer Engine's casts (``ModelWork.float8_casts``, its
    ``Float8CurrentScalingQuantizer``) a tensor is read for its amax, then read and written as fp8 with its
    transpose (``2 w + 2``): a linear's input each forward (kept fp8 for the backward; the projections reading
    one input, Megatron-LM's ``linear_qkv`` and ``linear_fc1``, cast it once) and its output gradient each
    backward, its weight once a step (TE keeps the fp8 weight and its transpose over the step's
    micro-batches, ``is_first_microbatch``), so a micro-batch pays ``1 / num_micro_batches`` of it. Left out:
    the scales' all-reduce and the casts' launch overheads.
    """
    recipe = np.asarray(cols["float8"])[:, None]
    on = recipe != FLOAT8_RECIPES.index("none")
    zeros = np.zeros((len(rows.tp), len(model.kinds)))
    experts = np.asarray(cols["float8_experts"], dtype=bool)[:, None]
    if not np.count_nonzero(on):
        return zeros, zeros, zeros, experts
    _stated(model, k, _LOW_PRECISION_WORK[:3], on, "float8 (a torchao recipe)")
    shard = sharding_rules.sharding(cols)
    fp8_gather = (np.asarray(cols["float8_all_gather"], dtype=bool) & shard.fsdp)[:, None]
    weight = k["dense_parameters"][None, :] / rows.tp[:, None]
    shard_weight = weight / shard.dense_ways[:, None]
    inputs = k["float8_input_elements_per_token"] * split
    grads = k["float8_output_elements_per_token"] * split
    flops = np.where(on, k["float8_mm_flops_per_token"] * split, 0.0)
    routed = np.count_nonzero(experts)
    if routed:
        _stated(model, k, _LOW_PRECISION_WORK[5:7], experts[:, 0], "float8_experts=true")
        copies = split * rows.imbalance[:, None]
        routed_in, routed_grads = (k[name] * copies for name in _LOW_PRECISION_WORK[5:7])
        routed_weight = k["routed_parameters"][None, :] / (rows.ep * rows.etp)[:, None]
    if model.float8_casts == "transformer_engine":  # each tensor once with its transpose, the weight once a step
        _stated(model, k, _LOW_PRECISION_WORK[7:8], on, "float8 under Transformer Engine's casts")
        cast = 2.0 * rows.compute_bytes[:, None] + 2.0
        steps = rows.micro_batches[:, None]
        inputs = k["float8_fused_input_elements_per_token"] * split  # linear_qkv's and linear_fc1's input once
        cast_fwd = np.where(on, cast * (inputs + weight / steps), 0.0)
        cast_bwd = np.where(on, cast * grads, 0.0)
        if routed:
            cast_fwd = cast_fwd + np.where(experts, cast * (routed_in + routed_weight / steps), 0.0)
            cast_bwd = cast_bwd + np.where(experts, cast * routed_grads, 0.0)
        return flops, cast_fwd, cast_bwd, experts
    # torchtitan casts a TP rank's gathered inputs and output gradients before SP's gather only under tensorwise
    # Float8 TP styles (PrepareFloat8ModuleInput, Float8ColwiseParallel, Float8RowwiseParallel): otherwise each
    # linear casts what it reads gathered, every token's (torchtitan models/llama3/parallelize_llama.py)
    tensorwise = recipe[:, 0] == FLOAT8_RECIPES.index("tensorwise")
    gathered = on[:, 0] & (rows.tp > 1) & ~(tensorwise & rows.sp)
    if np.count_nonzero(gathered):
        _stated(model, k, _LOW_PRECISION_WORK[8:], gathered, "float8 without its tensorwise TP styles")
        unsplit = np.where(gathered, rows.tokens * (1.0 - 1.0 / rows.tp), 0.0)[:, None]
        inputs = inputs + k["float8_gathered_input_elements_per_token"] * unsplit
        grads = grads + k["float8_gathered_output_elements_per_token"] * unsplit
    cast = 2.0 * rows.compute_bytes[:, None] + 1.0
    weight_fwd = np.where(fp8_gather, shard_weight, weight)
    weight_bwd = np.where(fp8_gather, np.where(shard.keeps_gathered[:, None], 0.0, shard_weight), weight)
    cast_fwd = np.where(on, cast * (inputs + weight_fwd), 0.0)
    # rowwise scales the backward's second use of each tensor along its other axis: a transposed high-precision
    # copy, written and read back by the cast (2 w an element), for the output gradient and input of the weight's
    # gradient and the weight of the input's (torchao/testing/training/roofline_utils.py, "rowwise");
    # rowwise_with_gw_hp's weight gradient reads the high-precision input and output gradient: its backward casts
    # the output gradient and the weight once each, along the axis each needs (roofline_utils.py, the same)
    transposed = np.where(recipe == FLOAT8_RECIPES.index("rowwise"), 2.0 * rows.compute_bytes[:, None], 0.0)
    weight_hp = recipe == FLOAT8_RECIPES.index("rowwise_with_gw_hp")
    cast_bwd = np.where(on, cast * (np.where(weight_hp, grads, 2.0 * grads + inputs) + weight_bwd)
                        + transposed * (grads + inputs + weight_bwd), 0.0)
    if routed:
        cast_fwd = cast_fwd + np.where(experts, cast * (routed_in + routed_weight), 0.0)
        cast_bwd = cast_bwd + np.where(experts, (cast * 2.0 + transposed) * routed_grads
                                       + (cast + transposed) * (routed_in + routed_weight), 0.0)
    return flops, cast_fwd, cast_bwd, experts


def _fp8_seconds_per_flop(hardware: Hardware, eff: Mapping[str, float]) -> float:
    """What a Float8 linear's FLOP costs beside the compute dtype's ``1 / peak`` at the same shape efficiency: the
    fp8 peak's, where fp8 GEMMs reach ``matmul_fp8`` of it against the compute dtype's ``matmul`` of its own."""
    return eff["matmul"] / (eff["matmul_fp8"] * hardware.peak_flops("fp8"))


def _gemm_arrays(model: ModelWork) -> Dict[str, np.ndarray]:
    """The kinds' GEMM shapes as ``(K, G)`` arrays (padded with weightless 1 x 1 GEMMs), and ``gemm_weight``
    ``(K, G, 3)``: each GEMM's share of its kind's FLOPs of each op class (:data:`GEMM_CLASSES`);
    ``class_whole_share`` ``(K, 3)``: the share of each class's FLOPs in GEMMs TP leaves whole (``split``
    ``none``), and ``class_forward_only_whole_share`` that of its forward-only GEMMs' FLOPs (0 without any)."""
    width = max([len(model.work[k].gemms) for k in model.kinds] + [1])
    out = {name: np.ones((len(model.kinds), width)) for name in ("gemm_in", "gemm_out", "gemm_tokens", "gemm_experts")}
    out["gemm_split"] = np.zeros((len(model.kinds), width), dtype=np.int64)
    out["gemm_routed"] = np.zeros((len(model.kinds), width), dtype=bool)
    weight = np.zeros((len(model.kinds), width, len(GEMM_CLASSES)))
    only = np.zeros((len(model.kinds), width), dtype=bool)
    for i, kind in enumerate(model.kinds):  # once a ModelWork, over its kinds' handful of shapes
        for j, g in enumerate(model.work[kind].gemms):
            out["gemm_in"][i, j], out["gemm_out"][i, j] = g.in_features, g.out_features
            out["gemm_tokens"][i, j], out["gemm_experts"][i, j] = g.tokens_per_token, g.experts
            out["gemm_split"][i, j] = GEMM_SPLITS.index(g.split)
            out["gemm_routed"][i, j] = g.op_class == "routed"
            weight[i, j, GEMM_CLASSES.index(g.op_class)] = g.flops_per_token
            only[i, j] = g.forward_only
    totals = weight.sum(axis=1, keepdims=True)
    out["gemm_weight"] = np.divide(weight, totals, out=np.zeros_like(weight), where=totals > 0)
    out["gemm_shaped"] = totals[:, 0, :] > 0  # (K, 3): the classes whose shapes are known
    whole = (out["gemm_split"] == GEMM_SPLITS.index("none"))[:, :, None]
    out["class_whole_share"] = (out["gemm_weight"] * whole).sum(axis=1)
    out["whole_parameters"] = np.array([tp_whole_parameters(model.work[k].gemms) for k in model.kinds],
                                       dtype=np.float64)
    only_weight = weight * only[:, :, None]
    only_totals = only_weight.sum(axis=1)
    out["class_forward_only_whole_share"] = np.divide((only_weight * whole).sum(axis=1), only_totals,
                                                      out=np.zeros_like(only_totals), where=only_totals > 0)
    return out


def _kernel_tables(hardware: Hardware) -> Optional[kernels.KernelTables]:
    """The hardware's kernel tables, read once a Hardware (None: it states none)."""
    if hardware.kernel_tables is None:
        return None
    return _derived("kernel_tables", hardware,
                    lambda hw: kernels.parse_kernel_tables(f"hardware {hw.name!r}", hw.kernel_tables))


def _matmul_inverse_efficiency(model: ModelWork, rows: "_Rows", cols: Mapping[str, Any], hardware: Hardware,
                               eff: Mapping[str, float]) -> Tuple[np.ndarray, np.ndarray]:
    """``(N, K, 3)`` the forward's and the backward's seconds a matmul FLOP of each op class, times the peak.

    Each of a kind's GEMMs at its shape on a rank (:func:`ndcost.kernels.gemm_efficiency`), weighted by its
    share of the class's FLOPs: ``sum_g share_g / efficiency_g``; the backward runs the input gradient
    ``(M, in, out)`` and the weight gradient ``(out, in, M)`` (``m, n, k``), each the forward's FLOPs, so
    its figure sums both. ``M`` is the micro-batch's tokens on a CP rank (every TP rank multiplies them all,
    gathered under SP); ``column`` GEMMs split ``out`` and ``row`` ones ``in`` over TP. A routed GEMM's
    ``M`` is the tokens an expert receives: the EP group's tokens at ``tokens_per_token`` experts each,
    spread evenly over the ``experts`` and scaled by ``moe_imbalance`` (the busiest rank's), ``tokens x
    tokens_per_token x ep x imbalance / experts``; its width splits over ETP and the rank's ``experts / ep``
    experts run as one grouped GEMM. A class whose shapes are unknown takes the constant
    ``efficiency.matmul`` (``matmul_backward``).
    """
    codes = np.asarray(cols["compute_dtype"], dtype=np.int64)
    if len(codes) != 1:
        return _matmul_inverse_efficiency_rows(model, rows, codes, hardware, eff)
    # one row (one strategy): its shapes' figures kept a model, hardware and shape (what they depend on alone)
    kept = _derived("matmul_one_row", model, lambda _: {})
    key = (id(hardware), eff["matmul"], eff["matmul_backward"], int(codes[0]),
           *(float(column[0]) for column in (rows.tokens, rows.tp, rows.ep, rows.etp, rows.imbalance)))
    hit = kept.get(key)
    if hit is None or hit[0] is not hardware:
        forward, backward = _matmul_inverse_efficiency_rows(model, rows, codes, hardware, eff)
        forward.setflags(write=False)
        backward.setflags(write=False)
        if len(kept) >= _ONE_ROW_KEPT:
            kept.clear()
        hit = kept[key] = (hardware, forward, backward)
    return hit[1], hit[2]


_ONE_ROW_KEPT = 4096  # one-row figures kept a model (a search's distinct shapes)


def _matmul_inverse_efficiency_rows(model: ModelWork, rows: "_Rows", codes: np.ndarray, hardware: Hardware,
                                    eff: Mapping[str, float]) -> Tuple[np.ndarray, np.ndarray]:
    k = _kind_arrays(model)
    # the shapes depend on these alone: priced once for each distinct row (a search repeats them)
    key = np.zeros(len(codes), dtype=np.int64)
    for column in (rows.tokens, rows.tp, rows.ep, rows.etp, rows.imbalance, codes):  # one code a row, mixed radix
        found, at = distinct(column)
        key = key * len(found) + at
        if len(found) > 1 and int(key.max()) > 1 << 40:  # kept compact, far from overflowing
            key = distinct(key)[1]
    keys, inverse = distinct(key)
    first = np.zeros(len(keys), dtype=np.int64)
    first[inverse] = np.arange(len(key))  # a row of each distinct key (any: the rows of a key agree)
    distinct_rows = np.stack([rows.tokens, rows.tp, rows.ep, rows.etp, rows.imbalance, codes], axis=1)[first]
    tokens, tp, ep, etp, imbalance = (distinct_rows[:, i, None, None] for i in range(5))
    tables = _kernel_tables(hardware)
    routed = k["gemm_routed"][None]
    m = np.maximum(1.0, np.where(routed, tokens * k["gemm_tokens"] * ep * imbalance / k["gemm_experts"], tokens))
    ways = np.where(routed, etp, tp)
    split = k["gemm_split"][None]
    n = k["gemm_out"] / np.where(split == GEMM_SPLITS.index("column"), ways, 1.0)
    kk = k["gemm_in"] / np.where(split == GEMM_SPLITS.index("row"), ways, 1.0)
    groups = np.where(routed, np.maximum(1.0, k["gemm_experts"] / ep), 1.0)
    m, n, kk, groups = np.broadcast_arrays(m, n, kk, groups)
    inverse_f, inverse_b = np.empty(m.shape), np.empty(m.shape)
    dtype_codes = distinct_rows[:, 5].astype(np.int64)
    for code in np.unique(dtype_codes).tolist():  # a loop over the compute dtypes a batch uses
        at = dtype_codes == code

        def efficiency(mm, nn, kd, key, at=at, dtype=DTYPE_NAMES[code]):
            return kernels.gemm_efficiency(hardware, tables, dtype, mm[at], nn[at], kd[at], stated=eff[key],
                                           groups=groups[at])
        inverse_f[at] = 1.0 / efficiency(m, n, kk, "matmul")
        inverse_b[at] = 1.0 / efficiency(m, kk, n, "matmul_backward") + 1.0 / efficiency(n, kk, m, "matmul_backward")
    unshaped = ~k["gemm_shaped"][None]                                # (1, K, 3)
    forward = np.einsum("ukg,kgc->ukc", inverse_f, k["gemm_weight"]) + unshaped / eff["matmul"]
    backward = np.einsum("ukg,kgc->ukc", inverse_b, k["gemm_weight"]) + unshaped * 2.0 / eff["matmul_backward"]
    return forward[inverse], backward[inverse]


# Activation checkpointing's host work, as ratios to the plain forward's host seconds (the launch floor's
# launches x dispatch_seconds), measured by benchmarks/measure_checkpoint_overhead.py on Transformers' eager
# LlamaDecoderLayer and Qwen3MoeDecoderLayer (benchmarks/data/checkpoint_overhead.json, the CPU rows: the two
# layers' mean, each within 10% of it). torch.utils.checkpoint's non-reentrant saved-tensor hooks pack every
# saved tensor in the forward; the backward's first unpack runs the recompute in its own frame, its pack hooks
# filling the holders (_checkpoint_hook); under create_selective_checkpoint_contexts a TorchDispatchMode calls the
# policy on every op of the forward and of the recompute (_CachingTorchDispatchMode, _CachedTorchDispatchMode;
# torch/utils/checkpoint.py). Per mode (forward, backward's recompute):
# the forward's host seconds over the plain forward's, and the recompute's (its hooks and the unpacks
# included) in plain forwards.
CHECKPOINT_HOST_RATIOS: Mapping[str, Tuple[float, float]] = frozen_mapping({
    "full": (1.50, 1.90), "selective": (3.67, 3.49)})
# recompute=core_attention checkpoints the attention function alone: its host work is a layer's attention's, near
# the same in plain ops whatever the layer's (Llama 35 and Qwen3-MoE 45 of its 38 and 71 forward ops' seconds;
# the mean: 15.3 in the forward, 24.7 in the backward's recompute, the SDPA call rerun included), not a share of
# its ops.
CORE_ATTENTION_HOST_OPS: Tuple[float, float] = (15.3, 24.7)


def _launch_bound(model: ModelWork, rows: "_Rows", cols: Mapping[str, Any], hardware: Hardware,
                  ring_launches: Any = 0.0) -> Dict[str, np.ndarray]:
    """``(N, K)`` the least seconds a layer's passes can take for the kernels they launch and the host's work.

    ``launches x max(launch_seconds, dispatch_seconds)``: every kernel occupies the GPU at least
    ``launch_seconds``, and eager PyTorch dispatches them one by one from the host at
    ``dispatch_seconds`` each. A forward launches the kind's ``launches_per_layer`` (the census's count, else
    the eager modules' analytic one), ``launches_per_token`` for each token of the rank's sequence and ring CP's
    *ring_launches* ``(N, K)`` (:func:`_ring_attention_work`); the backward twice the forward's (no census counts
    the backward's). Left out: a kind's own ratio (1.4 to 1.9 on the H200-measured kinds, 3.6 on each chunk of
    Qwen3-Next's eager chunked delta rule: tests/test_backward_launches.py). Keys ``forward``, ``backward``, and
    for a
    checkpointed layer ``checkpointed_forward`` and ``recompute``: the host's part scaled by
    :data:`CHECKPOINT_HOST_RATIOS` (``core_attention``: :data:`CORE_ATTENTION_HOST_OPS` plain ops a layer with
    attention); a selective or core-attention recompute's own kernels' GPU floor is left out (its roofline
    share prices them). Under ``compile`` torch.compile traces the checkpoint into its graph
    (``tag_activation_checkpoint``, torch/_higher_order_ops/wrap.py; the partitioner recomputes): no hooks, no
    dispatch mode, a full recompute at the plain forward's floor.
    """
    k = _kind_arrays(model)
    launch, dispatch, _ = kernels.launch_costs(_kernel_tables(hardware))
    forward = k["launches_per_layer"] + k["launches_per_token"] * (rows.seq / rows.cp)[:, None] + ring_launches
    floor = forward * max(launch, dispatch)
    mode = np.asarray(cols["recompute"])[:, None]
    if not np.count_nonzero(mode != RECOMPUTE.index("none")):
        return {"forward": floor, "backward": 2.0 * floor, "checkpointed_forward": floor,
                "recompute": np.zeros(floor.shape)}
    compiled = np.asarray(cols["compile"], dtype=bool)[:, None]
    full, selective, core = (mode == RECOMPUTE.index(name) for name in ("full", "selective", "core_attention"))

    def host(ratio):
        return forward * np.maximum(launch, dispatch * ratio)

    def core_ops(ops):
        return ops * np.where(k["has_attention"][None, :], dispatch, 0.0)
    (full_f, full_r), (sel_f, sel_r) = CHECKPOINT_HOST_RATIOS["full"], CHECKPOINT_HOST_RATIOS["selective"]
    if np.count_nonzero(compiled):
        eager = ~compiled
        full_eager, selective_eager, core_eager = full & eager, selective & eager, core & eager
    else:  # every row eager
        full_eager, selective_eager, core_eager = full, selective, core
    checkpointed = _select_made([(full_eager, lambda: host(full_f)), (selective_eager, lambda: host(sel_f)),
                                 (core_eager, lambda: floor + core_ops(CORE_ATTENTION_HOST_OPS[0]))],
                                floor, floor.shape)
    recompute = _select_made([(full_eager, lambda: host(full_r)), (full, lambda: floor),
                              (selective_eager, lambda: forward * dispatch * sel_r),
                              (core_eager, lambda: core_ops(CORE_ATTENTION_HOST_OPS[1]))], 0.0, floor.shape)
    return {"forward": floor, "backward": 2.0 * floor, "checkpointed_forward": checkpointed, "recompute": recompute}


def _select_made(made: Sequence[Tuple[np.ndarray, Callable[[], Any]]], default: Any, shape: Tuple[int, ...]):
    """:func:`ndcost.compose.memory.select` of ``(condition, make)`` pairs, a choice made only where its condition
    holds on some row (a batch of one strategy runs one recompute mode: the others' arithmetic is skipped), as
    an array of *shape*."""
    out = default
    for condition, make in reversed(made):
        if np.count_nonzero(condition):
            out = np.where(condition, make(), out)
    if np.ndim(out) == 0:  # no condition held: the default everywhere
        return np.full(shape, out, dtype=np.float64)
    if np.shape(out) != shape:  # the default (and choices) over part of the shape, broadcast
        out = np.array(np.broadcast_to(out, shape), dtype=np.float64)
    return out


# ---------------------------------------------------------------------------
# the steps
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True, eq=False)
class _Rows:
    """The per-row figures every step reads, ``(N,)`` float64 unless noted."""

    dp: np.ndarray
    fsdp: np.ndarray
    tp: np.ndarray
    pp: np.ndarray
    vpp: np.ndarray
    cp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    micro_batch: np.ndarray
    micro_batches: np.ndarray
    seq: np.ndarray
    sp: np.ndarray              # bool
    vocab_parallel: np.ndarray  # bool
    imbalance: np.ndarray
    compute_bytes: np.ndarray
    param_bytes: np.ndarray
    grad_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    master_bytes: np.ndarray
    peak_flops: np.ndarray
    tokens: np.ndarray          # a micro-batch's tokens on one CP rank


def _rows(cols: Mapping[str, Any], hardware: Hardware) -> _Rows:
    def f64(name):
        return np.asarray(cols[name], dtype=np.float64)

    widths = {f"{name}_bytes": DTYPE_BYTES[np.asarray(cols[f"{name}_dtype"])]
              for name in ("compute", "param", "grad", "optimizer", "master")}
    b, s, cp = f64("micro_batch"), f64("seq"), f64("cp")
    return _Rows(dp=f64("dp"), fsdp=f64("fsdp"), tp=f64("tp"), pp=f64("pp"), vpp=f64("vpp"), cp=cp, ep=f64("ep"),
                 etp=f64("etp"), micro_batch=b, micro_batches=f64("num_micro_batches"), seq=s,
                 sp=np.asarray(cols["sp"]), vocab_parallel=np.asarray(cols["vocab_parallel"]),
                 imbalance=f64("moe_imbalance"), peak_flops=_peak_flops(hardware, cols["compute_dtype"]),
                 tokens=b * s / cp, **widths)


def layer_seconds(model: ModelWork, cols: Mapping[str, Any], hardware: Hardware,
                  eff: Optional[Mapping[str, float]] = None, rows: Optional[_Rows] = None) -> Dict[str, np.ndarray]:
    """Each kind's compute seconds for one layer and one micro-batch on one device, ``(N, K)`` arrays.

    A roofline per op class: matmuls against the compute dtype's peak (or,
    where the weights are read slower than the math runs, HBM bandwidth),
    the attention scores and the linear recurrence at their own efficiency,
    elementwise bytes against HBM. The backward is twice the forward's work but the forward-only work's
    (``KindWork.forward_only_*``: what autograd records no backward for);
    recompute adds the forward (``full``), the census's measured shares of
    the weight matmuls and of the scores (or linear recurrence) and, eager,
    the forward's elementwise kernels (``selective`` under an op-level
    policy; without the shares the core attention, as Megatron's selective
    recompute) or the scores (``core_attention``). Left out: eager softmax's
    rerun where a policy keeps both of eager attention's matmuls.
    Under ``float8`` the Float8 linears' FLOPs run at the fp8 peak and their
    casts add elementwise bytes (:func:`_float8_linears`); under ``compile``
    the elementwise bytes are the fused count (:func:`_elementwise_elements`).
    Each matmul is priced at its shape's efficiency
    (:func:`_matmul_inverse_efficiency`: the hardware's ``kernel_tables``,
    else the prior of :func:`ndcost.kernels.prior_gemm_efficiency`), and
    elementwise kernels at the efficiency of their mean size where the
    hardware has an elementwise table. A pass takes at least its kernels'
    launch bound (:func:`_launch_bound`): ``forward = max(roofline,
    launches x max(launch_seconds, dispatch_seconds))``, the backward's with
    twice the launches; full recompute repeats the forward's roofline,
    selective and core-attention recompute their roofline share, the
    recompute and the backward together at least their floors together
    (checkpoint's host work in the recompute's), and a checkpointed layer's
    forward (``checkpointed_forward``) at least its own (:func:`_launch_bound`).
    Ring CP adds its steps' merges and accumulations (:func:`_ring_attention_work`: elementwise bytes at HBM,
    their launches on the floor), rerun wherever the attention is recomputed.
    Keys: ``forward``, ``backward``, ``recompute``, ``checkpointed_forward``, ``scores_forward``,
    ``scores_backward`` (the attention kernel's), ``scores_first_forward``, ``scores_first_backward`` (its
    first ring step's, for CP ring overlap), ``ring_merges_forward``, ``ring_merges_backward``,
    ``matmul_forward``, ``matmul_backward`` (the matmuls'), ``selective_measured``.
    """
    eff = efficiencies(hardware)[0] if eff is None else eff
    rows = _rows(cols, hardware) if rows is None else rows
    if len(rows.tp) != 1:
        return _layer_seconds(model, cols, hardware, eff, rows)
    # one row (one strategy): its figures kept (a search's strategies share them where they differ in dp, pp,
    # zero, micro-batches ...)
    float8 = np.asarray(cols["float8"])[0] != FLOAT8_RECIPES.index("none")
    return _kept_one_row("layer_one_row", model, hardware, eff, cols, _LAYER_READ + _FLOAT8_READ if float8
                         else _LAYER_READ, (), lambda: _layer_seconds(model, cols, hardware, eff, rows))


# every column layer_seconds reads (through _Rows and its helpers), and those float8's rows read besides (their
# sharding, :func:`_float8_linears`): a one-row key missing one would hand a strategy another's figures
_LAYER_READ = ("tp", "cp", "micro_batch", "seq", "sp", "compute_dtype", "param_dtype", "moe_imbalance", "ep", "etp",
               "recompute", "compile", "cp_algo", "cp_rotate", "float8", "float8_experts")
_FLOAT8_READ = sharding_rules.READ + ("float8_all_gather", "num_micro_batches")


def _kept_one_row(tag: str, model: ModelWork, hardware: Hardware, eff: Mapping[str, float], cols: Mapping[str, Any],
                  read: Tuple[str, ...], extra: Tuple[Hashable, ...], make: Callable[[], Dict[str, Any]]):
    """A one-row batch's figures ``make()`` (a dict of arrays), kept a model (by *tag*), hardware, efficiencies,
    the values of the columns *read* (every one the figures depend on) and *extra* (any other input), read-only;
    a fresh dict of them each call."""
    kept = _derived(tag, model, lambda _: {})
    key = (id(hardware), *eff.items(), *extra, *(np.asarray(cols[name]).item() for name in read))
    hit = kept.get(key)
    if hit is None or hit[0] is not hardware:
        figures = make()
        for array in figures.values():
            if isinstance(array, np.ndarray):
                array.setflags(write=False)
        if len(kept) >= _ONE_ROW_KEPT:
            kept.clear()
        hit = kept[key] = (hardware, figures)
    return dict(hit[1])


def _layer_seconds(model: ModelWork, cols: Mapping[str, Any], hardware: Hardware, eff: Mapping[str, float],
                   rows: _Rows) -> Dict[str, np.ndarray]:
    k = _kind_arrays(model)
    # the rooflines read every column the layer's figures read but recompute, and the launch floor fewer: one
    # row's kept by those (a strategy differing in its recompute alone finds them)
    float8 = len(rows.tp) == 1 and np.asarray(cols["float8"])[0] != FLOAT8_RECIPES.index("none")
    roofline = _kept_where_one_row("rooflines_one_row", model, hardware, eff, cols,
                                   _ROOFLINE_READ + _FLOAT8_READ if float8 else _ROOFLINE_READ,
                                   lambda: _layer_rooflines(model, cols, hardware, eff, rows))
    floor = _kept_where_one_row("launch_one_row", model, hardware, eff, cols, _LAUNCH_READ,
                                lambda: _launch_bound(model, rows, cols, hardware, roofline["ring_launches"]))
    roofline_f, roofline_b = roofline["roofline_f"], roofline["roofline_b"]
    fwd_mm, fwd_attention, by_class = roofline["matmul_forward"], roofline["attention_forward"], roofline["by_class"]
    forward, backward = np.maximum(roofline_f, floor["forward"]), np.maximum(roofline_b, floor["backward"])
    share_att = k["recomputed_attention_mm_share"][None, :]
    share_other = k["recomputed_other_mm_share"][None, :]
    share_scores = k["recomputed_scores_share"][None, :]
    measured = k["selective_measured"][None, :]

    def selective():
        mm = np.add.reduce(by_class, axis=-1)
        att_share = np.divide(by_class[..., 0], mm, out=np.zeros(mm.shape), where=mm > 0)
        # an op-level policy keeps the outputs of the ops it lists (matmuls, attention kernels, collectives) and
        # reruns every other op of the forward (_CachedTorchDispatchMode, torch/utils/checkpoint.py): the
        # elementwise kernels with the recomputed matmuls; under compile the partitioner fuses the rerun
        # elementwise ops into the backward's kernels (what they read the backward reads): not added
        eager_elementwise = np.where(_fused_rows(model, cols), 0.0, roofline["elementwise_forward"])
        # the scores (eager's matmuls and softmax, or the kernel) and a linear recurrence, where it reruns them
        scores = nan_to_zero(share_scores) * (fwd_attention + roofline["recurrence_forward"])
        return np.where(measured, nan_to_zero(share_att) * fwd_mm * att_share
                        + nan_to_zero(share_other) * fwd_mm * (1.0 - att_share) + scores + eager_elementwise,
                        fwd_attention)
    mode = np.asarray(cols["recompute"])[:, None]
    # a layer's recompute runs at the start of its backward: the two are one stretch of the GPU's queue and of the
    # host's dispatch, bounded together (the host, running ahead, hides its recompute's work behind a long backward)
    if np.count_nonzero(mode != RECOMPUTE.index("none")):
        roofline_r = _select_made([(mode == RECOMPUTE.index(name), make) for name, make in (
            ("full", lambda: roofline_f), ("selective", selective), ("core_attention", lambda: fwd_attention))],
            0.0, forward.shape)
        recompute = np.maximum(roofline_r + roofline_b, floor["recompute"] + floor["backward"]) - backward
    else:  # nothing recomputed: a roofline of 0 s
        recompute = np.maximum(roofline_b, floor["recompute"] + floor["backward"]) - backward
    return {"forward": forward, "backward": backward, "recompute": recompute,
            "checkpointed_forward": np.maximum(roofline_f, floor["checkpointed_forward"]),
            **{key: roofline[key] for key in ("scores_forward", "scores_backward", "scores_first_forward",
                                              "scores_first_backward", "ring_merges_forward", "ring_merges_backward",
                                              "matmul_forward", "matmul_backward")},
            "selective_measured": measured if measured.shape == forward.shape else np.broadcast_to(measured,
                                                                                                   forward.shape)}


# every column _layer_rooflines reads: the layer's but recompute
_ROOFLINE_READ = tuple(name for name in _LAYER_READ if name != "recompute")


def _layer_rooflines(model: ModelWork, cols: Mapping[str, Any], hardware: Hardware, eff: Mapping[str, float],
                     rows: _Rows) -> Dict[str, np.ndarray]:
    """``(N, K)`` a layer's rooflines a micro-batch, forward and backward (``roofline_f``, ``roofline_b``: matmuls,
    attention, linear recurrence, elementwise bytes; :func:`layer_seconds`), and their parts the recompute and
    the callers read: ``matmul_forward``, ``matmul_backward``, ``attention_forward`` (what recomputing the
    attention function reruns), :func:`_attention_seconds`' figures, and ``by_class`` ``(N, K, 3)``, the matmul
    FLOPs of each op class."""
    k = _kind_arrays(model)
    tp, cp, b, s = rows.tp[:, None], rows.cp[:, None], rows.micro_batch[:, None], rows.seq[:, None]
    sp, peak = rows.sp[:, None], rows.peak_flops[:, None]
    hbm = float(hardware.hbm_bytes_per_second)
    tokens = rows.tokens[:, None]
    split = tokens / tp
    # a GEMM TP leaves whole (MLA's down-projections, a router) runs whole on every TP rank, on every token
    # (gathered under SP, as _matmul_inverse_efficiency shapes it): its class's FLOPs on a rank are the split
    # GEMMs' over tp and the whole ones' in full
    extra = (tokens - split)[..., None]
    by_class = k["class_mm_flops_per_token"] * (split[..., None] + extra * k["class_whole_share"])  # (N, K, 3)
    # the backward's: the forward's less what it does not repeat (ModelWork's forward-only work)
    forward_only = bool(k["has_forward_only"])
    by_class_b = by_class - k["class_forward_only_mm_flops_per_token"] * (
        split[..., None] + extra * k["class_forward_only_whole_share"]) if forward_only else by_class
    if np.count_nonzero(rows.imbalance != 1.0):  # the busiest expert rank's routed tokens
        by_class[..., 2] *= rows.imbalance[:, None]
        if forward_only:
            by_class_b[..., 2] *= rows.imbalance[:, None]
    inverse_f, inverse_b = _matmul_inverse_efficiency(model, rows, cols, hardware, eff)
    # a model without sliding windows: every kind's pairs causal (window_pairs' windowless figure)
    pairs = window_pairs(s, k["window"]) if np.count_nonzero(k["window"]) else causal_pairs(s)
    scores = k["score_flops_per_pair"] * pairs * b / (tp * cp)
    # a model without linear recurrences or routed experts: their terms are 0, left out
    linrec = k["linrec_flops_per_token"] * split if np.count_nonzero(k["linrec_flops_per_token"]) else None
    weights = (k["dense_parameters"] - k["whole_parameters"]) / tp + k["whole_parameters"]
    if np.count_nonzero(k["routed_parameters"]):
        weights = weights + k["routed_parameters"] / (rows.ep * rows.etp)[:, None]
    weights = rows.param_bytes[:, None] * (weights + k["replicated_parameters"])
    elementwise = rows.compute_bytes[:, None] * tokens * _elementwise_elements(model, k, cols, tp, sp)
    fp8_mm, cast_fwd, cast_bwd, fp8_experts = _float8_linears(model, k, rows, cols, split)
    fp8_experts = fp8_experts & (k["routed_mm_flops_per_token"][None, :] > 0)
    fp8_on = bool(np.count_nonzero(fp8_mm)) or bool(np.count_nonzero(fp8_experts))
    refusal = float8_refusal(hardware) if fp8_on else None
    if refusal:
        raise InvalidValue(refusal)
    fp8_seconds = _fp8_seconds_per_flop(hardware, eff) if fp8_on else 0.0

    def matmul(passes, inverse, flops, fp8_fraction=1.0):
        # the Float8 linears' share of the attention and other classes runs at the fp8 peak, at the compute
        # dtype's shape efficiency scaled by matmul_fp8 / matmul (an fp8 row of kernel_tables is not read); of a
        # backward's, fp8_fraction (the input gradient's and weight gradient's GEMMs taken as equal in time)
        per_class = flops * inverse
        seconds = np.add.reduce(per_class, axis=-1) / peak
        if fp8_on:  # a batch without Float8 linears adds no share (0 of finite seconds)
            dense = per_class[..., 0] + per_class[..., 1]
            fp8_share = fp8_fraction * np.divide(fp8_mm, flops[..., 0] + flops[..., 1], out=np.zeros_like(fp8_mm),
                                                 where=fp8_mm > 0)
            # under float8_experts the routed class's every FLOP (its grouped GEMMs) runs at the fp8 peak
            seconds = seconds + (fp8_share * dense + fp8_experts * per_class[..., 2]) * (fp8_seconds - 1.0 / peak)
        return np.maximum(seconds, (weights if passes == 1.0 else passes * weights) / (hbm * eff["memory"]))

    tables = _kernel_tables(hardware)
    per_kernel = elementwise / k["elementwise_launches"]
    # rowwise_with_gw_hp's weight gradient GEMMs run at compute_dtype: half the backward's Float8 linears' FLOPs
    weight_hp = np.asarray(cols["float8"])[:, None] == FLOAT8_RECIPES.index("rowwise_with_gw_hp")
    fwd_mm = matmul(1.0, inverse_f, by_class)
    bwd_mm = matmul(2.0, inverse_b, by_class_b, np.where(weight_hp, 0.5, 1.0) if fp8_on else 1.0)
    # the attention's figures read fewer columns than the rooflines': one row's kept by those
    attention = _kept_where_one_row("attention_one_row", model, hardware, eff, cols, _ATTENTION_READ,
                                    lambda: _attention_seconds(model, rows, cols, hardware, eff, scores))
    if forward_only:  # the scores' backward repeats its share of them (linear in their FLOPs at a shape)
        attention = {**attention, **{key: attention[key] * k["backward_score_share"]
                                     for key in ("scores_backward", "scores_first_backward")}}
    fwd_scores, bwd_scores = attention["scores_forward"], attention["scores_backward"]
    ring_fwd, ring_bwd = attention["ring_merges_forward"], attention["ring_merges_backward"]
    memory = (eff["memory"], eff["memory_backward"])
    fwd_attention = fwd_scores + ring_fwd  # what recomputing the attention function reruns
    elementwise_f, elementwise_b = kernels.elementwise_efficiencies(tables, per_kernel, stated=memory)
    roofline_f, roofline_b = fwd_mm + fwd_attention, bwd_mm + bwd_scores + ring_bwd
    recurrence_f: Any = 0.0  # no linear recurrence: 0 s
    if linrec is not None:
        recurrence_f = linrec / (peak * eff["linrec"])
        roofline_f = roofline_f + recurrence_f
        linrec_b = linrec - k["forward_only_linrec_flops_per_token"] * split if forward_only else linrec
        roofline_b = roofline_b + 2.0 * linrec_b / (peak * eff["linrec_backward"])
    repeated = elementwise  # the elementwise bytes the backward repeats (twice over)
    if forward_only:  # eager's forward-only bytes (compile's fused count is the shapes', which hold none)
        tp_split = np.where(sp, tp, 1.0)
        only = rows.compute_bytes[:, None] * tokens * (k["forward_only_elementwise_elements_per_token"] / tp
                                                       + k["forward_only_replicated_elements_per_token"] / tp_split)
        repeated = np.maximum(elementwise - np.where(_fused_rows(model, cols), 0.0, only), 0.0)
    if np.count_nonzero(np.asarray(cols["float8"]) != FLOAT8_RECIPES.index("none")):  # the Float8 casts' bytes
        elementwise_fwd, elementwise_bwd = elementwise + cast_fwd, 2.0 * repeated + cast_bwd
    else:
        elementwise_fwd, elementwise_bwd = elementwise, 2.0 * repeated
    elementwise_f_seconds = elementwise_fwd / (hbm * elementwise_f)
    roofline_f = roofline_f + elementwise_f_seconds
    roofline_b = roofline_b + elementwise_bwd / (hbm * elementwise_b)
    return {"roofline_f": roofline_f, "roofline_b": roofline_b, "matmul_forward": fwd_mm, "matmul_backward": bwd_mm,
            "attention_forward": fwd_attention, "elementwise_forward": elementwise_f_seconds,
            "recurrence_forward": recurrence_f, "by_class": by_class, **attention}


# every column _attention_seconds reads (through _Rows, _scores_seconds' scores and _ring_attention_work), and
# _launch_bound (its ring launches: ring CP's steps): a one-row key missing one would hand a strategy another's
_ATTENTION_READ = ("tp", "cp", "micro_batch", "seq", "compute_dtype", "cp_algo", "cp_rotate", "compile")
_LAUNCH_READ = ("seq", "cp", "cp_algo", "recompute", "compile")


def _kept_where_one_row(tag: str, model: ModelWork, hardware: Hardware, eff: Mapping[str, float],
                        cols: Mapping[str, Any], read: Tuple[str, ...], make: Callable[[], Dict[str, Any]],
                        extra: Tuple[Hashable, ...] = ()):
    """``make()``; for a batch of one strategy kept by the columns *read* and *extra* (:func:`_kept_one_row`)."""
    if len(cols["tp"]) != 1:
        return make()
    return _kept_one_row(tag, model, hardware, eff, cols, read, extra, make)


def _attention_seconds(model: ModelWork, rows: "_Rows", cols: Mapping[str, Any], hardware: Hardware, eff,
                       scores: np.ndarray) -> Dict[str, np.ndarray]:
    """``(N, K)`` the attention's seconds of a layer and micro-batch: its kernel's (:func:`_scores_seconds`:
    ``scores_forward``, ``scores_backward``, ``scores_first_forward``, ``scores_first_backward``) and ring CP's
    merges and accumulations at HBM (:func:`_ring_attention_work`: ``ring_merges_forward``,
    ``ring_merges_backward``, at the elementwise efficiency of their mean kernel), and the ring's launches
    (``ring_launches``)."""
    forward, backward, first_forward, first_backward = _scores_seconds(model, rows, cols, hardware, eff, scores)
    ring = _ring_attention_work(_kind_arrays(model), rows, cols, _fused_rows(model, cols))
    if np.count_nonzero(ring["launches"]):  # some row runs ring CP (its launches: > 0 exactly there)
        hbm = float(hardware.hbm_bytes_per_second)
        ring_f, ring_b = kernels.elementwise_efficiencies(
            _kernel_tables(hardware), ring["forward_bytes"] / np.maximum(ring["launches"], 1.0),
            stated=(eff["memory"], eff["memory_backward"]))
        ring_fwd, ring_bwd = ring["forward_bytes"] / (hbm * ring_f), ring["backward_bytes"] / (hbm * ring_b)
    else:  # no merges: zero bytes
        ring_fwd, ring_bwd = ring["forward_bytes"], ring["backward_bytes"]
    return {"scores_forward": forward, "scores_backward": backward, "scores_first_forward": first_forward,
            "scores_first_backward": first_backward, "ring_merges_forward": ring_fwd, "ring_merges_backward": ring_bwd,
            "ring_launches": ring["launches"]}


# Transformers' eager_attention_forward (modeling_llama.py and the families that copy it) on a 2-byte compute dtype,
# bytes a score element moves outside the two matmuls each pass: the forward's scaling (read, write: 4), mask add
# (4), softmax(dtype=float32) as torch runs it, an upcast (read 2, write 4) then the softmax in fp32 (read 4, write
# 4), and the cast back (read 4, write 2): 28 in 5 kernels, as the census counts them
# (tests/test_census_attribution.py); the backward's cast to fp32 (6), softmax backward (reads the fp32 gradient and
# output, writes fp32: 12), cast back (6) and the scaling's (4): 28. Dropout at p = 0 returns its input
# (torch.nn.functional.dropout); the mask's reads (a batch's, not a head's) are left out.
EAGER_SOFTMAX_BYTES_PER_SCORE = 28.0
EAGER_SOFTMAX_KERNELS = 5


# torch's ring attention (torch/distributed/tensor/experimental/_context_parallel/_attention.py, as torchtitan runs it:
# _cp_options' defaults, convert_to_f32 and enable_load_balance on): the kernels a forward launches beyond the
# layer's one SDPA call, cp - 1 of them a later step (the partial-query case): its SDPA call, the K/V concatenation
# sent on (torch.cat, before every step but the last), the output's cast to fp32 (_SDPAMerger.step), the merge's
# eight elementwise ops (_merge_one: out - sigmoid(block_lse - lse) * (out - block_out), lse - logsigmoid(lse -
# block_lse)) and _partial_update's two concatenations; and once a pass the keys' and values' .contiguous() copies,
# step 0's cast and the result's cast back (its logsumexp stays fp32: no kernel)
RING_LAUNCHES_PER_LATER_STEP = 13.0
RING_LAUNCHES_PER_PASS = 4.0


def _ring_attention_work(k: Mapping[str, np.ndarray], rows: _Rows, cols: Mapping[str, Any],
                         compiled: np.ndarray) -> Dict[str, np.ndarray]:
    """``(N, K)`` what ring CP's merges and gradient accumulations move through HBM a layer and micro-batch on one
    device, forward and backward (``forward_bytes``, ``backward_bytes``), and the kernels the forward launches
    beyond the layer's (``launches``); 0 without ring CP or attention.

    As torch's ring runs them (``_templated_ring_attention``, ``_SDPAMerger``, ``_templated_ring_attention_backward``
    in torch/distributed/tensor/experimental/_context_parallel/_attention.py): ``w`` the compute width, on the rank's
    tokens over TP: ``q`` query, ``o`` output, ``kv`` key-and-value (``KindWork.kv_elements_per_token``, as SDPA
    receives them) and ``l`` logsumexp (a head a token) elements. Forward, eager: the keys' and values'
    ``.contiguous()`` (``2 w kv``), a K/V concatenation before each of the first ``cp - 1`` steps (``2 w kv``
    each), step 0's cast of its output to fp32 and the result's back (``2 (w + 4) o``); each later step merges
    its output into the fp32 running one, on all the queries (rank ``cp - 1``: the cast ``(w + 4) o``, the merge
    ``32 o + 56 l``) or on half of them (rank 0: half that, plus ``_partial_update``'s concatenations of the whole
    output and logsumexp, ``8 o + 8 l``). Backward, eager: fp32 accumulators zeroed (``4 (q + kv)``), the
    copies and concatenations again, step 0's accumulation (``(8 + w) (q + kv)``), every step's concatenation of
    the fp32 key and value gradients sent on (``8 kv``), the casts back at the end (``(4 + w) (q + kv)``); each
    later step adds its gradients into the fp32 accumulators, whole or into one half followed by that
    tensor's concatenation (``8`` a whole element), on the queries' half at rank 0 (with the logsumexp half's
    ``.contiguous()``, ``4 l``) or the keys' half at rank ``cp - 1``. Each later step is priced at the slower of
    the two ranks' (the ring waits for its slowest; the ranks between mix the two). Under ``compile`` torchtitan
    compiles each block whole, the ring traced into the graph (``_maybe_wait``'s docstring), and each merge or
    accumulation is one fused kernel reading its inputs and writing its result once: the forward's
    ``(8 + w) o + 12 l`` a later step (``(8 + w / 2) o + 10 l`` at rank 0), the copies and the one
    concatenation the all-gather sends (the rest are dead; under ``cp_rotate=p2p`` each of the ``cp - 1`` is
    sent, ``2 w kv`` each, in both passes), the backward's accumulations
    ``(8 + w) x + (8 + w / 2) y`` (the whole tensor and the halved one) and the key gradients' final cast; the
    casts at step 0 and of the result are taken as folded into the neighbouring merge (counted at fp32: at
    most ``2 (4 - w) o`` over). The forward's launches are counted as eager (as the layer's own are, under
    ``compile`` too): :data:`RING_LAUNCHES_PER_PASS` and :data:`RING_LAUNCHES_PER_LATER_STEP`. Left out: the
    all-gathered buffer's chunk views (no copies), the rotater's buffer handling on the host.
    """
    shape = (len(rows.cp), len(k["has_attention"]))
    ulysses = np.asarray(cols["cp_algo"]) == CP_ALGOS.index("ulysses")
    on = ((rows.cp > 1) & ~ulysses)[:, None] & k["has_attention"][None, :]
    if not np.count_nonzero(on):
        zeros = np.zeros(shape)
        return {"forward_bytes": zeros, "backward_bytes": zeros, "launches": zeros}
    w, cp = rows.compute_bytes[:, None], rows.cp[:, None]
    tokens = (rows.tokens / rows.tp)[:, None]
    q = tokens * k["query_elements_per_token"]
    o = tokens * k["attention_output_elements_per_token"]
    lse = tokens * k["attention_heads"]
    kv = tokens * k["kv_elements_per_token"]
    later = cp - 1.0
    compiled_rows = np.count_nonzero(compiled)  # eager's and compile's figures priced only where a row runs them
    if compiled_rows < len(compiled):
        eager_f = (2.0 * w * kv * cp + 2.0 * (w + 4.0) * o
                   + later * np.maximum((w + 36.0) * o + 56.0 * lse, (w / 2.0 + 26.0) * o + 36.0 * lse))
        eager_b = ((4.0 + (8.0 + w) + (4.0 + w)) * (q + kv) + 2.0 * w * kv * cp + 8.0 * kv * cp
                   + later * np.maximum((8.0 + w) * q + ((8.0 + w) / 2.0 + 8.0) * kv,
                                        ((8.0 + w) / 2.0 + 8.0) * q + (8.0 + w) * kv + 4.0 * lse))
    if compiled_rows:
        fused_f = 4.0 * w * kv + later * np.maximum((8.0 + w) * o + 12.0 * lse, (8.0 + w / 2.0) * o + 10.0 * lse)
        fused_b = (4.0 * w * kv + (4.0 + w) * (q + 2.0 * kv)
                   + later * np.maximum((8.0 + w) * q + (8.0 + w / 2.0) * kv,
                                        (8.0 + w / 2.0) * q + (8.0 + w) * kv + 4.0 * lse))
        # under cp_rotate=p2p every concatenation is sent on: none is dead
        sent = np.where((np.asarray(cols["cp_rotate"]) == CP_ROTATES.index("p2p"))[:, None],
                        2.0 * w * kv * np.maximum(cp - 2.0, 0.0), 0.0)
        fused_f, fused_b = fused_f + sent, fused_b + sent
    if not compiled_rows:
        forward, backward = eager_f, eager_b
    elif compiled_rows == len(compiled):
        forward, backward = fused_f, fused_b
    else:
        forward, backward = np.where(compiled, fused_f, eager_f), np.where(compiled, fused_b, eager_b)
    launches = np.where(on, RING_LAUNCHES_PER_PASS + RING_LAUNCHES_PER_LATER_STEP * later, 0.0)
    if np.count_nonzero(on) == on.size:  # every row rings on every kind
        return {"forward_bytes": forward, "backward_bytes": backward, "launches": launches}
    return {"forward_bytes": np.where(on, forward, 0.0), "backward_bytes": np.where(on, backward, 0.0),
            "launches": launches}


def _scores_seconds(model: ModelWork, rows: _Rows, cols: Mapping[str, Any], hardware: Hardware, eff,
                    scores: np.ndarray) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(N, K)`` forward and backward seconds of the attention scores (``Q K^T`` and ``P V``: *scores* FLOPs, one
    layer and micro-batch on one device) at the efficiency of the kernel the runtime runs, on the shape it runs,
    and the seconds of the first of ring CP's steps of each pass (the whole pass without ring CP).

    The kernel is the runtime's (``ModelWork.attention_kernel``; SDPA's backend as PyTorch picks it in the
    hardware's ``kernel_tables.sdpa_backends`` order, or in the runtime's own order (:func:`_sdpa_order`),
    :func:`ndcost.kernels.attention_kernel`), read per compute
    dtype and kind. Under ring CP the kernel runs once a step, ``cp`` steps a pass, as torch's load-balanced
    ring runs them (``_templated_ring_attention`` and its backward,
    torch/distributed/tensor/experimental/_context_parallel/_attention.py; each rank holds two of the ``2 cp``
    sequence chunks, ``_load_balancer.py``): step 0 causal on the rank's ``seq / cp`` queries and keys (``1 / cp``
    of its pairs), each later step non-causal on half of them, rank 0 on half the queries against all the keys,
    rank ``cp - 1`` on all the queries against half the keys; each later step is priced at the slower of the
    two shapes (the ring waits for its slowest rank). Under Ulysses the query block is the whole sequence (the
    heads split ``cp`` ways instead); the heads ``micro_batch x heads / tp``. A fused kernel takes
    :func:`ndcost.kernels.attention_efficiency` (measured curves, the plateau prior, else the constant) on the
    estimator's FLOPs. Eager attention is priced as what it runs (:func:`_eager_scores`): two batched matmuls
    over every ``s_q x s_k`` pair at their GEMM efficiency (``s_k = s (1 + KindWork.extra_keys_per_token)``;
    ``Q K^T``: ``s_q x s_k x d``, ``P V``: ``s_q x d_v x s_k``, the backward's four products likewise) and its
    softmax's elementwise bytes; left out there, the extra elementwise ops a family's own eager function adds
    (GPT-OSS's sinks: a concatenation, a max) and DeepSeek-V4's indexer scores (its compressed sparse layers'
    lightning indexer). A kind without heads (``KindWork.attention_heads`` 0), or a model without a runtime
    kernel, keeps
    ``efficiency.attention`` and ``attention_backward``; those, and eager attention (torch's ring runs the SDPA
    kernels only), take ``1 / cp`` of the pass as the ring's first step. The ring's merges and launches are
    :func:`_ring_attention_work`'s.
    """
    peak = rows.peak_flops[:, None]
    tables = _kernel_tables(hardware)
    order = _sdpa_order(model, hardware)
    k = _kind_arrays(model)
    capability = hardware.compute_capability
    groups = _derived(("attention_kernels", order, capability), model,
                      lambda m: _attention_groups(m, k, order, capability))
    codes = np.asarray(cols["compute_dtype"])
    one_dtype = len(codes) == 1 or np.count_nonzero(codes == codes[0]) == len(codes)
    first = groups[DTYPE_NAMES[int(codes[0])]]
    covered = one_dtype and len(first) == 1 and isinstance(first[0][1], slice)  # one kernel prices every kind
    ulysses = (np.asarray(cols["cp_algo"]) == CP_ALGOS.index("ulysses"))[:, None]
    any_ulysses = np.count_nonzero(ulysses)  # without Ulysses no head split: the sequence splits cp ways
    cp, seq = rows.cp[:, None], rows.seq[:, None]
    ring = (cp > 1) & ~ulysses if any_ulysses else cp > 1
    any_ring = bool(np.count_nonzero(ring))
    first_share = np.where(ring, 1.0 / cp, 1.0)   # the ring's step 0: 1 / cp of the rank's pairs

    def split(f, b, share=first_share):  # a pass priced at one shape, its first step 1 / cp of it under ring CP
        return f, b, f * share, b * share

    if not covered:
        forward = scores / (peak * eff["attention"])
        backward = 2.0 * scores / (peak * eff["attention_backward"])
        forward, backward, first_forward, first_backward = split(forward, backward)
        if not any(groups.values()):
            return forward, backward, first_forward, first_backward
    if any_ulysses:
        head_split = np.where(ulysses, cp, 1.0)
        seq_q = seq / (cp / head_split)
        heads = (rows.micro_batch[:, None] / (rows.tp[:, None] * head_split)) * k["attention_heads"]
    else:  # the same figures at a head split of 1
        seq_q = seq / cp
        heads = (rows.micro_batch[:, None] / rows.tp[:, None]) * k["attention_heads"]
    stated = (eff["attention"], eff["attention_backward"])
    for code in [int(codes[0])] if one_dtype else np.unique(codes).tolist():  # the compute dtypes a batch uses
        dtype = DTYPE_NAMES[code]
        at = slice(None) if one_dtype else codes == code
        for name, kinds, d, dv in groups[dtype]:  # and the kernels its kinds run (one a kind)
            cell = (at, kinds) if isinstance(at, slice) or isinstance(kinds, slice) else np.ix_(at, kinds)
            if name == "eager":
                keys = seq[at] * (1.0 + k["extra_keys_per_token"][kinds])  # and the compressed entries (DSV4)
                f, b = _eager_scores(hardware, tables, dtype, eff, seq_q[at], keys, heads[cell], d, dv, peak[at],
                                     rows.compute_bytes[at][:, None])
                priced = split(f, b, first_share[at])
            else:
                ef, eb = kernels.attention_efficiency(hardware, tables, name, dtype, seq_q[at], heads[cell], d, True,
                                                      stated=stated)
                f, b = scores[cell] / (peak[at] * ef), 2.0 * scores[cell] / (peak[at] * eb)
                priced = split(f, b, first_share[at])
                if any_ring:  # the later steps, non-causal: half the queries (rank 0) or all of them (rank cp - 1)
                    hf, hb = kernels.attention_efficiency(hardware, tables, name, dtype, seq_q[at] / 2.0, heads[cell],
                                                          d, False, stated=stated)
                    wf, wb = kernels.attention_efficiency(hardware, tables, name, dtype, seq_q[at], heads[cell], d,
                                                          False, stated=stated)
                    first, later = scores[cell] * first_share[at], scores[cell] * (1.0 - first_share[at])
                    f0, b0 = first / (peak[at] * ef), 2.0 * first / (peak[at] * eb)
                    priced = (np.where(ring[at], f0 + later / (peak[at] * np.minimum(hf, wf)), f),
                              np.where(ring[at], b0 + 2.0 * later / (peak[at] * np.minimum(hb, wb)), b), f0, b0)
            if covered:
                return priced
            forward[cell], backward[cell], first_forward[cell], first_backward[cell] = priced
    return forward, backward, first_forward, first_backward


def _sdpa_order(model: ModelWork, hardware: Hardware) -> Tuple[str, ...]:
    """The order SDPA-class attention tries the kernels: the runtime's own on this device
    (``ModelWork.attention_backends``: Transformer Engine's, cuDNN's first from Hopper on), else the hardware's
    (``kernel_tables.sdpa_backends``: PyTorch's SDPA)."""
    own = kernels.runtime_sdpa_backends(model.attention_backends, hardware.compute_capability) \
        if model.attention_backends else ()
    if own:
        return own
    tables = _kernel_tables(hardware)
    return kernels.DEFAULT_SDPA_BACKENDS if tables is None else tables.sdpa_backends


def _fused_rows(model: ModelWork, cols: Mapping[str, Any]) -> np.ndarray:
    """``(N, 1)`` whether each row's pointwise chains run as one kernel each: under ``compile``, or everywhere
    under a runtime whose pointwise ops run fused (``ModelWork.fused_pointwise``: Transformer Engine's kernels)."""
    compiled = np.asarray(cols["compile"], dtype=bool)[:, None]
    return np.ones(compiled.shape, dtype=bool) if model.fused_pointwise else compiled


def _attention_groups(model: ModelWork, k: Mapping[str, np.ndarray], order: Tuple[str, ...],
                      capability: Optional[str]):
    """Per compute dtype, each attention kernel the model's kinds with heads run under SDPA order *order* on a
    device of compute *capability*: ``(kernel, kinds, head_dim, value_head_dim)``, *kinds* a slice where every kind
    runs it, else a mask."""
    shaped = (k["attention_heads"] > 0) & bool(model.attention_kernel)
    out: Dict[str, list] = {}
    for dtype in DTYPE_NAMES:
        names = [kernels.attention_kernel(model.attention_kernel, dtype, int(d), int(dv), order, capability)
                 for d, dv in zip(k["attention_head_dim"], k["attention_value_head_dim"], strict=True)]
        out[dtype] = []
        for name in sorted({n for n, on in zip(names, shaped, strict=True) if on}):
            kinds = shaped & np.array([n == name for n in names])
            out[dtype].append((name, slice(None) if kinds.all() else kinds, k["attention_head_dim"][kinds],
                               k["attention_value_head_dim"][kinds]))
    return out


def _eager_scores(hardware: Hardware, tables, dtype: str, eff, seq_q, seq_k, heads, d, dv, peak, width):
    """Eager attention's forward and backward seconds: its batched matmuls over every ``s_q x s_k`` pair (eager
    masks, it skips nothing: ``2 s_q s_k d`` FLOPs a head for ``Q K^T``, ``2 s_q s_k d_v`` for ``P V``, the
    backward's four products each its forward's) at their shapes' GEMM efficiency, and its softmax's bytes
    (:data:`EAGER_SOFTMAX_BYTES_PER_SCORE` a score)."""
    def stacked(*operands):  # the six products' operands along a leading axis, at the heads' shape
        out = np.empty((len(operands),) + np.shape(heads))
        for i, operand in enumerate(operands):
            out[i] = operand
        return out

    # Q K^T and P V, then the backward's dQ = dS K, dK = dS^T Q, dP = dO V^T, dV = P^T dO: one efficiency call
    inverse = 1.0 / kernels.gemm_efficiency(
        hardware, tables, dtype, stacked(seq_q, seq_q, seq_q, seq_k, seq_q, seq_k),
        stacked(seq_k, dv, d, d, seq_k, dv), stacked(d, seq_k, seq_k, seq_q, dv, seq_q),
        stated=np.array([eff["matmul"]] * 2 + [eff["matmul_backward"]] * 4).reshape((6,) + (1,) * np.ndim(heads)),
        groups=heads)
    pairs = heads * seq_q * seq_k
    qk, pv = 2.0 * pairs * d, 2.0 * pairs * dv
    forward = qk * inverse[0] + pv * inverse[1]
    backward = qk * (inverse[2] + inverse[3]) + pv * (inverse[4] + inverse[5])
    moved = EAGER_SOFTMAX_BYTES_PER_SCORE * width / 2.0 * pairs
    hbm = float(hardware.hbm_bytes_per_second)
    memory_f, memory_b = kernels.elementwise_efficiencies(tables, moved / EAGER_SOFTMAX_KERNELS,
                                                          stated=(eff["memory"], eff["memory_backward"]))
    return forward / peak + moved / (hbm * memory_f), backward / peak + moved / (hbm * memory_b)


def _elementwise_elements(model: ModelWork, k: Mapping[str, np.ndarray], cols: Mapping[str, Any], tp, sp):
    """``(N, K)`` elementwise elements a token on one TP rank: eager's, or fused (:func:`_fused_rows`) each
    pointwise chain once (the KindWork's compiled figures: reads and writes once a chain)."""
    tp_split = np.where(sp, tp, 1.0)
    eager = k["elementwise_elements_per_token"] / tp + k["replicated_elements_per_token"] / tp_split
    compiled = _fused_rows(model, cols)
    if not np.count_nonzero(compiled):
        return eager
    _stated(model, k, _LOW_PRECISION_WORK[3:5], compiled,
            "a runtime fusing its pointwise ops" if model.fused_pointwise else "compile=true")
    fused = k["compiled_elementwise_elements_per_token"] / tp + k["compiled_replicated_elements_per_token"] / tp_split
    return np.where(compiled, fused, eager)


def async_tp_refusal(hardware: Hardware, tp: int) -> str:
    """Why ``async_tp`` cannot run a TP group of *tp* devices on *hardware*: one beyond an NVLink domain."""
    domain = int(hardware.nvlink_domain_devices)
    return (f"async_tp=true with tp={tp}: torch's symmetric memory reaches peers within one NVLink domain "
            f"({domain} devices on hardware {hardware.name!r}); use tp <= {domain} or async_tp=false")


def _async_tp_arrays(model: ModelWork) -> Mapping[str, np.ndarray]:
    """The GEMMs async TP fuses with SP's collectives, made once a ModelWork: ``fused`` ``(4, K, G)`` masks (the
    attention's all-gather consumers and reduce-scatter producers, then the MLP's, :data:`ASYNC_TP_GROUPS`),
    each GEMM's weight elements ``(K, G)`` and the GEMMs each all-gather feeds ``(2, K)`` (counted)."""
    k = _kind_arrays(model)
    h = float(model.hidden_size)
    column = k["gemm_split"] == GEMM_SPLITS.index("column")
    row = k["gemm_split"] == GEMM_SPLITS.index("row")
    masks = []
    for c in (GEMM_CLASSES.index("attention"), GEMM_CLASSES.index("other")):
        member = k["gemm_weight"][..., c] > 0
        masks += [member & column & (k["gemm_in"] == h), member & row & (k["gemm_out"] == h)]
    weights, counts = np.zeros(k["gemm_in"].shape), np.zeros(k["gemm_in"].shape)
    for i, kind in enumerate(model.kinds):  # once a ModelWork, over its kinds' handful of shapes
        for j, g in enumerate(model.work[kind].gemms):
            weights[i, j], counts[i, j] = float(g.count * g.in_features * g.out_features), float(g.count)
    fused = np.stack(masks)
    out = {"fused": fused, "weights": weights, "consumers": (fused[0::2] * counts).sum(axis=-1)}
    for array in out.values():
        array.setflags(write=False)
    return frozen_mapping(out)


# The SMs DeepEP's normal (high-throughput) kernels take: deepseek-ai/DeepEP deep_ep/buffer.py ``Buffer.num_sms``,
# Megatron-LM's ``moe_deepep_num_sms`` (megatron/core/transformer/transformer_config.py); arXiv:2412.19437 section
# 3.2.2 (its dispatch and combine kernels on 20 SMs saturate IB and NVLink).
DEEPEP_SMS = 20

# async TP's four forward collectives, in _async_tp_arrays' order: what each fuses with
ASYNC_TP_GROUPS = ("all_gather", "reduce_scatter", "all_gather", "reduce_scatter")


def _async_tp(model: ModelWork, rows: _Rows, cols, hardware: Hardware, eff, coll, hidden_msg, link, on):
    """Under ``async_tp`` (rows *on*), a layer's TP collectives and their exposed seconds, ``(N, K)`` each:
    ``comm_fwd``, ``exposed_fwd``, ``comm_bwd``, ``exposed_bwd``, as torch's micro-pipelined TP runs them.

    torch.compile's pass (torch/_inductor/fx_passes/micro_pipeline_tp.py) fuses an all-gather with the matmuls
    taking its result as their left operand, and a reduce-scatter with the one matmul producing its input; the
    fused ops (torch/distributed/_symmetric_memory/__init__.py) cut the ``M`` rows into ``tp`` pieces:
    ``_pipelined_all_gather_and_consume`` copies the local shard into the symmetric buffer (a barrier; not
    overlapped, its comment says), multiplies it while the next shard is pulled from its peer, and pulls each
    remote shard while the previous one is multiplied; ``_pipelined_produce_and_all2all`` multiplies each
    peer's chunk, which the peer pulls while the next is multiplied, the local chunk last, then sums the ``tp``
    partials. Both alternate two streams so that one piece's matmul runs beside the next's (their comments:
    "computation/computation overlapping ... reducing quantization inefficiency"): a piece's ``M / tp`` rows
    run at the efficiency of a GEMM of two pieces' rows. With ``c`` one piece's matmuls (no faster than
    reading their weights) and ``x`` one shard's pull, the op takes ``c + (tp - 1) max(c, x)`` plus the local
    copy (``2`` shard bytes through HBM at ``efficiency.memory``) or the sum (``(1 + 1 / tp)`` hidden bytes);
    what it takes beyond the same matmuls unfused is exposed, its ``tp - 1`` pulls and the copy or sum its
    communication. Fused: the column-split GEMMs reading the hidden width (QKV, gate and up)
    with SP's all-gathers, the row-split GEMMs writing it (output and down projections) with its
    reduce-scatters, forward and recomputed forward alike; in the backward the output gradient's all-gather
    with those row GEMMs' input gradient, and the input gradient's reduce-scatter only where one GEMM
    consumed the all-gather (several GEMMs' gradients are summed before it: no producing matmul). A
    collective without such GEMMs, or one not fused, is NCCL's, exposed. A pull is a copy engine's
    ``copy_`` from the peer's buffer over NVLink at the within-node link's bytes per second times
    ``efficiency.collective_within_node`` (no ring steps, no protocol factor). Left out: the barriers' latency,
    the copy of the local shard into the gathered output (overlapped with the last piece), the copies' HBM
    traffic slowing the matmuls.
    """
    k, a = _kind_arrays(model), _async_tp_arrays(model)
    across = on & (rows.tp > int(hardware.nvlink_domain_devices))
    if np.count_nonzero(across):
        raise InvalidValue(async_tp_refusal(hardware, int(rows.tp[across][0])))
    tp, tokens = rows.tp[:, None, None], rows.tokens[:, None, None]
    piece_rows = tokens * np.minimum(2.0, tp) / tp  # the rows of the two pieces sharing the SMs
    split = k["gemm_split"][None]
    n = k["gemm_out"] / np.where(split == GEMM_SPLITS.index("column"), tp, 1.0)
    kk = k["gemm_in"] / np.where(split == GEMM_SPLITS.index("row"), tp, 1.0)
    m_whole, m_piece, n, kk = np.broadcast_arrays(np.maximum(1.0, tokens), np.maximum(1.0, piece_rows), n, kk)
    inverse = {name: np.empty(m_whole.shape) for name in ("fwd", "fwd_piece", "bwd", "bwd_piece")}
    tables = _kernel_tables(hardware)
    codes = np.asarray(cols["compute_dtype"], dtype=np.int64)
    for code in np.unique(codes).tolist():  # a loop over the compute dtypes a batch uses
        at = codes == code

        def efficiency(mm, nn, kd, key, at=at, dtype=DTYPE_NAMES[code]):
            return kernels.gemm_efficiency(hardware, tables, dtype, mm[at], nn[at], kd[at], stated=eff[key])
        inverse["fwd"][at] = 1.0 / efficiency(m_whole, n, kk, "matmul")
        inverse["fwd_piece"][at] = 1.0 / efficiency(m_piece, n, kk, "matmul")
        inverse["bwd"][at] = 1.0 / efficiency(m_whole, kk, n, "matmul_backward")  # the input gradient's
        inverse["bwd_piece"][at] = 1.0 / efficiency(m_piece, kk, n, "matmul_backward")
    # a GEMM's FLOPs a token: its share of its class's (the estimator's totals), as layer_seconds prices them
    class_flops = np.stack([k["attention_mm_flops_per_token"], k["other_mm_flops_per_token"],
                            k["routed_mm_flops_per_token"]], axis=-1)
    flops = np.einsum("kgc,kc->kg", k["gemm_weight"], class_flops)[None] * tokens / tp   # (N, K, G) a rank's
    split_tokens = rows.tokens[:, None] / rows.tp[:, None]
    dense = (k["attention_mm_flops_per_token"] + k["other_mm_flops_per_token"]) * split_tokens
    fp8_mm = _float8_linears(model, k, rows, cols, split_tokens)[0]
    peak = rows.peak_flops[:, None]
    fp8_share = np.divide(fp8_mm, dense, out=np.zeros_like(fp8_mm), where=fp8_mm > 0)
    per_flop = 1.0 / peak + (fp8_share * (_fp8_seconds_per_flop(hardware, eff) - 1.0 / peak) if fp8_mm.any()
                             else 0.0)
    hbm = float(hardware.hbm_bytes_per_second) * eff["memory"]
    weight_seconds = a["weights"][None] / tp * rows.param_bytes[:, None, None] / hbm     # (N, K, G) one read

    def seconds(mask, inv, pieces):  # (N, K) the masked GEMMs: whole (pieces 1) or one of tp pieces
        run = np.einsum("nkg,kg->nk", flops * inv, mask) / pieces * per_flop
        return np.maximum(run, np.einsum("nkg,kg->nk", weight_seconds, mask))

    bw, lat, _ = link
    p = rows.tp[:, None]
    shard = (hidden_msg / rows.tp)[:, None]
    pull = shard / bw[:, None] + lat[:, None]
    fixed = {"all_gather": 2.0 * shard / hbm, "reduce_scatter": (hidden_msg[:, None] + shard) / hbm}
    nccl = {name: np.broadcast_to(coll[name](hidden_msg, rows.tp, bw, lat, **link[2])[:, None], p.shape)
            for name in ("all_gather", "reduce_scatter")}

    def fused(name, mask, inv, inv_piece):  # (comm, exposed) of one collective; NCCL's where nothing fuses
        piece, whole = seconds(mask, inv_piece, p), seconds(mask, inv, 1.0)
        total = piece + (p - 1.0) * np.maximum(piece, pull) + fixed[name]
        has = mask.any(axis=-1)[None]
        comm = np.where(has, (p - 1.0) * pull + fixed[name], nccl[name])
        return comm, np.where(has, np.maximum(0.0, total - whole), nccl[name])

    out = {key: np.zeros((len(rows.tp), len(model.kinds))) for key in ("comm_fwd", "exposed_fwd", "comm_bwd",
                                                                        "exposed_bwd")}
    for g, name in enumerate(ASYNC_TP_GROUPS):  # four collectives a layer
        comm, exposed = fused(name, a["fused"][g], inverse["fwd"], inverse["fwd_piece"])
        out["comm_fwd"] += comm
        out["exposed_fwd"] += exposed
        if name == "reduce_scatter":  # its backward: the output gradient's all-gather before the input gradient
            comm, exposed = fused("all_gather", a["fused"][g], inverse["bwd"], inverse["bwd_piece"])
        else:  # the input gradient's reduce-scatter: fused where one GEMM's gradient feeds it
            single = a["fused"][g] & (a["consumers"][g // 2] == 1.0)[:, None]
            comm, exposed = fused("reduce_scatter", single, inverse["bwd"], inverse["bwd_piece"])
        out["comm_bwd"] += comm
        out["exposed_bwd"] += exposed
    return {key: np.where((rows.tp > 1)[:, None], value, 0.0) for key, value in out.items()}


def _layer_communication(model: ModelWork, rows: _Rows, cols, layer, overlaps_ep: np.ndarray, hardware: Hardware,
                         eff, coll) -> Dict[str, np.ndarray]:
    """Each kind's per-layer collectives a micro-batch, ``(N, K)`` seconds: all of them and the exposed ones.

    TP: two sync points a layer each pass (all-reduce, or all-gather and
    reduce-scatter under SP: the same volume; under ``async_tp`` the collective
    matmuls of :func:`_async_tp`). CP ring: torch's ring attention's K/V
    all-gather and, in the backward, its fp32 K/V gradients passed on each step
    (:func:`_ring_communication`). Ulysses: all-to-alls of queries, keys,
    values and the output, the backward's the same bytes transposed. EP:
    dispatch and combine all-to-alls. ``*_extra``: what recomputing a layer's
    forward repeats: its forward collectives under full recompute; under
    selective, those of TP and EP its policy does not keep
    (``ModelWork.selective_rerun_collectives``: torchtitan's keeps SP's
    reduce-scatters and reruns its all-gathers, the all-reduces and the
    all-to-alls; a kept attention kernel keeps CP's exchanges out of the rerun).
    """
    if len(rows.tp) != 1:
        return _layer_communication_rows(model, rows, cols, layer, overlaps_ep, hardware, eff, coll)
    # one row: kept as layer_seconds' figures (*layer*, made from the columns of _LAYER_READ), with the columns
    # the collectives read besides, the schedule's overlap, the collectives and DEEPEP_SMS; async TP's float8 rows
    # read the sharding (:func:`_async_tp`)
    lowp = np.asarray(cols["float8"])[0] != FLOAT8_RECIPES.index("none") or bool(np.asarray(cols["async_tp"])[0])
    return _kept_one_row("communication_one_row", model, hardware, eff, cols,
                         _COMMUNICATION_READ + _FLOAT8_READ if lowp else _COMMUNICATION_READ,
                         (bool(overlaps_ep[0]), DEEPEP_SMS, *coll.items()),
                         lambda: _layer_communication_rows(model, rows, cols, layer, overlaps_ep, hardware, eff, coll))


_COMMUNICATION_READ = _LAYER_READ + ("async_tp", "ep_dispatcher")


def _layer_communication_rows(model: ModelWork, rows: _Rows, cols, layer, overlaps_ep: np.ndarray,
                              hardware: Hardware, eff, coll) -> Dict[str, np.ndarray]:
    n, h, width = len(rows.tp), float(model.hidden_size), rows.compute_bytes
    tp, ep, etp, tokens = rows.tp, rows.ep, rows.etp, rows.tokens
    k = _kind_arrays(model)
    # TP's and CP's collectives read fewer columns than the layer's: one row's kept by those (async TP's rows by
    # every column the layer's communication reads, as _layer_communication keeps it)
    one_row_async = n == 1 and bool(np.asarray(cols["async_tp"])[0])
    tp_part = _kept_where_one_row("tp_communication_one_row", model, hardware, eff, cols,
                                  _COMMUNICATION_READ + _FLOAT8_READ if one_row_async else _TP_READ,
                                  lambda: _tp_communication(model, rows, cols, hardware, eff, coll),
                                  tuple(coll.items()))
    tp_fwd, tp_bwd, tp_exposed_fwd, tp_exposed_bwd, rerun, exposed_rerun = (tp_part[key] for key in (
        "fwd", "bwd", "exposed_fwd", "exposed_bwd", "rerun", "exposed_rerun"))
    # the CP collectives' overlap reads the layer's attention figures: those of _ATTENTION_READ's columns
    cp_part = _kept_where_one_row("cp_communication_one_row", model, hardware, eff, cols, _ATTENTION_READ,
                                  lambda: _cp_communication(model, rows, cols, layer, hardware, eff, coll),
                                  tuple(coll.items()))
    cp_fwd, cp_bwd, cp_fwd_exposed, cp_bwd_exposed = (cp_part[key] for key in ("fwd", "bwd", "exposed_fwd",
                                                                                "exposed_bwd"))
    expert_parallel = np.count_nonzero((ep > 1) | (etp > 1))
    if expert_parallel:
        # Megatron-LM's alltoall dispatcher (megatron/core/transformer/moe/token_dispatcher.py): each rank's
        # routed copies of its tokens go to their experts' EP ranks (all-to-all, the EP group strided by etp),
        # then are all-gathered over the expert-TP group (gather_from_sequence_parallel_region) and, back,
        # reduce-scattered over it before the combine's all-to-all; each pass runs the pair again (their
        # gradients)
        copies = (tokens / tp * h * width * rows.imbalance)[:, None] * k["experts_per_token"][None, :]
        bw_ep, lat_ep, link_ep = group_link(hardware, etp, ep, eff, ring=False)
        ep_pass = 2.0 * coll["all_to_all"](copies, ep[:, None], bw_ep[:, None], lat_ep[:, None],  # dispatch, combine
                                           **{key: value[:, None] for key, value in link_ep.items()})
        if np.count_nonzero(etp > 1):
            bw_etp, lat_etp, link_etp = group_link(hardware, np.ones(n), etp, eff)
            etp_link = {key: value[:, None] for key, value in link_etp.items()}
            gather = coll["all_gather"](copies, etp[:, None], bw_etp[:, None], lat_etp[:, None], **etp_link)
            scatter = (gather if coll["reduce_scatter"] is coll["all_gather"]
                       else coll["reduce_scatter"](copies, etp[:, None], bw_etp[:, None], lat_etp[:, None], **etp_link))
            ep_pass = ep_pass + np.where((etp > 1)[:, None], gather + scatter, 0.0)
        token_bytes = (tokens * etp / tp * h * width * rows.imbalance)[:, None]  # a copy of each token, as DeepEP sends
        deepep = (np.asarray(cols["ep_dispatcher"]) == EP_DISPATCHERS.index("deepep")) & (ep > 1)
        sm_share = np.zeros((n, 1))  # the SMs the dispatch kernels hold while they run beside the layer's compute
        if np.count_nonzero(deepep):
            ep_pass = np.where(deepep[:, None], _deepep_pass(model, rows, hardware, eff, coll, token_bytes, k), ep_pass)
            if hardware.sm_count:
                sm_share = np.where(deepep, DEEPEP_SMS / float(hardware.sm_count), 0.0)[:, None]
    exposed_fwd, exposed_bwd = tp_exposed_fwd + cp_fwd_exposed, tp_exposed_bwd + cp_bwd_exposed
    comm_fwd, comm_bwd = tp_fwd + cp_fwd, tp_bwd + cp_bwd
    # each group's exposed seconds a pass (forward, backward) and what its recompute reruns: the totals' parts
    groups = {"tp": [tp_exposed_fwd, tp_exposed_bwd, exposed_rerun], "cp": [cp_fwd_exposed, cp_bwd_exposed, 0.0],
              "ep": [0.0, 0.0, 0.0]}
    if expert_parallel:  # (without, the all-to-alls are 0 s: nothing to add)
        overlapped = overlaps_ep[:, None]
        if np.count_nonzero(overlapped):
            # the compute beside a pass of c seconds runs on the SMs its kernels leave (a share s of them held):
            # both done max(c, t + s c) after they start, t the compute alone, so max(s c, c - t) is exposed
            slowed = ep_pass * sm_share
            ep_exposed_fwd = np.where(overlapped, np.maximum(slowed, ep_pass - layer["forward"]), ep_pass)
            ep_exposed_bwd = np.where(overlapped, np.maximum(slowed, ep_pass - layer["backward"]), ep_pass)
        else:
            ep_exposed_fwd = ep_exposed_bwd = ep_pass
        exposed_fwd, exposed_bwd = exposed_fwd + ep_exposed_fwd, exposed_bwd + ep_exposed_bwd
        comm_fwd, comm_bwd = comm_fwd + ep_pass, comm_bwd + ep_pass
        groups["ep"][:2] = ep_exposed_fwd, ep_exposed_bwd
        if "all_to_all" in model.selective_rerun_collectives:  # the dispatch and combine run again too
            rerun, exposed_rerun = rerun + ep_pass, exposed_rerun + ep_exposed_fwd
            groups["ep"][2] = ep_exposed_fwd
    mode = np.asarray(cols["recompute"])[:, None]
    full = mode == RECOMPUTE.index("full")
    selective = mode == RECOMPUTE.index("selective")
    shape = exposed_fwd.shape
    recomputes = bool(np.count_nonzero(full) or np.count_nonzero(selective))
    if recomputes:
        comm_extra = np.where(full, comm_fwd, np.where(selective, rerun, 0.0))
        exposed_extra = np.where(full, exposed_fwd, np.where(selective, exposed_rerun, 0.0))
    else:
        comm_extra = exposed_extra = np.zeros(shape)
    out = {"comm_fwd": comm_fwd, "comm_bwd": comm_bwd, "exposed_fwd": exposed_fwd, "exposed_bwd": exposed_bwd,
           "comm_extra": comm_extra, "exposed_extra": exposed_extra}
    for group, (fwd, bwd, rerun_exposed) in groups.items():  # (N, K) each, as the totals
        out[f"exposed_{group}"] = np.broadcast_to(np.add(fwd, bwd), shape)
        out[f"exposed_{group}_extra"] = np.broadcast_to(np.where(full, fwd, np.where(selective, rerun_exposed, 0.0))
                                                        if recomputes else 0.0, shape)
    return out


# every column _tp_communication reads without async TP (through _Rows)
_TP_READ = ("tp", "micro_batch", "seq", "cp", "compute_dtype", "sp", "async_tp")


def _tp_communication(model: ModelWork, rows: _Rows, cols, hardware: Hardware, eff, coll) -> Dict[str, np.ndarray]:
    """A layer's TP collectives a micro-batch (:func:`_layer_communication`), all of them and the exposed ones of
    each pass (``fwd``, ``bwd``, ``exposed_fwd``, ``exposed_bwd``): ``(N, 1)``, or ``(N, K)`` under ``async_tp``;
    ``rerun`` and ``exposed_rerun``, those of the forward's a selective recompute runs again
    (``ModelWork.selective_rerun_collectives``)."""
    n, h = len(rows.tp), float(model.hidden_size)
    tp = rows.tp
    hidden_msg = rows.tokens * h * rows.compute_bytes                  # a TP rank's activations of a layer
    bw_tp, lat_tp, link_tp = group_link(hardware, np.ones(n), tp, eff)
    sp_rows = np.count_nonzero(rows.sp)  # priced only where a row runs it: SP's pair, or the all-reduce
    zero = np.zeros(n)
    gather = scatter = reduce = zero
    if sp_rows:
        gather = coll["all_gather"](hidden_msg, tp, bw_tp, lat_tp, **link_tp)
        scatter = (gather if coll["reduce_scatter"] is coll["all_gather"]  # one function: the same figure
                   else coll["reduce_scatter"](hidden_msg, tp, bw_tp, lat_tp, **link_tp))
        if sp_rows < n:
            gather, scatter = np.where(rows.sp, gather, 0.0), np.where(rows.sp, scatter, 0.0)
    if sp_rows < n:
        reduce = coll["all_reduce"](hidden_msg, tp, bw_tp, lat_tp, **link_tp)
        if sp_rows:
            reduce = np.where(rows.sp, 0.0, reduce)
    # each pass's two: the attention's and the MLP's
    by_collective = {"all_gather": 2.0 * gather, "reduce_scatter": 2.0 * scatter, "all_reduce": 2.0 * reduce}
    tp_pass = by_collective["all_gather"] + by_collective["reduce_scatter"] + by_collective["all_reduce"]
    # what recompute=selective runs again: the forward's collectives its policy does not keep
    rerun = sum((by_collective[name] for name in model.selective_rerun_collectives if name in by_collective), zero)
    # (N, 1): broadcast over the kinds by the sums below
    tp_fwd = tp_bwd = tp_exposed_fwd = tp_exposed_bwd = tp_pass[:, None]
    async_tp = np.asarray(cols["async_tp"], dtype=bool)
    if np.count_nonzero(async_tp):  # the collective matmuls of torch's micro-pipelined TP
        fused = _async_tp(model, rows, cols, hardware, eff, coll, hidden_msg, (bw_tp, lat_tp, link_tp), async_tp)
        on = async_tp[:, None]
        tp_fwd, tp_bwd = np.where(on, fused["comm_fwd"], tp_fwd), np.where(on, fused["comm_bwd"], tp_bwd)
        tp_exposed_fwd = np.where(on, fused["exposed_fwd"], tp_exposed_fwd)
        tp_exposed_bwd = np.where(on, fused["exposed_bwd"], tp_exposed_bwd)
    # the rerun exposed as the forward's collectives are (all of them, but under async TP)
    exposed_share = np.divide(tp_exposed_fwd, tp_fwd, out=np.ones(np.shape(tp_fwd)), where=tp_fwd > 0)
    return {"fwd": tp_fwd, "bwd": tp_bwd, "exposed_fwd": tp_exposed_fwd, "exposed_bwd": tp_exposed_bwd,
            "rerun": rerun[:, None], "exposed_rerun": rerun[:, None] * exposed_share}


def _cp_communication(model: ModelWork, rows: _Rows, cols, layer, hardware: Hardware, eff,
                      coll) -> Dict[str, np.ndarray]:
    """A layer's CP collectives a micro-batch (:func:`_layer_communication`: ring CP's, :func:`_ring_communication`,
    or Ulysses' all-to-alls), all of them and the exposed ones of each pass (``fwd``, ``bwd``, ``exposed_fwd``,
    ``exposed_bwd``), ``(N, K)``, 0 on a kind without attention."""
    n, width = len(rows.tp), rows.compute_bytes
    tp, cp, tokens = rows.tp, rows.cp, rows.tokens
    k = _kind_arrays(model)
    if np.count_nonzero(cp > 1):
        bw_cp, lat_cp, link_cp = group_link(hardware, tp, cp, eff, ring=False)
        link_cp = {key: value[:, None] for key, value in link_cp.items()}
        attends = k["has_attention"][None, :]
        ulysses = (np.asarray(cols["cp_algo"]) == CP_ALGOS.index("ulysses"))[:, None]
        ulysses_rows = np.count_nonzero(ulysses)  # each algorithm priced only where a row runs it
        if ulysses_rows < n:
            ring = _ring_communication(k, rows, cols, layer, hardware, eff, coll, (bw_cp, lat_cp, link_cp))
        if ulysses_rows:
            # the projections' keys and values, before the attention function repeats them (DeepSpeed's
            # DistributedAttention exchanges its inputs; repeat_kv runs inside it)
            cp_ulysses_msg = (tokens * width / tp)[:, None] * (
                2.0 * k["query_elements_per_token"] + k["kv_elements_per_token"] / k["kv_copies"])[None, :]
            cp_ulysses = coll["all_to_all"](cp_ulysses_msg, cp[:, None], bw_cp[:, None], lat_cp[:, None], **link_cp)
        every_kind_attends = np.count_nonzero(attends) == attends.size

        def cp_seconds(key):  # (N, K) the row's algorithm's, 0 on a kind without attention
            seconds = (ring[key] if not ulysses_rows else cp_ulysses if ulysses_rows == n
                       else np.where(ulysses, cp_ulysses, ring[key]))
            return seconds if every_kind_attends else np.where(attends, seconds, 0.0)
        cp_fwd, cp_bwd = cp_seconds("forward"), cp_seconds("backward")
        cp_fwd_exposed, cp_bwd_exposed = cp_seconds("exposed_forward"), cp_seconds("exposed_backward")
    else:  # no row splits its sequence: no K/V pass nor all-to-all (each 0 s on a group of one)
        cp_fwd = cp_bwd = cp_fwd_exposed = cp_bwd_exposed = np.zeros((n, len(model.kinds)))
    return {"fwd": cp_fwd, "bwd": cp_bwd, "exposed_fwd": cp_fwd_exposed, "exposed_bwd": cp_bwd_exposed}


@functools.lru_cache(maxsize=4096)
def expected_parts_reached(experts: int, top_k: int, groups: int, allowed: int, parts: int) -> float:
    """The expected number of *parts* (equal runs of the routed experts in order: the EP ranks, or the NVLink
    domains an EP group spans) holding at least one of a token's *top_k* experts.

    The token's experts are drawn uniformly among those of *allowed* of the *groups* equal groups, the groups
    chosen uniformly (group-limited routing, ``DeepseekV3TopkRouter``; ``groups = allowed = 1``: any expert),
    as a balanced router spreads them. Exact under that assumption where parts and groups nest (one count
    divides the other); otherwise the groups' limit is dropped, which reaches more parts (an upper bound), and
    where *parts* does not divide the experts, every copy is counted (``min(parts, top_k)``).
    """
    if top_k <= 0 or parts <= 1:
        return float(min(max(parts, 0), 1)) if top_k > 0 else 0.0
    if experts % parts:
        return float(min(parts, top_k))
    per_part, per_group = experts // parts, experts // groups
    pool = allowed * per_group  # the experts a token may take
    miss = 1.0 / math.comb(pool, top_k)
    if parts % groups == 0:  # a group spans parts // groups parts (groups = 1: no limit)
        hit = allowed / groups * (1.0 - math.comb(pool - per_part, top_k) * miss)
    elif groups % parts == 0:  # a part holds groups // parts whole groups, m of them allowed (hypergeometric)
        held = groups // parts
        hit = sum(math.comb(held, m) * math.comb(groups - held, allowed - m) / math.comb(groups, allowed)
                  * (1.0 - math.comb(pool - m * per_group, top_k) * miss)
                  for m in range(0, min(held, allowed) + 1))
    else:
        hit = 1.0 - math.comb(experts - per_part, top_k) / math.comb(experts, top_k)
    return parts * hit


def _reached(model: ModelWork, parts: np.ndarray) -> np.ndarray:
    """``(N,)`` :func:`expected_parts_reached` of the model's routing, one figure a distinct *parts*."""
    values, inverse = np.unique(np.asarray(parts, dtype=np.int64), return_inverse=True)
    figures = np.array([expected_parts_reached(model.routed_experts, model.experts_per_token, model.expert_groups,
                                               model.expert_groups_per_token, v) for v in values.tolist()])
    return figures[inverse.reshape(-1)]


def _deepep_pass(model: ModelWork, rows: _Rows, hardware: Hardware, eff, coll, token_bytes: np.ndarray,
                 k: Mapping[str, np.ndarray]) -> np.ndarray:
    """``(N, K)`` seconds of a layer's dispatch and combine a micro-batch as DeepEP runs them.

    Dispatch (DeepSeek-V3, arXiv:2412.19437 section 3.2.2; deepseek-ai/DeepEP's normal kernels): a token goes
    once to each EP rank holding any of its experts; an EP group over several NVLink domains sends it once
    over the network to each other domain holding any (to the rank of the same index there), which forwards
    it on NVLink to the ranks that need it. The legs run at once, chunk by chunk, so a pass takes the slower:
    the network's all-to-all of ``D`` domains reached copies over the domains, or NVLink's of ``R`` ranks
    reached copies over a domain's EP ranks (:func:`expected_parts_reached`). Combine sends the same bytes
    back. Without the model's expert count (a third party's estimator) every copy is sent, as ``alltoall``'s.
    Where a schedule overlaps the pass with compute, the compute runs on the SMs the kernels leave
    (``DEEPEP_SMS``; :func:`_layer_communication`). Left out: its FP8 dispatch (the compute width here).
    """
    ep, etp = rows.ep.astype(np.int64), rows.etp.astype(np.int64)
    moe = k["experts_per_token"][None, :] > 0
    per_domain = np.clip(int(hardware.nvlink_domain_devices) // np.maximum(etp, 1), 1, ep)  # EP ranks a domain
    domains = -(-ep // per_domain)
    if model.routed_experts:
        reached_ranks, reached_domains = _reached(model, ep), _reached(model, domains)
    else:
        reached_ranks = reached_domains = np.minimum(ep, k["experts_per_token"].max()).astype(np.float64)
    bw, lat, link = group_link(hardware, etp, per_domain, eff, ring=False)
    seconds = coll["all_to_all"](token_bytes * reached_ranks[:, None], per_domain[:, None], bw[:, None],
                                 lat[:, None], **{key: value[:, None] for key, value in link.items()})
    across = domains > 1
    if np.count_nonzero(across):
        bw, lat, link = group_link(hardware, etp * per_domain, domains, eff, ring=False)
        network = coll["all_to_all"](token_bytes * reached_domains[:, None], domains[:, None], bw[:, None],
                                     lat[:, None], **{key: value[:, None] for key, value in link.items()})
        seconds = np.where(across[:, None], np.maximum(seconds, network), seconds)
    return 2.0 * np.where(moe, seconds, 0.0)


def _ring_communication(k: Mapping[str, np.ndarray], rows: _Rows, cols: Mapping[str, Any], layer,
                        hardware: Hardware, eff, coll, p2p) -> Dict[str, np.ndarray]:
    """``(N, K)`` seconds of ring CP's collectives a layer and micro-batch, each pass's and their exposed part, as
    torch's ring attention runs them (``_templated_ring_attention`` and its backward,
    torch/distributed/tensor/experimental/_context_parallel/_attention.py) under the strategy's ``cp_rotate``.

    ``allgather`` (torchtitan's default ``context_parallel_rotate_method``, torch's ``_AllGatherRotater``):
    forward, one all-gather of the rank's keys and values (``kv`` elements at the compute width, ``cp`` blocks
    gathered), issued before step 0's kernel and waited for before step 1's: hidden behind step 0's kernel only
    (``scores_first_forward``), the excess exposed; backward, a second all-gather behind step 0's backward kernel.
    ``p2p`` (torch's ``_AllToAllRotater``, torchtitan's ``"alltoall"``): ``permute_tensor``, an
    ``all_to_all_single`` with one peer each way (a send and a receive), of one block, issued before each of the
    first ``cp - 1`` steps' kernels and waited for before the next step's: each hidden behind its own step's
    kernel (step 0's, then a later step's: ``(scores - scores_first) / (cp - 1)``), the excess exposed per step.
    In the backward, under either, the key and value gradients, accumulated in fp32 (``convert_to_f32``), are
    passed to the next rank after every one of the ``cp`` steps (the ``dkv_rotater`` is always
    ``_AllToAllRotater``), each waited for after the next step's kernel, so hidden behind one later step's backward
    kernel, and the last, waited for right after the loop, exposed. Under ``p2p`` a later step's K/V send is
    issued after the previous step's gradient send on the same process group (one NCCL stream, so one after the
    other): the two share that step's kernel.

    Megatron-LM's ``--cp-comm-type p2p`` (Transformer Engine's ``AttnFuncWithCPAndKVP2P``,
    transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py) is priced as ``p2p``: its
    forward the same sends in the same order; its backward sends the gradients at the compute width, in one
    message with the next K/V block, and none after the loop, so this bounds its backward's exposure above. Left
    out: the step's merges and accumulations the sends also overlap (so the exposure is an upper bound), the
    all-gathers and sends sharing the links with FSDP's and TP's collectives.
    """
    cp, width, tp = rows.cp[:, None], rows.compute_bytes[:, None], rows.tp[:, None]
    kv = (rows.tokens[:, None] / tp) * k["kv_elements_per_token"][None, :]
    bw_p, lat_p, link_p = p2p
    dkv = coll["send_recv"](4.0 * kv, 2.0, bw_p[:, None], lat_p[:, None], **link_p)
    later = np.maximum(cp - 1.0, 1.0)
    later_backward = (layer["scores_backward"] - layer["scores_first_backward"]) / later  # one later step's kernel
    on = cp > 1
    rotating = (np.asarray(cols["cp_rotate"]) == CP_ROTATES.index("p2p"))[:, None]
    gathering = ~rotating
    out = {}
    if np.count_nonzero(gathering):
        bw_g, lat_g, link_g = group_link(hardware, rows.tp, rows.cp, eff)
        gather = coll["all_gather"](cp * kv * width, cp, bw_g[:, None], lat_g[:, None],
                                    **{key: value[:, None] for key, value in link_g.items()})
        out = {"forward": gather, "backward": gather + cp * dkv,
               "exposed_forward": np.maximum(0.0, gather - layer["scores_first_forward"]),
               "exposed_backward": np.maximum(0.0, gather - layer["scores_first_backward"])
               + (cp - 1.0) * np.maximum(0.0, dkv - later_backward) + dkv}
    if np.count_nonzero(rotating):
        send = coll["send_recv"](kv * width, 2.0, bw_p[:, None], lat_p[:, None], **link_p)
        later_forward = (layer["scores_forward"] - layer["scores_first_forward"]) / later
        middle = np.maximum(cp - 2.0, 0.0)  # the later steps that send a K/V block: all but the last
        passed = {"forward": (cp - 1.0) * send, "backward": (cp - 1.0) * send + cp * dkv,
                  "exposed_forward": np.maximum(0.0, send - layer["scores_first_forward"])
                  + middle * np.maximum(0.0, send - later_forward),
                  "exposed_backward": np.maximum(0.0, send - layer["scores_first_backward"])
                  + middle * np.maximum(0.0, dkv + send - later_backward)
                  + np.maximum(0.0, dkv - later_backward) + dkv}
        out = passed if not out else {key: np.where(rotating, passed[key], value) for key, value in out.items()}
    if np.count_nonzero(on) == len(on):  # every row rings
        return out
    return {key: np.where(on, value, 0.0) for key, value in out.items()}


# every column _embedding_and_head reads (through _Rows): a one-row key missing one would hand a strategy another's
_ENDS_READ = ("tp", "micro_batch", "seq", "cp", "compute_dtype", "param_dtype", "vocab_parallel", "loss_engine")


def _embedding_and_head(model: ModelWork, rows: _Rows, cols: Mapping[str, Any], hardware: Hardware,
                        eff) -> Dict[str, np.ndarray]:
    """``(N,)`` seconds of the embedding and of the head and loss, forward and backward, a micro-batch.

    The head, as the memory model counts it, is split over TP only when
    vocabulary-parallel (otherwise every TP rank runs the whole head and
    loss). The loss moves the census's output-layer bytes, else the logits
    cast to fp32, log-softmax read and written, the gather and the final norm;
    under ``loss_engine=compiled`` Inductor's kernels read the 16-bit logits
    twice forward (the max, then the exponentials' sum) and once backward,
    writing their gradient: ``2 w`` a logit each pass.
    """
    hbm, h, vocab = float(hardware.hbm_bytes_per_second), float(model.hidden_size), float(model.vocab_size)
    width, peak, tokens = rows.compute_bytes, rows.peak_flops, rows.tokens
    vocab_parallel = np.count_nonzero(rows.vocab_parallel)
    head_split = (rows.tp if vocab_parallel == len(rows.tp) else np.ones(len(rows.tp)) if not vocab_parallel
                  else np.where(rows.vocab_parallel, rows.tp, 1.0))
    head_flops = model.head_flops_per_token * tokens / head_split * (1 + len(model.mtp_kinds))
    head_weights = rows.param_bytes * (model.head_parameters or model.embedding_parameters) / head_split
    head_fwd = np.maximum(head_flops / (peak * eff["matmul"]), head_weights / (hbm * eff["memory"]))
    head_bwd = np.maximum(2 * head_flops / (peak * eff["matmul_backward"]), 2 * head_weights / (hbm * eff["memory"]))
    if model.loss_bytes_per_token is not None:
        loss_per_token = model.loss_bytes_per_token / head_split
    else:
        loss_per_token = vocab / head_split * (width + 16.0) + NORM_ELEMENTS * h * 2.0
    compiled = np.asarray(cols["loss_engine"]) == _COMPILED_LOSS
    if np.count_nonzero(compiled):
        loss_per_token = np.where(compiled, vocab / head_split * 2.0 * width + NORM_ELEMENTS * h * 2.0,
                                  loss_per_token)
    loss_bytes = tokens * loss_per_token * (1 + len(model.mtp_kinds))
    embedding_bytes = 2.0 * tokens * h * width
    return {"head_fwd": head_fwd + loss_bytes / (hbm * eff["memory"]),
            "head_bwd": head_bwd + loss_bytes / (hbm * eff["memory_backward"]),
            "embed_fwd": embedding_bytes / (hbm * eff["memory"]),
            "embed_bwd": embedding_bytes / (hbm * eff["memory_backward"]), "head_split": head_split}


def _rank_parameters(model: ModelWork, rows: _Rows, counts, where: placement_rules.RankPlacement, head_split):
    """``(N, R)`` parameters on each rank: dense (split by TP, norms replicated, embedding, head) and routed."""
    k = _kind_arrays(model)
    split, replicated, routed = np.einsum("srk,mk->msr", counts, k["parameters_by_part"])  # each rank's layers'
    dense = split / rows.tp[:, None]
    dense = dense + replicated
    dense = dense + where.has_embedding * (model.embedding_parameters / head_split)[:, None]
    dense = dense + where.has_head * ((model.head_parameters / head_split) + model.final_norm_parameters)[:, None]
    return dense, routed / (rows.ep * rows.etp)[:, None]


def _fp8_gathered(cols, shard: sharding_rules.Sharding) -> np.ndarray:
    """``(N,)`` whether FSDP2 gathers the Float8 linears' weights (a kind's TP-split parameters) in fp8, one byte
    an element (``float8_all_gather``)."""
    return np.asarray(cols["float8_all_gather"], dtype=bool) & shard.fsdp


def _data_parallel(rows: _Rows, shard: sharding_rules.Sharding, dense_params, routed_params, hardware: Hardware,
                   eff, coll) -> Dict[str, np.ndarray]:
    """``(N, R)`` seconds of the step's data-parallel collectives (a micro-batch's FSDP / ZeRO-3 gathers and
    reduce-scatters are :func:`_fsdp`'s).

    Under FSDP or ZeRO-3 (parameters sharded) the reduce-scattered gradient
    shards are all-reduced over the shard group's replicas (HSDP's dp; the cp
    ranks under ``shard_mesh=dp``; :mod:`ndcost.compose.sharding`). Otherwise
    once a step the gradients are all-reduced, or under ZeRO 1/2
    reduce-scattered over the shard group (the shards all-reduced over its
    replicas) and the updated parameters all-gathered; routed experts over
    their expert-data-parallel group.
    """
    gathers = shard.sharded["parameters"]
    distributed_optimizer = ~gathers & shard.sharded["optimizer_states"]
    plain = ~gathers & ~distributed_optimizer
    group, replicas, experts = shard.dense_ways, shard.replicas, shard.expert_replicas
    n = len(gathers)
    # the rows of each mode (a partition): a mode no row runs is skipped, a mode every row runs needs no picks
    g_rows, z_rows = np.count_nonzero(gathers), np.count_nonzero(distributed_optimizer)
    plain_rows = n - g_rows - z_rows
    grad_bytes, egrad_bytes = dense_params * rows.grad_bytes[:, None], routed_params * rows.grad_bytes[:, None]

    def run(name, needed, message, size, stride):  # the group's link found only where some row needs it
        if not (_some_peer(needed, size) and np.count_nonzero(message)):
            return np.zeros(np.shape(message))
        return _run_rows(coll[name], needed, message, size, group_link(hardware, stride, size, eff))

    g = gathers[:, None]
    z = distributed_optimizer[:, None]
    shard_sum = run("all_reduce", ~plain, grad_bytes / group[:, None], shard.shard_replicas, shard.replica_stride)
    scatter, escatter = (run("reduce_scatter", distributed_optimizer, grad_bytes, group, shard.shard_stride),
                         run("reduce_scatter", distributed_optimizer, egrad_bytes, experts, rows.etp * rows.ep))
    if g_rows == n:
        dense_grad_step, expert_grad_step = shard_sum, np.zeros(shard_sum.shape)
    elif z_rows == n:
        dense_grad_step, expert_grad_step = scatter + shard_sum, escatter
    else:
        dense_plain = run("all_reduce", plain, grad_bytes, replicas, rows.tp)
        expert_plain = run("all_reduce", plain, egrad_bytes, experts, rows.etp * rows.ep)
        if plain_rows == n:
            dense_grad_step, expert_grad_step = dense_plain, expert_plain
        else:
            dense_grad_step = np.where(g, shard_sum, np.where(z, scatter + shard_sum, dense_plain))
            expert_grad_step = np.where(g, 0.0, np.where(z, escatter, expert_plain))
    if not z_rows:
        param_step = np.zeros(dense_grad_step.shape)
    else:
        if _scatter_is_gather(coll, rows):  # the same bytes through the same function
            gather, egather = scatter, escatter
        else:
            param_bytes = rows.param_bytes[:, None]
            gather, egather = (run("all_gather", distributed_optimizer, dense_params * param_bytes, group,
                                   shard.shard_stride),
                               run("all_gather", distributed_optimizer, routed_params * param_bytes, experts,
                                   rows.etp * rows.ep))
        param_step = gather + egather if z_rows == n else np.where(z, gather + egather, 0.0)
    return {"grad_step": dense_grad_step + expert_grad_step, "param_step": param_step}


def _some_peer(needed: np.ndarray, size: np.ndarray) -> bool:
    """Whether some row *needed* has a group of more than one member (*size*): a collective over a group of one,
    or of no bytes, is 0 s (NCCL returns at once), so a batch with neither skips it (as CP's and the experts')
    without finding its link."""
    return bool(np.count_nonzero(needed & (size > 1)))


def _run_rows(seconds, needed, message, size, link) -> np.ndarray:
    """``(N, M)`` the collective *seconds* of ``(N, M)`` messages over each row's group (*size*, *link*:
    :func:`group_link`'s, ``(N,)`` each), priced on the rows *needed* only, 0 on the others."""
    bandwidth, latency, keywords = link
    count = np.count_nonzero(needed)
    if count == needed.size:
        return seconds(message, size[:, None], bandwidth[:, None], latency[:, None],
                       **{key: value[:, None] for key, value in keywords.items()})
    out = np.zeros(np.shape(message))
    if not count:
        return out
    picked = np.flatnonzero(needed)
    out[picked] = seconds(message[picked], size[picked, None], bandwidth[picked, None], latency[picked, None],
                          **{key: value[picked, None] for key, value in keywords.items()})
    return out


def _scatter_is_gather(coll, rows: _Rows) -> bool:
    """Whether a reduce-scatter of the gradients costs what the all-gather of the parameters does: one function
    registered for both (NCCL's ring, the built-in) and gradients as wide as parameters in every row."""
    return coll["reduce_scatter"] is coll["all_gather"] and _equal(rows.param_bytes, rows.grad_bytes)


def _equal(a: np.ndarray, b: np.ndarray) -> bool:
    """``np.array_equal`` of two ``(N,)`` arrays, without its wrapper's work (it weighs on a batch of one)."""
    return np.count_nonzero(a == b) == len(a)


def _fsdp(model: ModelWork, rows: _Rows, shard: sharding_rules.Sharding, counts, where: placement_rules.RankPlacement,
          rank, hardware: Hardware, eff, coll, fp8_gather: np.ndarray, copies_out: np.ndarray,
          live: Optional[np.ndarray] = None) -> Dict[str, np.ndarray]:
    """``(N, R)`` seconds a micro-batch of FSDP / ZeRO-3's per-layer gathers and reduce-scatters, all of them and
    the exposed ones, as FSDP2 schedules them (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py`` and
    ``_fsdp_state.py``; torchtitan's ``apply_fsdp`` wraps each block, the root holding embedding, norm and head).

    One layer's gather is prefetched while the layer before it runs: in the forward the root's gather (embedding,
    head, final norm) and the first layer's are exposed, layer ``i``'s gather hides behind layer ``i - 1``'s
    forward only up to that layer's compute; in the backward layer ``i``'s gather (none under
    ``reshard_after_forward=false``) and layer ``i + 2``'s reduce-scatter run behind layer ``i + 1``'s backward,
    the last layer's gather and the first's reduce-scatter, and the root's (the root is not resharded after
    forward, ``fully_shard``'s docstring), exposed. Layers of a kind are alike, so a rank's sum is its counts
    times each kind's per-layer excess; a neighbour of another kind is taken as of the layer's own kind, and the
    first and last layers' terms as the rank's layer-weighted mean (exact on a rank of one kind). Left out: the
    gathers and scatters sharing links with TP/EP traffic, and torchtitan's unresharded last block.
    Parameters are gathered at the compute width, as the memory model holds them (FSDP2's
    ``MixedPrecisionPolicy.param_dtype`` casts the shard before the all-gather); under *fp8_gather*
    (``float8_all_gather``, ``(N,)``) a kind's Float8 linears (its TP-split parameters) at one byte.

    On the rows *copies_out* ``(N,)`` marks (``fsdp_engine`` torch's: FSDP2), each gather's copy-out
    (``foreach_all_gather_copy_out``, ``_fsdp_collectives.py``: ``split_with_sizes_copy`` of the gathered bytes
    into the parameters' unsharded storage, one kernel a group) runs on the compute stream once the all-gather is
    done, serial with the layers' compute: ``copies_f`` and ``copies_b`` ``(N, R)`` a micro-batch,
    ``step_copies`` a step, its bytes read and written at HBM. ZeRO-3's and Megatron-FSDP's parameters are views
    of the gathered buffer (DeepSpeed's ``partition_parameters.py``; Megatron-FSDP's ``ParamAndGradBuffer``): no
    copy. The copy-in before the all-gather and the reduce-scatter's run on FSDP's own streams, behind the
    compute (left out).

    Under ``gradient_sync=last_micro_batch`` (``shard.defers_reduce``; ``torch/distributed/pipelining/stage.py``:
    every micro-batch's backward runs with ``set_requires_gradient_sync(False)`` and
    ``set_reshard_after_backward(False)``, then each parameter group's ``post_backward`` once) nothing is
    reduce-scattered a micro-batch: ``step_comm`` / ``step_exposed`` ``(N, R)`` hold the step's one
    reduce-scatter of the stage's layers and root, exposed whole (``_root_post_backward_final_callback`` makes
    the compute stream wait for it, ``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``; the other ranks'
    drain in 1F1B would hide some of theirs, not credited), and the root's gather; under
    ``reshard_after_forward=false`` the layers too are gathered once a step, in the first micro-batch's forward
    (its prefetch as above), else each micro-batch's forward and backward gather them as without PP (a forward
    right after a backward finds its layers still gathered: an upper bound). Under DeepSpeed ZeRO-3's *live*
    parameters (``live_parameters_elements``, ``(N,)``) the backward gathers again the share of each layer's
    gather past what the prefetcher kept (its messages priced as the whole layer's, scaled).
    """
    gathers = shard.sharded["parameters"]
    n, ranks, kinds = counts.shape
    if not np.count_nonzero(gathers):
        zeros = np.zeros((n, ranks))
        return {"gathers": zeros, "scatters": zeros, "exposed_f": zeros, "exposed_b": zeros, "step_comm": zeros,
                "step_exposed": zeros, "copies_f": zeros, "copies_b": zeros, "step_copies": zeros}
    k = _kind_arrays(model)
    link_sh = group_link(hardware, shard.shard_stride, shard.dense_ways, eff)
    # else no expert gathers (0 s: no bytes, or every expert group of one)
    routed_experts = np.count_nonzero(k["routed_parameters"]) and _some_peer(gathers, shard.expert_replicas)
    link_edp = group_link(hardware, rows.etp * rows.ep, shard.expert_replicas, eff) if routed_experts else None

    def run(name, elements, width, size, link):  # one collective of *elements* a row and kind, where FSDP runs
        return _run_rows(coll[name], gathers, elements * width[:, None], size, link)

    def run_shard_group(name, layer_elements, root_elements, width):
        # the layers' (N, K) and the root's (N, R) collectives over the shard group, in one call (a collective
        # prices each message of its array on its own)
        both = run(name, np.concatenate([layer_elements, root_elements], axis=1), width, shard.dense_ways, link_sh)
        return both[:, :kinds], both[:, kinds:]

    whole = k["whole_parameters"][None, :]  # every TP rank's (tp_whole_parameters)
    linears = (k["dense_parameters"][None, :] - whole) / rows.tp[:, None] + whole
    dense = linears + k["replicated_parameters"][None, :]                            # (N, K)
    routed = k["routed_parameters"][None, :] / (rows.ep * rows.etp)[:, None]         # (N, K)
    width = rows.compute_bytes
    head = where.has_head * (model.head_parameters / rank["head_split"] + model.final_norm_parameters)[:, None]
    root = where.has_embedding * (model.embedding_parameters / rank["head_split"])[:, None] + head
    # in elements at the compute width: the linears gathered in fp8 count 1 / width of theirs
    fp8_rows = np.count_nonzero(fp8_gather)
    gathered = dense - np.where(fp8_gather[:, None], linears * (1.0 - 1.0 / width[:, None]), 0.0) if fp8_rows \
        else dense
    layer_gather, root_gather = run_shard_group("all_gather", gathered, root, width)
    gather = layer_gather + run("all_gather", routed, width, shard.expert_replicas, link_edp) if routed_experts \
        else layer_gather
    same = _scatter_is_gather(coll, rows) and not fp8_rows and _equal(width, rows.grad_bytes)
    if same:
        scatter, root_scatter = gather, root_gather
    else:
        layer_scatter, root_scatter = run_shard_group("reduce_scatter", dense, root, rows.grad_bytes)
        scatter = layer_scatter + run("reduce_scatter", routed, rows.grad_bytes, shard.expert_replicas, link_edp) \
            if routed_experts else layer_scatter
    # the backward gathers again unless reshard_after_forward=false (a batch without it: the forward's figures)
    gather_b = np.where(shard.keeps_gathered[:, None], 0.0, gather) if np.count_nonzero(shard.keeps_gathered) \
        else gather
    layers = np.add.reduce(counts, axis=2)                                           # (N, R)
    placed = np.count_nonzero(layers > 0) == layers.size  # every rank holds a layer: no guard against none

    def total(per_layer):                                                            # (N, K) or (N, R, K) -> (N, R)
        return np.einsum("srk,sk->sr" if per_layer.ndim == 2 else "srk,srk->sr", counts, per_layer)

    if live is not None and np.count_nonzero(live):
        # DeepSpeed ZeRO-3's prefetcher keeps what it gathers up to live_parameters_elements (the memory model's
        # rule, _communication_buffers), the head and final norm first (the forward's last): the backward gathers
        # again the layers' elements past the rest of the bound, each layer's gather taken as that share of its
        # own (DeepSpeed 0.19.8 counted on the CPU: tests/test_deepspeed_zero.py)
        layer_elements = total(dense + routed)                                       # (N, R)
        again = np.clip((layer_elements + head - live[:, None]) / np.maximum(layer_elements, 1.0), 0.0, 1.0)
        gather_b = np.where((live > 0)[:, None, None], gather_b[:, None, :] * again[:, :, None],
                            gather_b[:, None, :])                                    # (N, R, K)

    def mean(summed):                                                                # a total's rank layer mean
        return summed / layers if placed else np.divide(summed, layers, out=np.zeros(layers.shape), where=layers > 0)

    def where_layers(values):                                                        # 0 on a rank without layers
        return values if placed else np.where(layers > 0, values, 0.0)

    # each figure's per-layer total once (the backward's gathers and the scatters are the forward's gathers
    # where they are the same array)
    total_g = total(gather)
    total_gb = total_g if gather_b is gather else total(gather_b)
    total_rs = total_g if scatter is gather else total(scatter)
    forward, backward = rank["layer_forward"], rank["layer_backward"]                # (N, R, K) each
    g, gb, rs = gather[:, None, :], gather_b if gather_b.ndim == 3 else gather_b[:, None, :], scatter[:, None, :]
    mean_g = mean(total_g)
    mean_gb = mean_g if total_gb is total_g else mean(total_gb)
    mean_rs = mean_g if total_rs is total_g else mean(total_rs)
    total_excess_f = total(np.maximum(0.0, g - forward))
    layers_f = where_layers(mean_g + total_excess_f - mean(total_excess_f))  # a forward's layer gathers
    exposed_f = layers_f + root_gather
    both = np.maximum(0.0, gb + rs - backward)
    total_excess_gb = total(np.maximum(0.0, gb - backward))
    mean_excess_gb = mean(total_excess_gb)
    mean_excess_rs = mean_excess_gb if scatter is gather_b else mean(total(np.maximum(0.0, rs - backward)))
    total_both = total(both)
    many = (mean_gb + mean_rs + total_both - 2.0 * mean(total_both) + mean_excess_gb + mean_excess_rs)
    if np.count_nonzero(layers > 1) == layers.size:
        exposed_b = many + root_scatter
    else:
        exposed_b = np.where(layers > 1, many, where_layers(mean_gb + mean_rs)) + root_scatter
    g_rows, rg = gathers[:, None], shard.keeps_gathered[:, None]
    gathers_f_b = total_g + total_gb + root_gather
    scatters = total_rs + root_scatter
    # the copy-outs: a rank's layers' gathered bytes (and the root's) read and written, each layer one kernel
    layer_bytes = gathered * width[:, None] + (routed * width[:, None] if routed_experts else 0.0)    # (N, K)
    copied = 2.0 * total(layer_bytes)                                                 # (N, R)
    copied_root = 2.0 * root * width[:, None]
    hbm = float(hardware.hbm_bytes_per_second)
    copy_efficiency = kernels.elementwise_efficiency(_kernel_tables(hardware), mean(copied), stated=eff["memory"])
    copy_layers, copy_root = copied / (hbm * copy_efficiency), copied_root / (hbm * eff["memory"])
    if np.count_nonzero(copies_out) < n:
        copy_layers, copy_root = (np.where(copies_out[:, None], x, 0.0) for x in (copy_layers, copy_root))
    copies_f, copies_b = copy_layers + copy_root, np.where(rg, 0.0, copy_layers)
    step_copies = np.zeros((n, ranks))
    step_comm = step_exposed = np.zeros((n, ranks))
    if np.count_nonzero(shard.defers_reduce):
        # gradient_sync=last_micro_batch: the root and, under keeps_gathered, the layers gathered once a step
        # (the first micro-batch's forward); one reduce-scatter of the stage, exposed whole
        d = shard.defers_reduce[:, None]
        once = d & rg
        gathers_b = where_layers(mean_gb + total_excess_gb - mean_excess_gb)
        step_comm = np.where(d, scatters + root_gather + np.where(rg, total_g, 0.0), 0.0)
        step_exposed = np.where(d, scatters + root_gather + np.where(rg, layers_f, 0.0), 0.0)
        exposed_f = np.where(once, 0.0, np.where(d, layers_f, exposed_f))
        exposed_b = np.where(d, gathers_b, exposed_b)
        gathers_f_b = np.where(once, 0.0, np.where(d, 2.0 * total_g, gathers_f_b))
        scatters = np.where(d, 0.0, scatters)
        step_copies = np.where(d, copy_root + np.where(rg, copy_layers, 0.0), 0.0)
        copies_f = np.where(once, 0.0, np.where(d, copy_layers, copies_f))
    out = {"gathers": gathers_f_b, "scatters": scatters, "exposed_f": exposed_f, "exposed_b": exposed_b,
           "step_comm": step_comm, "step_exposed": step_exposed, "copies_f": copies_f, "copies_b": copies_b,
           "step_copies": step_copies}
    if np.count_nonzero(gathers) == n:  # every row gathers: the figures as they are
        return out
    return {key: np.where(g_rows, value, 0.0) for key, value in out.items()}


def _pipeline(model: ModelWork, rows: _Rows, cols, schedules, stage, hardware: Hardware, eff, coll):
    """The pipeline's sends and the schedule's bubble.

    A send carries a micro-batch's activations (split by tp under SP);
    ``2 vpp`` a rank a micro-batch, ``2 (p * v - 1)`` exposed on the fill and
    drain path. The bubble is the schedule's idle stage steps
    (``schedule/<name>.bubble_stage_steps``) at the mean stage time of the
    ranks other than the busiest.
    """
    pp, vpp, n = rows.pp, rows.vpp, len(rows.pp)
    staged = pp > 1
    staged_rows = np.count_nonzero(staged)
    if not staged_rows:  # no pipeline: one rank, no sends, no bubble
        zeros = np.zeros(n)
        return {"send": zeros, "pp_comm": zeros, "pp_exposed": zeros, "busiest": np.zeros(n, dtype=np.intp),
                "bubble": np.zeros(n)}

    def on_stages(seconds):  # 0 on the rows without a pipeline
        return seconds if staged_rows == n else np.where(staged, seconds, 0.0)
    message = rows.tokens * float(model.hidden_size) * rows.compute_bytes / np.where(rows.sp, rows.tp, 1.0)
    bw_pp, lat_pp, link_pp = group_link(hardware, rows.tp * rows.cp * rows.dp * rows.fsdp, pp, eff, ring=False)
    send = on_stages(coll["send_recv"](message, pp, bw_pp, lat_pp, nodes=link_pp["nodes"]))
    busiest = np.argmax(stage, axis=1)
    idle = np.add.reduce(stage, axis=1) - stage[np.arange(n), busiest]
    steps = np.zeros(n)
    codes = np.asarray(cols["schedule"])
    found = distinct(codes)[0].tolist()
    if len(found) == 1:  # one schedule (one strategy's): every row, no picks
        steps[:] = schedules[found[0]].bubble_stage_steps(pp, vpp, rows.micro_batches)
    else:
        for code in found:  # a loop over the schedules a batch uses
            mask = codes == code
            steps[mask] = schedules[code].bubble_stage_steps(pp[mask], vpp[mask], rows.micro_batches[mask])
    return {"send": send, "pp_comm": 2.0 * vpp * send, "pp_exposed": on_stages(2.0 * (pp * vpp - 1.0) * send),
            "busiest": busiest, "bubble": on_stages(steps * idle / np.maximum(pp - 1.0, 1.0))}


def _optimizer_seconds(rows: _Rows, shard: sharding_rules.Sharding, dense_params, routed_params, states,
                       real_rank: Optional[np.ndarray], hardware: Hardware, eff) -> np.ndarray:
    """``(N,)`` the optimizer step on the busiest rank: the bytes it reads and writes against HBM bandwidth.

    Parameters (read, written), gradients, master weights and optimizer
    states (read, written) of the rank's shard (:mod:`ndcost.compose.sharding`).
    """
    local = _local_elements(dense_params, routed_params, shard, "optimizer_states")
    per_param = 2 * rows.param_bytes + rows.grad_bytes + 2 * rows.master_bytes + 2 * states * rows.optimizer_bytes
    hbm = float(hardware.hbm_bytes_per_second)
    return _most_on_real_ranks(local * per_param[:, None] / (hbm * eff["memory"]), real_rank)


def _local_elements(dense_params, routed_params, shard: sharding_rules.Sharding, category: str) -> np.ndarray:
    """``(N, R)`` elements of each rank's shard of *category*: its dense and routed parameters over their ways
    (a model without routed experts: the dense alone)."""
    local = dense_params / shard.ways(category)[:, None]
    if np.count_nonzero(routed_params):
        local = local + routed_params / shard.expert_ways(category)[:, None]
    return local


def _most_on_real_ranks(values: np.ndarray, real_rank: Optional[np.ndarray]) -> np.ndarray:
    """``(N,)`` the most of ``(N, R)`` *values* on each row's real ranks (those past its pp count 0); without the
    picks where every rank is real (*real_rank* None: a group of one pp) or the reduction over one rank."""
    if real_rank is not None:
        values = np.where(real_rank, values, 0.0)
    return values[:, 0] if values.shape[1] == 1 else np.maximum.reduce(values, axis=1)


def _offload_seconds(rows: _Rows, cols, shard: sharding_rules.Sharding, dense_params, routed_params, rank,
                     offloaded_activations, real_rank, hardware: Hardware) -> Dict[str, np.ndarray]:
    """Offloading's seconds on each rank ``(N, R)``: a micro-batch's exposed copies (``exposed_f``, ``exposed_b``)
    and all of them (``copies``), the step's copies out and in; and the CPU step on the busiest rank ``(N,)``.

    Each direction of the host link runs at ``host_to_device_bytes_per_second`` and hides behind the pass's
    compute (:data:`OVERLAP_RULES`). A micro-batch: ``offload_activations`` copies its saved activations out
    in the forward and in for the backward (*offloaded_activations*, the memory model's bytes);
    ``offload_params`` copies the parameter shard in for the forward's gathers and again for the
    backward's under ``reshard_after_forward``, and the gradient shard out. The step, ``offload_optimizer``:
    without ``offload_params`` the optimizer shard's gradients out (hidden behind the last backward) and
    its updated parameters in (exposed), and the CPU step, the node's ``cpu_optimizer_parameters_per_second``
    shared by its devices (exposed; it replaces the device's optimizer seconds). Left out: pinned staging,
    the host links' sharing of PCIe switches and host memory bandwidth, the copies' latency.
    """
    n, ranks = dense_params.shape
    zeros = np.zeros((n, ranks))
    flags = {name: np.asarray(cols[name], dtype=bool) for name in ("offload_optimizer", "offload_params",
                                                                    "offload_activations")}
    if not any(np.count_nonzero(flag) for flag in flags.values()):
        return {"exposed_f": zeros, "exposed_b": zeros, "copies": zeros, "step_out": zeros, "step_in": zeros,
                "cpu_step": np.zeros(n)}
    link = hardware.host_to_device_bytes_per_second
    if link is None:
        raise Unpriced(f"hardware {hardware.name!r} states no host_to_device_bytes_per_second, which prices "
                       f"offloading's copies; add it to its hardware file")
    if np.count_nonzero(flags["offload_activations"]) and offloaded_activations is None:
        raise Unpriced("offload_activations: the time model copies the memory model's activation bytes; price "
                       "the strategies with CostModel.evaluate_many")

    def local(category):  # (N, R) elements of the rank's shard of *category*
        return _local_elements(dense_params, routed_params, shard, category)

    def seconds(elements, width, flag):
        return np.where(flag[:, None], elements * width[:, None] / link, 0.0)

    activations = (np.zeros((n, ranks)) if offloaded_activations is None
                   else np.where(flags["offload_activations"][:, None], offloaded_activations / link, 0.0))
    params_in = seconds(local("parameters"), rows.param_bytes, flags["offload_params"])
    params_again = np.where(shard.keeps_gathered[:, None], 0.0, params_in)  # the backward's gather copies again
    grads_out = seconds(local("gradients"), rows.grad_bytes, flags["offload_params"])
    # each direction its own: out then in over a forward, in then out over a backward
    exposed_f = np.maximum(0.0, np.maximum(params_in, activations) - rank["compute_f"])
    exposed_b = np.maximum(0.0, np.maximum(activations + params_again, grads_out) - rank["compute_b"])
    optimizer = flags["offload_optimizer"] & ~flags["offload_params"]
    shard_elements = local("optimizer_states")
    step_out = seconds(shard_elements, rows.grad_bytes, optimizer)
    step_in = seconds(shard_elements, rows.param_bytes, optimizer)
    devices = rows.dp * rows.fsdp * rows.cp * rows.tp * rows.pp
    sharing = np.minimum(devices, float(hardware.devices_per_node))  # devices whose steps a node's CPUs run
    cpu = np.where(flags["offload_optimizer"][:, None], shard_elements * sharing[:, None]
                   / float(hardware.cpu_optimizer_parameters_per_second), 0.0)
    return {"exposed_f": exposed_f, "exposed_b": exposed_b,
            "copies": 2.0 * activations + params_in + params_again + grads_out, "step_out": step_out,
            "step_in": step_in, "cpu_step": _most_on_real_ranks(cpu, real_rank)}


def _check_splits(model: ModelWork, cols) -> None:
    """Refuse a ``pp_layers`` that does not sum to the model's layers (the resolver's own check)."""
    bounds = cols.get("pp_bounds")
    if bounds is None:
        return
    totals = bounds.max(axis=1)
    bad = (bounds[:, 0] >= 0) & (totals != model.num_layers)
    if bad.any():
        i = int(np.argmax(bad))
        split = np.diff(bounds[i][bounds[i] >= 0])
        raise InvalidValue(f"pp_layers {'/'.join(map(str, split.tolist()))} sums to {totals[i]} but "
                           f"{model.name!r} has {model.num_layers} layers")


_LAYER_GROUPS = ("tp", "cp", "ep")  # the groups whose collectives run inside the layers


def _rank_compute(model: ModelWork, rows: _Rows, cols, where: placement_rules.RankPlacement, counts, schedules,
                  hardware: Hardware, eff, coll) -> Dict[str, np.ndarray]:
    """``(N, R)`` seconds a micro-batch on each rank: compute forward and backward, layer collectives, exposed ones.

    ``recompute_layers`` recomputes that share of a rank's layers (``vpp``
    chunks of them), the rest keeping their activations: only that share
    pays the recompute and the checkpointed forward's host work.
    """
    overlaps_ep = np.array([bool(s.overlaps_expert_communication) for s in schedules],
                           dtype=bool)[np.asarray(cols["schedule"])]
    layer = layer_seconds(model, cols, hardware, eff, rows)
    comm = _layer_communication(model, rows, cols, layer, overlaps_ep, hardware, eff, coll)
    ends = (_embedding_and_head(model, rows, cols, hardware, eff) if len(rows.tp) != 1 else  # one row: kept
            _kept_one_row("ends_one_row", model, hardware, eff, cols, _ENDS_READ, (),
                          lambda: _embedding_and_head(model, rows, cols, hardware, eff)))
    layers_on_rank = np.add.reduce(counts, axis=2)
    rl = np.asarray(cols["recompute_layers"], dtype=np.float64)[:, None]
    partial = np.count_nonzero(rl >= 0)  # rows recomputing some of their layers (else all: a share of 1)
    fraction = np.where(rl < 0, 1.0, np.minimum(1.0, np.divide(rl * rows.vpp[:, None], layers_on_rank,
                                                                 out=np.ones(layers_on_rank.shape),
                                                                 where=layers_on_rank > 0))) \
        if partial else np.ones(layers_on_rank.shape)

    def share(per_rank):  # the recomputed layers' share of a rank's figure
        return fraction * per_rank if partial else per_rank
    is_first, is_head = where.has_embedding, where.has_head
    # each (N, K) figure summed over each rank's layers, (N, R), in one contraction (the figures stacked by
    # np.array: np.stack's result where their shapes agree, as np.stack requires, without its Python wrapper)
    # the groups whose collectives some row's layers expose; where one alone does, its figure is the total's
    present = [g for g in _LAYER_GROUPS
               if np.count_nonzero(comm[f"exposed_{g}"]) or np.count_nonzero(comm[f"exposed_{g}_extra"])]
    apart = present if len(present) > 1 else []
    (forward, checkpointed, backward, recompute, comm_layers, comm_extra, exposed_f, exposed_b,
     exposed_extra, *by_group) = np.einsum("srk,msk->msr", counts, np.array([
         layer["forward"], layer["checkpointed_forward"] - layer["forward"], layer["backward"], layer["recompute"],
         comm["comm_fwd"] + comm["comm_bwd"], comm["comm_extra"], comm["exposed_fwd"], comm["exposed_bwd"],
         comm["exposed_extra"]] + [comm[f"exposed_{g}{part}"] for g in apart for part in ("", "_extra")]))
    exposed_b = exposed_b + share(exposed_extra)
    # each layer group's exposed seconds, forward and backward (exposed_f plus exposed_b over the groups)
    groups = {f"exposed_{g}": np.zeros(exposed_f.shape) for g in _LAYER_GROUPS}
    groups.update({f"exposed_{g}": by_group[2 * i] + share(by_group[2 * i + 1]) for i, g in enumerate(apart)})
    if len(present) == 1:
        groups[f"exposed_{present[0]}"] = exposed_f + exposed_b
    return {
        **groups,
        "compute_f": forward + share(checkpointed) + is_first * ends["embed_fwd"][:, None]
        + is_head * ends["head_fwd"][:, None],
        "compute_b": (backward + share(recompute)
                      + is_first * ends["embed_bwd"][:, None] + is_head * ends["head_bwd"][:, None]),
        "comm_layers": comm_layers + share(comm_extra),
        "exposed_f": exposed_f,
        "exposed_b": exposed_b,
        "head_split": ends["head_split"],
        # one layer of each kind a micro-batch as it runs, (N, R, K): the forward with a checkpoint's host work and
        # the backward with the recompute, on the rank's recomputed share; FSDP's prefetch hides behind them
        "layer_forward": layer["forward"][:, None, :]
        + fraction[:, :, None] * (layer["checkpointed_forward"] - layer["forward"])[:, None, :],
        "layer_backward": layer["backward"][:, None, :] + fraction[:, :, None] * layer["recompute"][:, None, :],
    }


def _chunked(model: ModelWork, cols, hardware: Hardware, schedules, states_per_parameter) -> TimeArrays:
    """:func:`step_time` over ``CHUNK_ROWS`` rows at a time (the per-rank arrays are rows x ranks x kinds)."""
    n = len(cols["tp"])
    parts = [step_time(model, {k: None if v is None else v[i:i + CHUNK_ROWS] for k, v in cols.items()},
                       hardware, schedules=schedules, states_per_parameter=states_per_parameter)
             for i in range(0, n, CHUNK_ROWS)]
    return TimeArrays(**{name: np.concatenate([getattr(p, name) for p in parts]) for name in TIME_FIELDS},
                      provenance=parts[0].provenance,
                      detail={k: np.concatenate([p.detail[k] for p in parts]) for k in parts[0].detail
                              if np.ndim(parts[0].detail[k]) == 1})


def step_time(model: ModelWork, strategies: Any, hardware: Hardware, *, schedules: Optional[Sequence[Any]] = None,
              states_per_parameter: Optional[np.ndarray] = None,
              placed: Optional[placement_rules.RankPlacement] = None,
              offloaded_activations: Optional[np.ndarray] = None) -> TimeArrays:
    """Price a batch of strategies: one entry a strategy in each returned array.

    *strategies* is compose's columns (with *schedules* and
    *states_per_parameter* by code, as the resolver passes them), or, without
    *schedules*, Strategy values or a mapping of field -> values, converted by
    :func:`strategy_columns` and priced with the registry's plugins. *placed*
    is the batch's placement where the caller made it already (the resolver
    hands over the memory composition's); else it is made here.
    *offloaded_activations* ``(N, R)`` is the memory model's bytes a
    micro-batch's activations copy each way under ``offload_activations``.
    """
    if schedules is None:
        names = registry_names()
        cols = strategy_columns(strategies, names)
        _check_splits(model, cols)
        plugins = columns.code_plugins(manager.registry(), names)
        schedules, states_per_parameter = plugins.schedules, plugins.states_per_parameter
    else:
        cols = strategies
    n = len(cols["tp"])
    if n > CHUNK_ROWS and placed is None:
        return _chunked(model, cols, hardware, schedules, states_per_parameter)
    eff, eff_sources = _derived("efficiencies", hardware, efficiencies)
    coll = _collectives()
    rows, shard = _rows(cols, hardware), sharding_rules.sharding(cols)
    where = placed if placed is not None else placement_rules.RankPlacement.of(placement_rules.place(
        placement_rules.LayerStack.from_runs(model.kinds, model.layer_runs), cols, schedules,
        mtp_counts=mtp_counts(model), pp_bounds=cols.get("pp_bounds")))
    counts = where.layers.astype(np.float64)                           # (N, R, K)
    ranks_real = np.arange(counts.shape[1])[None, :] < rows.pp[:, None]
    # None where every rank is real (a group of one pp): no picks
    real_rank = None if np.count_nonzero(ranks_real) == ranks_real.size else ranks_real
    rank = _rank_compute(model, rows, cols, where, counts, schedules, hardware, eff, coll)
    dense_params, routed_params = _rank_parameters(model, rows, counts, where, rank["head_split"])
    dp = _data_parallel(rows, shard, dense_params, routed_params, hardware, eff, coll)
    # FSDP2 copies each gather out into the parameters; ZeRO-3's and Megatron-FSDP's are views of the buffer
    copies_out = (np.asarray(cols["zero"]) != 3) & (np.asarray(cols["fsdp_engine"]) != _MEGATRON_FSDP)
    fsdp = _fsdp(model, rows, shard, counts, where, rank, hardware, eff, coll, _fp8_gathered(cols, shard),
                 copies_out, np.asarray(cols["live_parameters_elements"], dtype=np.float64))
    fsdp_exposed_f, fsdp_exposed_b = fsdp["exposed_f"], fsdp["exposed_b"]
    # FSDP's per-layer collectives and offloading's copies are 0 s on rows without them: added only where some has
    fsdp_rows = np.count_nonzero(shard.sharded["parameters"])
    offloading = any(np.count_nonzero(np.asarray(cols[name], dtype=bool))
                     for name in ("offload_optimizer", "offload_params", "offload_activations"))
    off = _offload_seconds(rows, cols, shard, dense_params, routed_params, rank, offloaded_activations, real_rank,
                           hardware) if offloading else None
    forward, backward = rank["compute_f"] + rank["exposed_f"], rank["compute_b"] + rank["exposed_b"]
    if fsdp_rows:
        forward = forward + fsdp_exposed_f + fsdp["copies_f"]
        backward = backward + fsdp_exposed_b + fsdp["copies_b"]
    if off is not None:
        forward, backward = forward + off["exposed_f"], backward + off["exposed_b"]
    stage = forward + backward
    if real_rank is not None:  # ranks past a row's pp: none
        stage = np.where(real_rank, stage, 0.0)
    pipe = _pipeline(model, rows, cols, schedules, stage, hardware, eff, coll)
    # a shard's all-reduce over its replicas follows FSDP's deferred reduce-scatter, after the backward (exposed);
    # DDP under gradient_sync=every_micro_batch, and ZeRO-2 always (DeepSpeed's stage_1_and_2.py reduces its
    # buckets every micro-step into the partitioned gradients), reduce behind each micro-batch's backward
    hidden_by = np.where(shard.defers_reduce[:, None], 0.0, backward) if np.count_nonzero(shard.defers_reduce) \
        else backward
    sync = np.asarray(cols["gradient_sync"])
    every = (sync == GRADIENT_SYNC.index("every_micro_batch")) | (np.asarray(cols["zero"]) == 2)
    reductions = np.where(every & ~shard.sharded["parameters"], rows.micro_batches, 1.0)
    grad_exposed = reductions * _most_on_real_ranks(np.maximum(0.0, dp["grad_step"] - hidden_by), real_rank)
    param_exposed = _most_on_real_ranks(np.maximum(0.0, dp["param_step"] - forward), real_rank)
    states = np.asarray(states_per_parameter, dtype=np.float64)[np.asarray(cols["optimizer"])]
    optimizer = _optimizer_seconds(rows, shard, dense_params, routed_params, states, real_rank, hardware, eff)
    offloads_optimizer = np.asarray(cols["offload_optimizer"], dtype=bool)
    if off is not None and np.count_nonzero(offloads_optimizer):
        optimizer = np.where(offloads_optimizer, off["cpu_step"], optimizer)
    m = rows.micro_batches
    busiest = (np.arange(n), pipe["busiest"])

    def pick(a):  # (N, R) -> (N,): the busiest rank's (the only one without a pipeline: no picks)
        return a[:, 0] if a.shape[1] == 1 else a[busiest]
    compute = m * (pick(rank["compute_f"]) + pick(rank["compute_b"]))
    if fsdp_rows:  # FSDP's copy-outs, on the compute stream
        compute = compute + m * (pick(fsdp["copies_f"]) + pick(fsdp["copies_b"])) + pick(fsdp["step_copies"])
    exposed_layers = pick(rank["exposed_f"]) + pick(rank["exposed_b"])
    comm_layers = pick(rank["comm_layers"])
    if fsdp_rows:
        exposed_layers = exposed_layers + pick(fsdp_exposed_f) + pick(fsdp_exposed_b)
        comm_layers = comm_layers + pick(fsdp["gathers"]) + pick(fsdp["scatters"])
    exposed, communication = m * exposed_layers, m * (comm_layers + pipe["pp_comm"])
    if fsdp_rows:
        exposed, communication = exposed + pick(fsdp["step_exposed"]), communication + pick(fsdp["step_comm"])
    exposed = exposed + grad_exposed + param_exposed + pipe["pp_exposed"]
    # the busiest rank's collectives; the pipeline's sends are its own, or the fill and drain path's where the step
    # waits on more of them (fewer micro-batches than stages): what it exposes it spends
    communication = (communication + reductions * pick(dp["grad_step"]) + pick(dp["param_step"])
                     + np.maximum(0.0, pipe["pp_exposed"] - m * pipe["pp_comm"]))
    by_group = {f"exposed_{g}_seconds": m * pick(rank[f"exposed_{g}"]) for g in _LAYER_GROUPS}
    by_group["exposed_fsdp_seconds"] = (m * (pick(fsdp_exposed_f) + pick(fsdp_exposed_b)) + pick(fsdp["step_exposed"])
                                        if fsdp_rows else np.zeros(n))
    by_group["exposed_dp_seconds"] = grad_exposed + param_exposed
    by_group["exposed_pp_seconds"] = pipe["pp_exposed"]
    step = compute + exposed + pipe["bubble"] + optimizer
    if off is not None:
        offload_step = _most_on_real_ranks(np.maximum(0.0, off["step_out"] - backward) + off["step_in"], real_rank)
        exposed_offload = m * (pick(off["exposed_f"]) + pick(off["exposed_b"])) + offload_step
        offload = m * pick(off["copies"]) + pick(off["step_out"] + off["step_in"])
        step = step + exposed_offload
    else:
        exposed_offload, offload = np.zeros(n), np.zeros(n)
    seconds = {"compute_seconds": compute, "exposed_communication_seconds": exposed,
               "communication_seconds": communication, "bubble_seconds": pipe["bubble"],
               "optimizer_seconds": optimizer, "offload_seconds": offload,
               "exposed_offload_seconds": exposed_offload, "step_seconds": step, **by_group}
    detail = {"stage_seconds": stage, "busiest_rank": pipe["busiest"], "forward_seconds": pick(forward),
              "backward_seconds": pick(backward), "grad_sync_seconds": pick(dp["grad_step"]),
              "pp_send_seconds": pipe["send"], "fsdp_exposed_forward_seconds": fsdp_exposed_f,
              "fsdp_exposed_backward_seconds": fsdp_exposed_b}
    kinds = _derived("kernel_kinds", model, _kernel_kinds)  # what of the model the provenance reads beyond its source
    read = (model.source, kinds, model.attention_kernel, tuple(model.attention_backends.items()),
            model.fused_pointwise, model.complex_rotary, model.float8_casts)
    provenance = _derived(("provenance", *read, tuple(coll.values())), hardware,
                          lambda hw: _provenance(model, eff, eff_sources, coll, hw))
    return _results(model, rows, seconds, detail, provenance, _float8_model_flops(model, rows, cols, hardware))


def distinct(values) -> Tuple[np.ndarray, np.ndarray]:
    """``np.unique(values, return_inverse=True)`` (the inverse flat), without its sort where every value is the
    same (a batch of one strategy, or of one sequence length)."""
    values = np.asarray(values)
    if len(values) == 1 or (len(values) and np.count_nonzero(values == values[0]) == len(values)):
        return values[:1], np.zeros(len(values), dtype=np.int64)
    found, inverse = np.unique(values, return_inverse=True)
    return found, inverse.reshape(-1)


def mtp_counts(model: ModelWork) -> np.ndarray:
    """(K,) the model's MTP layers of each kind (run with the head); read-only, made once a ModelWork."""
    return _derived("mtp_counts", model, _make_mtp_counts)


def _make_mtp_counts(model: ModelWork) -> np.ndarray:
    counts = np.bincount([model.kinds.index(kind) for kind in model.mtp_kinds], minlength=len(model.kinds))
    counts.setflags(write=False)
    return counts


def _provenance(model: ModelWork, eff, eff_sources, coll, hardware: Hardware) -> Dict[str, str]:
    return {
        "compute": f"roofline per op class; flops: {model.source}",
        "efficiency": ", ".join(f"{key}={eff[key]:g} ({eff_sources[key]})" for key in EFFICIENCY_KEYS),
        "kernels": _kernel_provenance(model, hardware),
        "communication": "collective/" + ", collective/".join(sorted(coll)),
        "overlap": "; ".join(f"{use}: {rule}" for use, rule in OVERLAP_RULES.items()),
        "hardware": f"hardware/{hardware.name}",
        "network": _network_provenance(hardware),
        "offload": _offload_provenance(hardware),
        "model": "ndcost.compose.time",
    }


def _kernel_provenance(model: ModelWork, hardware: Hardware) -> str:
    """Where the GEMM, elementwise and launch figures came from, and which kinds' matmuls have no shapes."""
    tables = _kernel_tables(hardware)
    sms = f"{hardware.sm_count} SMs" if hardware.sm_count else "no sm_count: tile quantization only"
    gemm = "GEMMs by shape: "
    if tables is not None and tables.gemm:
        gemm += f"kernel_tables ({', '.join(sorted(tables.gemm))}; {tables.source}), else "
    if tables is not None and tables.gemm_shape:
        gemm += (f"kernel_tables.gemm_shape's measured shape dependence, its best cell at efficiency.matmul "
                 f"({', '.join(sorted(tables.gemm_shape))}; {tables.gemm_shape_source}), else ")
    gemm += (f"the prior (128 x 128 tile waves over {sms}, times the roofline on intensity, "
             f"{'x'.join(map(str, kernels.REFERENCE_GEMM))} at efficiency.matmul)")
    unshaped, launches = _derived("kernel_kinds", model, _kernel_kinds)
    if unshaped:
        gemm += f"; no GEMM shapes, constant efficiency.matmul: {unshaped}"
    elementwise = ("elementwise by bytes a kernel: kernel_tables" if tables is not None and tables.elementwise
                   is not None else "elementwise: constant efficiency.memory")
    launch, dispatch, source = kernels.launch_costs(tables)
    if model.fused_pointwise:
        elementwise += ", each pointwise chain one kernel (the runtime's fused kernels: compile's fused count)"
    if model.complex_rotary:
        elementwise += ("; under compile the complex rotary unfused (Inductor runs complex operators as ATen "
                        "kernels: its casts and product apart)")
    elementwise += ("; Float8 casts as Transformer Engine's (each tensor once with its transpose, 2w + 2 bytes an "
                    "element, the weight once a step)" if model.float8_casts == "transformer_engine" else
                    "; Float8 casts as torchao's (2w + 1 bytes an element, input and weight each pass)")
    return (f"{gemm}; {_attention_provenance(model, hardware, tables)}; {elementwise}; a layer's pass >= its "
            f"launches x max(launch {launch:g} s, dispatch {dispatch:g} s) ({source}), forward launches {launches}, "
            f"backward twice the forward's; checkpoint's host work (eager) {dict(CHECKPOINT_HOST_RATIOS)} plain "
            f"forwards (forward, recompute), core_attention {CORE_ATTENTION_HOST_OPS} plain ops a layer with attention")


def _attention_provenance(model: ModelWork, hardware: Hardware, tables: Optional[kernels.KernelTables]) -> str:
    """Which kernel each kind's attention scores run at bf16 and where its efficiency comes from."""
    kinds = [k for k in model.kinds if model.work[k].has_attention]
    shaped = [k for k in kinds if model.work[k].attention_heads > 0]
    if not model.attention_kernel or not shaped:
        return "attention scores: constant efficiency.attention / attention_backward (no runtime kernel or shape)"
    parts = []
    for kind in shaped:
        work = model.work[kind]
        name = kernels.attention_kernel(model.attention_kernel, "bf16", work.attention_head_dim,
                                        work.attention_value_head_dim, _sdpa_order(model, hardware),
                                        hardware.compute_capability)
        where = ("batched matmuls at their GEMM efficiency and the softmax's bytes" if name == "eager"
                 else kernels.attention_source(tables, name, "bf16"))
        parts.append(f"{kind}: {name}, {where}")
    unshaped = sorted(set(kinds) - set(shaped))
    rest = f"; no heads, constant efficiency.attention: {', '.join(unshaped)}" if unshaped else ""
    return f"attention scores under the runtime's {model.attention_kernel} at bf16: {'; '.join(parts)}{rest}"


def _kernel_kinds(model: ModelWork) -> Tuple[str, str]:
    """The kinds without GEMM shapes, and each kind's forward launches and where they were counted."""
    def counted(work):
        if not work.launches_per_layer:
            return "not counted"
        return "census" if "census launches" in work.source else "analytic"
    return (", ".join(kind for kind in model.kinds if not model.work[kind].gemms),
            ", ".join(f"{kind}: {model.work[kind].launches_per_layer:g} ({counted(model.work[kind])})"
                      for kind in model.kinds))


def _network_provenance(hardware: Hardware) -> str:
    return (f"NVLink domain of {hardware.nvlink_domain_devices} devices, {hardware.nics_per_node} NICs a node of "
            f"{hardware.devices_per_node} (ndcost.compose.topology: hierarchical rings across domains, a node's "
            f"NICs shared by its groups); NVLS {hardware.nvls_architecture or 'none'}; the built-in collectives "
            f"are NCCL's tuning model (src/graph/tuning.cc, NVIDIA/nccl 5067397c)")


def _offload_provenance(hardware: Hardware) -> str:
    link = hardware.host_to_device_bytes_per_second
    cpu = hardware.cpu_optimizer_parameters_per_second
    default = " (ZeRO-Offload's CPU-Adam, arXiv:2101.06840 Table 3: the default)" \
        if cpu == CPU_ADAM_PARAMETERS_PER_SECOND else ""
    return (f"host link {'unstated' if link is None else f'{link:g} bytes/s'} a device and direction; CPU "
            f"optimizer {cpu:g} parameters/s a node{default}")


def _float8_model_flops(model: ModelWork, rows: _Rows, cols, hardware: Hardware) -> Optional[Tuple[np.ndarray, float]]:
    """Under ``float8``: ``(N,)`` of a sequence's training model FLOPs the Float8 linears run in fp8 (three times
    their forward's: each has a backward; twice under ``rowwise_with_gw_hp``; and of the routed experts under
    ``float8_experts``), and the fp8 peak; None where no row runs float8."""
    on = np.asarray(cols["float8"]) != FLOAT8_RECIPES.index("none")
    if not np.count_nonzero(on):
        return None
    counts = model.layer_counts()
    linears = sum(count * float(model.work[kind].float8_mm_flops_per_token or 0.0) for kind, count in counts.items())
    routed = sum(count * float(model.work[kind].routed_mm_flops_per_token) for kind, count in counts.items())
    per_token = linears + np.asarray(cols["float8_experts"], dtype=bool) * routed
    # rowwise_with_gw_hp's weight gradient (a third of the training FLOPs) is the compute dtype's, not fp8
    passes = np.where(np.asarray(cols["float8"]) == FLOAT8_RECIPES.index("rowwise_with_gw_hp"), 2.0, 3.0)
    return np.where(on, passes * per_token * rows.seq, 0.0), hardware.peak_flops("fp8")


def _model_flops_at(model: ModelWork, seq: np.ndarray) -> np.ndarray:
    """``model.training_flops_per_sequence(seq)`` of a ``(1,)`` *seq*, kept a ModelWork and sequence length."""
    kept = _derived("model_flops", model, lambda _: {})
    key = float(seq[0])
    if key not in kept:
        flops = kept[key] = np.asarray(model.training_flops_per_sequence(seq), dtype=np.float64)
        flops.setflags(write=False)
    return kept[key]


def _results(model: ModelWork, rows: _Rows, seconds: Mapping[str, np.ndarray], detail: Dict[str, Any],
             provenance: Mapping[str, str], float8: Optional[Tuple[np.ndarray, float]] = None) -> TimeArrays:
    """The step's arrays with its throughput and MFU (the model's forward and backward FLOPs, no recompute, over
    the compute dtype's peak; under ``float8`` the Float8 linears' FLOPs over the fp8 peak, so that MFU is the
    step's share of the time the model's FLOPs take at the peaks they run at)."""
    step, s = seconds["step_seconds"], rows.seq
    sequences = rows.dp * rows.fsdp * rows.micro_batches * rows.micro_batch
    # the resolver prices one sequence length a call: one evaluation
    one_seq = len(s) == 1 or (len(s) > 0 and s.min() == s.max())
    per_sequence = _model_flops_at(model, s[:1]) if one_seq else model.training_flops_per_sequence(s)
    model_flops = per_sequence * sequences
    devices = rows.dp * rows.fsdp * rows.cp * rows.tp * rows.pp
    detail["model_flops"] = model_flops
    at_peak = model_flops / rows.peak_flops
    if float8 is not None:
        fp8_flops = float8[0] * sequences
        at_peak = at_peak - fp8_flops / rows.peak_flops + fp8_flops / float8[1]
    return TimeArrays(tokens_per_second=sequences * s / step, mfu=at_peak / (step * devices),
                      provenance=provenance, detail=detail, **seconds)


# ---------------------------------------------------------------------------
# the resolver's hook
# ---------------------------------------------------------------------------
def attach(result: Any, batch: Any, hardware: Hardware, model_work: Callable[[int], ModelWork],
           plugins: columns.CodePlugins) -> Any:
    """*result* (the resolver's BatchResult) with ``time`` filled for its valid rows.

    Called by ``CostModel._attach_time`` with the batch's columns as compose
    read them (*batch*), the model's work at a sequence length (*model_work*)
    and the plugins behind the codes (*plugins*). Rows are grouped by sequence length (one :class:`ModelWork`
    each: the census's FLOPs where it measured them, else analytic) and
    pipeline depth, cut at ``CHUNK_ROWS``: one :func:`step_time` call a group.
    Invalid rows hold NaN. A batch no FLOPs source covers keeps its memory
    results and says why in the time provenance's ``unpriced``.
    """
    n = len(result.valid)
    arrays: Dict[str, np.ndarray] = {}  # made NaN where a row is not priced, unless one group prices every row
    valid = np.asarray(result.valid, dtype=bool)
    provenance: Dict[str, Any] = {}
    if np.count_nonzero(valid):
        try:
            rows = np.flatnonzero(valid)
            every = len(rows) == n  # every row valid (one strategy's): the columns as they are
            cols: Dict[str, Any] = (dict(batch.cols) if every else
                                    {k: np.asarray(v)[rows] for k, v in batch.cols.items()})
            splits = None if batch.pp_layers is None else [batch.pp_layers[i] for i in rows.tolist()]
            cols["pp_bounds"] = None if splits is None else placement_rules.split_bounds(splits)
            seqs, inverse = distinct(cols["seq"])
            works = {seq: model_work(seq) for seq in seqs.tolist()}
            # rows grouped by (sequence length, pp), each group a contiguous slice after one sort, so a
            # group's per-rank arrays are only as wide as its pp; groups cut at CHUNK_ROWS rows
            pp = cols["pp"]
            radix = int(np.maximum.reduce(pp)) + 1
            key = inverse * radix + pp
            if len(key) == 1 or (len(key) <= CHUNK_ROWS and np.count_nonzero(key == key[0]) == len(key)):
                # one group (one strategy): no sort
                order, cuts, ordered = np.arange(len(key)), [0, len(key)], cols
            else:
                order = np.argsort(key, kind="stable")
                edges = np.flatnonzero(np.diff(key[order])) + 1
                cuts = sorted(set(edges.tolist()) | set(range(0, len(order), CHUNK_ROWS)) | {len(order)})
                ordered = {k: None if v is None else v[order] for k, v in cols.items()}
            for lo, hi in zip(cuts[:-1], cuts[1:], strict=True):  # a loop over the groups, not rows
                seq = seqs[key[order[lo]] // radix].item()
                sub = ordered if hi - lo == len(order) else {k: None if v is None else v[lo:hi]
                                                             for k, v in ordered.items()}
                group, ranks = rows[order[lo:hi]], int(cols["pp"][order[lo]])
                in_order = every and ordered is cols  # one group of every row, in order: the arrays as they are
                at = slice(None) if in_order else group
                # the memory composition's placement of these rows (one pp a group: its ranks are the width)
                placed = placement_rules.RankPlacement.from_stages(
                    result.stage_kind_layers[at, :ranks], result.embedding_stage[at], result.head_stage[at],
                    mtp_counts(works[seq]))
                priced = step_time(works[seq], sub, hardware, schedules=plugins.schedules,
                                   states_per_parameter=plugins.states_per_parameter, placed=placed,
                                   offloaded_activations=result.stage_offloaded_activation_bytes[at, :ranks])
                if in_order:
                    arrays = {name: getattr(priced, name) for name in TIME_FIELDS}
                else:
                    for name in TIME_FIELDS:
                        if name not in arrays:
                            arrays[name] = np.full(n, np.nan)
                        arrays[name][group] = getattr(priced, name)
                provenance = dict(priced.provenance)
            provenance["flops"] = "; ".join(f"seq {int(seq)}: {works[seq].source}" for seq in seqs.tolist())
        except Unpriced as exc:
            provenance = {"unpriced": str(exc)}
    if "unpriced" in provenance:
        return attrs.evolve(result, time=None, provenance={**dict(result.provenance), "time": provenance})
    time: Dict[str, Any] = {name: arrays[name] if name in arrays else np.full(n, np.nan) for name in TIME_FIELDS}
    time["provenance"] = provenance
    return attrs.evolve(result, time=time, provenance={**dict(result.provenance), "time": provenance})
