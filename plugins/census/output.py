"""The output layer's census: the final norm, the LM head and Transformers' causal-LM loss.

Run as a trainer runs them: the loss (``transformers.loss.loss_utils.
ForCausalLMLoss``, which upcasts the logits to fp32) holds what the backward
needs, and the model's logits are dropped before the backward. Measured at
the full vocabulary and at half of it: the bytes the half changes are those
a vocabulary-parallel loss over two ranks splits.
"""
from __future__ import annotations

import copy
import importlib
from typing import Any, Dict, Mapping

from ndcost.records import KindRecord

KIND = "output"


def output_config(hf_config: Mapping[str, Any]) -> Dict[str, Any]:
    """What decides the output layer's census, for its cache key."""
    keep = ("model_type", "hidden_size", "vocab_size", "hidden_act")
    return {k: v for k, v in sorted(hf_config.items())
            if k in keep or "norm" in k or "eps" in k or "logit" in k or "softcap" in k}


def _holder(config: Any, runtime: Any, norm: Any):
    """A module holding ``norm`` (the final norm, of the class of a layer's input norm) and ``lm_head``."""
    import torch

    from ndcost.plugins.census import layer as L

    holder = torch.nn.Module()
    holder.norm = norm
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        holder.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False,
                                         device=norm.weight.device)
    finally:
        torch.set_default_dtype(default)
    if runtime.replacements:
        L._replaced(holder, config, runtime.replacements)
    return holder


def measure_output(config: Any, seq: int, runtime: Any):
    """(Measured, ForwardCount) of the output layer of *config* at *seq* tokens."""
    import torch

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census.flops import ForwardCount, _counter_class, flop_formulas
    from ndcost.plugins.census.measure import ModuleStack, measure

    loss_function = importlib.import_module("transformers.loss.loss_utils").ForCausalLMLoss
    # the layer is built only for its input norm's class; contracts and replacements apply to the holder
    with L.fake_layer(config, 0, runtime, contracts=False, replacements=False) as fake:
        holder = _holder(config, runtime, fake.layer.input_layernorm)
        hidden = torch.empty(1, seq, config.hidden_size, dtype=torch.bfloat16, requires_grad=True)
        labels = torch.zeros(1, seq, dtype=torch.long)
        params = list(holder.parameters())

        def forward():
            return loss_function(holder.lm_head(holder.norm(hidden)), labels, config.vocab_size)

        measured = measure(params, (hidden,), forward, lambda loss: loss.backward())
        stack = ModuleStack(holder)
        counter = _counter_class()(stack, {p.untyped_storage()._cdata for p in params}, (), flop_formulas())
        try:
            with torch.no_grad(), counter:
                forward()
        finally:
            stack.close()
    counted = ForwardCount(flops=counter.flops, all_pairs_flops=counter.all_pairs, moved_bytes=counter.moved,
                           parameter_bytes=counter.parameter, launches=counter.launches)
    return measured, counted


def census_output(config: Any, seq: int, runtime: Any) -> KindRecord:
    """The output layer's KindRecord; its TP part is what a vocabulary-parallel split divides."""
    from ndcost.plugins.census.records import SOURCE, split

    half = copy.deepcopy(config)
    half.vocab_size = max(1, config.vocab_size // 2)
    (one, counted), (two, _) = measure_output(config, seq, runtime), measure_output(half, seq, runtime)
    saved, saved_tp = split(one.saved_bytes, two.saved_bytes, seq)
    working, working_tp = split(one.working_bytes, two.working_bytes, seq)
    return KindRecord(kind=KIND, seq=seq, source=SOURCE, saved_per_token=saved, saved_tp_per_token=saved_tp,
                      working_per_token=working, working_tp_per_token=working_tp,
                      flops_by_part=counted.flops, flops_all_pairs_by_part=counted.all_pairs_flops,
                      traffic=counted.traffic())
