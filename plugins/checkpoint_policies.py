"""Selective activation checkpointing policies, registered as ``checkpoint_policy/<name>``.

Two scopes:

- ``layer``: the whole decoder layer runs under ``torch.utils.checkpoint``
  with ``create_selective_checkpoint_contexts`` and an op-level policy: the
  outputs of the ops in ``saves`` are kept, every second call of the ops in
  ``alternate`` is recomputed (one counter for all of them, counted apart
  in the forward and in the recompute), the ops in ``recomputes`` always
  are, everything else is recomputed. torchtitan's default
  (``torchtitan``) and HyperParallel's (``hyperparallel``) are this scope.
- ``core_attention``: only the attention function (Transformers' attention
  interface: QK^T, softmax, dropout, PV or the fused kernel) runs under a
  plain checkpoint, keeping its inputs; the rest of the layer saves as
  without checkpointing. Megatron-LM's ``recompute_granularity=selective``
  with ``recompute_modules=[core_attn]`` is this scope.

Ops are named as strings (``aten.mm.default``) so registering a policy does
not import torch. A kernel contract's op is decided on as the runtime
operator it stands for (``KernelContract.stands_for``).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Optional, Tuple

import attrs

from ndcost.hookspecs import hookimpl

SCOPES = ("layer", "core_attention")


def _base(name: str) -> str:
    """An op name without its overload: ``aten.mm.default`` -> ``aten.mm``."""
    return name[: -len(".default")] if name.endswith(".default") else name


@attrs.frozen(kw_only=True)
class CheckpointPolicy:
    """A selective checkpointing policy (see the module docstring for the scopes)."""

    name: str
    summary: str
    scope: str = attrs.field(default="layer", validator=attrs.validators.in_(SCOPES))
    saves: Tuple[str, ...] = attrs.field(default=(), converter=tuple)
    alternate: Tuple[str, ...] = attrs.field(default=(), converter=lambda v: (v,) if isinstance(v, str)
                                             else tuple(v or ()))
    recomputes: Tuple[str, ...] = attrs.field(default=(), converter=tuple)

    def op_policy(self, stands_for: Mapping[Any, str] = None,
                  note: Optional[Callable[[Any, Tuple[Any, ...], bool, bool], None]] = None) -> Callable[..., Any]:
        """A policy function for ``create_selective_checkpoint_contexts``, with its own mm counters.

        *stands_for* maps contract ops to the runtime operators they stand
        for. *note*, if given, is called for every decision as ``note(func,
        args, saved, is_recompute)``.
        """
        from torch.utils.checkpoint import CheckpointPolicy as Decision

        aliases = dict(stands_for or {})
        saves = {False: self.decider(), True: self.decider()}  # the forward's and the recompute's counters

        def policy(ctx, func, *args, **kwargs):
            save = saves[ctx.is_recompute](aliases.get(func) or str(func))
            if note is not None:
                note(func, args, save, ctx.is_recompute)
            return Decision.MUST_SAVE if save else Decision.PREFER_RECOMPUTE

        return policy

    def decider(self) -> Callable[[str], bool]:
        """``save(op_name)``: whether the policy keeps the output of the next call, with its own counter.

        One forward's calls (or one recompute's) go through one decider, in
        order; the op records' formulas decide on a layer's listed calls with
        it (``ndcost.plugins.op_records.policy_saves``), the census on the ops
        it dispatches (:meth:`op_policy`), so both read this one rule.
        """
        saves = {_base(n) for n in self.saves}
        alternate = {_base(n) for n in self.alternate}
        recomputes = {_base(n) for n in self.recomputes}
        count = [0]

        def save(op_name: str) -> bool:
            name = _base(op_name)
            if name in alternate:
                count[0] += 1
                return count[0] % 2 == 1  # the first saved, the second recomputed, ...
            return name in saves and name not in recomputes

        return save


BUILTIN = (
    CheckpointPolicy(
        name="torchtitan",
        summary="torchtitan's op-level SAC: keep mm (every second one recomputed), SDPA flash/efficient/cuDNN, "
                "reduce_scatter and max outputs; recompute the rest",
        scope="layer",
        saves=("aten.mm.default",
               "aten._scaled_dot_product_flash_attention.default",
               "aten._scaled_dot_product_efficient_attention.default",
               "aten._scaled_dot_product_cudnn_attention.default",
               "_c10d_functional.reduce_scatter_tensor.default",
               "aten.max.default"),
        alternate="aten.mm.default",
    ),
    CheckpointPolicy(
        name="hyperparallel",
        summary="HyperParallel's eager selective AC: matmuls (mm, matmul, linear, grouped_mm) alternate on one "
                "counter; PyTorch's compute-intensive ops, SDPA and NPU fusion attention, max and the collectives "
                "saved; topk and the rest recomputed",
        scope="layer",
        # hyper_parallel.distributed.activation_checkpoint: _SELECTIVE_AC_COMPUTE_OP_NAMES and
        # _SELECTIVE_AC_COMM_OP_NAMES, with torch._functorch.partitioners' compute-intensive ops
        saves=("aten.mm", "aten.addmm", "aten.bmm", "aten.linear", "aten._scaled_mm",
               "aten.convolution", "aten.convolution_backward", "aten.upsample_bilinear2d",
               "aten._efficient_attention_forward", "aten._flash_attention_forward",
               "aten._scaled_dot_product_cudnn_attention", "aten._scaled_dot_product_efficient_attention",
               "aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_flash_attention_for_cpu",
               "aten._scaled_dot_product_fused_attention_overrideable", "aten.scaled_dot_product_attention",
               "npu.npu_fusion_attention", "npu.npu_fusion_attention_v3", "aten._flex_attention", "aten.max",
               "aten.all_to_all_single", "aten.reduce_scatter_tensor", "_c10d_functional.all_to_all_single",
               "_c10d_functional.reduce_scatter_tensor", "c10d.allreduce_"),
        # _SELECTIVE_AC_MATMUL_OPS (one counter) and _SELECTIVE_AC_FORCE_RECOMPUTE_OPS
        alternate=("aten.matmul", "aten.mm", "aten.linear", "aten._grouped_mm", "aten._scaled_grouped_mm"),
        recomputes=("aten.topk",),
    ),
    CheckpointPolicy(
        name="megatron-core-attention",
        summary="Megatron-LM selective recompute of the core attention (recompute_modules=[core_attn]): "
                "the attention function keeps its inputs and runs again in the backward",
        scope="core_attention",
    ),
)


@hookimpl
def ndcost_register(register):
    for policy in BUILTIN:
        register(f"checkpoint_policy/{policy.name}", policy)
