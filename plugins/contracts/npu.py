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
  2048 x 2048 constant a device allocates once for every layer and
  micro-batch, so it counts toward no layer. It states no attention sinks
  (GPT-OSS, DeepSeek-V4): such a layer is refused.
- ``npu-rms-norm``: ``torch_npu.npu_rms_norm``, keeping its input and an
  fp32 ``rstd`` of shape ``[..., 1]`` (and its gamma, a parameter).
- ``npu-swiglu``: ``torch_npu.npu_swiglu``, keeping its input only (the
  fused gate-and-up projection's output), its output half as wide.
- ``npu-native``: torch_npu's own ATen kernels where they keep other bytes
  than the CPU's: dropout keeps a uint8 bit mask, one bit an element padded
  to whole blocks of 128 elements (``npu_dropout_gen_mask``), and
  ``native_layer_norm`` fp32 mean and rstd for bf16 input. Stated from
  torch_npu's kernels, not measured on an NPU.

Module replacements (factories for a runtime profile's ``replacements``,
called as ``factory(module, config)``, paths matched by pattern as a
training framework's plan does): :func:`fused_rms_norm` (an RMSNorm running
``npu-rms-norm``), :func:`fused_swiglu_mlp` (a gated MLP whose gate and up
projections are one matmul feeding ``npu-swiglu``) and
:func:`fused_attention` (an attention module calling the fused kernel). The
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
import inspect
from typing import Any, Iterator, Mapping, Optional, Tuple

from ndcost.errors import CensusUnavailable
from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import Contract, FlopCount, KernelContract, Site

ATTENTION = "npu-fusion-attention"
RMS_NORM = "npu-rms-norm"
SWIGLU = "npu-swiglu"
NATIVE = "npu-native"

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
             saves="its input and fp32 rstd [..., 1]"),
    Contract(name=SWIGLU, device="npu",
             summary="torch_npu.npu_swiglu, run by the fused_swiglu_mlp replacement",
             implementation="ndcost.plugins.contracts.npu:swiglu_implementation",
             saves="its input (the fused gate-and-up projection's output)"),
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
    from torch import Tensor

    namespace = "ndcost_npu"

    # -- fusion attention ---------------------------------------------------
    @torch.library.custom_op(f"{namespace}::fusion_attention", mutates_args=(),
        schema="(Tensor query, Tensor key, Tensor value, float scale, float keep_prob, int pre_tokens, "
               "int next_tokens) -> (Tensor, Tensor, Tensor, Tensor)")
    def fusion_attention(query: Tensor, key: Tensor, value: Tensor, scale: float, keep_prob: float,
                         pre_tokens: int, next_tokens: int) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
        raise NotImplementedError(f"{namespace}::fusion_attention is a contract for fake tensors only; "
                                  f"on an Ascend NPU call torch_npu.npu_fusion_attention")

    @fusion_attention.register_fake
    def _(query, key, value, scale, keep_prob, pre_tokens, next_tokens):
        batch, queries, heads, _ = query.shape
        keys = key.shape[1]
        out = query.new_empty((batch, queries, heads, value.shape[-1]))
        stats = [query.new_empty((batch, heads, queries, SOFTMAX_STAT_WIDTH), dtype=torch.float32)
                 for _ in range(2)]
        mask_bytes = dropout_mask_bytes(batch, heads, queries, keys) if keep_prob < 1.0 else 0
        mask = query.new_empty((mask_bytes,), dtype=torch.uint8)
        return out, stats[0], stats[1], mask

    @torch.library.custom_op(f"{namespace}::fusion_attention_grad", mutates_args=(),
        schema="(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor out, Tensor softmax_max, "
               "Tensor softmax_sum, Tensor mask, float scale, float keep_prob, int pre_tokens, "
               "int next_tokens) -> (Tensor, Tensor, Tensor)")
    def fusion_attention_grad(grad: Tensor, query: Tensor, key: Tensor, value: Tensor, out: Tensor,
                              softmax_max: Tensor, softmax_sum: Tensor, mask: Tensor, scale: float,
                              keep_prob: float, pre_tokens: int,
                              next_tokens: int) -> Tuple[Tensor, Tensor, Tensor]:
        raise NotImplementedError(f"{namespace}::fusion_attention_grad is a contract for fake tensors only")

    @fusion_attention_grad.register_fake
    def _(grad, query, key, value, out, softmax_max, softmax_sum, mask, scale, keep_prob, pre_tokens,
          next_tokens):
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)

    def attention_setup(ctx, inputs, output):
        query, key, value, scale, keep_prob, pre_tokens, next_tokens = inputs
        out, softmax_max, softmax_sum, mask = output
        ctx.mark_non_differentiable(softmax_max, softmax_sum, mask)
        ctx.options = (scale, keep_prob, pre_tokens, next_tokens)
        ctx.dropout = keep_prob < 1.0
        saved = [query, key, value, out, softmax_max, softmax_sum]
        if ctx.dropout:
            saved.append(mask)
        ctx.save_for_backward(*saved)

    def attention_backward(ctx, grad, _max, _sum, _mask):
        saved = ctx.saved_tensors
        query, key, value, out, softmax_max, softmax_sum = saved[:6]
        mask = saved[6] if ctx.dropout else softmax_max.new_empty((0,), dtype=torch.uint8)
        dq, dk, dv = fusion_attention_grad(grad, query, key, value, out, softmax_max, softmax_sum, mask,
                                           *ctx.options)
        return dq, dk, dv, None, None, None, None

    fusion_attention.register_autograd(attention_backward, setup_context=attention_setup)

    # -- RMSNorm ------------------------------------------------------------
    @torch.library.custom_op(f"{namespace}::rms_norm", mutates_args=(),
        schema="(Tensor x, Tensor gamma, float epsilon) -> (Tensor, Tensor)")
    def rms_norm(x: Tensor, gamma: Tensor, epsilon: float) -> Tuple[Tensor, Tensor]:
        raise NotImplementedError(f"{namespace}::rms_norm is a contract for fake tensors only; "
                                  f"on an Ascend NPU call torch_npu.npu_rms_norm")

    @rms_norm.register_fake
    def _(x, gamma, epsilon):
        return torch.empty_like(x), x.new_empty((*x.shape[:-1], 1), dtype=torch.float32)

    def norm_setup(ctx, inputs, output):
        x, gamma, _ = inputs
        _, rstd = output
        ctx.mark_non_differentiable(rstd)
        ctx.save_for_backward(x, gamma, rstd)

    def norm_backward(ctx, grad, _rstd):
        x, gamma, _ = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(gamma), None

    rms_norm.register_autograd(norm_backward, setup_context=norm_setup)

    # -- SwiGLU -------------------------------------------------------------
    @torch.library.custom_op(f"{namespace}::swiglu", mutates_args=(),
        schema="(Tensor x, int dim) -> Tensor")
    def swiglu(x: Tensor, dim: int) -> Tensor:
        raise NotImplementedError(f"{namespace}::swiglu is a contract for fake tensors only; "
                                  f"on an Ascend NPU call torch_npu.npu_swiglu")

    @swiglu.register_fake
    def _(x, dim):
        shape = list(x.shape)
        shape[dim] //= 2
        return x.new_empty(shape)

    def swiglu_setup(ctx, inputs, output):
        x, dim = inputs
        ctx.dim = dim
        ctx.save_for_backward(x)

    def swiglu_backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.empty_like(x), None

    swiglu.register_autograd(swiglu_backward, setup_context=swiglu_setup)

    # -- dropout ------------------------------------------------------------
    @torch.library.custom_op(f"{namespace}::dropout", mutates_args=(),
                             schema="(Tensor x, float p) -> (Tensor, Tensor)")
    def dropout(x, p):
        raise NotImplementedError(f"{namespace}::dropout is a contract for fake tensors only")

    @dropout.register_fake
    def _(x, p):
        return torch.empty_like(x), x.new_empty((dropout_mask_bytes_elements(x.numel()),), dtype=torch.uint8)

    def dropout_setup(ctx, inputs, output):
        _, mask = output
        ctx.mark_non_differentiable(mask)
        ctx.like = inputs[0]
        ctx.save_for_backward(mask)

    def dropout_backward(ctx, grad, _mask):
        return torch.empty_like(grad), None

    dropout.register_autograd(dropout_backward, setup_context=dropout_setup)

    ops = torch.ops.ndcost_npu
    return ops


