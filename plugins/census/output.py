"""The output layer's census: the final norm, the LM head and Transformers' causal-LM loss (and what a family
runs between its last layer and its norm, its ``output_prelude``: DeepSeek-V4's hyper-connection head).

Run as a trainer runs them: the loss (``transformers.loss.loss_utils.
ForCausalLMLoss``, which upcasts the logits to fp32) holds what the backward
needs, and the model's logits are dropped before the backward. Measured at
the full vocabulary and at half of it: the bytes the half changes are those
a vocabulary-parallel loss over two ranks splits.
"""
from __future__ import annotations

import contextlib
import copy
import importlib
from typing import Any, Dict, Iterator, Mapping, Tuple

from ndcost.records import KindRecord

KIND = "output"


def output_config(hf_config: Mapping[str, Any]) -> Dict[str, Any]:
    """What decides the output layer's census, for its cache key (a multimodal config's text part).

    ``pad_token_id`` is in it: the census builds the base model, whose embedding takes it as its padding row.
    """
    keep = ("model_type", "hidden_size", "vocab_size", "hidden_act", "n_embd", "layer_norm_epsilon", "pad_token_id")
    text = hf_config.get("text_config")
    source = {**hf_config, **text} if isinstance(text, Mapping) else hf_config
    streams = _prelude(str(source.get("model_type", "")))[1]
    keep += (streams,) if streams else ()
    return {k: v for k, v in sorted(source.items())
            if k in keep or "norm" in k or "eps" in k or "logit" in k or "softcap" in k}


def text_config(config: Any) -> Any:
    """The decoder's config: *config* itself, or a multimodal config's text part (Qwen3.5)."""
    if getattr(config, "hidden_size", None) or not hasattr(config, "get_text_config"):
        return config
    return config.get_text_config(decoder=True)


def _base_model_class(config: Any, modeling: Any) -> type:
    """The model class whose forward ends with the final norm (``LlamaModel``, ``GPT2Model``, ``Olmo2Model``)."""
    import transformers

    from ndcost.errors import CensusUnavailable

    try:
        found = transformers.AutoModel._model_mapping[type(config)]
        if found.__module__ == modeling.__name__:
            return found
    except (KeyError, ValueError):
        pass
    candidates = [cls for name, cls in vars(modeling).items()
                  if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)
                  and cls.__module__ == modeling.__name__ and name.endswith("Model")
                  and not name.endswith("PreTrainedModel")
                  and not any(w in name for w in ("Vision", "Audio", "Encoder", "MTP"))]
    candidates.sort(key=lambda cls: "Text" not in cls.__name__)
    if not candidates:
        raise CensusUnavailable(f"{modeling.__name__} defines no base model class the output census can take "
                                f"the final norm from; price the output layer from the formulas (census='off')")
    return candidates[0]


def _stack_norm(model: Any) -> Any:
    """The norm after the decoder stack: the last norm child of the module holding the layers."""
    import torch

    owners = [module for name, module in model.named_modules()
              if not any(w in name for w in ("visual", "vision", "audio", "encoder", "mtp"))
              and any(isinstance(child, torch.nn.ModuleList) and child_name in ("layers", "h", "blocks")
                      for child_name, child in module.named_children())]
    for owner in owners:
        norms = [module for name, module in owner.named_children()
                 if not isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict))
                 and "norm" in type(module).__name__.lower()]
        if norms:
            return norms[-1]
    return None


def _prelude(model_type: str) -> Tuple[Tuple[str, ...], str]:
    """The family's ``output_prelude`` and ``output_streams`` (none for a family that states none)."""
    from ndcost.plugins.census.stack import _family

    family = _family(model_type)
    return tuple(getattr(family, "output_prelude", ()) or ()), str(getattr(family, "output_streams", "") or "")


def final_norm(config: Any, modeling: Any) -> Any:
    """The final norm as the model builds it: its base model's own, built with one layer (fake tensors active).

    The last norm child of the module holding the decoder layers (``norm``,
    GPT-2's ``ln_f``): the model's ``__init__`` decides its class, width and
    options, so a family with post-norms only (OLMo-2), a LayerNorm with a
    bias (GPT-2) or a norm of its own class is built as it is.
    """
    return output_modules(config, modeling)[1]


def output_modules(config: Any, modeling: Any) -> Tuple[Any, Any]:
    """The modules the base model runs between its last layer and its final norm (the family's
    ``output_prelude``, as one ``Sequential``; None where it names none), and :func:`final_norm`."""
    import torch

    from ndcost.errors import CensusUnavailable

    one = copy.deepcopy(config)
    layers = getattr(one, "num_hidden_layers", None)
    if isinstance(layers, int) and layers > 1:
        for name, value in list(vars(one).items()):
            if isinstance(value, list) and len(value) == layers:
                setattr(one, name, value[:1])  # per-layer lists (layer_types) at the one layer built
        one.num_hidden_layers = 1
    from ndcost.plugins.census.stack import fake_module_conversions

    with fake_module_conversions():  # DeepSeek-V4's norm.to(torch.float32) on a fake parameter
        model = _base_model_class(one, modeling)(one)
    norm = _stack_norm(model)
    if norm is None:
        raise CensusUnavailable(f"{type(model).__name__} holds no final norm the output census recognises (a norm "
                                f"beside its decoder layers); price the output layer from the formulas "
                                f"(census='off')")
    names = _prelude(str(getattr(config, "model_type", "")))[0]
    missing = [name for name in names if not isinstance(getattr(model, name, None), torch.nn.Module)]
    if missing:
        raise CensusUnavailable(f"{type(model).__name__} has no module {', '.join(missing)} its family's "
                                f"output_prelude names; price the output layer from the formulas (census='off')")
    return (torch.nn.Sequential(*(getattr(model, name) for name in names)) if names else None), norm


