"""Contracts of Ascend NPU kernels (``torch_npu``), and the fused modules a training framework installs.

A run on Ascend NPUs with a training framework's fused modules (MindSpeed,
HyperParallel) calls ``torch_npu`` kernels a host cannot: the census runs
them as custom ops whose fake implementations and autograd state what the
kernels keep for the backward.

- ``npu-fusion-attention``: ``torch_npu.npu_fusion_attention`` in the
  ``BSND`` layout Transformers' NPU integration uses. It keeps the query,
  key and value as the kernel takes them (grouped-query keys and values
  unexpanded: the kernel takes ``N2 < N1`` heads), its output, and the two
  softmax statistics ``softmax_max`` and ``softmax_sum``, each fp32
  ``[b, n, s, 8]``; where the keep probability is below 1, also the dropout
  mask it draws, one bit per query-key pair of each head (uint8, packed).
  The causal mask the kernel reads in its compressed sparse mode is one
  2048 x 2048 constant, built once per device and shared by all layers and
  micro-batches, so no layer is charged for it. It states no attention sinks
  (GPT-OSS, DeepSeek-V4): such a layer is refused.
- ``npu-rms-norm``: ``torch_npu.npu_rms_norm``, keeping its input and an
  fp32 ``rstd`` of shape ``[..., 1]`` (and its gamma, a parameter).
- ``npu-swiglu``: ``torch_npu.npu_swiglu``, keeping its input only (the
  fused gate-and-up projection's output), its output half as wide.
- ``npu-grouped-experts``: HyperParallel's grouped routed experts
  (``hyper_parallel/components/modules/grouped_experts.py``, ``GroupedExperts``,
  the module its recipes' ``plan_overrides`` put on ``*.mlp.experts``):
  ``torch_npu.npu_moe_token_permute`` keeps the tokens, their experts and the
  int32 order it sorts the routes in; HyperParallel's ``GMMFunction``
  (``components/functional/grouped_matmul.py``) around each
  ``npu_grouped_matmul`` keeps its input and the int64 group list (and the
  weight, a parameter); ``npu_swiglu`` between them keeps the gate-and-up
  output; ``npu_moe_token_unpermute`` keeps the expert outputs, the order and
  the routing weights (the savers of the permute and unpermute are
  HyperParallel's census contracts', ``auto_parallel/_npu_contracts.py``).
  Expert weights are held ``[E, in, out]``, as the module transposes
  Transformers' ``[E, out, in]``.
- ``npu-native``: torch_npu's own ATen kernels where they keep other bytes
  than the CPU's: dropout keeps a uint8 bit mask, one bit an element padded
  to whole blocks of 128 elements (``npu_dropout_gen_mask``), and
  ``native_layer_norm`` fp32 mean and rstd for bf16 input. Stated from
  torch_npu's kernels, not measured on an NPU.

Module replacements (factories for a runtime profile's ``replacements``,
called as ``factory(module, config)``, paths matched by pattern as a
training framework's plan does): :func:`fused_rms_norm` (an RMSNorm running
``npu-rms-norm``), :func:`fused_swiglu_mlp` (a gated MLP whose gate and up
projections are one matmul feeding ``npu-swiglu``),
:func:`grouped_experts` (routed experts as HyperParallel's grouped experts,
``npu-grouped-experts``) and :func:`fused_attention` (an attention module
calling the fused kernel). The
fused attention is Transformers' attention interface entry
``npu_fusion_attention``, which a profile names as its ``attention`` for
every layer, or installs on the attention modules it matches by path.

Known limitations: the kernels' workspace is not seen by the working-peak
count; a zero-centred RMSNorm (weight stored as ``w - 1``, Qwen3-Next) runs
with ``1 + w`` as gamma, a tensor of the hidden width the kernel keeps.
"""
from __future__ import annotations

import contextlib
import copy
import functools
from typing import Any, Iterator, Mapping, Optional, Tuple

