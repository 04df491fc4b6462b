"""Models: a config, a spec YAML or a name becomes a :class:`ModelSpec`; a spec's parameters by kind and part.

The family that reads a config is found by its ``model_type`` in the registry
(``family/<model_type>``, contributed by plugins); a model type nobody
registered falls back to a generic decoder family, with a warning naming the
fields it read. Counting parameters is plain integer arithmetic over the
registered formula slots (``formula/...``): this module never imports torch
or transformers except in :func:`transformers_config`.
"""
from __future__ import annotations

import builtins
import difflib
import json
import math
import os
import warnings
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import attrs

from ndcost import manager
from ndcost.errors import InvalidValue, UnknownKey
from ndcost.specio import load_yaml, read_text
from ndcost.values import PARTS, LayerGroup, ModelSpec, frozen_mapping

__all__ = [
    "load_model", "transformers_config", "parameters", "ParameterCount", "Family", "ConfigReader",
    "family_for", "formula", "known_models", "model_path", "FamilyFallbackWarning", "check_config", "MAX_LAYERS",
]


class FamilyFallbackWarning(UserWarning):
    """A config's model_type has no family plugin; the generic decoder family read it."""


# ---------------------------------------------------------------------------
# the parameter count
# ---------------------------------------------------------------------------
def _frozen_nested(value: Any) -> Mapping:
    return MappingProxyType({k: MappingProxyType(dict(v)) for k, v in dict(value or {}).items()})


@attrs.frozen(kw_only=True)
class ParameterCount:
    """A model's parameters: one layer of each kind by part, the layer counts, and the model-level tensors.

    ``total`` is what Transformers builds from the config: every non-MTP layer,
    the embedding, the head where untied, the final norm and ``other``
    model-level tensors (a hyper-connection head); it excludes the
    MTP layers (``mtp``) and buffers (``buffers``: the routers' score-correction
    biases a checkpoint carries). ``by_part`` sums to ``total``.
    ``published_total`` is the figure a model card quotes where it differs.
    ``uncounted`` names the parts the family could not count from what it
    read (each with what was assumed in their place): where it is not empty,
    ``total`` may differ from Transformers' model.
    """

    by_kind: Mapping[str, Mapping[str, int]] = attrs.field(converter=_frozen_nested)
    layer_counts: Mapping[str, int] = attrs.field(converter=frozen_mapping)
    embedding: int
    head: int
    final_norm: int
    mtp: int
    buffers: int
    total: int
    by_part: Mapping[str, int] = attrs.field(converter=frozen_mapping)
    published_total: Optional[int] = None
    other: int = 0
    uncounted: Tuple[str, ...] = ()

    def __attrs_post_init__(self):
        if sum(self.by_part.values()) != self.total:
            raise InvalidValue(f"ParameterCount: by_part sums to {sum(self.by_part.values())}, total is {self.total}")

    def kind_total(self, kind: str) -> int:
        """The parameters of one layer of *kind*."""
        return sum(self.by_kind[kind].values())

    def to_dict(self) -> Dict[str, Any]:
        """Plain dicts and ints (``ndcost params --json``)."""
        return {"total": self.total, "by_part": dict(self.by_part),
                "by_kind": {k: dict(v) for k, v in self.by_kind.items()},
                "layer_counts": dict(self.layer_counts), "embedding": self.embedding, "head": self.head,
                "final_norm": self.final_norm, "other": self.other, "mtp": self.mtp, "buffers": self.buffers,
                "published_total": self.published_total, "uncounted": list(self.uncounted)}


# ---------------------------------------------------------------------------
# reading a config
# ---------------------------------------------------------------------------
_MISSING = object()


