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

- ``te-grouped-mlp``: Megatron-LM's ``TEGroupedMLP`` behind the alltoall
  dispatcher's fused permutation (Megatron-LM d98e8a6
  megatron/core/transformer/moe/experts.py, token_dispatcher.py; Transformer
  Engine v2.9 transformer_engine/pytorch/permutation.py): the permutation
  keeps an int32 ``row_id_map [tokens, 2 E + 1]`` (``make_row_id_map``), which
  the unpermutation keeps too (one tensor); ``linear_fc1`` and ``linear_fc2``
  (``GroupedLinear``) keep their inputs; between them ``WeightedSwiGLUFunction``
  (megatron/core/fusions/fused_bias_swiglu.py) keeps its input and the
  permuted routing weights, in the router logits' dtype
  (moe_utils.py ``topk_routing_with_score_function``), which it scales by, so the unpermutation keeps
  none of the experts' outputs (Transformers' experts keep the gate, its
  SiLU, the up projection and the weighted outputs). GPT-OSS's experts run
  ``weighted_bias_quick_geglu_impl`` (megatron/core/fusions/fused_bias_geglu.py): its clamp runs
  eagerly, each half's ``clamp`` keeping ``linear_fc1``'s output and ``torch.cat`` making the copy
  ``WeightedQuickGeGLUFunction`` keeps with the weights; ``linear_fc1``'s bias is the GEMM's, and
  ``linear_fc2``'s is added by expert after it (experts.py ``_apply_bias``: ``b * p``, keeping the
  weights again).