def _register_attention_function() -> None:
    """Make ``npu_fusion_attention`` an attention implementation (and mask builder) Transformers accepts."""
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION_IMPLEMENTATION, npu_fusion_attention_forward)
    # The kernel takes causality (and a sliding window) as its sparse mode, not a dense mask.
    AttentionMaskInterface.register(ATTENTION_IMPLEMENTATION, flash_attention_mask)


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


class _Attention(KernelContract):
    """``npu-fusion-attention``: the fusion attention op and Transformers' interface entry running it."""

    name = ATTENTION

    def __init__(self) -> None:
        self.ops = _ops()
        self.forward_op = self.ops.fusion_attention.default
        self.backward_op = self.ops.fusion_attention_grad.default
        _register_attention_function()

    def stands_for(self) -> Mapping[Any, str]:
        return {self.forward_op: "npu.npu_fusion_attention",
                self.backward_op: "npu.npu_fusion_attention_grad"}

    def install(self, site: Site):
        _register_attention_function()
        return super().install(site)

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        if func is not self.forward_op:
            return None
        import torch
        if tensor.dtype == torch.float32:
            return "softmax"
        if tensor.dtype == torch.uint8:
            return "dropout"
        return "attBMM"

    def part(self, func: Any) -> Optional[str]:
        return "scores" if func in (self.forward_op, self.backward_op) else None

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