class ConfigReader:
    """Reads a config mapping on behalf of a family: defaults, required fields, checks, and what was read.

    A field missing with no default is an InvalidValue naming the field and the
    family; widths must be positive integers; ``read`` lists what was read (the
    generic family's warning names them).
    """

    def __init__(self, config: Mapping[str, Any], family: str, defaults: Optional[Mapping[str, Any]] = None,
                 aliases: Optional[Mapping[str, Iterable[str]]] = None):
        self.config = config
        self.family = family
        self.defaults = dict(defaults or {})
        self.aliases = {k: tuple(v) for k, v in dict(aliases or {}).items()}
        self.read: List[str] = []

    def _value(self, name: str) -> Any:
        """The config's value of *name* or of one of its aliases (Transformers' ``attribute_map``)."""
        value = self.config.get(name)
        for alias in self.aliases.get(name, ()):
            if value is not None:
                break
            value = self.config.get(alias)
        return value

    def has(self, name: str) -> bool:
        return self._value(name) is not None

    def get(self, name: str, default: Any = _MISSING) -> Any:
        """The config's value, else the family's default (Transformers'), else *default*; required where none."""
        if name not in self.read:
            self.read.append(name)
        value = self._value(name)
        if value is not None:
            return value
        if self.defaults.get(name) is not None:
            return self.defaults[name]
        if default is not _MISSING:
            return default
        raise InvalidValue(f"the {self.family} family needs {name!r} in the config, which does not state it; "
                           f"add {name} to the config")

    def int(self, name: str, default: Any = _MISSING, minimum: int = 1) -> Optional[int]:
        """An integer field, at least *minimum* (positive by default); None passes where it is the default."""
        value = self.get(name, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidValue(f"{self.family} config: {name} must be an integer, got {value!r}")
        if value < minimum:
            raise InvalidValue(f"{self.family} config: {name} must be >= {minimum}, got {value}")
        return value

    def optional_int(self, name: str) -> Optional[builtins.int]:  # the method int shadows the type here
        """An integer field where an explicit None (or 0) means "absent" (a query latent rank)."""
        if name in self.config or any(a in self.config for a in self.aliases.get(name, ())):
            value = self._value(name)
            if name not in self.read:
                self.read.append(name)
            return None if value in (None, 0) else self.int(name)
        value = self.get(name, None)
        return None if value in (None, 0) else self.int(name)

    def bool(self, name: str, default: Any = _MISSING) -> Optional[bool]:
        """A true/false field (a string such as "no" is refused, not read as true); None where the default."""
        value = self.get(name, default)
        if value is not None and not isinstance(value, builtins.bool):
            raise InvalidValue(f"{self.family} config: {name} must be true or false, got {value!r}")
        return value


# ---------------------------------------------------------------------------
# checking a config before any family or Transformers reads it
# ---------------------------------------------------------------------------
# More layers than any model has (the largest stack a few hundred): a count past it is a typo, and building
# or walking that many layers would hang.
MAX_LAYERS = 100_000
_LAYER_COUNT_FIELDS = ("num_hidden_layers", "n_layer", "num_layers", "num_nextn_predict_layers",
                       "mtp_num_hidden_layers", "num_mtp_layers")
# Fields Transformers builds modules from that cannot be null (it derives no default from None).
_NOT_NULL = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
# What each field must be where the config states it (not null): ("int", least value), ("bool",),
# ("probability",) in [0, 1], ("positive",) a finite number > 0, ("rope",) a RoPE parameter mapping,
# ("name",) a non-empty string.
_FIELD_RULES: Dict[str, Tuple[Any, ...]] = {
    **{name: ("int", 1) for name in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "intermediate_size", "vocab_size", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_inner",
        "n_positions", "moe_intermediate_size", "num_experts_per_tok", "kv_lora_rank", "v_head_dim",
        "qk_rope_head_dim", "decoder_sparse_step", "linear_num_key_heads", "linear_num_value_heads",
        "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval")},
    **{name: ("int", 0) for name in (
        "num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts", "q_lora_rank",
        "qk_nope_head_dim", "sliding_window", "first_k_dense_replace", "max_window_layers",
        "shared_expert_intermediate_size", "num_nextn_predict_layers", "window_size")},
    **{name: ("bool",) for name in (
        "tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window", "use_qk_norm",
        "norm_topk_prob", "qkv_bias")},
    **{name: ("probability",) for name in (
        "attention_dropout", "hidden_dropout", "attn_pdrop", "resid_pdrop", "embd_pdrop",
        "attention_probs_dropout_prob", "hidden_dropout_prob")},
    **{name: ("positive",) for name in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "rope_theta")},
    "rope_scaling": ("rope",), "rope_parameters": ("rope",),
    "hidden_act": ("name",), "activation_function": ("name",),
}


