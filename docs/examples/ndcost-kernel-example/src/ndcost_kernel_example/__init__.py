"""An example third-party ndcost plugin: a kernel contract, and a runtime profile that runs it.

The kernel is FlashAttention's Triton implementation,
``flash_attn.flash_attn_triton.flash_attn_func`` (Dao-AILab/flash-attention,
flash_attn/flash_attn_triton.py). Its forward (``FlashAttnFunc``) keeps for
the backward ``q, k, v, o, lse``:

- q, k and v as it takes them, ``[b, s, h, d]``, with k and v at the query's
  head count (``_flash_attn_forward`` asserts ``k.shape == (batch, seqlen_k,
  nheads, d)``: it has no grouped-query attention, so its caller repeats them);
- its output, ``o = torch.empty_like(q)``;
- the log-sum-exp, fp32 ``[b, h, ceil(s / 128) * 128]``: rounded up to whole
  blocks of 128 queries;

and no dropout state (the Triton version has no dropout). ndcost's built-in
``cuda-sdpa`` contract (torch SDPA's cuDNN kernel) keeps k and v unexpanded,
the log-sum-exp ``[b, h, s, 1]`` and two int64 RNG scalars instead, so a
layer under this kernel keeps ``2 b (h - kv) s d`` more elements of k and v,
``b h (ceil(s / 128) * 128 - s)`` more fp32 statistics and 16 bytes less.

This module registers, without importing torch:

- ``contract/triton-flash-attention``: the contract (its torch side is
  :mod:`ndcost_kernel_example.triton_flash`, imported when a census runs);
- ``attention_kernel/flash_attn_triton``: the attention implementation the
  runtime names, a fused one (it keeps the statistics, not the scores), which
  the op records price when the census is off;
- ``runtime/hf-cuda-triton-flash``: the profile in ``runtimes/``.
"""
from importlib import resources

import ndcost
from ndcost.plugins.contracts import AttentionKernel, Contract, register_attention_kernels, register_contracts
from ndcost.plugins.runtimes import register_profile_dir

CONTRACT = Contract(
    name="triton-flash-attention",
    summary="FlashAttention's Triton kernel (flash_attn.flash_attn_triton.flash_attn_func) on a CUDA GPU",
    implementation="ndcost_kernel_example.triton_flash:implementation",
    saves="q, k and v [b, s, h, d] (k and v repeated to the query's heads), the output, "
          "fp32 logsumexp [b, h, ceil(s / 128) * 128]; no dropout state",
    device="cuda",
)

KERNEL = AttentionKernel(
    name="flash_attn_triton",
    materializes_scores=False,
    description="FlashAttention's Triton kernel: the log-sum-exp (per 128-query block), not the scores",
)


@ndcost.hookimpl
def ndcost_register(register):
    register_contracts(register, (CONTRACT,))
    register_attention_kernels(register, (KERNEL,))
    register_profile_dir(register, resources.files(__name__) / "runtimes")