@contextlib.contextmanager
def output_holder(config: Any, runtime: Any, fp32: bool = False) -> Iterator[Any]:
    """A module holding ``norm`` (the model's final norm) and ``lm_head``, on fake tensors in bf16 (or fp32), and
    ``prelude`` where the family runs modules between its last layer and its norm (:func:`output_modules`).

    The runtime's replacements apply to it (path ``norm`` for the final
    norm) and its profile-wide kernel contracts are active while the context
    lasts (CUDA's layer norm keeps fp32 statistics, as GPT-2's ``ln_f`` shows).
    """
    import torch

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.contracts import Site

    config = text_config(config)
    modeling = L.modeling_module(config)
    model_type = str(getattr(config, "model_type", ""))
    loaded = L.load_contracts(runtime.contracts, model_type, runtime.name)
    with contextlib.ExitStack() as stack:
        L.enter_fake_mode(stack)
        holder = torch.nn.Module()
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float32 if fp32 else torch.bfloat16)
        try:
            prelude, holder.norm = output_modules(config, modeling)
            if prelude is not None:
                holder.prelude = prelude
            holder.lm_head = torch.nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        finally:
            torch.set_default_dtype(default)
        if runtime.replacements:
            L._replaced(holder, config, runtime.replacements)
        holder.train()
        site = Site(config=config, modeling=modeling, root=holder, runtime=runtime)
        for contract in loaded:
            stack.enter_context(contract.install(site))
        yield holder


def measure_output(config: Any, seq: int, runtime: Any, autocast: bool = False):
    """(Measured, ForwardCount) of the output layer of *config* at *seq* tokens (*autocast*: as the layers')."""
    import torch

    from ndcost.plugins.census import layer as L
    from ndcost.plugins.census.flops import counter_class, flop_formulas
    from ndcost.plugins.census.measure import ModuleStack, measure

    loss_function = importlib.import_module("transformers.loss.loss_utils").ForCausalLMLoss
    config = text_config(config)
    with output_holder(config, runtime, fp32=autocast) as holder:
        prelude = getattr(holder, "prelude", None)
        streams = _prelude(str(getattr(config, "model_type", "")))[1]
        hidden = L.hidden_input(config, seq, fp32=autocast)
        if prelude is not None and streams:  # what the last layer hands on: [1, s, streams, h]
            hidden = torch.empty(1, seq, int(getattr(config, streams)), config.hidden_size, dtype=hidden.dtype,
                                 requires_grad=True)
        labels = torch.zeros(1, seq, dtype=torch.long)
        params = list(holder.parameters())

        def forward():
            with L.autocast(autocast):
                ahead = hidden if prelude is None else prelude(hidden)
                return loss_function(holder.lm_head(holder.norm(ahead)), labels, config.vocab_size)

        # the head's gradient, priced with the parameters', does not decide the loss's moment (measure's docstring)
        measured = measure(params, (hidden,), forward, lambda loss: loss.backward(), weight_copies=autocast,
                           gradients_at_peak=False)
        if autocast:
            return measured, None
        stack = ModuleStack(holder)
        counter = counter_class()(stack, {p.untyped_storage()._cdata for p in params}, (), flop_formulas())
        try:
            with torch.no_grad(), counter:
                forward()
        finally:
            stack.close()
    return measured, counter.count()


def census_output(config: Any, seq: int, runtime: Any) -> KindRecord:
    """The output layer's KindRecord; its TP part is what a vocabulary-parallel split divides."""
    from ndcost.plugins.census.records import SOURCE, autocast_figures, reserved_figures, split

    config = text_config(config)
    half = copy.deepcopy(config)
    half.vocab_size = max(1, config.vocab_size // 2)
    pad = getattr(half, "pad_token_id", None)
    if isinstance(pad, int) and not -half.vocab_size <= pad < half.vocab_size:
        # the base model's embedding (built for the final norm) refuses a padding row past its vocabulary;
        # the census measures only the norm, the head and the loss, which never read the padding row
        half.pad_token_id = None
    (one, counted), (two, _) = measure_output(config, seq, runtime), measure_output(half, seq, runtime)
    saved, saved_tp = split(one.saved_bytes, two.saved_bytes, seq)
    working, working_tp = split(one.working_bytes, two.working_bytes, seq)
    autocast = autocast_figures(lambda each: measure_output(each, seq, runtime, autocast=True)[0], config, half,
                                seq, lambda why: None, alone=True)
    # the caching allocator's reserved bytes above allocated ones over the layer's forward and backward
    return KindRecord(kind=KIND, seq=seq, source=SOURCE, saved_per_token=saved, saved_tp_per_token=saved_tp,
                      working_per_token=working, working_tp_per_token=working_tp, **autocast,
                      **reserved_figures(one, two, seq, alone=True),
                      flops_by_part=counted.flops, flops_all_pairs_by_part=counted.all_pairs_flops,
                      traffic=counted.traffic())