def _check_rope(where: str, field: str, value: Any) -> None:
    """A RoPE mapping (or one per layer type): its type a name, its factor a number >= 1.

    The factor's bound is Transformers' (``modeling_rope_utils``'s ``_validate_linear_rope_parameters``);
    whether Transformers knows the type is checked where it is imported (:func:`transformers_config`).
    """
    if not isinstance(value, Mapping):
        raise InvalidValue(f"{where}: {field} must be a mapping ({{rope_type: linear, factor: 2.0}}) or null, "
                           f"got {value!r}")
    nested = [v for v in value.values() if isinstance(v, Mapping)]
    for params in nested if nested and len(nested) == len(value) else [value]:
        kind = params.get("rope_type", params.get("type"))
        if kind is not None and not isinstance(kind, str):
            raise InvalidValue(f"{where}: {field} rope_type must be a name (default, linear, yarn, ...), "
                               f"got {kind!r}")
        factor = params.get("factor")
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not math.isfinite(factor) or factor < 1):
            raise InvalidValue(f"{where}: {field} factor must be a number >= 1, got {factor!r}")


def _check_field(where: str, field: str, value: Any) -> None:
    rule = _FIELD_RULES[field]
    if rule[0] == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidValue(f"{where}: {field} must be an integer, got {value!r}; write it without a decimal "
                               f"point or quotes")
        if value < rule[1]:
            raise InvalidValue(f"{where}: {field} must be >= {rule[1]}, got {value}")
    elif rule[0] == "bool":
        if not isinstance(value, bool):
            raise InvalidValue(f"{where}: {field} must be true or false, got {value!r}")
    elif rule[0] == "rope":
        _check_rope(where, field, value)
    elif rule[0] == "name":
        if not isinstance(value, str) or not value:
            raise InvalidValue(f"{where}: {field} must be a name (silu, gelu, ...), got {value!r}")
    else:
        number = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        if rule[0] == "probability" and not (number and 0 <= value <= 1):
            raise InvalidValue(f"{where}: {field} must be a probability in [0, 1], got {value!r}")
        if rule[0] == "positive" and not (number and value > 0):
            raise InvalidValue(f"{where}: {field} must be a finite number > 0, got {value!r}")


def check_config(config: Mapping[str, Any], where: str) -> None:
    """Refuse a config Transformers could not build, or would build wrong, naming *where*, the field and the fix.

    Checked: the fields of ``_FIELD_RULES`` (integers that are integers, true/false that are booleans,
    probabilities, RoPE parameters), the fields that cannot be null, a layer count past MAX_LAYERS, and a
    ``pad_token_id`` inside the vocabulary (its embedding's padding row). A multimodal config's
    ``text_config`` is checked as the decoder it describes. Ranges a family needs (heads dividing the width)
    are its own to check.
    """
    text = config.get("text_config")
    views = [config] + ([text] if isinstance(text, Mapping) else [])
    for view in views:
        for field, value in view.items():
            if value is None:
                if field in _NOT_NULL:
                    raise InvalidValue(f"{where}: {field} is null; state it as an integer (or remove the field "
                                       f"for the family's default)")
            elif field in _FIELD_RULES:
                _check_field(where, field, value)
        for field in _LAYER_COUNT_FIELDS:
            count = view.get(field)
            if isinstance(count, int) and count > MAX_LAYERS:
                raise InvalidValue(f"{where}: {field} {count:,} is past {MAX_LAYERS:,}, more layers than any "
                                   f"model has; fix the layer count")
    decoder = {**config, **text} if isinstance(text, Mapping) else config
    _check_pad(where, decoder.get("pad_token_id"), decoder.get("vocab_size"))