from ndcost.errors import CensusUnavailable
from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import (
    AttentionKernel,
    Contract,
    FlopCount,
    FusedRmsNorm,
    FusedSwiGlu,
    OpContract,
    Site,
    attention_saved_op,
    define_fused_norm_ops,
    dropout_replaced,
    fake_only_op,
    fp32_layer_norm_statistics,
    fused_module_classes,
    register_attention_function,
    register_attention_kernels,
    register_contracts,
    register_kernel_autograd,
    swiglu_experts,
)
from ndcost.plugins.contracts import fused_rms_norm as _fused_rms_norm
from ndcost.plugins.contracts import fused_swiglu_mlp as _fused_swiglu_mlp

ATTENTION = "npu-fusion-attention"
RMS_NORM = "npu-rms-norm"
SWIGLU = "npu-swiglu"
NATIVE = "npu-native"
GROUPED_EXPERTS = "npu-grouped-experts"

# The name the fused attention takes in Transformers' attention interface (and its mask interface).
ATTENTION_IMPLEMENTATION = "npu_fusion_attention"

# softmax_max and softmax_sum keep this many fp32 values per head and query.
SOFTMAX_STAT_WIDTH = 8

CONTRACTS = (
    Contract(name=ATTENTION, device="npu",
             summary="torch_npu.npu_fusion_attention (BSND layout), Transformers' attention interface "
                     "'npu_fusion_attention'",
             implementation="ndcost.plugins.contracts.npu:attention_implementation",
             saves="q, k, v (grouped heads unexpanded), the output, softmax_max and softmax_sum fp32 "
                   "[b, n, s, 8]; a packed dropout mask (1 bit a pair) where keep_prob < 1"),
    Contract(name=RMS_NORM, device="npu",
             summary="torch_npu.npu_rms_norm, run by the fused_rms_norm replacement",
             implementation="ndcost.plugins.contracts.npu:rms_norm_implementation",
             saves="its input and fp32 rstd [..., 1]", fuses="rms_norm"),
    Contract(name=SWIGLU, device="npu",
             summary="torch_npu.npu_swiglu, run by the fused_swiglu_mlp replacement",
             implementation="ndcost.plugins.contracts.npu:swiglu_implementation",
             saves="its input (the fused gate-and-up projection's output)", fuses="silu_gated_mlp"),
    Contract(name=GROUPED_EXPERTS, device="npu",
             summary="HyperParallel's GroupedExperts: npu_moe_token_permute, npu_grouped_matmul (GMMFunction), "
                     "npu_swiglu and npu_moe_token_unpermute, run by the grouped_experts replacement",
             implementation="ndcost.plugins.contracts.npu:grouped_experts_implementation",
             saves="permute: the tokens, their experts, the int32 route order; each grouped matmul: its input "
                   "and the int64 group list; unpermute: the expert outputs, the order, the routing weights"),
    Contract(name=NATIVE, device="npu",
             summary="torch_npu's ATen kernels whose saved outputs differ from the CPU's: dropout and layer norm",
             implementation="ndcost.plugins.contracts.npu:native_implementation",
             saves="dropout keeps a uint8 bit mask (one bit an element, padded to 128 elements); "
                   "native_layer_norm keeps fp32 mean and rstd for bf16/fp16 input"),
)

# torch_npu's dropout draws its mask one bit an element, in blocks of this many elements.
DROPOUT_MASK_BLOCK = 128


def causal_pairs(queries: int, keys: int, window: Optional[int] = None) -> int:
    """Query-key pairs a causal kernel computes, aligned to the bottom right, within *window* keys if given."""
    total = 0
    offset = keys - queries
    if window is None or window <= 0:
        if offset >= 0:
            return queries * offset + queries * (queries + 1) // 2
        return sum(max(0, min(keys, i + offset + 1)) for i in range(queries))
    for i in range(queries):
        visible = max(0, min(keys, i + offset + 1))
        total += min(visible, window)
    return total