The norm and SwiGLU keep what the NPU's fused kernels keep (``npu-rms-norm``,
``npu-swiglu``): the same ops (:func:`ndcost.plugins.contracts.define_fused_norm_ops`)
in a namespace of their own. The replacement factories :func:`rms_norm`,
:func:`swiglu_mlp` and :func:`grouped_mlp` put them in place of Transformers'
RMSNorms, SiLU-gated MLPs and SiLU-gated routed experts (a runtime profile's
``replacements``: ``megatron-te-cuda``'s).

Left out: Transformer Engine's FP8 copies of the linears' inputs (under
``float8`` it keeps a GEMM's input in FP8 for the weight's gradient, 1 byte
an element where the census counts the 16-bit activation), the expert-parallel
chunk sort's indices (a few per rank), and the norms' kernel workspaces.
"""
from __future__ import annotations

import functools
from typing import Any, Mapping, Tuple

from ndcost.hookspecs import hookimpl
from ndcost.plugins.contracts import (
    Contract,
    FusedRmsNorm,
    FusedSwiGlu,
    OpContract,
    clamped_glu_experts,
    define_fused_norm_ops,
    fake_only_op,
    fused_module_classes,
    fused_rms_norm,
    fused_swiglu_mlp,
    register_contracts,
    swiglu_experts,
)

RMS_NORM = "te-rms-norm"
SWIGLU = "te-swiglu"
GROUPED_MLP = "te-grouped-mlp"

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
    Contract(name=GROUPED_MLP, device="cuda",
             summary="Megatron-LM's TEGroupedMLP behind the fused permutation (moe_permute, GroupedLinear, "
                     "WeightedSwiGLUFunction, moe_unpermute), run by the grouped_mlp replacement",
             implementation="ndcost.plugins.contracts.transformer_engine:grouped_mlp_implementation",
             saves="the permutation's int32 row_id_map [tokens, 2 E + 1]; each grouped linear its input; the "
                   "weighted SwiGLU (GPT-OSS: the clamps linear_fc1's output, the weighted quick-GeGLU the "
                   "clamped copy) its input and the routing weights", fuses="gated_experts"),
)


@functools.lru_cache(maxsize=None)
def _ops() -> Any:
    """The custom ops, defined once per process (a custom op cannot be defined twice)."""
    import torch

    define_fused_norm_ops("ndcost_te", "Transformer Engine's RMSNorm or Megatron-LM's bias_swiglu_impl on a GPU")
    _define_grouped_mlp_ops()
    return torch.ops.ndcost_te


def _define_grouped_mlp_ops() -> None:
    """``ndcost_te::moe_permute``, ``grouped_linear``, ``weighted_swiglu`` and ``moe_unpermute``, each keeping what
    its Transformer Engine or Megatron-LM function keeps (the module docstring)."""
    import torch

    use = "on a GPU run Megatron-LM's TEGroupedMLP"

    def permute_fake(tokens, indices, probs, num_experts):
        routes = indices.numel()
        return (tokens.new_empty((routes, tokens.shape[-1])), probs.new_empty((routes,)),
                indices.new_empty((tokens.shape[0], 2 * num_experts + 1), dtype=torch.int32))

    permute = fake_only_op("ndcost_te::moe_permute",
                           "(Tensor tokens, Tensor indices, Tensor probs, int num_experts) -> (Tensor, Tensor, Tensor)",
                           permute_fake, use=use)

    def permute_setup(ctx, inputs, output):
        ctx.mark_non_differentiable(output[2])
        ctx.save_for_backward(output[2])
        ctx.shapes = (inputs[0].shape, inputs[2].shape)

    def permute_backward(ctx, grad, grad_probs, _map):
        tokens, probs = ctx.shapes
        return grad.new_empty(tokens), None, grad_probs.new_empty(probs), None

    permute.register_autograd(permute_backward, setup_context=permute_setup)

    grouped_linear = fake_only_op(
        "ndcost_te::grouped_linear", "(Tensor x, Tensor weight, Tensor group_list, Tensor? bias) -> Tensor",
        lambda x, weight, group_list, bias: x.new_empty((x.shape[0], weight.shape[1])), use=use)

    def grouped_linear_setup(ctx, inputs, output):  # the input and the weight; the bias's gradient needs neither
        ctx.save_for_backward(inputs[0], inputs[1])
        ctx.bias_shape = None if inputs[3] is None else inputs[3].shape

    def grouped_linear_backward(ctx, grad):
        x, weight = ctx.saved_tensors
        bias = None if ctx.bias_shape is None else grad.new_empty(ctx.bias_shape)
        return torch.empty_like(x), torch.empty_like(weight), None, bias

    grouped_linear.register_autograd(grouped_linear_backward, setup_context=grouped_linear_setup)

    def glu_fake(x, probs):
        return x.new_empty((x.shape[0], x.shape[1] // 2))

    def glu_backward(ctx, grad):
        x, probs = ctx.saved_tensors
        return torch.empty_like(x), torch.empty_like(probs)

    for name in ("weighted_swiglu", "weighted_quick_geglu"):  # each keeps its input and the weights
        fake_only_op(f"ndcost_te::{name}", "(Tensor x, Tensor probs) -> Tensor", glu_fake, use=use).register_autograd(
            glu_backward, setup_context=lambda ctx, inputs, output: ctx.save_for_backward(*inputs))

    expert_bias = fake_only_op(
        "ndcost_te::expert_bias", "(Tensor out, Tensor bias, Tensor probs, Tensor group_list) -> Tensor",
        lambda out, bias, probs, group_list: torch.empty_like(out), use=use)

    def expert_bias_setup(ctx, inputs, output):  # b * p by expert: the weights (the bias is a parameter)
        ctx.save_for_backward(inputs[2])
        ctx.bias_shape = inputs[1].shape

    def expert_bias_backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        return grad, grad.new_empty(ctx.bias_shape), torch.empty_like(probs), None

    expert_bias.register_autograd(expert_bias_backward, setup_context=expert_bias_setup)

    unpermute = fake_only_op(
        "ndcost_te::moe_unpermute", "(Tensor permuted, Tensor row_id_map) -> Tensor",
        lambda permuted, row_id_map: permuted.new_empty((row_id_map.shape[0], permuted.shape[-1])), use=use)

    def unpermute_setup(ctx, inputs, output):
        ctx.save_for_backward(inputs[1])
        ctx.routes = inputs[0].shape

    unpermute.register_autograd(lambda ctx, grad: (grad.new_empty(ctx.routes), None), setup_context=unpermute_setup)


@functools.lru_cache(maxsize=None)
def rms_norm_implementation() -> FusedRmsNorm:
    """``te-rms-norm``: the op :func:`rms_norm`'s module runs."""
    return FusedRmsNorm(_ops(), RMS_NORM, "transformer_engine.rmsnorm_fwd")


@functools.lru_cache(maxsize=None)
def swiglu_implementation() -> FusedSwiGlu:
    """``te-swiglu``: the op :func:`swiglu_mlp`'s module runs."""
    return FusedSwiGlu(_ops(), SWIGLU, "megatron.bias_swiglu_impl")


class _GroupedMlp(OpContract):
    """``te-grouped-mlp``: the ops :class:`TeGroupedMLP` runs. The grouped linears' inputs are the feed-forward's
    matmuls' saves, the weighted SwiGLU's its activation's, the row map the permutation's."""

    name = GROUPED_MLP
    forward = "grouped_linear"

    def __init__(self) -> None:
        super().__init__(_ops())
        self._saves_as = {self.forward_op: "ffMM", self.ops.weighted_swiglu.default: "ffAct",
                          self.ops.weighted_quick_geglu.default: "ffAct", self.ops.expert_bias.default: "ffAct",
                          self.ops.moe_permute.default: "other"}

    def stands_for(self) -> Mapping[Any, str]:
        return {self.forward_op: "transformer_engine.general_grouped_gemm",
                self.ops.weighted_swiglu.default: "megatron.weighted_bias_swiglu_impl",
                self.ops.weighted_quick_geglu.default: "megatron.weighted_bias_quick_geglu_impl",
                self.ops.expert_bias.default: "megatron.moe_experts_apply_bias",
                self.ops.moe_permute.default: "transformer_engine.moe_permute",
                self.ops.moe_unpermute.default: "transformer_engine.moe_unpermute"}

    def saved_op(self, func: Any, tensor: Any) -> Any:
        return self._saves_as.get(func)

    def matmul_flops(self, func: Any, args: Tuple[Any, ...]) -> int:
        if func is not self.forward_op:
            return 0
        x, weight = args[:2]
        return 2 * x.shape[0] * x.shape[1] * weight.shape[1]  # each routed row through its expert's weight

    def flop_formulas(self) -> Mapping[Any, Any]:
        def forward(x_shape, weight_shape, group_shape, bias_shape=None, out_shape=None, **kwargs):
            return 2 * x_shape[0] * x_shape[1] * weight_shape[1]

        return {self.ops.grouped_linear: forward}


@functools.lru_cache(maxsize=None)
def grouped_mlp_implementation() -> _GroupedMlp:
    return _GroupedMlp()


def _module_classes():
    import torch

    TeRMSNorm, TeSwiGLUMLP = fused_module_classes(_ops, "Te")

    class TeGroupedMLP(torch.nn.Module):
        """Routed experts as Megatron-LM's TEGroupedMLP runs them behind the fused permutation (``te-grouped-mlp``).

        Transformers' experts interface (tokens, top-k experts, top-k weights),
        the source's ``[E, 2I, hidden]`` and ``[E, hidden, I]`` weights kept.
        """

        def __init__(self, source: Any) -> None:
            super().__init__()
            self.gate_up_proj, self.down_proj = source.gate_up_proj, source.down_proj
            self.num_experts = source.gate_up_proj.shape[0]

        def forward(self, hidden_states: Any, top_k_index: Any, top_k_weights: Any) -> Any:
            ops = _ops()
            flat = hidden_states.view(-1, hidden_states.shape[-1])
            # the weights in the router logits' dtype, as Megatron-LM's topk_routing_with_score_function casts them
            permuted, probs, row_id_map = ops.moe_permute(flat, top_k_index, top_k_weights, self.num_experts)
            with torch.no_grad():
                group_list = torch.histc(top_k_index.reshape(-1).float(), bins=self.num_experts, min=0,
                                         max=self.num_experts).long()
            out = self.experts(ops, permuted, probs.unsqueeze(-1), group_list)
            return ops.moe_unpermute(out, row_id_map).view(hidden_states.shape)

        def experts(self, ops: Any, permuted: Any, weights: Any, group_list: Any) -> Any:
            """linear_fc1, the weighted SwiGLU, linear_fc2 over the routes in expert order."""
            activated = ops.weighted_swiglu(ops.grouped_linear(permuted, self.gate_up_proj, group_list, None), weights)
            return ops.grouped_linear(activated, self.down_proj, group_list, None)

    class TeClampedGroupedMLP(TeGroupedMLP):
        """GPT-OSS's routed experts as Megatron-LM's TEGroupedMLP runs them: biased grouped linears (the source's
        ``[E, hidden, 2I]`` and ``[E, I, hidden]`` weights, as views ``[E, out, in]``), the clamp eager, the
        weighted quick-GeGLU fused, the down projection's bias added by expert."""

        def __init__(self, source: Any) -> None:
            super().__init__(source)
            self.gate_up_proj_bias, self.down_proj_bias = source.gate_up_proj_bias, source.down_proj_bias
            self.limit = float(source.limit)

        def experts(self, ops: Any, permuted: Any, weights: Any, group_list: Any) -> Any:
            fc1 = ops.grouped_linear(permuted, self.gate_up_proj.transpose(1, 2), group_list, self.gate_up_proj_bias)
            gate, up = fc1.chunk(2, -1)  # weighted_bias_quick_geglu_impl's clamp, eager
            clamped = torch.cat((gate.clamp(max=self.limit), up.clamp(min=-self.limit, max=self.limit)), -1)
            out = ops.grouped_linear(ops.weighted_quick_geglu(clamped, weights), self.down_proj.transpose(1, 2),
                                     group_list, None)
            return ops.expert_bias(out, self.down_proj_bias, weights, group_list)

    return TeRMSNorm, TeSwiGLUMLP, TeGroupedMLP, TeClampedGroupedMLP


@functools.lru_cache(maxsize=None)
def module_classes():
    """``(TeRMSNorm, TeSwiGLUMLP, TeGroupedMLP, TeClampedGroupedMLP)``, defined on first use (torch imported
    then)."""
    return _module_classes()


def rms_norm(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, an RMSNorm with a weight, as one running ``te-rms-norm``."""
    return fused_rms_norm(module, module_classes()[0])


def swiglu_mlp(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, a SiLU-gated MLP, as Megatron-LM's ``linear_fc1``, ``te-swiglu``,
    ``linear_fc2``."""
    return fused_swiglu_mlp(module, config, module_classes()[1])


def grouped_mlp(module: Any, config: Any) -> Any:
    """Replacement factory: *module*, Transformers' SiLU-gated or GPT-OSS's clamped routed experts, as
    Megatron-LM's TEGroupedMLP (``te-grouped-mlp``); other experts as they are."""
    if swiglu_experts(module, config):
        return module_classes()[2](module)
    return module_classes()[3](module) if clamped_glu_experts(module) else module


@hookimpl
def ndcost_register(register):
    register_contracts(register, CONTRACTS)