def _check_pad(where: str, pad: Any, vocab: Any) -> None:
    """The padding row must be one of the embedding's: ``torch.nn.Embedding``'s rule, a negative id counting
    from the end."""
    if pad is None:
        return
    if isinstance(pad, bool) or not isinstance(pad, int):
        raise InvalidValue(f"{where}: pad_token_id must be an integer token id or null, got {pad!r}")
    if isinstance(vocab, int) and not -vocab <= pad < vocab:
        raise InvalidValue(f"{where}: pad_token_id {pad} is outside the vocabulary (vocab_size {vocab}, ids "
                           f"0..{vocab - 1}); set pad_token_id below {vocab}, or to null")


def check_heads(family: str, hidden: int, heads: int, kv_heads: Optional[int], head_dim_stated: bool) -> None:
    """Heads must divide the hidden width (where the head width is derived) and KV heads the heads."""
    if not head_dim_stated and hidden % heads:
        raise InvalidValue(f"{family} config: num_attention_heads {heads} does not divide hidden_size {hidden} "
                           f"({hidden} / {heads} = {hidden / heads:g}); state head_dim or fix the widths")
    if kv_heads is not None and heads % kv_heads:
        raise InvalidValue(f"{family} config: num_key_value_heads {kv_heads} does not divide "
                           f"num_attention_heads {heads}")


def check_divides(family: str, what: str, divisor: int, whole: int, whole_name: str) -> None:
    if whole % divisor:
        raise InvalidValue(f"{family} config: {what} {divisor} does not divide {whole_name} {whole} "
                           f"({whole} / {divisor} = {whole / divisor:g})")


def groups_of(kinds: Iterable[str], mtp_kind: Optional[str] = None, mtp_count: int = 0) -> Tuple[LayerGroup, ...]:
    """Consecutive equal kinds as LayerGroups in model order, then *mtp_count* MTP layers."""
    groups: List[LayerGroup] = []
    current, count = None, 0
    for kind in kinds:
        if kind == current:
            count += 1
            continue
        if current is not None:
            groups.append(LayerGroup(kind=current, count=count))
        current, count = kind, 1
    if current is not None:
        groups.append(LayerGroup(kind=current, count=count))
    if mtp_count:
        groups.append(LayerGroup(kind=mtp_kind or "mtp", count=mtp_count, mtp=True))
    return tuple(groups)


# ---------------------------------------------------------------------------
# formulas and families
# ---------------------------------------------------------------------------
def _registry():
    return manager.registry()


def formula(name: str) -> Callable[..., int]:
    """The formula slot registered as ``formula/<name>`` (a plugin may override it)."""
    return _registry().get(f"formula/{name}")


