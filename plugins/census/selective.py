"""A layer under selective activation checkpointing: what it keeps, and the matmul FLOPs it runs again.

The layer runs as a trainer wraps it: ``torch.utils.checkpoint.checkpoint``
(non-reentrant, RNG state not preserved, as torchtitan calls it) with
``create_selective_checkpoint_contexts`` and the runtime's policy
(``checkpoint_policy/<name>``), fresh counters for every call. The rotary
embeddings and the mask are computed once by the model outside the layer's
checkpoint, so they are not the layer's (the memory model counts them once
a stage: ``KindRecord.shared_saved_per_token``). What the layer keeps is what is
live once its forward has returned: its input and what the policy saved.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any, Dict, Iterator, Mapping, Tuple

from ndcost.plugins.census import layer as L
from ndcost.records import recomputed_shares
from ndcost.plugins.census.measure import Measured, measure

_MATMULS = ("mm", "addmm", "bmm", "baddbmm", "_grouped_mm")


def matmul_flops(func: Any, args: Tuple[Any, ...]) -> int:
    """Matmul FLOPs of one call of *func* on *args* (two per multiply-add of each output element); 0 for a non-matmul."""
    name = getattr(func, "_opname", "")
    if name not in _MATMULS:
        return 0
    first, second = (args[1], args[2]) if name in ("addmm", "baddbmm") else (args[0], args[1])
    if name == "_grouped_mm":
        return grouped_mm_flops(tuple(first.shape), tuple(second.shape))
    return 2 * first.numel() * second.shape[-1]


def grouped_mm_flops(a: Tuple[int, ...], b: Tuple[int, ...]) -> int:
    """FLOPs of ``aten._grouped_mm(a, b, offs)``: each row (or, 2D x 2D, each reduction slice) in one group."""
    if len(a) == 2 and len(b) == 3:       # tokens [M, K] through experts [G, K, N]
        return 2 * a[0] * a[1] * b[2]
    if len(a) == 2 and len(b) == 2:       # weight gradient: [K, M] x [M, N], M split into groups
        return 2 * a[0] * a[1] * b[1]
    if len(a) == 3 and len(b) == 2:       # [G, M, K] x [K, N] split along N
        return 2 * a[1] * a[2] * b[1]
    return 2 * a[0] * a[1] * a[2] * b[-1]  # batched [G, M, K] x [G, K, N]


class RecomputeLedger:
    """What a selective policy decided on in the forward, saved or recomputed, by class
    (:func:`ndcost.records.recomputed_shares`): matmul FLOPs with a weight of the attention's
    (*attention_storages*), with another weight (*parameter_storages*), with none; and a fused kernel's calls (a
    contract op running as the scores or a linear recurrence)."""

    def __init__(self, attention_storages, contracts=(), parameter_storages=()) -> None:
        self.attention = set(attention_storages)
        self.parameters = set(parameter_storages) | self.attention
        self.contracts = list(contracts)  # their matmuls (a fused module's grouped GEMMs) count as aten's do
        self.flops: Dict[Tuple[str, bool], int] = {}
        self.decisions = []

    def note(self, func: Any, args: Tuple[Any, ...], saved: bool, is_recompute: bool) -> None:
        import torch
        self.decisions.append((str(func), saved, is_recompute))
        if is_recompute:
            return
        if any(c.part(func) in ("scores", "linrec") for c in self.contracts):
            self.flops[("kernel", not saved)] = self.flops.get(("kernel", not saved), 0) + 1
            return
        flops = matmul_flops(func, args) or sum(c.matmul_flops(func, args) for c in self.contracts)
        if flops:
            storages = {a.untyped_storage()._cdata for a in args if isinstance(a, torch.Tensor)}
            kind = ("attention" if storages & self.attention else "other" if storages & self.parameters
                    else "scores")
            self.flops[(kind, not saved)] = self.flops.get((kind, not saved), 0) + flops

    def shares(self) -> Dict[str, float]:
        """The share of each class the backward runs again (:func:`ndcost.records.recomputed_shares`)."""
        return recomputed_shares(self.flops)


def _stands_for(contracts) -> Mapping[Any, str]:
    out: Dict[Any, str] = {}
    for contract in contracts:
        out.update(contract.stands_for())
    return out


@contextlib.contextmanager
def _core_attention_checkpointed() -> Iterator[None]:
    """Transformers' attention functions run under a plain checkpoint while the context lasts."""
    import torch
    from transformers import modeling_utils

    interfaces = modeling_utils.ALL_ATTENTION_FUNCTIONS
    original = interfaces.get_interface

    def get_interface(implementation, default):
        function = original(implementation, default)

        @functools.wraps(function)
        def checkpointed(module, *args, **kwargs):
            return torch.utils.checkpoint.checkpoint(function, module, *args, use_reentrant=False,
                                                     preserve_rng_state=False, **kwargs)
        return checkpointed

    interfaces.get_interface = get_interface
    try:
        yield
    finally:
        del interfaces.get_interface


def measure_selective(fake: L.FakeLayer, policy: Any, seq: int,
                      ledger: RecomputeLedger = None) -> Measured:
    """What *fake*'s layer keeps under *policy* (its input included), and the backward's peak."""
    import torch
    from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

    hidden = L.hidden_input(fake.config, seq)
    grad = torch.empty_like(hidden, requires_grad=False)
    where = L.positions(fake, hidden)
    mask = L.attention_mask(fake, hidden, where[0])
    params = list(fake.layer.parameters())
    shared = L.handed(where, mask)
    if policy.scope == "layer":
        stands_for = _stands_for(fake.contracts)

        def context_fn():
            return create_selective_checkpoint_contexts(
                policy.op_policy(stands_for, note=ledger.note if ledger is not None else None))

        call = functools.partial(checkpoint, fake.layer, use_reentrant=False, preserve_rng_state=False,
                                 context_fn=context_fn)
        scope = contextlib.nullcontext()
    else:
        call = None
        scope = _core_attention_checkpointed()
        # the layer itself is not checkpointed: it keeps what it saves outside the attention, and its input
        # only where an op saves it; the rotary tables are the stage's (KindRecord.shared_saved_per_token)
    with scope:
        return measure(params, (hidden,), lambda: L.run(fake, hidden, where, mask, call),
                       lambda out: out.backward(grad), grad_inputs=(grad,), checkpointed=True, shared=shared,
                       inputs_kept=policy.scope == "layer")


def attention_storages(layer: Any) -> set:
    """Storages of the parameters of the layer's attention child (a child named for attention)."""
    from ndcost.plugins.census.measure import module_part
    out = set()
    for path, module in layer.named_modules():
        if path and module_part(path, module) == "attention":
            out.update(p.untyped_storage()._cdata for p in module.parameters(recurse=False))
    return out