class _RmsNorm(KernelContract):
    """``npu-rms-norm``: the op :class:`NpuRMSNorm` runs."""

    name = RMS_NORM

    def __init__(self) -> None:
        self.ops = _ops()
        self.forward_op = self.ops.rms_norm.default

    def stands_for(self) -> Mapping[Any, str]:
        return {self.forward_op: "npu.npu_rms_norm"}

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        return "normOp" if func is self.forward_op else None

    def part(self, func: Any) -> Optional[str]:
        return "norm" if func is self.forward_op else None


class _SwiGlu(KernelContract):
    """``npu-swiglu``: the op :class:`NpuSwiGLUMLP` runs."""

    name = SWIGLU

    def __init__(self) -> None:
        self.ops = _ops()
        self.forward_op = self.ops.swiglu.default

    def stands_for(self) -> Mapping[Any, str]:
        return {self.forward_op: "npu.npu_swiglu"}

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        return "ffAct" if func is self.forward_op else None


@functools.lru_cache(maxsize=None)
def attention_implementation() -> _Attention:
    return _Attention()


@functools.lru_cache(maxsize=None)
def rms_norm_implementation() -> _RmsNorm:
    return _RmsNorm()


@functools.lru_cache(maxsize=None)
def swiglu_implementation() -> _SwiGlu:
    return _SwiGlu()


class _Native(KernelContract):
    """``npu-native``: ``F.dropout`` as torch_npu runs it (a bit mask), and layer norms' fp32 statistics."""

    name = NATIVE

    def __init__(self) -> None:
        self.ops = _ops()
        self.forward_op = self.ops.dropout.default

    def stands_for(self) -> Mapping[Any, str]:
        return {self.forward_op: "npu.npu_dropout"}

    def install(self, site: Site):
        return _native_installed(self.ops)

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        return "dropout" if func is self.forward_op else None


@contextlib.contextmanager
def _native_installed(ops: Any) -> Iterator[None]:
    import torch.nn.functional as F

    original = F.dropout

    @functools.wraps(original)
    def dropout(input, p=0.5, training=True, inplace=False):
        if not training or p == 0 or inplace:
            return original(input, p, training, inplace)
        return ops.dropout(input, float(p))[0]

    F.dropout = dropout
    try:
        with _layer_norm_mode()():
            yield
    finally:
        F.dropout = original