class Family:
    """How one model family's config becomes a ModelSpec, and what each of its layer kinds holds.

    A family plugin registers an instance as ``family/<model_type>``.
    ``stack_census`` says whether a census must measure the whole stack (layers
    that cannot run alone, such as hyper-connected residual streams).
    Subclasses implement :meth:`spec` and :meth:`layer_parameters`; the
    model-level tensors default to an embedding, an untied head and one norm.
    """

    name: str = "family"
    model_types: Tuple[str, ...] = ()
    stack_census: bool = False
    # Why the layers cannot run alone, for the census's refusal of one layer (where stack_census).
    stack_census_reason: str = ""
    # Why the op records' formulas (specs/op_records.yaml) cannot price the family's layers, where they cannot:
    # its kinds are then priced by the census alone, and refused with this reason where it cannot run.
    formulas_unpriced: str = ""
    # Whether Transformers runs the family's attention through SDPA (its PreTrainedModel's
    # ``_supports_sdpa``): where not, a runtime that asks for SDPA runs its fallback (eager, scores
    # materialized), and the op records' formulas must price that, without importing transformers.
    supports_sdpa: bool = True
    # Op-record values (specs/op_records.yaml) where the family's modules keep other than the records'
    # defaults, e.g. ``{"norm_bytes": 8}`` for an RMSNorm multiplying its weight in fp32 (OLMo-2).
    op_record_values: Mapping[str, float] = {}
    # Elementwise traffic in 2-byte elements an element where the family's modules move other than
    # Transformers' Llama modules (plugins/estimators/flops.py): ``norm`` (18), ``rotary`` (10), ``rotary_table``
    # (1: a bf16 cos or sin element; 2 where fp32).
    elementwise_elements: Mapping[str, int] = {}
    # Kernels a forward launches where the family's modules launch other than the analytic estimator's counts
    # (plugins/estimators/flops.py): ``router`` (its MoE router, from its linear to the copies' weights; a softmax
    # router's 8), ``expert_act`` (a routed expert's activation; SiLU times up's 2), ``rotary`` (a rotated tensor;
    # rotate_half's 5), ``norm`` (an RMSNorm; LlamaRMSNorm's 8), ``shared_gate`` (a gate scaling the shared experts'
    # output; none) and ``eager_attention`` (its eager attention beyond an SDPA call;
    # ndcost.work.EAGER_ATTENTION_LAUNCHES).
    kernel_launches: Mapping[str, int] = {}
    # The base model's modules its forward runs between the last layer and the final norm, in order (DeepSeek-V4's
    # ``hc_head``, folding the hyper-connection streams into one): the output layer's census runs them on what the
    # last layer hands on, ``[1, s, streams, h]`` with ``streams`` the config field ``output_streams`` names
    # (empty: ``[1, s, h]``).
    output_prelude: Tuple[str, ...] = ()
    output_streams: str = ""
    # Transformers' defaults of the fields the family reads, so a config.json
    # written with only its differences reads the same.
    defaults: Mapping[str, Any] = {}
    # other names of a field (Transformers' ``attribute_map`` both ways)
    aliases: Mapping[str, Tuple[str, ...]] = {}

    def activation_estimators(self, spec: ModelSpec, kind: str) -> Tuple[str, ...]:
        """The ``estimator/activations/<name>`` to price *kind* by, best first (the first available wins)."""
        census = "stack_census" if self.stack_census else "census"
        return (census,) if self.formulas_unpriced else (census, "op_records")

    def flops_estimators(self, spec: ModelSpec, kind: str) -> Tuple[str, ...]:
        """The ``estimator/flops/<name>`` to price *kind*'s work by, best first (the first that measures it wins)."""
        return ("census", "analytic")

    def reader(self, config: Mapping[str, Any]) -> ConfigReader:
        return ConfigReader(config, self.name, self.defaults, self.aliases)

    def spec(self, config: Mapping[str, Any], name: str) -> ModelSpec:  # pragma: no cover - abstract
        raise NotImplementedError

    def layer_parameters(self, spec: ModelSpec, kind: str) -> Dict[str, int]:  # pragma: no cover - abstract
        raise NotImplementedError

    # model-level tensors --------------------------------------------------
    def embedding_parameters(self, spec: ModelSpec) -> int:
        return formula("embedding.params")(vocab=spec.vocab_size, hidden=spec.hidden_size)

    def head_parameters(self, spec: ModelSpec) -> int:
        return formula("head.params")(vocab=spec.vocab_size, hidden=spec.hidden_size,
                                      tied=spec.tie_word_embeddings)

    def final_norm_parameters(self, spec: ModelSpec) -> int:
        return formula("norm.params.layer")(hidden=spec.hidden_size, norms=1,
                                            bias=spec.extra.get("norm_bias", False))

    def other_parameters(self, spec: ModelSpec) -> int:
        """Model-level tensors outside the layers, the embedding, the head and the final norm."""
        return 0

    def buffers(self, spec: ModelSpec) -> int:
        """Buffers a checkpoint carries beside the parameters (router score-correction biases)."""
        return 0

    def router_selection_bytes(self, spec: ModelSpec) -> int:
        """Bytes a token the family's MoE router moves selecting experts without a gradient (forward-only work, whole
        on every TP rank), beyond the grouped_mm dispatch's indices; 0: its selection runs under autograd."""
        return 0

    def uncounted_parts(self, spec: ModelSpec) -> Tuple[str, ...]:
        """Parts this family could not count from the config, each with what it assumed (a guess, said so)."""
        return ()

    def published_total(self, spec: ModelSpec, total: int, buffers: int) -> Optional[int]:
        """The total a model card quotes where it differs from Transformers' parameters."""
        stated = spec.extra.get("published_total")
        return None if stated is None else int(stated)

    def __repr__(self) -> str:
        return f"<family {self.name} ({', '.join(self.model_types)})>"