def dropout_mask_bytes_elements(elements: int) -> int:
    """Bytes of torch_npu's dropout mask over *elements*: one bit each, padded to whole 128-element blocks."""
    return -(-elements // DROPOUT_MASK_BLOCK) * DROPOUT_MASK_BLOCK // 8


def dropout_mask_bytes(batch: int, heads: int, queries: int, keys: int) -> int:
    """Bytes of the packed dropout mask: one bit per query-key pair of each head."""
    return -(-(batch * heads * queries * keys) // 8)


@functools.lru_cache(maxsize=None)
def _ops() -> Any:
    """The NPU custom ops, defined once per process (a custom op cannot be defined twice)."""
    import torch

    namespace = "ndcost_npu"

    # -- fusion attention ---------------------------------------------------
    def attention_fake(query, key, value, scale, keep_prob, pre_tokens, next_tokens):
        batch, queries, heads, _ = query.shape
        keys = key.shape[1]
        out = query.new_empty((batch, queries, heads, value.shape[-1]))
        stats = [query.new_empty((batch, heads, queries, SOFTMAX_STAT_WIDTH), dtype=torch.float32)
                 for _ in range(2)]
        mask_bytes = dropout_mask_bytes(batch, heads, queries, keys) if keep_prob < 1.0 else 0
        mask = query.new_empty((mask_bytes,), dtype=torch.uint8)
        return out, stats[0], stats[1], mask

    fusion_attention = fake_only_op(
        f"{namespace}::fusion_attention",
        "(Tensor query, Tensor key, Tensor value, float scale, float keep_prob, int pre_tokens, "
        "int next_tokens) -> (Tensor, Tensor, Tensor, Tensor)",
        attention_fake, use="on an Ascend NPU call torch_npu.npu_fusion_attention")

    def attention_grad_fake(grad, query, key, value, out, softmax_max, softmax_sum, mask, scale, keep_prob,
                            pre_tokens, next_tokens):
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)

    fusion_attention_grad = fake_only_op(
        f"{namespace}::fusion_attention_grad",
        "(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor out, Tensor softmax_max, "
        "Tensor softmax_sum, Tensor mask, float scale, float keep_prob, int pre_tokens, "
        "int next_tokens) -> (Tensor, Tensor, Tensor)",
        attention_grad_fake)

    def attention_saves(inputs, output):
        # q, k, v, the output, softmax_max and softmax_sum, and the dropout mask where it draws one
        query, key, value, scale, keep_prob = inputs[:5]
        return [query, key, value, *output[:3]] + ([output[3]] if keep_prob < 1.0 else [])

    register_kernel_autograd(
        fusion_attention, fusion_attention_grad, saves=attention_saves, options=lambda inputs: inputs[3:],
        stateless=(1, 2, 3),
        kept=lambda saved: (*saved[:6], saved[6] if len(saved) > 6
                            else saved[4].new_empty((0,), dtype=torch.uint8)))

    # -- RMSNorm and SwiGLU: torch_npu.npu_rms_norm and torch_npu.npu_swiglu ---------------
    define_fused_norm_ops(namespace, "torch_npu.npu_rms_norm or torch_npu.npu_swiglu on an Ascend NPU")

    # -- dropout ------------------------------------------------------------
    dropout = fake_only_op(
        f"{namespace}::dropout", "(Tensor x, float p) -> (Tensor, Tensor)",
        lambda x, p: (torch.empty_like(x),
                      x.new_empty((dropout_mask_bytes_elements(x.numel()),), dtype=torch.uint8)))

    def dropout_setup(ctx, inputs, output):
        _, mask = output
        ctx.mark_non_differentiable(mask)
        ctx.like = inputs[0]
        ctx.save_for_backward(mask)

    def dropout_backward(ctx, grad, _mask):
        return torch.empty_like(grad), None

    dropout.register_autograd(dropout_backward, setup_context=dropout_setup)

    # -- grouped experts ----------------------------------------------------
    def permute_fake(tokens, indices):
        routes = indices.numel()
        return tokens.new_empty((routes, tokens.shape[-1])), indices.new_empty((routes,), dtype=torch.int32)

    permute = fake_only_op(f"{namespace}::moe_token_permute", "(Tensor tokens, Tensor indices) -> (Tensor, Tensor)",
                           permute_fake, use="on an Ascend NPU call torch_npu.npu_moe_token_permute")

    def permute_setup(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(inputs[0], inputs[1], output[1])

    permute.register_autograd(lambda ctx, grad, _order: (torch.empty_like(ctx.saved_tensors[0]), None),
                              setup_context=permute_setup)

    grouped_matmul = fake_only_op(
        f"{namespace}::grouped_matmul", "(Tensor x, Tensor weight, Tensor group_list) -> Tensor",
        lambda x, weight, group_list: x.new_empty((x.shape[0], weight.shape[-1])),
        use="on an Ascend NPU call torch_npu.npu_grouped_matmul")

    def grouped_matmul_backward(ctx, grad):
        x, weight, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(weight), None

    grouped_matmul.register_autograd(
        grouped_matmul_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))

    unpermute = fake_only_op(
        f"{namespace}::moe_token_unpermute", "(Tensor permuted, Tensor order, Tensor probs) -> Tensor",
        lambda permuted, order, probs: permuted.new_empty((probs.shape[0], permuted.shape[-1])),
        use="on an Ascend NPU call torch_npu.npu_moe_token_unpermute")

    def unpermute_backward(ctx, grad):
        permuted, _, probs = ctx.saved_tensors
        return torch.empty_like(permuted), None, torch.empty_like(probs)

    unpermute.register_autograd(
        unpermute_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))

    ops = torch.ops.ndcost_npu
    return ops


