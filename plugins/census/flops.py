"""Forward FLOPs of a layer by part, and the bytes it moves by part, from one fake forward.

FLOPs come from ``torch.utils.flop_counter``'s formula registry (the one
``FlopCounterMode`` uses), overlaid per run with formulas it lacks or
miscounts: ``aten._grouped_mm`` (absent), grouped convolution's backward
(counted as if ungrouped), SDPA's flash, memory-efficient and cuDNN ops and
their backwards (counted at every pair where causal), and the kernel contracts' ops, whose attention
scores are counted at the pairs the causal kernel computes, and beside them
at all pairs. Each op counts toward the part of the layer running it
(:func:`ndcost.plugins.census.measure.module_part`); a matmul in the
attention that no weight takes part in is its scores', or the linear
recurrence's while a gated delta rule runs.

Traffic: an op reads its tensor arguments and writes its outputs; an op
that only aliases its input (a view, and the ops that return an input's
storage without a view annotation: ``aten._unsafe_view``, which every
``nn.Linear`` on a 3-D input runs after its ``mm``, ``aten.lift_fresh``,
``aten.alias``) moves nothing and launches no kernel, so it counts for
neither, nor for FLOPs. The parameters' share of the bytes read is kept
apart, as a strategy divides it where it leaves the activations' alone.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Mapping

import attrs

from ndcost.plugins.census.measure import ModuleStack, aliases_only
from ndcost.plugins.census.selective import grouped_mm_flops


@attrs.frozen(kw_only=True)
class ForwardCount:
    """A layer's forward on one sequence: FLOPs by part (as run and at all pairs) and traffic by part."""

    flops: Dict[str, int]
    all_pairs_flops: Dict[str, int]
    moved_bytes: Dict[str, int]
    parameter_bytes: Dict[str, int]
    launches: Dict[str, int]
    # of the above, what autograd records no backward for (no output of the op requires grad: a module's no_grad
    # work, as DeepSeek-V3.2's indexer, and integer bookkeeping): FLOPs by part, and the bytes its FLOP-less ops
    # move beyond the weights they read; empty where the forward ran without autograd (nothing told apart)
    forward_only_flops: Dict[str, int] = attrs.field(factory=dict)
    forward_only_moved_bytes: Dict[str, int] = attrs.field(factory=dict)

    def traffic(self) -> Dict[str, Dict[str, int]]:
        return {"moved_bytes": dict(self.moved_bytes), "parameter_bytes": dict(self.parameter_bytes),
                "launches": dict(self.launches), "forward_only_moved_bytes": dict(self.forward_only_moved_bytes)}