def family_for(model_type: str, registry=None) -> Optional[Family]:
    """The family registered for *model_type*, or None."""
    registry = registry or _registry()
    return registry.find(f"family/{model_type}")


def generic_family() -> Family:
    family = _registry().find("family/generic_decoder")
    if family is None:
        raise UnknownKey("no generic decoder family is registered (family/generic_decoder); "
                         "reinstall ndcost with `pip install -e .`")
    return family


# ---------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------
def _models_dir():
    return resources.files("ndcost.specs") / "models"


def known_models() -> List[str]:
    """Names of the model specs shipped in specs/models/."""
    try:
        return sorted(p.name[:-5] for p in _models_dir().iterdir() if p.name.endswith(".yaml"))
    except (FileNotFoundError, NotADirectoryError):
        return []


def model_path(name: str):
    """The spec YAML of a shipped model *name*; an unknown name lists the closest known names."""
    entry = _models_dir() / f"{name}.yaml"
    if entry.is_file():
        return entry
    known = known_models()
    close = difflib.get_close_matches(name, known, n=5, cutoff=0.4)
    hint = f"closest known: {', '.join(close)}" if close else f"known: {', '.join(known) or 'none'}"
    raise UnknownKey(f"unknown model {name!r}; {hint} (or pass a config.json, a folder holding one, "
                     f"or a spec YAML path)")


def _read_yaml(path) -> Dict[str, Any]:
    data = load_yaml(read_text(path, "model spec"), where=f"model spec {path}")
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise InvalidValue(f"model spec {path}: expected a mapping with a 'config' mapping "
                           f"(the Transformers config fields, with model_type)")
    return data


def _from_mapping(config: Mapping[str, Any], name: str, extra: Optional[Mapping[str, Any]] = None,
                  where: str = "") -> ModelSpec:
    config = dict(config)
    where = where or f"model {name!r}"
    model_type = config.get("model_type")
    if not model_type:
        raise InvalidValue(f"{where}: the config states no model_type; add model_type "
                           f"(the Transformers config's model type) so its family can read it")
    if not isinstance(model_type, str):
        raise InvalidValue(f"{where}: model_type must be a name (llama, qwen3, ...), got {model_type!r}")
    check_config(config, where)
    family = family_for(model_type)
    fallback = family is None
    if fallback:
        family = generic_family()
    assert family is not None  # family_for found one, or the generic fallback
    spec = family.spec(config, name)
    if fallback:
        read = spec.extra.get("fields_read", ())
        uncounted = _uncounted(family, spec)
        how = ("parts it could not count: " + "; ".join(uncounted) if uncounted
               else "its parameters as Transformers' modules hold them")
        warnings.warn(f"no family plugin for model_type {model_type!r} (model {name!r}); counting it as a "
                      f"generic decoder from the fields {', '.join(read)}; {how}", FamilyFallbackWarning,
                      stacklevel=3)
    updates: Dict[str, Any] = {"hf_config": config}
    if extra:
        updates["extra"] = {**spec.extra, **extra}
    return attrs.evolve(spec, **updates)