def _register_attention_function() -> None:
    """Make ``npu_fusion_attention`` an attention implementation (and mask builder) Transformers accepts.

    The kernel takes causality (and a sliding window) as its sparse mode, not a dense mask.
    """
    register_attention_function(ATTENTION_IMPLEMENTATION, npu_fusion_attention_forward)


def npu_fusion_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                                 dropout: float = 0.0, scaling: Optional[float] = None,
                                 sliding_window: Optional[int] = None, **kwargs: Any) -> Tuple[Any, None]:
    """Transformers' attention interface, run by ``npu_fusion_attention`` as its NPU integration calls it.

    Takes ``[b, n, s, d]`` heads as Transformers hands them, lays them out
    ``BSND`` (a copy where they are not already in that memory order) and
    returns the ``[b, s, n, d]`` output the kernel writes.
    """
    if getattr(module, "sinks", None) is not None or kwargs.get("s_aux") is not None:
        raise CensusUnavailable(
            f"{type(module).__name__} adds learned attention sinks, which torch_npu.npu_fusion_attention "
            f"(contract {ATTENTION!r}) does not take; price this model under a runtime whose attention "
            f"states sinks (hf-cuda runs Transformers' eager attention), or from the formulas (census='off')")
    if attention_mask is not None:
        raise CensusUnavailable(
            f"{type(module).__name__} was handed a dense attention mask; contract {ATTENTION!r} states the "
            f"kernel's causal and sliding-window sparse modes only. Price it under hf-cuda, or from the formulas")
    ops = _ops()
    width = query.shape[-1]
    scale = float(scaling) if scaling is not None else width ** -0.5
    window = int(sliding_window) if sliding_window else 0
    q, k, v = (t.transpose(1, 2).contiguous() for t in (query, key, value))
    out = ops.fusion_attention(q, k, v, scale, 1.0 - float(dropout), window if window else 2 ** 31 - 1, 0)[0]
    return out, None


