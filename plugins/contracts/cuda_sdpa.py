"""Contract ``cuda-sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` as it runs on a CUDA GPU.

On a CPU host SDPA dispatches to a CPU kernel that keeps other bytes than the
GPU's, so the census routes every SDPA call to a custom op whose fake
implementation and autograd state what the CUDA kernel keeps. Measured on an
H200 with torch 2.11 (tests/data/h200_measurements.json), SDPA without a mask
and with head widths up to 256 runs the cuDNN kernel, which keeps for its
backward:

- the query, and the key and value *unexpanded* (Transformers passes
  ``enable_gqa=True`` for grouped-query attention without a mask);
- its output, laid out in memory as the query is (Llama's rotated query is
  ``[b, s, h, d]`` in memory, so Transformers' ``transpose(1, 2).contiguous()``
  copies nothing; DeepSeek-V3's and Qwen3-Next's queries are concatenated,
  contiguous ``[b, h, s, d]``, and the copy is a new storage the output
  projection saves);
- one fp32 softmax statistic (the logsumexp) of shape ``[b, h, s, 1]``;
- two int64 scalars, the RNG seed and offset.

Unequal query and value widths (DeepSeek-V3's 192 and 128) run the same way.
With a mask (a sliding window: Transformers then expands k and v itself with
``repeat_kv``, as it passes ``enable_gqa`` only without a mask) the cuDNN
kernel runs too: on the H200 (tests/data/h200_sliding_window_output_selective.json, a
Mistral-7B layer with a 1024-token window) it kept q, the expanded k and v,
its output, the boolean mask as an additive bias in the query's dtype
``[1, 1, s, s]``, the logsumexp ``[b, h, s, 1]`` (cuDNN's shape; the
memory-efficient kernel's is ``[b, h, ceil(s / 32) * 32]``) and the two RNG
scalars. With a head wider than 256, SDPA takes the memory-efficient kernel,
which keeps q, k, v, its output laid out ``[b, s, h, d]``, the bias where
masked, that padded logsumexp fp32 and the two RNG scalars.

Known limitations: the kernels' internal scratch buffers (the backward's fp32
accumulators) are not seen by the working-peak count; the memory-efficient
path is stated from torch's source, not from an H200 measurement.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, ContextManager, Iterator, Mapping, Optional, Tuple

from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import (AttentionKernel, Contract, FlopCount, KernelContract, OpContract, Site,
                                      attention_saved_op, dropout_replaced, fake_only_op,
                                      fp32_layer_norm_statistics, function_replaced, register_attention_kernels,
                                      register_contracts, register_kernel_autograd)

NAME = "cuda-sdpa"
# the operator the contract's kernel stands for, which an op-level checkpoint policy decides on
SDPA_CALL = "aten._scaled_dot_product_cudnn_attention"

CONTRACT = Contract(
    name=NAME,
    summary="torch SDPA on a CUDA GPU (cuDNN kernel, masked or not; memory-efficient kernel past 256-wide heads)",
    implementation="ndcost.plugins.contracts.cuda_sdpa:implementation",
    saves="q, k and v unexpanded, the output (laid out as q), fp32 logsumexp [b, h, s, 1], "
          "int64 RNG seed and offset; under a mask also the additive bias (k and v then expanded by the caller)",
    device="cuda",
)

# The largest head width the cuDNN kernel takes.
_MAX_HEAD_DIM = 256
# The memory-efficient kernel pads its logsumexp to a multiple of this many queries.
_EFFICIENT_LSE_BLOCK = 32


def _cudnn_kernel(query: Any, key: Any, value: Any, attn_mask: Any) -> bool:
    """Whether SDPA takes the cuDNN kernel for these inputs on an H200 (head widths up to 256, masked or not)."""
    return query.shape[-1] == key.shape[-1] <= _MAX_HEAD_DIM and value.shape[-1] <= _MAX_HEAD_DIM


def _strides_like(strides: Tuple[int, ...], size: Tuple[int, ...]) -> Tuple[int, ...]:
    """Dense strides for *size* with the dimensions in the memory order *strides* gives them."""
    order = sorted(range(len(size)), key=lambda i: (-strides[i], i))  # outermost first
    out = [0] * len(size)
    step = 1
    for i in reversed(order):
        out[i] = step
        step *= size[i]
    return tuple(out)


def _pairs(queries: int, keys: int, causal: bool) -> int:
    """Query-key pairs a kernel computes: below the diagonal (inclusive) where causal, else all."""
    if not causal:
        return queries * keys
    if queries <= keys:
        # causal aligned to the top left, as SDPA's is_causal
        return queries * (queries + 1) // 2
    return keys * (keys + 1) // 2 + (queries - keys) * keys


def forward_flops(q_shape, k_shape, v_shape, causal: bool) -> Tuple[int, int]:
    """(FLOPs as the kernel runs them, FLOPs at all pairs) of one SDPA forward: scores and values."""
    batch, heads, queries, width = q_shape
    keys, value_width = k_shape[-2], v_shape[-1]
    per_pair = 2 * batch * heads * (width + value_width)
    return per_pair * _pairs(queries, keys, causal), per_pair * queries * keys


def backward_flops(q_shape, k_shape, v_shape, causal: bool) -> int:
    """FLOPs of one SDPA backward: the scores recomputed, dP = dO v^T, dV, dQ and dK."""
    batch, heads, queries, width = q_shape
    keys, value_width = k_shape[-2], v_shape[-1]
    per_pair = 2 * batch * heads * (3 * width + 2 * value_width)
    return per_pair * _pairs(queries, keys, causal)


class _CudaSdpa(OpContract):
    """The torch side of ``cuda-sdpa``: two custom ops and a function mode routing SDPA to them."""

    name = NAME
    forward, backward = "cuda_sdpa", "cuda_sdpa_backward"
    # torchtitan's policy saves the cuDNN and the efficient kernels alike
    stands = (SDPA_CALL, SDPA_CALL + "_backward")
    runs_as = "scores"

    def __init__(self) -> None:
        import torch

        self._torch = torch

        def sdpa_fake(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa):
            batch, heads, queries, _ = query.shape
            value_width = value.shape[-1]
            size = (batch, heads, queries, value_width)
            if _cudnn_kernel(query, key, value, attn_mask):
                # cuDNN lays its output out as the query is laid out
                out = torch.empty_strided(size, _strides_like(query.stride(), size), dtype=query.dtype,
                                          device=query.device)
                stat = query.new_empty((batch, heads, queries, 1), dtype=torch.float32)
            else:
                # the memory-efficient kernel writes [b, s, h, d]
                out = torch.empty_strided(size, (queries * heads * value_width, value_width,
                                                 heads * value_width, 1), dtype=query.dtype, device=query.device)
                padded = -(-queries // _EFFICIENT_LSE_BLOCK) * _EFFICIENT_LSE_BLOCK
                stat = query.new_empty((batch, heads, padded), dtype=torch.float32)
            seed = query.new_empty((), dtype=torch.int64)
            offset = query.new_empty((), dtype=torch.int64)
            return out, stat, seed, offset

        cuda_sdpa = fake_only_op(
            "ndcost::cuda_sdpa",
            "(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, bool is_causal, "
            "float? scale, bool enable_gqa) -> (Tensor, Tensor, Tensor, Tensor)",
            sdpa_fake, use="on a CUDA device call torch.nn.functional.scaled_dot_product_attention")
        # autocast casts SDPA's inputs to its dtype (a census under autocast runs CPU autocast)
        torch.library.register_autocast("ndcost::cuda_sdpa", "cpu", torch.bfloat16)

        def sdpa_backward_fake(grad, query, key, value, out, stat, seed, offset, attn_mask, dropout_p, is_causal,
                               scale, enable_gqa):
            return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)

        cuda_sdpa_backward = fake_only_op(
            "ndcost::cuda_sdpa_backward",
            "(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor out, Tensor stat, Tensor seed, "
            "Tensor offset, Tensor? attn_mask, float dropout_p, bool is_causal, float? scale, "
            "bool enable_gqa) -> (Tensor, Tensor, Tensor)",
            sdpa_backward_fake)

        def saves(inputs, output):
            # q, k, v, the output, the logsumexp, the RNG seed and offset, and the mask where there is one
            query, key, value, attn_mask = inputs[:4]
            return [query, key, value, *output] + ([attn_mask] if attn_mask is not None else [])

        register_kernel_autograd(
            cuda_sdpa, cuda_sdpa_backward, saves=saves, options=lambda inputs: inputs[4:], stateless=(1, 2, 3),
            kept=lambda saved: (*saved[:7], saved[7] if len(saved) > 7 else None))
        super().__init__(torch.ops.ndcost)

    # -- what the census asks of a contract ---------------------------------
    def install(self, site: Site):
        return _routed(self)

    def call(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        """SDPA's signature, answered by the contract op (a bool mask becomes SDPA's additive bias)."""
        torch = self._torch
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # SDPA turns a boolean mask into an additive one of the query's dtype before the kernel
            attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
        if attn_mask is not None and is_causal:
            raise ValueError("scaled_dot_product_attention takes either attn_mask or is_causal, not both")
        return torch.ops.ndcost.cuda_sdpa(query, key, value, attn_mask, float(dropout_p), bool(is_causal),
                                          None if scale is None else float(scale), bool(enable_gqa))[0]

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        if func is not self.forward_op:
            return None
        # the logsumexp is softmax's, the int64 RNG seed and offset dropout's, q, k, v, the output and a mask
        # the two batched matmuls'
        return attention_saved_op(tensor, dropout_dtype=self._torch.int64)

    def flops(self, func, args, kwargs, out) -> Optional[FlopCount]:
        if func is not self.forward_op:
            return None
        query, key, value = args[:3]
        causal = bool(args[5]) if len(args) > 5 else bool(kwargs.get("is_causal", False))
        flops, all_pairs = forward_flops(tuple(query.shape), tuple(key.shape), tuple(value.shape), causal)
        return FlopCount(part="scores", flops=flops, all_pairs_flops=all_pairs)

    def flop_formulas(self) -> Mapping[Any, Any]:
        torch = self._torch

        def forward(query_shape, key_shape, value_shape, attn_mask_shape=None, dropout_p=0.0, is_causal=False,
                    *args, out_shape=None, **kwargs):
            return forward_flops(query_shape, key_shape, value_shape, bool(is_causal))[0]

        def backward(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
            causal = bool(args[6]) if len(args) > 6 else False
            return backward_flops(query_shape, key_shape, value_shape, causal)

        return {torch.ops.ndcost.cuda_sdpa: forward, torch.ops.ndcost.cuda_sdpa_backward: backward}


def _routed(contract: _CudaSdpa) -> ContextManager[None]:
    """Every ``torch.nn.functional.scaled_dot_product_attention`` call answered by the contract.

    The function is replaced on ``torch.nn.functional`` (Transformers looks
    it up there at each call), not by a function mode: a mode is off inside
    its own handler, so the recompute a checkpoint runs during the backward
    would miss it.
    """
    import torch.nn.functional as F

    def make(original: Any) -> Any:
        def scaled_dot_product_attention(*args, **kwargs):
            return contract.call(*args, **kwargs)
        return scaled_dot_product_attention

    return function_replaced(F, "scaled_dot_product_attention", make)


@functools.lru_cache(maxsize=None)
def implementation() -> _CudaSdpa:
    """The contract's torch side, defined once per process (custom ops cannot be defined twice)."""
    return _CudaSdpa()


