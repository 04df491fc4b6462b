"""Selective activation checkpointing policies, registered as ``checkpoint_policy/<name>``.

Two scopes:

- ``layer``: the whole decoder layer runs under ``torch.utils.checkpoint``
  with ``create_selective_checkpoint_contexts`` and an op-level policy: the
  outputs of the ops in ``saves`` are kept, every second call of the op in
  ``alternate`` is recomputed (counted apart in the forward and in the
  recompute), everything else is recomputed. torchtitan's default
  (``torchtitan``) is this scope.
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

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

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
    alternate: Optional[str] = None

    def op_policy(self, stands_for: Mapping[Any, str] = None,
                  note: Optional[Callable[[Any, Tuple[Any, ...], bool, bool], None]] = None) -> Callable[..., Any]:
        """A policy function for ``create_selective_checkpoint_contexts``, with its own mm counters.

        *stands_for* maps contract ops to the runtime operators they stand
        for. *note*, if given, is called for every decision as ``note(func,
        args, saved, is_recompute)``.
        """
        from torch.utils.checkpoint import CheckpointPolicy as Decision

        saves = {_base(n) for n in self.saves}
        alternate = _base(self.alternate) if self.alternate else None
        aliases = {op: _base(name) for op, name in (stands_for or {}).items()}
        counts: Dict[bool, int] = {False: 0, True: 0}

        def policy(ctx, func, *args, **kwargs):
            name = aliases.get(func) or _base(str(func))
            save = name in saves
            if save and name == alternate:
                counts[ctx.is_recompute] += 1
                save = counts[ctx.is_recompute] % 2 == 1  # the first saved, the second recomputed, ...
            if note is not None:
                note(func, args, save, ctx.is_recompute)
            return Decision.MUST_SAVE if save else Decision.PREFER_RECOMPUTE

        return policy


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
