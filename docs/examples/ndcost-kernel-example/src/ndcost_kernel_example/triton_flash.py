"""The torch side of contract ``triton-flash-attention``, imported only when a census runs.

Two fake-only custom ops stand for the kernel's forward and backward (what
the forward keeps: this package's docstring), and Transformers' attention
interface entry ``flash_attn_triton`` calls the forward as an integration
would: keys and values repeated to the query's heads (Transformers'
``repeat_kv``, transformers/integrations/sdpa_attention.py), every tensor laid
out ``[b, s, h, d]`` (a transpose, no copy where the last dimension is dense,
as the kernel's own ``x if x.stride(-1) == 1 else x.contiguous()``).

What the kernel cannot run is refused (``CensusUnavailable``), not priced
as something else: attention sinks, a dense mask (the kernel takes a bias,
which this contract does not state), a sliding window shorter than the
sequence, dropout, heads wider than 128.

Known limitations: the kernel's scratch buffer (``tmp``, fp32 like the
log-sum-exp, freed when the forward returns) and its backward's fp32
accumulators are not seen; FLOPs are counted at the pairs below the
diagonal, where the kernel computes whole 128 x 128 blocks on it. A Triton
kernel launched from Python is no dispatcher op a selective-checkpoint
policy names, so torchtitan's policy recomputes it (the contract stands for
no runtime operator).
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Optional, Tuple

from ndcost.errors import CensusUnavailable
from ndcost.plugins.contracts import (FlopCount, OpContract, Site, attention_saved_op, fake_only_op,
                                      register_attention_function, register_kernel_autograd)
from ndcost.plugins.contracts.cuda_sdpa import backward_flops, forward_flops

NAME = "triton-flash-attention"
ATTENTION = "flash_attn_triton"
# The kernel's log-sum-exp holds this many queries a block (seqlen_q_rounded in _flash_attn_forward).
LSE_BLOCK = 128
# The widest head the kernel takes (its assert d <= 128).
MAX_HEAD_DIM = 128


def lse_queries(queries: int) -> int:
    """The queries the kernel's log-sum-exp holds: *queries* rounded up to whole 128-query blocks."""
    return -(-queries // LSE_BLOCK) * LSE_BLOCK


def _bhsd(shape: Tuple[int, ...]) -> Tuple[int, ...]:
    """A ``[b, s, h, d]`` shape as ``[b, h, s, d]``, the order the SDPA FLOP formulas read."""
    batch, seq, heads, width = shape
    return batch, heads, seq, width


@functools.lru_cache(maxsize=None)
def _ops() -> Any:
    """The kernel's forward and backward as custom ops, defined once per process."""
    import torch

    def forward_fake(q, k, v, causal, softmax_scale):
        batch, queries, heads, _ = q.shape
        lse = q.new_empty((batch, heads, lse_queries(queries)), dtype=torch.float32)
        return torch.empty_like(q), lse

    forward = fake_only_op(
        "ndcost_kernel_example::flash_attn_triton",
        "(Tensor q, Tensor k, Tensor v, bool causal, float softmax_scale) -> (Tensor, Tensor)",
        forward_fake, use="on a CUDA GPU call flash_attn.flash_attn_triton.flash_attn_func")

    def backward_fake(grad, q, k, v, out, lse, causal, softmax_scale):
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    backward = fake_only_op(
        "ndcost_kernel_example::flash_attn_triton_backward",
        "(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, bool causal, float softmax_scale) "
        "-> (Tensor, Tensor, Tensor)",
        backward_fake)

    # FlashAttnFunc.forward: ctx.save_for_backward(q, k, v, o, lse, bias), bias None
    register_kernel_autograd(forward, backward, saves=lambda inputs, output: [*inputs[:3], *output],
                             options=lambda inputs: inputs[3:], stateless=(1,))
    return torch.ops.ndcost_kernel_example


def _refuse(module: Any, why: str) -> CensusUnavailable:
    return CensusUnavailable(f"{type(module).__name__}: {why}, which FlashAttention's Triton kernel (contract "
                             f"{NAME!r}) does not take; price this model under hf-cuda, or from the formulas "
                             f"(census='off')")


def flash_attn_triton_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                              dropout: float = 0.0, scaling: Optional[float] = None,
                              sliding_window: Optional[int] = None, **kwargs: Any) -> Tuple[Any, None]:
    """Transformers' attention interface, run by the kernel: ``[b, h, s, d]`` heads in, ``[b, s, h, d]`` out."""
    batch, heads, queries, width = query.shape
    if getattr(module, "sinks", None) is not None or kwargs.get("s_aux") is not None:
        raise _refuse(module, "its attention adds learned sinks")
    if attention_mask is not None:
        raise _refuse(module, "it was handed a dense attention mask")
    if sliding_window and queries > int(sliding_window):
        raise _refuse(module, f"its attention slides a {sliding_window}-token window over {queries} tokens")
    if dropout:
        raise _refuse(module, f"its attention drops probabilities out (p={dropout})")
    if width > MAX_HEAD_DIM or value.shape[-1] != width:
        raise _refuse(module, f"its heads are {width} wide for q and k and {value.shape[-1]} for v (the kernel "
                              f"takes one width up to {MAX_HEAD_DIM})")
    groups = heads // key.shape[1]
    if groups > 1:  # Transformers' repeat_kv: the kernel takes every head
        key, value = (t[:, :, None].expand(batch, t.shape[1], groups, *t.shape[2:]).reshape(batch, heads, *t.shape[2:])
                      for t in (key, value))
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    causal = kwargs.get("is_causal")
    causal = bool(getattr(module, "is_causal", True) if causal is None else causal)
    scale = float(scaling) if scaling is not None else width ** -0.5
    return _ops().flash_attn_triton(q, k, v, causal, scale)[0], None


