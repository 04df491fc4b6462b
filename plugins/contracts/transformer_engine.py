"""Contracts of Transformer Engine's fused RMSNorm and SwiGLU, as Megatron-LM's layers run them on a CUDA GPU.

- ``te-rms-norm``: Transformer Engine's RMSNorm (``transformer_engine.pytorch``
  ``RMSNorm`` and the norm of ``LayerNormLinear``, ``rmsnorm_fwd``), keeping
  its input, its weight (a parameter) and an fp32 ``rsigma`` a row; the
  normalized output the following linear keeps for its weight's gradient
  is that linear's own save, as Transformers' projections keep theirs.
- ``te-swiglu``: the fused SwiGLU between Megatron-LM's ``linear_fc1``
  (gate and up, one matmul) and ``linear_fc2``
  (megatron/core/fusions/fused_bias_swiglu.py ``BiasSwiGLUFunction``:
  ``ctx.save_for_backward(input)``; Transformer Engine's ``ops.SwiGLU``
  alike), keeping its input alone.

Both keep what the NPU's fused kernels keep (``npu-rms-norm``,
``npu-swiglu``): the same ops (:func:`ndcost.plugins.contracts.define_fused_norm_ops`)
in a namespace of their own. The replacement factories :func:`rms_norm` and
:func:`swiglu_mlp` put them in place of Transformers' RMSNorms and SiLU-gated
MLPs (a runtime profile's ``replacements``: ``megatron-te-cuda``'s).

Left out: Transformer Engine's FP8 copies of the linears' inputs (under
``float8`` it keeps a GEMM's input in FP8 for the weight's gradient, 1 byte
an element where the census counts the 16-bit activation), the routed
experts' own fused activation (Megatron-LM's grouped MLP keeps its input alone;
Transformers' experts keep theirs), and the norms' kernel workspaces.
"""
from __future__ import annotations

import functools
from typing import Any

from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import (
    Contract,
    FusedRmsNorm,
    FusedSwiGlu,
    define_fused_norm_ops,
    fused_module_classes,
    fused_rms_norm,
    fused_swiglu_mlp,
    register_contracts,
)

RMS_NORM = "te-rms-norm"
SWIGLU = "te-swiglu"

CONTRACTS = (
    Contract(name=RMS_NORM, device="cuda",
             summary="Transformer Engine's RMSNorm (rmsnorm_fwd), run by the rms_norm replacement",
             implementation="ndcost.plugins.contracts.transformer_engine:rms_norm_implementation",
             saves="its input and fp32 rsigma [..., 1]", fuses="rms_norm"),
    Contract(name=SWIGLU, device="cuda",
             summary="Megatron-LM's fused SwiGLU (BiasSwiGLUFunction) between linear_fc1 and linear_fc2, run by "
                     "the swiglu_mlp replacement",
             implementation="ndcost.plugins.contracts.transformer_engine:swiglu_implementation",
             saves="its input (linear_fc1's output, gate and up)", fuses="silu_gated_mlp"),
)


@functools.lru_cache(maxsize=None)
def _ops() -> Any:
    """The custom ops, defined once per process (a custom op cannot be defined twice)."""
    import torch

    define_fused_norm_ops("ndcost_te", "Transformer Engine's RMSNorm or Megatron-LM's bias_swiglu_impl on a GPU")
    return torch.ops.ndcost_te


@functools.lru_cache(maxsize=None)
def rms_norm_implementation() -> FusedRmsNorm:
    """``te-rms-norm``: the op :func:`rms_norm`'s module runs."""
    return FusedRmsNorm(_ops(), RMS_NORM, "transformer_engine.rmsnorm_fwd")


@functools.lru_cache(maxsize=None)
def swiglu_implementation() -> FusedSwiGlu:
    """``te-swiglu``: the op :func:`swiglu_mlp`'s module runs."""
    return FusedSwiGlu(_ops(), SWIGLU, "megatron.bias_swiglu_impl")


@functools.lru_cache(maxsize=None)
def module_classes():
    """``(TeRMSNorm, TeSwiGLUMLP)``, defined on first use (torch imported then)."""
    return fused_module_classes(_ops, "Te")


def rms_norm(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, an RMSNorm with a weight, as one running ``te-rms-norm``."""
    return fused_rms_norm(module, module_classes()[0])


def swiglu_mlp(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, a SiLU-gated MLP, as Megatron-LM's ``linear_fc1``, ``te-swiglu``,
    ``linear_fc2``."""
    return fused_swiglu_mlp(module, config, module_classes()[1])


@hookimpl
def ndcost_register(register):
    register_contracts(register, CONTRACTS)