# -- SDPA called on keys and values repeated to every query head -------------------------------------
REPEAT_KV_NAME = "cuda-sdpa-repeat-kv"

REPEAT_KV_CONTRACT = Contract(
    name=REPEAT_KV_NAME,
    summary="torch SDPA on a CUDA GPU, called on keys and values repeated to every query head (torchtitan's Llama)",
    implementation="ndcost.plugins.contracts.cuda_sdpa:repeat_kv_implementation",
    saves="as cuda-sdpa, with k and v the caller's copies repeated to every query head",
    device="cuda",
    repeats_kv=True,
)


class _CudaSdpaRepeatKv(_CudaSdpa):
    """``cuda-sdpa``'s kernel called as torchtitan's Llama calls it.

    torchtitan's ``Attention.forward`` (torchtitan/models/llama3/model/model.py,
    pytorch/torchtitan 018740b) runs ``repeat_kv`` on the keys and values before
    SDPA: an unsqueeze, an expand to ``n_rep`` copies of each KV head and a
    reshape, which copies them into a tensor of every query head's. The kernel
    then saves those copies (``n_heads / n_kv_heads`` times a KV head's bytes)
    and torch's ring attention, which stands in for SDPA under context
    parallelism, passes them around the ring. The expand and the reshape save
    nothing for their backward (a sum over the copies).
    """

    name = REPEAT_KV_NAME

    def __init__(self, kernel: _CudaSdpa) -> None:
        vars(self).update(vars(kernel))  # its custom ops: a torch.library op is defined once a process

    def call(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        return super().call(query, _repeated(key, query), _repeated(value, query), attn_mask, dropout_p,
                            is_causal, scale, False)


def _repeated(states: Any, query: Any) -> Any:
    """*states* ``[b, kv_heads, s, d]`` with each KV head repeated to its query heads, as torchtitan's ``repeat_kv``."""
    batch, kv_heads, tokens, width = states.shape
    copies = query.shape[-3] // kv_heads
    if copies == 1:
        return states
    return states[:, :, None].expand(batch, kv_heads, copies, tokens, width).reshape(
        batch, kv_heads * copies, tokens, width)


@functools.lru_cache(maxsize=None)
def repeat_kv_implementation() -> _CudaSdpaRepeatKv:
    return _CudaSdpaRepeatKv(implementation())


# -- CUDA's own ATen kernels where their outputs differ from the CPU's -------------------------------
NATIVE_NAME = "cuda-native"

NATIVE_CONTRACT = Contract(
    name=NATIVE_NAME,
    summary="CUDA's ATen kernels whose saved outputs differ from the CPU's: dropout and layer norm",
    implementation="ndcost.plugins.contracts.cuda_sdpa:native_implementation",
    saves="native_dropout keeps a bool mask (the CPU kernel one of the input's dtype); native_layer_norm "
          "keeps fp32 mean and rstd for bf16/fp16 input (the CPU kernel keeps them in the input's dtype)",
    device="cuda",
)


class _CudaNative(KernelContract):
    """A dispatch mode giving ``native_dropout`` and ``native_layer_norm`` the outputs their CUDA kernels give.

    Measured on an H200 (GPT-2 medium, tests/data/h200_measurements.json):
    the dropout masks saved are bool and the layer norms' statistics fp32.
    """

    name = NATIVE_NAME

    def install(self, site: Site):
        return _native_installed()


@contextlib.contextmanager
def _native_installed() -> Iterator[None]:
    """CUDA's fused dropout for ``F.dropout`` (the CPU path multiplies by a mask of the input's dtype) and the mode."""
    import torch

    with dropout_replaced(lambda input, p: torch.ops.aten.native_dropout(input, p, True)[0]):
        with _native_mode()():
            yield


@functools.lru_cache(maxsize=None)
def _native_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    dropout = torch.ops.aten.native_dropout.default

    class _Native(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is dropout and out[1].dtype != torch.bool:
                return out[0], torch.empty(out[1].shape, dtype=torch.bool, device=out[1].device)
            return fp32_layer_norm_statistics(func, args, out)

    return _Native


@functools.lru_cache(maxsize=None)
def native_implementation() -> _CudaNative:
    return _CudaNative()


# The attention implementations a CUDA run (Transformers' ``attn_implementation``) chooses among:
# only eager keeps the scores; the fused kernels keep a row's logsumexp (measured above for cuDNN).
ATTENTION_KERNELS = (
    AttentionKernel(name="eager", materializes_scores=True,
                    description="Transformers' eager attention: matmul, softmax, dropout; the scores are saved"),
    AttentionKernel(name="sdpa", materializes_scores=False, call=SDPA_CALL,
                    description="torch SDPA (cuDNN / flash / memory-efficient): the logsumexp, not the scores"),
    AttentionKernel(name="flash", materializes_scores=False, description="a flash-attention kernel"),
    AttentionKernel(name="flash_attention_2", materializes_scores=False, description="FlashAttention-2"),
    AttentionKernel(name="flash_attention_3", materializes_scores=False, description="FlashAttention-3"),
    AttentionKernel(name="flex_attention", materializes_scores=False,
                    description="torch FlexAttention: a compiled fused kernel keeping the logsumexp"),
)


@hookimpl
def ndcost_register(register):
    register_contracts(register, (CONTRACT, REPEAT_KV_CONTRACT, NATIVE_CONTRACT))
    register_attention_kernels(register, ATTENTION_KERNELS)
