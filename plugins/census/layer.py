"""One decoder layer of a Transformers model, built on fake tensors under a runtime profile.

The layer is the family's own class from its Transformers modeling module,
built from the config with the index of the first layer of its kind, in
bf16, under ``FakeTensorMode`` (nothing is allocated), with the attention
and experts implementations the runtime picks, its module replacements
installed and its kernel contracts active while the layer runs.
"""
from __future__ import annotations

import contextlib
import copy
import fnmatch
import importlib
import inspect
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import attrs

from ndcost.errors import CensusUnavailable, InvalidValue, NdcostError

# Config fields that tensor parallelism divides among ranks (head counts and feed-forward widths).
TP_FIELDS = (
    "num_attention_heads", "num_key_value_heads", "intermediate_size", "moe_intermediate_size",
    "shared_expert_intermediate_size", "linear_num_key_heads", "linear_num_value_heads",
)


# Head counts a TP rank may hold whole where there are fewer than ranks: Megatron and torchtitan
# replicate key-value heads (MQA's single shared head, DeepSeek-V4's) rather than split one.
REPLICABLE_FIELDS = ("num_key_value_heads",)


def tp_config(config: Any, tp: int) -> Any:
    """*config* as one of *tp* tensor-parallel ranks holds a layer: the seven TP fields divided by *tp*.

    ``head_dim`` is fixed first, so halving the heads keeps each head's
    width. A config class's ``attribute_map`` may give one attribute two
    names (DeepSeek-V4 maps ``intermediate_size`` onto
    ``moe_intermediate_size``): each underlying attribute is divided once,
    or the rank's layer would be a quarter as wide at TP 2. Key-value heads
    fewer than *tp* (and dividing it) are replicated: each rank holds one,
    so the census's TP pair puts their bytes in the part TP does not split.
    """
    config = copy.deepcopy(config)
    if tp == 1:
        return config
    heads = getattr(config, "num_attention_heads", None)
    if heads:
        config.head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    aliases = getattr(type(config), "attribute_map", None) or {}
    divided = set()
    for name in TP_FIELDS:
        target = aliases.get(name, name)
        if target in divided:
            continue
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            if name in REPLICABLE_FIELDS and value < tp and tp % value == 0:
                setattr(config, name, 1)
            elif value % tp:
                raise InvalidValue(f"{name} = {value} is not divisible by TP {tp}; the TP split needs it even "
                                   f"(choose a TP size dividing it)")
            else:
                setattr(config, name, value // tp)
            divided.add(target)
    return config


def modeling_module(config: Any) -> Any:
    """Import and return ``transformers.models.<type>.modeling_<type>`` for *config* (a ``_text`` type falls back to its base)."""
    model_type = str(getattr(config, "model_type", ""))
    names = [model_type] + ([model_type[: -len("_text")]] if model_type.endswith("_text") else [])
    for name in names:
        try:
            return importlib.import_module(f"transformers.models.{name}.modeling_{name}")
        except ImportError:
            continue
    raise CensusUnavailable(
        f"Transformers {_version('transformers')} ships no modeling code for model_type {model_type!r}; "
        f"upgrade Transformers, or price this model from the formulas (census='off')")


def _version(package: str) -> str:
    try:
        return importlib.import_module(package).__version__
    except Exception:  # pragma: no cover
        return "?"


def _pretrained_class(modeling: Any) -> Optional[type]:
    import transformers
    for value in vars(modeling).values():
        if (isinstance(value, type) and issubclass(value, transformers.PreTrainedModel)
                and value.__name__.endswith("PreTrainedModel") and value.__module__ == modeling.__name__):
            return value
    return None


def layer_classes(modeling: Any) -> Tuple[type, type]:
    """The text decoder layer class and the text rotary embedding class of *modeling*."""
    classes = dict(filter(lambda item: isinstance(item[1], type) and item[1].__module__ == modeling.__name__,
                          vars(modeling).items()))
    pretrained = _pretrained_class(modeling)
    preferred = list(getattr(pretrained, "_no_split_modules", None) or ())
    layers = [classes[name] for name in preferred if name in classes and name.endswith("DecoderLayer")]
    layers += [classes[name] for name in classes if name.endswith("DecoderLayer") and classes[name] not in layers]
    layers += [classes[name] for name in preferred if name in classes and classes[name] not in layers]  # GPT2Block
    layers = [cls for cls in layers if not any(w in cls.__name__ for w in ("Vision", "MTP", "Audio", "Encoder"))]
    rotary = [classes[name] for name in classes if name.endswith("RotaryEmbedding") and "Vision" not in name]
    rotary.sort(key=lambda cls: "Text" not in cls.__name__)
    if not layers:
        raise CensusUnavailable(f"{modeling.__name__} defines no decoder layer class the census can build")
    return layers[0], (rotary[0] if rotary else None)


def attention_implementation(modeling: Any, runtime: Any) -> str:
    """The attention implementation the runtime runs: its choice where the model supports it, else its fallback."""
    wanted = runtime.attention
    pretrained = _pretrained_class(modeling)
    if wanted == "sdpa" and pretrained is not None and not getattr(pretrained, "_supports_sdpa", False):
        return runtime.attention_fallback
    return wanted


@attrs.define
class FakeLayer:
    """A built layer and what running it needs."""

    layer: Any
    rotary: Any
    config: Any
    modeling: Any
    runtime: Any
    contracts: List[Any]
    layer_index: int


def load_contracts(names: Sequence[str], model_type: str, runtime_name: str) -> List[Any]:
    """The kernel contracts *names* (loaded), refusing one no installed plugin registers."""
    from ndcost import manager
    from ndcost.plugins.contracts import Contract
    registry = manager.registry()
    out = []
    for name in names:
        found = registry.find(f"contract/{name}")
        if not isinstance(found, Contract):
            raise CensusUnavailable(
                f"runtime {runtime_name!r} runs {model_type} layers under kernel contract {name!r}, which no "
                f"installed plugin registers (contract/{name}); install the plugin that states that kernel, "
                f"or price this model from the formulas (census='off')")
        out.append(found.load())
    return out


def _replaced(root: Any, config: Any, replacements: Sequence[Any]) -> None:
    """Install *replacements* on *root*'s modules whose path and class name match.

    A factory that fails leaves a layer the run does not build: Transformers'
    module in its place keeps other bytes (DeepSeek-V3.2's eager indexer, under
    HyperParallel's selective policy, far more than the layer keeps plain), so
    the census refuses (CensusUnavailable naming the factory and, for an import,
    the library missing) rather than measure it.
    """
    from ndcost.plugins.contracts import import_target

    for rule in replacements:
        try:
            factory = import_target(rule.factory)
        except (ImportError, AttributeError) as exc:
            raise CensusUnavailable(
                f"the runtime replaces {list(rule.match)} with {rule.factory}, which this host cannot import "
                f"({exc}); install it, or price the model from the formulas (census='off')") from exc
        for path, module in list(root.named_modules()):
            if not path or not any(fnmatch.fnmatchcase(path, p) for p in rule.match):
                continue
            if not fnmatch.fnmatchcase(type(module).__name__, rule.module_type):
                continue
            parent_path, _, leaf = path.rpartition(".")
            parent = root.get_submodule(parent_path) if parent_path else root
            setattr(parent, leaf, _built(rule, factory, path, module, config))


def _built(rule: Any, factory: Callable[..., Any], path: str, module: Any, config: Any) -> Any:
    """``factory(module, config)``, any failure but a refusal of ndcost's own a CensusUnavailable naming it."""
    try:
        return factory(module, config)
    except NdcostError:
        raise
    except ImportError as exc:
        library = exc.name or str(exc)
        raise CensusUnavailable(
            f"the runtime replaces {path} ({type(module).__name__}) with {rule.factory}, which needs {library}, "
            f"absent on this host ({exc}); the layer the run builds cannot be measured here: run the census "
            f"where {library} imports, or price the model from the formulas (census='off')") from exc
    except Exception as exc:
        raise CensusUnavailable(
            f"the runtime replaces {path} ({type(module).__name__}) with {rule.factory}, which failed "
            f"({type(exc).__name__}: {exc}); the layer the run builds cannot be measured here: fix the "
            f"factory, or price the model from the formulas (census='off')") from exc


def refuse_unsupported(runtime: Any, config: Any, what: str) -> str:
    """*config*'s model type, refused (CensusUnavailable) where *runtime* says it cannot price a *what* of it."""
    model_type = str(getattr(config, "model_type", ""))
    reason = runtime.unsupported.get(model_type)
    if reason:
        raise CensusUnavailable(f"runtime {runtime.name!r} cannot price a {model_type} {what}: {reason}")
    return model_type


def runtime_config(config: Any, modeling: Any, runtime: Any) -> Any:
    """A copy of *config* naming *runtime*'s attention and experts implementations."""
    config = copy.deepcopy(config)
    config._attn_implementation = attention_implementation(modeling, runtime)
    config._experts_implementation = runtime.experts
    return config


def enter_fake_mode(stack: contextlib.ExitStack) -> None:
    """``FakeTensorMode`` entered on *stack*, with its logger quiet while it lasts.

    An op a layer cannot run on fake tensors (one whose meta kernel refuses its
    operands) raises, and the census turns that into its own
    reason (``CensusUnavailable``, "not measured"); FakeTensorMode also logs
    the traceback at ERROR (``_dispatch_impl``,
    torch/_subclasses/fake_tensor.py), which a user would read as a failure.
    """
    import logging

    from torch._subclasses.fake_tensor import FakeTensorMode

    log = logging.getLogger("torch._subclasses.fake_tensor")
    level = log.level
    log.setLevel(logging.CRITICAL)
    stack.callback(log.setLevel, level)
    stack.enter_context(FakeTensorMode(allow_non_fake_inputs=True))


def build_fake(stack: contextlib.ExitStack, build: Callable[[], Any], fp32: bool = False) -> Any:
    """``build()`` on fake tensors (the fake mode entered on *stack*, to last with it), bf16 (or fp32) the default dtype."""
    import torch

    enter_fake_mode(stack)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32 if fp32 else torch.bfloat16)
    try:
        return build()
    finally:
        torch.set_default_dtype(default)