def load_model(model: Any) -> ModelSpec:
    """A ModelSpec from a Transformers config, a config.json path, a folder holding one, a spec YAML or a name.

    A ModelSpec passes through unchanged. Every config is checked (:func:`check_config`) before its family
    or Transformers reads it.
    """
    if isinstance(model, ModelSpec):
        return model
    if hasattr(model, "to_dict") and hasattr(model, "model_type"):  # a Transformers config
        config = model.to_dict()
        config.setdefault("model_type", model.model_type)
        name = getattr(model, "name_or_path", "") or config["model_type"]
        return _from_mapping(config, name)
    if isinstance(model, Mapping):
        config = dict(model)
        return _from_mapping(config, str(config.get("_name_or_path") or config.get("model_type") or "model"))
    if not isinstance(model, (str, os.PathLike)):
        raise InvalidValue(f"load_model: expected a Transformers config, a path or a model name, "
                           f"got {type(model).__name__}")
    text = os.fspath(model)
    path = Path(text)
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise InvalidValue(f"folder {text!r} holds no config.json; pass the config.json path or a "
                               f"folder written by save_pretrained")
        path = config_file
    if path.is_file():
        if path.suffix in (".yaml", ".yml"):
            return _from_yaml(path)
        try:
            config = json.loads(read_text(path, "model config"))
        except json.JSONDecodeError as exc:
            raise InvalidValue(f"{text!r} is not a JSON config: {exc}") from None
        except RecursionError:
            raise InvalidValue(f"{text!r}: JSON nested too deeply to read") from None
        if not isinstance(config, dict):
            raise InvalidValue(f"{text!r} is not a JSON object")
        name = path.parent.name if path.name == "config.json" else path.stem
        return _from_mapping(config, name or config.get("model_type", "model"), where=f"model config {path}")
    if text.endswith((".yaml", ".yml", ".json")) or os.sep in text:
        raise InvalidValue(f"no such file: {text!r}")
    return _from_yaml(model_path(text))


def _from_yaml(path) -> ModelSpec:
    data = _read_yaml(path)
    where = f"model spec {path}"
    name = data.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidValue(f"{where}: name must be a string, got {name!r}")
    extra = {}
    published = data.get("published_total")
    if published is not None:
        if isinstance(published, bool) or not isinstance(published, int) or published < 1:
            raise InvalidValue(f"{where}: published_total must be a positive integer (a parameter count), "
                               f"got {published!r}")
        extra["published_total"] = published
    return _from_mapping(data["config"], name or Path(str(path)).stem, extra, where=f"{where} config")


def transformers_config(spec: ModelSpec):
    """The Transformers config rebuilt from ``spec.hf_config`` (imports transformers)."""
    from transformers import CONFIG_MAPPING

    config = dict(spec.hf_config)
    model_type = config.get("model_type") or spec.model_type
    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        raise UnknownKey(f"Transformers {__import__('transformers').__version__} has no config for "
                         f"model_type {model_type!r}") from None
    config.pop("model_type", None)
    try:
        built = cls.from_dict(config)
    except (TypeError, ValueError, KeyError, AttributeError) as exc:  # its strict dataclass, its RoPE check
        raise InvalidValue(f"model {spec.name!r}: Transformers refuses its config ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())}); fix the field it names") from None
    _check_rope_type(spec, built)
    _check_activation(spec, built)
    for decoder in (built, getattr(built, "text_config", None)):  # a pad id Transformers defaults, too
        if decoder is not None:
            _check_pad(f"model {spec.name!r}", getattr(decoder, "pad_token_id", None),
                       getattr(decoder, "vocab_size", None))
    return built