class _TritonFlash(OpContract):
    """``triton-flash-attention``: the forward and backward ops, and the attention interface entry calling them."""

    name = NAME
    forward, backward = "flash_attn_triton", "flash_attn_triton_backward"
    runs_as = "scores"

    def __init__(self) -> None:
        super().__init__(_ops())
        # before the layer is built: its config names the entry as its attention implementation
        register_attention_function(ATTENTION, flash_attn_triton_forward)

    def install(self, site: Site):
        register_attention_function(ATTENTION, flash_attn_triton_forward)
        return super().install(site)

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        # the fp32 log-sum-exp is softmax's; q, k, v and the output the two batched matmuls'
        return attention_saved_op(tensor) if func is self.forward_op else None

    def flops(self, func: Any, args: Tuple[Any, ...], kwargs: Mapping[str, Any], out: Any) -> Optional[FlopCount]:
        if func is not self.forward_op:
            return None
        q, k, v, causal = args[:4]
        flops, all_pairs = forward_flops(_bhsd(q.shape), _bhsd(k.shape), _bhsd(v.shape), bool(causal))
        return FlopCount(part="scores", flops=flops, all_pairs_flops=all_pairs)

    def flop_formulas(self) -> Mapping[Any, Any]:
        # the ops' arguments in schema order, tensors as their shapes (torch.utils.flop_counter's form)
        def forward(q_shape, k_shape, v_shape, causal, softmax_scale, out_shape=None):
            return forward_flops(_bhsd(q_shape), _bhsd(k_shape), _bhsd(v_shape), bool(causal))[0]

        def backward(grad_shape, q_shape, k_shape, v_shape, o_shape, lse_shape, causal, softmax_scale,
                     out_shape=None):
            return backward_flops(_bhsd(q_shape), _bhsd(k_shape), _bhsd(v_shape), bool(causal))

        return {self.ops.flash_attn_triton: forward, self.ops.flash_attn_triton_backward: backward}


@functools.lru_cache(maxsize=None)
def implementation() -> _TritonFlash:
    """The contract's torch side, defined once per process (custom ops cannot be defined twice)."""
    return _TritonFlash()