def install_contracts(stack: contextlib.ExitStack, loaded: Sequence[Any], site: Any) -> None:
    """Each of the *loaded* contracts installed at *site* until *stack* closes."""
    for contract in loaded:
        stack.enter_context(contract.install(site))


@contextlib.contextmanager
def fake_layer(config: Any, layer_index: int, runtime: Any, contracts: bool = True,
               replacements: bool = True, fp32: bool = False) -> Iterator[FakeLayer]:
    """Layer *layer_index* of *config* on fake tensors, its runtime's contracts active while the context lasts.

    *contracts* and *replacements* off give Transformers' own modules and
    kernels' shapes as counted for FLOPs (a fused kernel runs the same
    arithmetic, and its matmuls are ones no dispatch would see). *fp32*
    builds the parameters in fp32 (a run under autocast), else bf16.
    """
    from ndcost.plugins.contracts import Site

    from ndcost.plugins.census.stack import refuse_single_layer

    refuse_single_layer(config)  # before building: such a family's layer fails deep inside its forward
    model_type = refuse_unsupported(runtime, config, "layer")
    modeling = modeling_module(config)
    layer_cls, rotary_cls = layer_classes(modeling)
    loaded = load_contracts(runtime.contracts_for(model_type), model_type, runtime.name) if contracts else []
    config = runtime_config(config, modeling, runtime)
    with contextlib.ExitStack() as stack:
        layer, rotary = build_fake(stack, lambda: (
            layer_cls(config, layer_index), rotary_cls(config=config) if rotary_cls is not None else None), fp32)
        if replacements and runtime.replacements:
            _replaced(layer, config, runtime.replacements)
        layer.train()
        install_contracts(stack, loaded, Site(config=config, modeling=modeling, root=layer, runtime=runtime))
        yield FakeLayer(layer=layer, rotary=rotary, config=config, modeling=modeling, runtime=runtime,
                        contracts=loaded, layer_index=layer_index)