def _check_activation(spec: ModelSpec, built: Any) -> None:
    """The activation the config names is one Transformers builds (``transformers.activations.ACT2FN``)."""
    from transformers.activations import ACT2FN

    for config in (built, getattr(built, "text_config", None)):
        for field in ("hidden_act", "activation_function"):
            name = getattr(config, field, None)
            if isinstance(name, str) and name not in ACT2FN:
                close = difflib.get_close_matches(name, list(ACT2FN), n=3)
                raise InvalidValue(f"model {spec.name!r}: {field} {name!r} is not an activation Transformers "
                                   f"builds; {'closest: ' + ', '.join(close) if close else 'e.g. silu, gelu'}")


def _check_rope_type(spec: ModelSpec, built: Any) -> None:
    """Every RoPE type the built config names is one Transformers computes (``ROPE_INIT_FUNCTIONS``)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for config in (built, getattr(built, "text_config", None)):
        params = getattr(config, "rope_parameters", None)
        if not isinstance(params, Mapping):
            continue
        nested = [v for v in params.values() if isinstance(v, Mapping)]
        for one in nested if nested and len(nested) == len(params) else [params]:
            kind = one.get("rope_type", one.get("type", "default"))
            if kind != "default" and kind not in ROPE_INIT_FUNCTIONS:
                raise InvalidValue(f"model {spec.name!r}: rope_type {kind!r} is not one Transformers "
                                   f"{__import__('transformers').__version__} computes; known: default, "
                                   f"{', '.join(sorted(ROPE_INIT_FUNCTIONS))}")


# ---------------------------------------------------------------------------
# counting
# ---------------------------------------------------------------------------
def _family_of(spec: ModelSpec) -> Family:
    family = family_for(spec.model_type)
    return family if family is not None else generic_family()


def _uncounted(family: Any, spec: ModelSpec) -> Tuple[str, ...]:
    """The family's :meth:`Family.uncounted_parts` (a family not built on Family states none)."""
    method = getattr(family, "uncounted_parts", None)
    return tuple(method(spec)) if method is not None else ()


def _check_parts(family: Family, kind: str, parts: Mapping[str, int]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for part, value in parts.items():
        if part not in PARTS:
            raise InvalidValue(f"family {family.name}: kind {kind!r} counts unknown part {part!r}; "
                               f"parts: {', '.join(PARTS)}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidValue(f"family {family.name}: kind {kind!r} part {part!r} is {value!r}, "
                               f"not a count (an integer >= 0)")
        if value:
            out[part] = out.get(part, 0) + value
    return out


def parameters(spec: ModelSpec) -> ParameterCount:
    """The parameters of *spec* by kind and part (plain integer arithmetic; no torch)."""
    spec = load_model(spec)
    family = _family_of(spec)
    by_kind: Dict[str, Dict[str, int]] = {}
    layer_counts: Dict[str, int] = {}
    mtp_kinds = set()
    for group in spec.layers:
        if group.kind not in by_kind:
            by_kind[group.kind] = _check_parts(family, group.kind, family.layer_parameters(spec, group.kind))
        layer_counts[group.kind] = layer_counts.get(group.kind, 0) + group.count
        if group.mtp:
            mtp_kinds.add(group.kind)
    embedding = family.embedding_parameters(spec)
    head = family.head_parameters(spec)
    final_norm = family.final_norm_parameters(spec)
    other = family.other_parameters(spec)
    by_part = {part: 0 for part in PARTS}
    mtp = 0
    for kind, parts in by_kind.items():
        n = layer_counts[kind]
        if kind in mtp_kinds:
            mtp += n * sum(parts.values())
            continue
        for part, value in parts.items():
            by_part[part] += n * value
    by_part["embedding"] += embedding
    by_part["head"] += head
    by_part["norm"] += final_norm
    by_part["other"] += other
    by_part = {part: value for part, value in by_part.items() if value}
    total = sum(by_part.values())
    buffers = family.buffers(spec)
    return ParameterCount(by_kind=by_kind, layer_counts=layer_counts, embedding=embedding, head=head,
                          final_norm=final_norm, other=other, mtp=mtp, buffers=buffers, total=total,
                          by_part=by_part, published_total=family.published_total(spec, total, buffers),
                          uncounted=_uncounted(family, spec))