class _Attention(OpContract):
    """``npu-fusion-attention``: the fusion attention op and Transformers' interface entry running it."""

    name = ATTENTION
    forward, backward = "fusion_attention", "fusion_attention_grad"
    stands = ("npu.npu_fusion_attention", "npu.npu_fusion_attention_grad")
    runs_as = "scores"

    def __init__(self) -> None:
        super().__init__(_ops())
        _register_attention_function()

    def install(self, site: Site):
        _register_attention_function()
        return super().install(site)

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        if func is not self.forward_op:
            return None
        import torch
        return attention_saved_op(tensor, dropout_dtype=torch.uint8)

    def flops(self, func, args, kwargs, out) -> Optional[FlopCount]:
        if func is not self.forward_op:
            return None
        query, key, value = args[:3]
        pre_tokens = int(args[5]) if len(args) > 5 else 2 ** 31 - 1
        batch, queries, heads, width = query.shape
        keys = key.shape[1]
        per_pair = 2 * batch * heads * (width + value.shape[-1])
        window = pre_tokens if pre_tokens < 2 ** 31 - 1 else None
        return FlopCount(part="scores", flops=per_pair * causal_pairs(queries, keys, window),
                         all_pairs_flops=per_pair * queries * keys)

    def flop_formulas(self) -> Mapping[Any, Any]:
        def forward(query_shape, key_shape, value_shape, scale=None, keep_prob=1.0, pre_tokens=2 ** 31 - 1,
                    next_tokens=0, *args, out_shape=None, **kwargs):
            batch, queries, heads, width = query_shape
            window = pre_tokens if pre_tokens < 2 ** 31 - 1 else None
            return 2 * batch * heads * (width + value_shape[-1]) * causal_pairs(queries, key_shape[1], window)

        def backward(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
            batch, queries, heads, width = query_shape
            pre_tokens = args[7] if len(args) > 7 else 2 ** 31 - 1
            window = pre_tokens if pre_tokens < 2 ** 31 - 1 else None
            return (2 * batch * heads * (3 * width + 2 * value_shape[-1])
                    * causal_pairs(queries, key_shape[1], window))

        return {self.ops.fusion_attention: forward, self.ops.fusion_attention_grad: backward}


class _GroupedExperts(OpContract):
    """``npu-grouped-experts``: the ops :class:`NpuGroupedExperts` runs (npu_swiglu is ``npu-swiglu``'s).

    Neither selective policy names ``npu.npu_grouped_matmul`` (HyperParallel's
    alternates on aten's matmuls only), so both recompute the grouped matmuls.
    """

    name = GROUPED_EXPERTS
    forward = "grouped_matmul"

    def __init__(self) -> None:
        super().__init__(_ops())

    def stands_for(self) -> Mapping[Any, str]:
        return {self.forward_op: "npu.npu_grouped_matmul",
                self.ops.moe_token_permute.default: "npu.npu_moe_token_permute",
                self.ops.moe_token_unpermute.default: "npu.npu_moe_token_unpermute"}

    def matmul_flops(self, func: Any, args: Tuple[Any, ...]) -> int:
        if func is not self.forward_op:
            return 0
        x, weight = args[:2]
        return 2 * x.shape[0] * x.shape[1] * weight.shape[-1]  # each routed row through its expert's weight


@functools.lru_cache(maxsize=None)
def attention_implementation() -> _Attention:
    return _Attention()


@functools.lru_cache(maxsize=None)
def rms_norm_implementation() -> FusedRmsNorm:
    """``npu-rms-norm``: the op :class:`NpuRMSNorm` runs."""
    return FusedRmsNorm(_ops(), RMS_NORM, "npu.npu_rms_norm")


@functools.lru_cache(maxsize=None)
def swiglu_implementation() -> FusedSwiGlu:
    """``npu-swiglu``: the op :class:`NpuSwiGLUMLP` runs."""
    return FusedSwiGlu(_ops(), SWIGLU, "npu.npu_swiglu")


@functools.lru_cache(maxsize=None)
def grouped_experts_implementation() -> _GroupedExperts:
    return _GroupedExperts()


class _Native(OpContract):
    """``npu-native``: ``F.dropout`` as torch_npu runs it (a bit mask), and layer norms' fp32 statistics."""

    name = NATIVE
    forward, stands, saves_as = "dropout", ("npu.npu_dropout",), "dropout"

    def __init__(self) -> None:
        super().__init__(_ops())

    def install(self, site: Site):
        return _native_installed(self.ops)


@contextlib.contextmanager
def _native_installed(ops: Any) -> Iterator[None]:
    with dropout_replaced(lambda input, p: ops.dropout(input, float(p))[0]):
        with _layer_norm_mode()():
            yield


@functools.lru_cache(maxsize=None)
def _layer_norm_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class _LayerNormStatistics(TorchDispatchMode):
        """``native_layer_norm`` with fp32 mean and rstd for reduced-precision input, as the NPU kernel keeps."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return fp32_layer_norm_statistics(func, args, func(*args, **(kwargs or {})))

    return _LayerNormStatistics


@functools.lru_cache(maxsize=None)
def native_implementation() -> _Native:
    return _Native()


# ---------------------------------------------------------------------------
# module replacements
# ---------------------------------------------------------------------------
def _module_classes():
    import torch

    NpuRMSNorm, NpuSwiGLUMLP = fused_module_classes(_ops, "Npu")

    class NpuGroupedExperts(torch.nn.Module):
        """Routed experts as HyperParallel's ``GroupedExperts`` runs them (contract ``npu-grouped-experts``).

        Transformers' experts interface (tokens, top-k experts, top-k
        weights); the source's weights held ``[E, hidden, 2I]`` and
        ``[E, I, hidden]``, the layout the grouped matmul takes. The routing
        weights scale the unpermute (HyperParallel's default
        ``router_gating_in_fp32``), so the permuted copy of them it draws
        and leaves unused is not drawn here.
        """

        def __init__(self, source: Any) -> None:
            super().__init__()
            experts, inner, hidden = source.gate_up_proj.shape
            like = dict(dtype=source.gate_up_proj.dtype, device=source.gate_up_proj.device)
            self.num_experts = experts
            self.gate_up_proj = torch.nn.Parameter(torch.empty(experts, hidden, inner, **like))
            self.down_proj = torch.nn.Parameter(torch.empty(experts, inner // 2, hidden, **like))

        def forward(self, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
            ops = _ops()
            flat = hidden_states.view(-1, hidden_states.shape[-1])
            permuted, order = ops.moe_token_permute(flat, top_k_index)
            with torch.no_grad():
                counts = torch.histc(top_k_index.reshape(-1).float(), bins=self.num_experts, min=0,
                                     max=self.num_experts).long()
                group_list = counts.cumsum(0)
            gated = ops.swiglu(ops.grouped_matmul(permuted, self.gate_up_proj, group_list), -1)
            out = ops.moe_token_unpermute(ops.grouped_matmul(gated, self.down_proj, group_list), order,
                                          top_k_weights)
            return out.view(hidden_states.shape)

    return NpuRMSNorm, NpuSwiGLUMLP, NpuGroupedExperts


@functools.lru_cache(maxsize=None)
def module_classes():
    """``(NpuRMSNorm, NpuSwiGLUMLP, NpuGroupedExperts)``, defined on first use (torch imported then)."""
    return _module_classes()


def fused_rms_norm(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, an RMSNorm with a weight, as one running ``npu-rms-norm``."""
    return _fused_rms_norm(module, module_classes()[0])