def _grid_rotary(rotary: Any) -> bool:
    """Whether *rotary* takes a row of position ids per grid (time, height, width), as multimodal ones do."""
    if getattr(rotary, "mrope_section", None) is not None:
        return True
    config = getattr(rotary, "config", None)
    return any(isinstance(getattr(config, name, None), Mapping) and "mrope_section" in getattr(config, name)
               for name in ("rope_parameters", "rope_scaling"))


def positions(fake: FakeLayer, hidden: Any) -> Tuple[Any, Any]:
    """Position ids of one sequence and the rotary embeddings of the layer's model for them."""
    import torch
    seq = hidden.shape[1]
    position_ids = torch.arange(seq).unsqueeze(0)
    if fake.rotary is None:
        return position_ids, None
    rotary_ids = position_ids[None].expand(3, *position_ids.shape) if _grid_rotary(fake.rotary) else position_ids
    with torch.no_grad():
        return position_ids, fake.rotary(hidden, rotary_ids)


def mask_type(config: Any, layer_index: int, modeling: Any) -> str:
    """The attention type the model builds layer *layer_index*'s mask for.

    ``layer_types`` where the config has them; else ``sliding_attention``
    where the config sets a ``sliding_window`` and the model's modeling
    module builds sliding-window masks (Mistral, Mixtral, Phi-3, Starcoder2,
    Qwen3-MoE with ``use_sliding_window``: their model picks
    ``create_sliding_window_causal_mask`` whenever ``sliding_window`` is set,
    for every layer); else ``full_attention``.
    """
    types = getattr(config, "layer_types", None)
    if types and layer_index < len(types):
        return types[layer_index]
    if getattr(config, "sliding_window", None) and hasattr(modeling, "create_sliding_window_causal_mask"):
        return "sliding_attention"
    return "full_attention"