def _grouped_mm_formula(a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    return grouped_mm_flops(tuple(a_shape), tuple(b_shape))


def _conv_backward_formula(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                           _output_padding, groups, output_mask, out_shape=None) -> int:
    """Grouped convolution backward: each of grad-input and grad-weight costs what the forward costs.

    A convolution's forward costs 2 x (output elements) x (input channels
    per group) x (kernel size); ``w_shape`` already holds the channels per
    group, so this is right for any ``groups``, where the registry's
    formula rebuilds the transposed convolution's shapes ungrouped.
    """
    import math
    forward = 2 * math.prod(grad_out_shape) * math.prod(w_shape[1:])
    if transposed:
        forward = 2 * math.prod(x_shape) * math.prod(w_shape[1:])
    return forward * (int(bool(output_mask[0])) + int(bool(output_mask[1])))


def _sdpa_formulas() -> Dict[str, Any]:
    """SDPA's flash, memory-efficient and cuDNN ops and their backwards at the pairs the kernel computes.

    ``FlopCounterMode``'s own formulas count every query-key pair, where a
    causal kernel skips those above the diagonal (about half). Each formula
    reads ``is_causal`` at its place in the op's schema.
    """
    from ndcost.plugins.contracts.cuda_sdpa import backward_flops, forward_flops

    def forward(causal_at: int):
        def formula(q, k, v, *args, out_shape=None, **kwargs):
            causal = kwargs.get("is_causal", args[causal_at - 3] if len(args) > causal_at - 3 else False)
            return forward_flops(tuple(q), tuple(k), tuple(v), bool(causal))[0]
        return formula

    def backward(causal_at: int):
        def formula(grad, q, k, v, *args, out_shape=None, **kwargs):
            causal = kwargs.get("is_causal", args[causal_at - 4] if len(args) > causal_at - 4 else False)
            return backward_flops(tuple(q), tuple(k), tuple(v), bool(causal))
        return formula

    # the index of is_causal in each schema
    return {"_scaled_dot_product_flash_attention": forward(4),
            "_scaled_dot_product_efficient_attention": forward(6),
            "_scaled_dot_product_cudnn_attention": forward(6),
            "_scaled_dot_product_flash_attention_backward": backward(11),
            "_scaled_dot_product_efficient_attention_backward": backward(11),
            "_scaled_dot_product_cudnn_attention_backward": backward(14)}


@functools.lru_cache(maxsize=None)
def _overlay_base() -> Dict[Any, Any]:
    import torch
    from torch.utils.flop_counter import shape_wrapper
    out = {torch.ops.aten._grouped_mm: shape_wrapper(_grouped_mm_formula),
           torch.ops.aten.convolution_backward: shape_wrapper(_conv_backward_formula)}
    for name, formula in _sdpa_formulas().items():
        out[getattr(torch.ops.aten, name)] = shape_wrapper(formula)
    return out


def flop_formulas(contracts=()) -> Dict[Any, Any]:
    """``torch.utils.flop_counter``'s registry overlaid with the census's formulas and *contracts*'."""
    from torch.utils.flop_counter import flop_registry, shape_wrapper
    formulas = dict(flop_registry)
    formulas.update(_overlay_base())
    for contract in contracts:
        for packet, formula in contract.flop_formulas().items():
            formulas[packet] = formula if getattr(formula, "_get_raw", False) else shape_wrapper(formula)
    return formulas


def custom_mapping(contracts=()) -> Dict[Any, Any]:
    """The overlay alone, in the form ``FlopCounterMode(custom_mapping=...)`` takes."""
    out = {packet: getattr(formula, "__wrapped__", formula) for packet, formula in _overlay_base().items()}
    for contract in contracts:
        out.update(contract.flop_formulas())
    return out


@functools.lru_cache(maxsize=None)
def counter_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    scores_ops = {"_softmax", "_log_softmax", "bmm", "baddbmm"}

    class _ForwardCounter(TorchDispatchMode):
        def __init__(self, stack: ModuleStack, params, contracts, formulas: Mapping[Any, Any],
                     seq: int = 0, autograd: bool = False) -> None:
            super().__init__()
            self.stack = stack
            self.params = params
            self.contracts = list(contracts)
            self.formulas = formulas
            self.seq = seq  # the layer's tokens a sequence: a tensor of seq x (at least) seq scores is the scores'
            self.flops: Dict[str, int] = {}
            self.all_pairs: Dict[str, int] = {}
            self.moved: Dict[str, int] = {}
            self.parameter: Dict[str, int] = {}
            self.launches: Dict[str, int] = {}
            # under autograd, each counted op's (part of its FLOPs, FLOPs, part of its bytes, bytes beyond the
            # weights, outputs): after the forward, those whose outputs require no grad are the forward-only work
            self.autograd = autograd
            self.ops: list = []

        def count(self) -> ForwardCount:
            """What was counted; the forward-only tables where the forward ran under autograd."""
            only_flops: Dict[str, int] = {}
            only_moved: Dict[str, int] = {}
            for flops_part, flops, part, moved, returned in self.ops:
                if any(t.requires_grad for t in returned):
                    continue
                if flops:
                    self._add(only_flops, flops_part, flops)
                else:
                    self._add(only_moved, part, moved)
            return ForwardCount(flops=self.flops, all_pairs_flops=self.all_pairs, moved_bytes=self.moved,
                                parameter_bytes=self.parameter, launches=self.launches,
                                forward_only_flops=only_flops, forward_only_moved_bytes=only_moved)

        def _add(self, table: Dict[str, int], part: str, value: int) -> None:
            table[part] = table.get(part, 0) + int(value)

        def _pairs(self, tensor, dims: int) -> bool:
            """Whether *tensor* (of at least *dims* dimensions: a head's scores are [b, h, s, s]; a hidden state
            [b, s, h] is not, however wide) holds a score for each query and key of the sequence."""
            return tensor.dim() >= dims and tensor.shape[-2] == self.seq and tensor.shape[-1] >= self.seq

        def _part(self, func, weighted: bool) -> str:
            for contract in self.contracts:
                found = contract.part(func)
                if found is not None:
                    return found
            part = self.stack.part()
            if part == "attention" and self.stack.delta_rule:
                return "linrec"
            if part == "attention" and not weighted and func._opname in scores_ops:
                return "scores"
            return part

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func.namespace == "prim":
                return out
            tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
            returned = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            if aliases_only(func, tensors, returned):
                return out
            weights = [t for t in tensors if t.untyped_storage()._cdata in self.params]
            part = self._part(func, bool(weights))
            if part == "attention" and self.seq and (
                    (not weights and any(self._pairs(t, 2) for t in returned))
                    or any(self._pairs(t, 4) for t in tensors + returned)):
                # eager attention's elementwise ops on the scores (scaling, mask, casts; GPT-OSS's concatenation
                # of its sinks, a weight, and its max over [b, h, s, s + 1]): they grow with the pairs, not the
                # tokens; the time model prices them with the scores (compose/time.py
                # EAGER_SOFTMAX_BYTES_PER_SCORE), not as the layer's
                part = "scores"
            counted = None
            flops_part, flops = part, 0
            for contract in self.contracts:
                counted = contract.flops(func, args, kwargs, out)
                if counted is not None:
                    flops_part, flops = counted.part, counted.flops
                    self._add(self.flops, counted.part, counted.flops)
                    self._add(self.all_pairs, counted.part, counted.all_pairs_flops)
                    break
            if counted is None:
                formula = self.formulas.get(func._overloadpacket)
                if formula is not None:
                    flops = formula(*args, **kwargs, out_val=out)
                    self._add(self.flops, part, flops)
                    self._add(self.all_pairs, part, flops)
            moved = sum(t.numel() * t.element_size() for t in tensors)
            moved += sum(t.numel() * t.element_size() for t in returned)
            weight_bytes = sum(t.numel() * t.element_size() for t in weights)
            self._add(self.moved, part, moved)
            self._add(self.parameter, part, weight_bytes)
            self._add(self.launches, part, 1)
            if self.autograd:
                self.ops.append((flops_part, int(flops), part, moved - weight_bytes, returned))
            return out

    return _ForwardCounter


def count_forward(fake, seq: int) -> ForwardCount:
    """FLOPs and traffic of one forward of *fake*'s layer (a :class:`~ndcost.plugins.census.layer.FakeLayer`)."""
    import torch
    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census.measure import delta_rule_followed

    # under autograd, as training runs it: what records no backward is told apart (ForwardCount.forward_only_flops)
    hidden = L.hidden_input(fake.config, seq, requires_grad=True)
    where = L.positions(fake, hidden)
    mask = L.attention_mask(fake, hidden, where[0])
    stack = ModuleStack(fake.layer)
    params = {p.untyped_storage()._cdata for p in fake.layer.parameters()}
    counter = counter_class()(stack, params, fake.contracts, flop_formulas(fake.contracts), seq, autograd=True)
    try:
        with torch.enable_grad(), delta_rule_followed(fake.modeling, fake.layer, stack), counter:
            L.run(fake, hidden, where, mask)
    finally:
        stack.close()
    return counter.count()
