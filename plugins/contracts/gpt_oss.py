"""Contract of GPT-OSS's attention as training runs execute it: one fused kernel with a learned sink a head.

Transformers ships GPT-OSS with eager attention for training (``_supports_sdpa = False``: SDPA takes no
sinks), which saves every ``[b, h, s, s]`` score matrix. Training runs take a fused kernel instead:
FlashAttention-3 with sinks (Transformers' ``kernels-community/vllm-flash-attn3`` attention implementation,
one of GPT-OSS's ``_compatible_flash_implementations``), or Transformer Engine's fused attention with a
learnable softmax offset under Megatron-LM (``softmax_type="learnable"``). Either computes each row's softmax
with the head's sink in its denominator, and keeps what flash attention keeps: the query
``[b, h, s, d]``, the key and value ``[b, h_kv, s, d]`` (GQA's heads unrepeated), its output and an fp32
log-sum-exp ``[b, h, s]``; the sink's gradient comes from the output and its gradient in the backward. A
sliding-window layer scores only the window (``sliding_window``) and builds no dense mask.

Known limitations: the kernel's backward scratch (its fp32 dQ accumulator) is not seen by the working-peak
count.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import (AttentionKernel, Contract, FamilyAttentionContract, FlopCount,
                                      attention_saved_op, fake_only_op, register_attention_kernels,
                                      register_contracts, register_kernel_autograd)

FLASH_SINKS = "gpt-oss-flash-sinks"
ATTENTION_IMPLEMENTATION = "gpt_oss_flash_sinks"

CONTRACTS = (
    Contract(name=FLASH_SINKS, device="cuda",
             summary="GPT-OSS's attention as one fused kernel with a learned sink a head (FA3 with sinks, "
                     "Transformer Engine's learnable softmax offset)",
             implementation="ndcost.plugins.contracts.gpt_oss:flash_sinks_implementation",
             saves="q [b, h, s, d], k and v [b, h_kv, s, d], the output, fp32 log-sum-exp [b, h, s]",
             attention=True),
)
# the formulas price the layer under the contract's name as a kernel keeping a row's statistics, not its scores
ATTENTION_KERNELS = (
    AttentionKernel(name=FLASH_SINKS, materializes_scores=False,
                    description="GPT-OSS's fused attention with sinks: the log-sum-exp, not the scores"),
)


@functools.lru_cache(maxsize=None)
def _ops() -> Any:
    """The custom ops, defined once per process."""
    import torch

    def attention_fake(query, key, value, sinks, scale, window):
        batch, heads, queries, width = query.shape
        out = query.new_empty((batch, queries, heads, value.shape[-1]))
        lse = query.new_empty((batch, heads, queries), dtype=torch.float32)
        return out, lse

    forward = fake_only_op(
        "ndcost_gpt_oss::flash_sinks",
        "(Tensor query, Tensor key, Tensor value, Tensor sinks, float scale, int window) -> (Tensor, Tensor)",
        attention_fake, use="run GPT-OSS with a flash kernel taking sinks on the device")
    backward = fake_only_op(
        "ndcost_gpt_oss::flash_sinks_grad",
        "(Tensor grad, Tensor query, Tensor key, Tensor value, Tensor sinks, Tensor out, Tensor lse, "
        "float scale, int window) -> (Tensor, Tensor, Tensor, Tensor)",
        lambda grad, query, key, value, sinks, out, lse, scale, window: (
            torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), torch.empty_like(sinks)))
    # q, k, v, the sinks (a parameter), the output and the log-sum-exp
    register_kernel_autograd(forward, backward, saves=lambda inputs, output: [*inputs[:4], *output],
                             options=lambda inputs: inputs[4:], stateless=(1,))
    return torch.ops.ndcost_gpt_oss


def flash_sinks_attention_forward(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                                  dropout: float = 0.0, scaling: Optional[float] = None,
                                  sliding_window: Optional[int] = None, s_aux: Any = None,
                                  **kwargs: Any) -> Tuple[Any, None]:
    """Transformers' attention interface, run by the fused kernel: ``[b, s, h, d]`` out, as flash returns it."""
    sinks = s_aux if s_aux is not None else module.sinks
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    return _ops().flash_sinks(query, key, value, sinks, scale, int(sliding_window or 0))[0], None


def causal_pairs(queries: int, window: int) -> int:
    """Query-key pairs a causal kernel scores over *queries* tokens, each seeing at most *window* (0: all)."""
    if window <= 0 or window >= queries:
        return queries * (queries + 1) // 2
    return window * (window + 1) // 2 + (queries - window) * window


class _FlashSinks(FamilyAttentionContract):
    name = FLASH_SINKS
    forward, backward = "flash_sinks", "flash_sinks_grad"
    stands = ("flash_attn_3.fwd_sinks", "flash_attn_3.bwd_sinks")
    runs_as = "scores"
    implementation_name = ATTENTION_IMPLEMENTATION
    attention_forward = staticmethod(flash_sinks_attention_forward)

    def __init__(self) -> None:
        super().__init__(_ops())
        self.register()

    def saved_op(self, func: Any, tensor: Any) -> Optional[str]:
        return attention_saved_op(tensor) if func is self.forward_op else None

    def flops(self, func, args, kwargs, out) -> Optional[FlopCount]:
        if func is not self.forward_op:
            return None
        query, key, value = args[:3]
        batch, heads, queries, width = query.shape
        per_pair = 2 * batch * heads * (width + value.shape[-1])  # QK^T and PV
        return FlopCount(part="scores", flops=per_pair * causal_pairs(queries, int(args[5])),
                         all_pairs_flops=per_pair * queries * key.shape[-2])


@functools.lru_cache(maxsize=None)
def flash_sinks_implementation() -> _FlashSinks:
    return _FlashSinks()


@hookimpl
def ndcost_register(register):
    register_contracts(register, CONTRACTS)
    register_attention_kernels(register, ATTENTION_KERNELS)