def attention_mask(fake: FakeLayer, hidden: Any, position_ids: Any) -> Any:
    """The mask the model hands this layer for one unpadded sequence, as its forward builds it.

    Full causal attention under SDPA gets None (the kernel's ``is_causal``);
    a sliding-window or chunked layer gets what Transformers' mask builders
    return for its layer type: under SDPA a boolean ``[1, 1, s, s]`` mask
    once the sequence reaches the window (below it, None and ``is_causal``),
    under eager an additive one. The mask is built at the model level, so a
    layer measured alone is handed it here as its model would hand it.
    """
    builders = {"full_attention": "create_causal_mask", "sliding_attention": "create_sliding_window_causal_mask",
                "chunked_attention": "create_chunked_causal_mask",
                # DeepSeek-V3.2's model always builds the causal mask (allow_is_causal_skip=False): its
                # indexer scores against it, and its attention folds the selection into it
                "indexed_attention": "create_causal_mask"}
    layer_type = mask_type(fake.config, fake.layer_index, fake.modeling)
    builder = builders.get(layer_type)
    if builder is None:
        return None
    masking = importlib.import_module("transformers.masking_utils")
    build = getattr(masking, builder)
    accepted = inspect.signature(build).parameters
    # no position ids: they would be inspected for packed sequences, which a fake tensor cannot answer
    kwargs = {"config": fake.config, "inputs_embeds": hidden, "attention_mask": None, "position_ids": None}
    if layer_type == "indexed_attention":
        kwargs["allow_is_causal_skip"] = False
    for name in ("cache", "past_key_values"):
        if name in accepted:
            kwargs[name] = None
            break  # the newer name only: the older one is deprecated where both are taken
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    if "cache_position" in accepted:
        import torch
        kwargs["cache_position"] = torch.arange(hidden.shape[1])
    return build(**kwargs)


def run(fake: FakeLayer, hidden: Any, where: Tuple[Any, Any], mask: Any = None,
        call: Optional[Callable[..., Any]] = None) -> Any:
    """One forward of the layer as its model calls it; returns the hidden states."""
    position_ids, embeddings = where
    accepted = inspect.signature(fake.layer.forward).parameters
    offered = dict(position_embeddings=embeddings, position_ids=position_ids, attention_mask=mask, use_cache=False)
    kwargs = {name: offered[name] for name in offered if name in accepted}
    out = (call or fake.layer)(hidden, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def handed(where: Tuple[Any, Any], mask: Any = None) -> Dict[str, Any]:
    """What the model computes once a forward and hands every layer (as :func:`run` hands it), by argument name:
    the position ids, the rotary embeddings, the mask (those it builds)."""
    position_ids, embeddings = where
    offered = dict(position_ids=position_ids, position_embeddings=embeddings, attention_mask=mask)
    return {name: value for name, value in offered.items() if value is not None}


def hidden_input(config: Any, seq: int, requires_grad: bool = True, fp32: bool = False) -> Any:
    """A bf16 (or fp32: the residual stream under autocast) micro-batch of one sequence of *seq* tokens entering a layer."""
    import torch
    return torch.empty(1, seq, config.hidden_size, dtype=torch.float32 if fp32 else torch.bfloat16,
                       requires_grad=requires_grad)


def autocast(enabled: bool) -> Any:
    """bf16 autocast as a run with fp32 parameters computes, where *enabled*: CPU autocast's op lists.

    The census's tensors are on the CPU, so CUDA's autocast cannot run over
    them; the two cast matmuls and scaled-dot-product attention alike, and
    CUDA's alone runs a reduced-precision input to softmax, layer norm, pow
    or rsqrt in fp32 (not met where the residual stream is fp32, and
    Transformers' eager softmax asks for fp32 itself).
    """
    import torch
    return torch.autocast("cpu", dtype=torch.bfloat16) if enabled else contextlib.nullcontext()