@functools.lru_cache(maxsize=None)
def _layer_norm_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    layer_norm = torch.ops.aten.native_layer_norm.default
    reduced = (torch.bfloat16, torch.float16)

    class _LayerNormStatistics(TorchDispatchMode):
        """``native_layer_norm`` with fp32 mean and rstd for reduced-precision input, as the NPU kernel keeps."""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is layer_norm and args[0].dtype in reduced:
                return (out[0], *(torch.empty(t.shape, dtype=torch.float32, device=t.device) for t in out[1:]))
            return out

    return _LayerNormStatistics


@functools.lru_cache(maxsize=None)
def native_implementation() -> _Native:
    return _Native()


# ---------------------------------------------------------------------------
# module replacements
# ---------------------------------------------------------------------------
def _zero_centred(module: Any) -> bool:
    """Whether *module*'s RMSNorm scales by ``1 + weight`` (Gemma, Qwen3-Next) rather than by ``weight``."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return False
    compact = source.replace(" ", "")
    return "(1.0+self.weight" in compact or "(1+self.weight" in compact


def _eps(module: Any) -> float:
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(module, name, None)
        if isinstance(value, (int, float)):
            return float(value)
    return 1e-6


def _module_classes():
    import torch

    class NpuRMSNorm(torch.nn.Module):
        """An RMSNorm running ``torch_npu.npu_rms_norm`` (contract ``npu-rms-norm``), the source's weight kept."""

        def __init__(self, weight: Any, eps: float, zero_centred: bool = False) -> None:
            super().__init__()
            self.weight = weight
            self.variance_epsilon = eps
            self.zero_centred = zero_centred

        def forward(self, hidden_states: Any) -> Any:
            gamma = (1.0 + self.weight) if self.zero_centred else self.weight
            return _ops().rms_norm(hidden_states, gamma.to(hidden_states.dtype)
                                   if gamma.dtype != hidden_states.dtype else gamma,
                                   self.variance_epsilon)[0]

    class NpuSwiGLUMLP(torch.nn.Module):
        """A gated MLP whose gate and up projections are one matmul feeding ``torch_npu.npu_swiglu``.

        ``gate_up_proj`` holds the source's gate and up weights stacked (the
        parameter count is the source's); ``down_proj`` is the source's.
        """

        def __init__(self, source: Any) -> None:
            super().__init__()
            gate, up = source.gate_proj, source.up_proj
            self.gate_up_proj = torch.nn.Linear(gate.in_features, gate.out_features + up.out_features,
                                                bias=gate.bias is not None, dtype=gate.weight.dtype,
                                                device=gate.weight.device)
            self.down_proj = source.down_proj

        def forward(self, x: Any) -> Any:
            return self.down_proj(_ops().swiglu(self.gate_up_proj(x), -1))

    return NpuRMSNorm, NpuSwiGLUMLP


@functools.lru_cache(maxsize=None)
def module_classes():
    """``(NpuRMSNorm, NpuSwiGLUMLP)``, defined on first use (torch imported then)."""
    return _module_classes()


def fused_rms_norm(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, an RMSNorm with a weight, as one running ``npu-rms-norm``."""
    weight = getattr(module, "weight", None)
    if weight is None:
        return module  # an unweighted norm is no fused RMSNorm's
    norm_cls, _ = module_classes()
    return norm_cls(weight, _eps(module), _zero_centred(module))


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


_GATED_ACTIVATIONS = ("silu", "swish")


def fused_swiglu_mlp(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, a SiLU-gated MLP (gate, up, down), as one running ``npu-swiglu``.

    A module of another shape (GPT-2's, a clamped or biased gate) is left
    as it is, as a framework's plan leaves a module its factory cannot fuse.
    """
    if not all(hasattr(module, name) for name in ("gate_proj", "up_proj", "down_proj")):
        return module
    act = str(getattr(config, "hidden_act", "") or getattr(config, "hidden_activation", ""))
    if act not in _GATED_ACTIVATIONS or getattr(module, "limit", None) is not None:
        return module
    _, mlp_cls = module_classes()
    return mlp_cls(module)


@hookimpl
def ndcost_register(register):
    for contract in CONTRACTS:
        register(f"contract/{contract.name}", contract)
