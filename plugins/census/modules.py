"""Transformers' own parameters of a config, read off its modules on the meta device, by part.

What the generic decoder family counts a model type by where no family plugin
knows it but Transformers does: which projections carry biases, which norms a
layer holds (OLMo-2's QK-norms over the whole projection width, Gemma-2's pre-
and post-feedforward norms) and which tensors are fused (Phi-3's qkv and
gate_up) are not stated in a config, only in the modeling code. The model is
built once on the meta device (no memory, no initialisation) and the result
is cached on disk (:mod:`ndcost.plugins.census.cache`), so loading the config
again imports neither torch nor Transformers.

The model is split structurally, as ndcost's families split it: the
embedding modules, the output embeddings (the head, where not tied), the
decoder layers (the module list of ``num_hidden_layers`` modules) and the rest
(a final norm, else ``other``). In a layer, a parameter belongs to the part of
the layer's child holding it: an attention (a child named ``*attn`` or
``*attention``; its own ``q_norm`` and ``k_norm`` are norms, those of an
indexer or a latent inside it are the attention's), an MLP (routed experts
under ``experts``, shared ones under ``shared*``, the router a child named
``gate`` or ``router``, else ``ffn``), a norm (a module whose class name says
``Norm``), else ``other`` (DeepSeek-V4's hyper-connections).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Tuple

from ndcost.errors import CensusUnavailable

# Bumped whenever the reading below changes what it returns.
PROBE_VERSION = 3


def unavailable(model_type: str) -> Optional[str]:
    """Why the modules of *model_type* cannot be read here, or None (looks at the installed files only)."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (pip install 'ndcost[census]')"
    spec = importlib.util.find_spec("transformers")
    roots = list(spec.submodule_search_locations or ()) if spec is not None else []
    folder = model_type.replace("-", "_")
    if not any((Path(root) / "models" / folder).is_dir() for root in roots):
        return f"the installed Transformers has no modeling code for model_type {model_type!r}"
    return None


def module_parameters(config: Mapping[str, Any]) -> Dict[str, Any]:
    """``{"layers": [{part: n}, ...], "embedding", "head", "final_norm", "other"}`` of *config* (a mapping).

    One entry of ``layers`` a decoder layer, in model order; cached on disk by
    the config's content and the torch and Transformers versions.
    CensusUnavailable where the modules cannot be read here (:func:`unavailable`).
    """
    from ndcost.plugins.census import cache

    why = unavailable(str(config.get("model_type")))
    if why is not None:
        raise CensusUnavailable(f"Transformers' modules not read: {why}")

    content = cache.entry_content(what="module_parameters", config=dict(config), probe_version=PROBE_VERSION)
    return cache.cached_json(content, lambda: _read(dict(config)), folder="parameters")


def _read(config: Dict[str, Any]) -> Dict[str, Any]:
    import torch
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    model_type = config.pop("model_type")
    hf = CONFIG_MAPPING[model_type].from_dict(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    text = getattr(hf, "get_text_config", lambda: hf)()
    layers = _layers(model, int(text.num_hidden_layers))
    seen = set()

    def take(modules: Any) -> int:
        total = 0
        for module in modules:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return total

    embedding = take(m for m in model.modules() if isinstance(m, torch.nn.Embedding))
    head = take([model.get_output_embeddings()] if model.get_output_embeddings() is not None else [])
    by_layer = []
    for layer in layers:
        parts: Dict[str, int] = {}
        for name, p in layer.named_parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            part = _part(layer, name)
            parts[part] = parts.get(part, 0) + p.numel()
        by_layer.append(parts)
    final_norm = other = 0
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        if _is_norm(model.get_submodule(name.rpartition(".")[0])):
            final_norm += p.numel()
        else:
            other += p.numel()
    return {"layers": by_layer, "embedding": embedding, "head": head, "final_norm": final_norm, "other": other}


def _layers(model: Any, count: int) -> Tuple[Any, ...]:
    """The decoder layers: the module list of *count* modules named ``*layers`` (else the first of *count*)."""
    import torch

    lists = [(name, m) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == count]
    if not lists:
        raise ValueError(f"{type(model).__name__} holds no list of {count} decoder layers")
    named = [m for name, m in lists if name.endswith("layers")]
    return tuple(named[0] if named else lists[0][1])


def _is_norm(module: Any) -> bool:
    return "norm" in type(module).__name__.lower()


def _part(layer: Any, name: str) -> str:
    """The part of *layer*'s parameter *name* (see the module docstring)."""
    path = name.split(".")
    child = path[0].lower()
    if child.endswith(("attn", "attention")):
        return "norm" if len(path) == 3 and path[1] in ("q_norm", "k_norm") else "attention"
    if _is_norm(layer.get_submodule(".".join(path[:-1]))):
        return "norm"
    if child in ("mlp", "feed_forward", "ffn", "block_sparse_moe", "moe"):
        inner = path[1].lower() if len(path) > 2 else ""
        if "shared" in inner:
            return "shared"
        if "expert" in inner:
            return "routed"
        if inner in ("gate", "router"):
            return "router"
        return "ffn"
    return "other"