def fused_attention(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, a Transformers attention, running ``npu_fusion_attention`` (only it).

    Transformers' attention modules call the attention interface their
    config names, so the module keeps its projections and gets a config of
    its own naming the fused kernel: a plan can fuse the attention of some
    layers (by path) and leave the rest on the runtime's attention.
    """
    if not hasattr(module, "config") or not hasattr(module.config, "_attn_implementation"):
        return module
    _register_attention_function()
    own = copy.copy(module.config)
    own._attn_implementation = ATTENTION_IMPLEMENTATION
    module.config = own
    return module


def fused_swiglu_mlp(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, a SiLU-gated MLP (gate, up, down), as one running ``npu-swiglu``."""
    return _fused_swiglu_mlp(module, config, module_classes()[1])


def grouped_experts(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, Transformers' routed experts, as HyperParallel's grouped experts.

    Only SiLU-gated experts without biases whose gate and up projections are
    one ``[E, 2I, hidden]`` weight, the case HyperParallel's module runs
    through ``npu_swiglu``; any other (another activation, which it runs
    through its own GLU, or GPT-OSS's clamped, biased experts) is left to
    grouped_mm.
    """
    if not swiglu_experts(module, config):
        return module
    _, _, experts_cls = module_classes()
    return experts_cls(module)


ATTENTION_KERNEL = AttentionKernel(
    name="npu_fusion_attention", materializes_scores=False,
    description="Ascend's torch_npu.npu_fusion_attention: a head's softmax statistics, not the scores")


@hookimpl
def ndcost_register(register):
    register_contracts(register, CONTRACTS)
    register_attention_kernels(register, (ATTENTION_KERNEL,))
