"""Frozen value types: a model's shape, a parallel strategy, a device, and the results.

Every class is ``attrs.frozen`` with keyword-only, validated fields. Counts
and bytes are exact ints; per-token figures are floats where a division makes
them so.
"""
from __future__ import annotations

import difflib
import math
import re
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import attrs

from ndcost.errors import InvalidValue, UnknownKey
from ndcost.layer import LayerKind

# ---------------------------------------------------------------------------
# shared identifiers
# ---------------------------------------------------------------------------
PARTS = ("attention", "norm", "ffn", "routed", "shared", "router", "embedding", "head", "mtp", "other")
OPS = ("attMM", "attBMM", "softmax", "dropout", "normOp", "ffAct", "ffMM", "linrec", "other")
FLOP_PARTS = PARTS + ("scores", "linrec")
MEMORY_CATEGORIES = ("parameters", "gradients", "master", "optimizer_states", "activations",
                     "working", "output", "communication", "allocator")


def frozen_mapping(value: Any) -> Mapping:
    return MappingProxyType(dict(value or {}))


def positive_int(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidValue(f"{type(instance).__name__}.{attribute.name} must be a positive integer, got {value!r}")


def non_negative_int(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValue(f"{type(instance).__name__}.{attribute.name} must be an integer >= 0, got {value!r}")


def _optional_non_negative_int(instance, attribute, value):
    if value is not None:
        non_negative_int(instance, attribute, value)


def _optional_positive_int(instance, attribute, value):
    if value is not None:
        positive_int(instance, attribute, value)


def _optional_count():
    """A width or count a family may leave unstated (None), never a negative or fractional one."""
    return attrs.field(default=None, validator=_optional_non_negative_int)


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class LayerGroup:
    """``count`` consecutive layers of one ``kind`` in model order; ``mtp`` flags a multi-token-prediction layer."""

    kind: str = attrs.field(validator=attrs.validators.matches_re(r"^[a-z][a-z0-9_]*$"))
    count: int = attrs.field(validator=positive_int)
    mtp: bool = False

    def __attrs_post_init__(self):
        if self.mtp and "mtp" not in self.kind:
            raise InvalidValue(f"an MTP layer kind's name must contain 'mtp', got {self.kind!r}")


@attrs.frozen(kw_only=True)
class ModelSpec:
    """What the cost model knows of a model: widths, its layer stack and what each kind of layer is.

    Fields a family does not have are ``None`` (never a silent zero). Biases
    are ``True``/``False`` where the config states them and ``None`` where it
    leaves them unstated. ``kind_specs`` describes every kind in ``layers``
    (:class:`~ndcost.layer.LayerKind`): it is what the estimators read.
    ``extra`` holds what only the family itself reads (hyper-connection
    widths, a bias convention, ...); ``hf_config`` the config as a
    dict, from which the census rebuilds the Transformers config.
    """

    name: str
    model_type: str
    family: str
    hidden_size: int = attrs.field(validator=positive_int)
    vocab_size: int = attrs.field(validator=positive_int)
    layers: Tuple[LayerGroup, ...] = attrs.field(converter=tuple)
    kind_specs: Mapping[str, LayerKind] = attrs.field(converter=frozen_mapping)
    num_attention_heads: int = attrs.field(validator=positive_int)
    num_key_value_heads: Optional[int] = _optional_count()
    head_dim: Optional[int] = _optional_count()
    intermediate_size: Optional[int] = _optional_count()
    # MLA
    q_lora_rank: Optional[int] = _optional_count()
    kv_lora_rank: Optional[int] = _optional_count()
    qk_rope_head_dim: Optional[int] = _optional_count()
    qk_nope_head_dim: Optional[int] = _optional_count()
    v_head_dim: Optional[int] = _optional_count()
    # experts
    num_experts: Optional[int] = _optional_count()
    num_shared_experts: Optional[int] = _optional_count()
    num_experts_per_tok: Optional[int] = _optional_count()
    moe_intermediate_size: Optional[int] = _optional_count()
    shared_expert_intermediate_size: Optional[int] = _optional_count()
    first_k_dense: Optional[int] = _optional_count()
    sparse_step: Optional[int] = _optional_count()
    # group-limited routing: the routed experts in expert_groups equal groups, a token's experts from at most
    # expert_groups_per_token of them (DeepSeek-V3's n_group, topk_group); None: not limited
    expert_groups: Optional[int] = _optional_count()
    expert_groups_per_token: Optional[int] = _optional_count()
    # linear attention (gated delta net)
    linear_num_key_heads: Optional[int] = _optional_count()
    linear_num_value_heads: Optional[int] = _optional_count()
    linear_key_head_dim: Optional[int] = _optional_count()
    linear_value_head_dim: Optional[int] = _optional_count()
    linear_conv_kernel_dim: Optional[int] = _optional_count()
    # conventions
    tie_word_embeddings: bool = False
    attention_bias: Optional[bool] = None
    mlp_bias: Optional[bool] = None
    max_position_embeddings: Optional[int] = _optional_count()
    extra: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    hf_config: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping, repr=False, eq=False)

    def __attrs_post_init__(self):
        if not self.layers:
            raise InvalidValue(f"model {self.name!r} has no layers")
        stacked = set(self.kinds)
        undescribed = [k for k in self.kinds if k not in self.kind_specs]
        if undescribed:
            raise InvalidValue(f"model {self.name!r}: layer kind(s) {', '.join(undescribed)} are not described; "
                               f"give kind_specs={{kind: LayerKind(attention=..., mlp=...)}} for each")
        unused = sorted(set(self.kind_specs) - stacked)
        if unused:
            raise InvalidValue(f"model {self.name!r}: kind_specs describes {', '.join(unused)}, which no layer "
                               f"group stacks; kinds stacked: {', '.join(self.kinds)}")
        for kind, described in self.kind_specs.items():
            if not isinstance(described, LayerKind):
                raise InvalidValue(f"model {self.name!r}: kind_specs[{kind!r}] must be a LayerKind, "
                                   f"got {type(described).__name__}")
        if self.num_attention_heads and self.head_dim is None and self.hidden_size % self.num_attention_heads:
            raise InvalidValue(
                f"model {self.name!r}: hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}; state head_dim explicitly")

    @property
    def num_layers(self) -> int:
        """Decoder layers Transformers builds (MTP layers excluded)."""
        return sum(g.count for g in self.layers if not g.mtp)

    @property
    def num_mtp_layers(self) -> int:
        return sum(g.count for g in self.layers if g.mtp)

    @property
    def kinds(self) -> Tuple[str, ...]:
        """Distinct layer kinds in model order."""
        return tuple(dict.fromkeys(g.kind for g in self.layers))

    def kind(self, name: str) -> LayerKind:
        """The description of layer kind *name*."""
        try:
            return self.kind_specs[name]
        except KeyError:
            raise InvalidValue(f"model {self.name!r} has no layer kind {name!r}; its kinds: "
                               f"{', '.join(self.kinds)}") from None

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def qkv_bias(self) -> Optional[bool]:
        """Whether the query, key and value projections add a bias (a family's ``extra``, else ``attention_bias``)."""
        return self.extra.get("qkv_bias", self.attention_bias)

    @property
    def o_bias(self) -> Optional[bool]:
        """Whether the attention's output projection adds a bias (a family's ``extra``, else ``attention_bias``)."""
        return self.extra.get("o_bias", self.attention_bias)

    def layer_kinds(self, include_mtp: bool = False) -> Tuple[str, ...]:
        """The kind of every layer in model order."""
        return tuple(g.kind for g in self.layers if include_mtp or not g.mtp for _ in range(g.count))


# ---------------------------------------------------------------------------
# the strategy
# ---------------------------------------------------------------------------
DTYPES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16",
                  "float8": "fp8", "e4m3": "fp8", "e5m2": "fp8"}
CP_ALGOS = ("ring", "ulysses", "colossal", "hybrid")
RECOMPUTE = ("none", "full", "selective", "core_attention")
SHARD_MESHES = ("dp_cp", "dp", "fsdp_cp")
FLOAT8_RECIPES = ("none", "tensorwise", "rowwise", "rowwise_with_gw_hp")  # torchao Float8LinearConfig.from_recipe_name
GRADIENT_SYNC = ("auto", "every_micro_batch", "last_micro_batch")
PP_ENGINES = ("auto", "megatron", "torch")
FSDP_ENGINES = ("auto", "torch", "megatron")
DDP_ENGINES = ("auto", "torch", "torch_bucket_view", "megatron", "deepspeed")
# DeepSpeed ZeRO's own fields and the ZeRO stages that run each, without PP (deepspeed/runtime/zero/): the
# resolver refuses them elsewhere, a search holds them there alone
ZERO_FIELD_STAGES = {"reduce_bucket_elements": (1, 2, 3), "reuse_distance_elements": (3,),
                     "live_parameters_elements": (3,), "sub_group_elements": (3,)}
DDP_BUCKET_ENGINES = ("auto", "torch")  # PyTorch DDP's buckets beside the gradients (auto is torch's)
LOSS_ENGINES = ("auto", "torch", "megatron", "compiled")
CP_ROTATES = ("allgather", "p2p")
EP_DISPATCHERS = ("alltoall", "deepep")


def deepspeed_bf16_optimizer(zero: Any, param_bf16: Any, grad_fp32: Any, on_device: Any) -> Any:
    """Where DeepSpeed runs its BF16_Optimizer in place of a ZeRO optimizer: ZeRO-1 with bf16 parameters and fp32
    gradients, the optimizer on the device (deepspeed/runtime/engine.py ``_do_optimizer_sanity_check``). Bools or
    bool arrays alike."""
    return (zero == 1) & param_bf16 & grad_fp32 & on_device


def _column(convert: Any, kind: str, **facts: Any) -> Any:
    """*convert* tagged with what the strategy codec reads of its field (``ndcost.columns``): its column kind
    (``int``, ``bool``, ``float``, ``choice``, ``dtype``, ``plugin``, ``split``) and its range or names."""
    convert.column_kind = kind
    for key, value in facts.items():
        setattr(convert, key, value)
    return convert


def _dtype(name: str) -> Any:
    def convert(value):
        if value is None:
            return None
        text = str(value).strip().lower()
        text = _DTYPE_ALIASES.get(text, text)
        if text not in DTYPES and not (name == "master_dtype" and text == "none"):
            allowed = ", ".join(DTYPES) + (", none" if name == "master_dtype" else "")
            raise InvalidValue(f"Strategy.{name}: unknown dtype {value!r}; allowed: {allowed}")
        return text
    return _column(convert, "dtype", allowed=tuple(DTYPES) + (("none",) if name == "master_dtype" else ()))


def _choice(name: str, allowed: Tuple[str, ...]):
    def convert(value):
        text = str(value).strip().lower()
        if text not in allowed:
            raise InvalidValue(f"Strategy.{name}: {value!r} is not allowed; allowed: {', '.join(allowed)}")
        return text
    return _column(convert, "choice", allowed=allowed)


# The most a strategy's integer field, and its devices ``dp * fsdp * cp * tp * pp``, may be: products of a few
# such fields stay exact in int64 (and float64), where the composition multiplies them.
MAX_STRATEGY_INTEGER = 2 ** 31 - 1


def _int_field(name: str, minimum: int, maximum: Optional[int] = None):
    def convert(value):
        if isinstance(value, bool):
            raise InvalidValue(f"Strategy.{name}: expected an integer, got {value!r}")
        try:
            number = int(value)
        except (TypeError, ValueError, OverflowError):
            raise InvalidValue(f"Strategy.{name}: expected an integer, got {value!r}") from None
        if isinstance(value, float) and value != number:
            raise InvalidValue(f"Strategy.{name}: expected an integer, got {value!r}")
        if number < minimum or (maximum is not None and number > maximum):
            bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise InvalidValue(f"Strategy.{name}: {value!r} is out of range; allowed: integers {bound}")
        if number > MAX_STRATEGY_INTEGER:
            raise InvalidValue(f"Strategy.{name}: {value!r} is beyond {MAX_STRATEGY_INTEGER:,} (2**31 - 1), the most "
                               f"a strategy's integer may be; give a smaller {name}")
        return number
    return _column(convert, "int", minimum=minimum,
                   maximum=MAX_STRATEGY_INTEGER if maximum is None else maximum, optional=False)


def _optional_int_field(name: str, minimum: int):
    inner = _int_field(name, minimum)

    def convert(value):
        if value is None or (isinstance(value, str) and value.lower() in ("", "all", "none")):
            return None
        return inner(value)
    return _column(convert, "int", minimum=minimum, maximum=MAX_STRATEGY_INTEGER, optional=True)


def _bool_field(name: str):
    def convert(value):
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise InvalidValue(f"Strategy.{name}: expected true or false, got {value!r}")
    return _column(convert, "bool")


def _float_field(name: str, minimum: float, maximum: Optional[float] = None):
    def convert(value):
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InvalidValue(f"Strategy.{name}: expected a number, got {value!r}") from None
        if not math.isfinite(number) or number < minimum or (maximum is not None and number > maximum):
            bound = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
            raise InvalidValue(f"Strategy.{name}: {value!r} is out of range; allowed: numbers {bound}")
        return number
    return _column(convert, "float", minimum=minimum, maximum=maximum)


def _pp_layers(value):
    if value is None or value == "" or value == ():
        return None
    if isinstance(value, str):
        parts = [p.strip() for p in value.replace(",", "/").split("/") if p.strip()]
    else:
        try:
            parts = list(value)
        except TypeError:
            raise InvalidValue(f"Strategy.pp_layers: expected a split such as '7/8/8/7', got {value!r}") from None
    layers = []
    for part in parts:
        number = None
        if not isinstance(part, bool) and not (isinstance(part, float) and not part.is_integer()):
            try:
                number = int(part)
            except (TypeError, ValueError):
                pass
        if number is None:
            raise InvalidValue(f"Strategy.pp_layers: {part!r} is not a layer count; give positive integers such "
                               f"as '7/8/8/7', got {value!r}")
        if not 1 <= number <= MAX_STRATEGY_INTEGER:
            raise InvalidValue(f"Strategy.pp_layers: every stage holds at least one layer (and at most "
                               f"{MAX_STRATEGY_INTEGER:,}), got {number} in {value!r}; give positive layer counts "
                               f"such as '7/8/8/7'")
        layers.append(number)
    if not layers:
        raise InvalidValue(f"Strategy.pp_layers: expected a split such as '7/8/8/7', got {value!r}")
    return tuple(layers)


_column(_pp_layers, "split")


# A plugin name as a registry key's last part takes it ("optimizer/<name>"), lower case.
_PLUGIN_NAME = re.compile(r"^[a-z0-9][a-z0-9_.\-]*$")


def unknown_plugin_name_message(field: str, namespace: str, value: str, known: Sequence[str]) -> str:
    """The message for a strategy naming a plugin nobody registered (said at evaluation, where the registry is)."""
    return (f"Strategy.{field}: unknown {field} {value!r}; allowed: {', '.join(known)} "
            f"(a plugin can register more as '{namespace}/<name>')")


def _plugin_name(field: str, namespace: str, example: str):
    """A converter accepting any plugin-style name, lower-cased; whether it is registered is asked at evaluation.

    A value type never consults the registry: building a strategy must not load
    the plugins (searchers build them by the million, and before any plugin is
    needed).
    """
    def convert(value):
        text = str(value).strip().lower() if isinstance(value, str) else None
        if text is None or not _PLUGIN_NAME.match(text):
            raise InvalidValue(f"Strategy.{field}: {value!r} is not a plugin name: use lower-case letters, "
                               f"digits, '_', '.', '-' (a name registered as '{namespace}/<name>', "
                               f"for example {field}={example})")
        return text
    return _column(convert, "plugin", namespace=namespace)


@attrs.frozen(kw_only=True, init=False)
class Strategy:
    """A parallel training strategy; ``Strategy.parse("dp=2,tp=4,seq=4096")`` builds one.

    Devices are ``dp * fsdp * cp * tp * pp``. Expert layers re-split the
    ``dp * fsdp * cp * tp`` ranks as ``ep * etp * expert-data-parallel``.
    ``seq`` is required for costs but may be left unset to describe a layout.
    """

    dp: int = attrs.field(default=1, converter=_int_field("dp", 1))
    fsdp: int = attrs.field(default=1, converter=_int_field("fsdp", 1))
    tp: int = attrs.field(default=1, converter=_int_field("tp", 1))
    pp: int = attrs.field(default=1, converter=_int_field("pp", 1))
    vpp: int = attrs.field(default=1, converter=_int_field("vpp", 1))
    cp: int = attrs.field(default=1, converter=_int_field("cp", 1))
    ep: int = attrs.field(default=1, converter=_int_field("ep", 1))
    etp: int = attrs.field(default=1, converter=_int_field("etp", 1))
    zero: int = attrs.field(default=0, converter=_int_field("zero", 0, 3))
    sp: bool = attrs.field(default=False, converter=_bool_field("sp"))
    cp_algo: str = attrs.field(default="ring", converter=_choice("cp_algo", CP_ALGOS))
    schedule: str = attrs.field(default="1f1b", converter=_plugin_name("schedule", "schedule", "1f1b"))
    micro_batch: int = attrs.field(default=1, converter=_int_field("micro_batch", 1))
    num_micro_batches: int = attrs.field(default=1, converter=_int_field("num_micro_batches", 1))
    seq: Optional[int] = attrs.field(default=None, converter=_optional_int_field("seq", 1))
    recompute: str = attrs.field(default="none", converter=_choice("recompute", RECOMPUTE))
    recompute_layers: Optional[int] = attrs.field(default=None, converter=_optional_int_field("recompute_layers", 0))
    vocab_parallel: bool = attrs.field(default=False, converter=_bool_field("vocab_parallel"))
    optimizer: str = attrs.field(default="adamw", converter=_plugin_name("optimizer", "optimizer", "adamw"))
    param_dtype: str = attrs.field(default="bf16", converter=_dtype("param_dtype"))
    compute_dtype: Optional[str] = attrs.field(default=None, converter=_dtype("compute_dtype"))
    grad_dtype: Optional[str] = attrs.field(default=None, converter=_dtype("grad_dtype"))
    optimizer_dtype: Optional[str] = attrs.field(default=None, converter=_dtype("optimizer_dtype"))
    master_dtype: str = attrs.field(default="none", converter=_dtype("master_dtype"))
    pp_layers: Optional[Tuple[int, ...]] = attrs.field(default=None, converter=_pp_layers)
    moe_imbalance: float = attrs.field(default=1.0, converter=_float_field("moe_imbalance", 1.0))
    allocator_overhead: float = attrs.field(default=0.0, converter=_float_field("allocator_overhead", 0.0, 1.0))
    shard_mesh: str = attrs.field(default="dp_cp", converter=_choice("shard_mesh", SHARD_MESHES))
    reshard_after_forward: bool = attrs.field(default=True, converter=_bool_field("reshard_after_forward"))
    offload_optimizer: bool = attrs.field(default=False, converter=_bool_field("offload_optimizer"))
    offload_params: bool = attrs.field(default=False, converter=_bool_field("offload_params"))
    offload_activations: bool = attrs.field(default=False, converter=_bool_field("offload_activations"))
    float8: str = attrs.field(default="none", converter=_choice("float8", FLOAT8_RECIPES))
    float8_all_gather: bool = attrs.field(default=False, converter=_bool_field("float8_all_gather"))
    float8_experts: bool = attrs.field(default=False, converter=_bool_field("float8_experts"))
    compile: bool = attrs.field(default=False, converter=_bool_field("compile"))
    async_tp: bool = attrs.field(default=False, converter=_bool_field("async_tp"))
    gradient_sync: str = attrs.field(default="auto", converter=_choice("gradient_sync", GRADIENT_SYNC))
    pp_engine: str = attrs.field(default="auto", converter=_choice("pp_engine", PP_ENGINES))
    pp_return_outputs: bool = attrs.field(default=False, converter=_bool_field("pp_return_outputs"))
    fsdp_engine: str = attrs.field(default="auto", converter=_choice("fsdp_engine", FSDP_ENGINES))
    ddp_engine: str = attrs.field(default="auto", converter=_choice("ddp_engine", DDP_ENGINES))
    reduce_bucket_elements: int = attrs.field(default=0, converter=_int_field("reduce_bucket_elements", 0))
    reduce_buckets: int = attrs.field(default=1, converter=_int_field("reduce_buckets", 1, 2))
    reuse_distance_elements: int = attrs.field(default=0, converter=_int_field("reuse_distance_elements", 0))
    live_parameters_elements: int = attrs.field(default=0, converter=_int_field("live_parameters_elements", 0))
    sub_group_elements: int = attrs.field(default=0, converter=_int_field("sub_group_elements", 0))
    loss_engine: str = attrs.field(default="auto", converter=_choice("loss_engine", LOSS_ENGINES))
    cp_rotate: str = attrs.field(default="allgather", converter=_choice("cp_rotate", CP_ROTATES))
    ep_dispatcher: str = attrs.field(default="alltoall", converter=_choice("ep_dispatcher", EP_DISPATCHERS))

    def __init__(self, *args: Any, **fields: Any) -> None:
        # attrs' own __init__ would answer an unknown or positional field with a bare TypeError;
        # a strategy refuses it as every other bad value: naming the field and the allowed ones.
        if args:
            raise InvalidValue(f"Strategy takes fields by name (Strategy(tp=2, seq=4096)), got positional "
                               f"{', '.join(map(repr, args))}; fields: {', '.join(Strategy.field_names())}")
        if not _STRATEGY_FIELDS.issuperset(fields):
            _refuse_unknown_fields(fields)
        self.__attrs_init__(**fields)

    def __attrs_post_init__(self):
        if self.devices > MAX_STRATEGY_INTEGER:
            raise InvalidValue(devices_message(self.dp, self.fsdp, self.cp, self.tp, self.pp))
        if self.pp_layers is not None and len(self.pp_layers) != self.pp * self.vpp:
            raise InvalidValue(f"Strategy.pp_layers: {len(self.pp_layers)} stages given "
                               f"({'/'.join(map(str, self.pp_layers))}) but pp * vpp = {self.pp * self.vpp}")
        # vpp with a non-interleaved schedule is refused by the schedule plugin, by name.
        ranks = self.dp * self.fsdp * self.cp * self.tp
        if ranks % (self.ep * self.etp):
            raise InvalidValue(f"Strategy: ep * etp = {self.ep} * {self.etp} = {self.ep * self.etp} must divide "
                               f"dp * fsdp * cp * tp = {ranks}")
        refused = low_precision_refusals(self.float8 != "none", self.float8 == "tensorwise", self.float8_all_gather,
                                         self.compile, self.async_tp, self.sp, self.compute == "fp8",
                                         self.float8_experts, self.float8 != "rowwise_with_gw_hp")
        for bad, message in zip(refused, LOW_PRECISION_REFUSALS, strict=True):
            if bad:
                raise InvalidValue(message)

    # resolved dtypes
    @property
    def compute(self) -> str:
        return self.compute_dtype or self.param_dtype

    @property
    def grad(self) -> str:
        return self.grad_dtype or self.param_dtype

    @property
    def optimizer_state_dtype(self) -> str:
        return self.optimizer_dtype or self.param_dtype

    @property
    def devices(self) -> int:
        return self.dp * self.fsdp * self.cp * self.tp * self.pp

    @property
    def expert_data_parallel(self) -> int:
        return self.dp * self.fsdp * self.cp * self.tp // (self.ep * self.etp)

    # --- the string form ---------------------------------------------------
    @classmethod
    def field_names(cls) -> Tuple[str, ...]:
        return tuple(a.name for a in attrs.fields(cls))

    @classmethod
    def parse(cls, text: str, **overrides: Any) -> "Strategy":
        """A strategy from ``"key=value,key=value"``; unknown keys are refused naming the fields."""
        if not isinstance(text, str):
            raise InvalidValue(f"Strategy.parse expects a string such as 'dp=2,tp=4,seq=4096', got {text!r}")
        values: Dict[str, Any] = {}
        for item in (p.strip() for p in text.split(",")):
            if not item:
                continue
            if "=" not in item:
                raise InvalidValue(f"Strategy.parse: {item!r} is not 'field=value' (in {text!r})")
            key, value = (s.strip() for s in item.split("=", 1))
            if key in values:
                raise InvalidValue(f"Strategy.parse: field {key!r} is given twice in {text!r}")
            values[key] = value
        values.update(overrides)
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> "Strategy":
        """A strategy from a mapping of field names; unknown names are refused with the closest field."""
        if not isinstance(values, Mapping):
            hint = "; for a string use Strategy.parse" if isinstance(values, str) else ""
            raise InvalidValue(f"Strategy.from_mapping expects a mapping of field names to values, such as "
                               f"{{'tp': 2, 'seq': 4096}}, got {type(values).__name__} {values!r}{hint}")
        values = dict(values)
        if not _STRATEGY_FIELDS.issuperset(values):
            _refuse_unknown_fields(values)
        return cls(**values)

    @classmethod
    def named_fields(cls, fields: Any) -> Dict[str, Any]:
        """The fields ``"k=v,..."`` or a mapping names, converted as a strategy converts them (a field given at
        its default included): what overrides or holds them over another strategy's."""
        if isinstance(fields, str):
            values = cls.parse(fields).to_dict()
            named = {item.split("=", 1)[0].strip() for item in fields.split(",") if item.strip()}
        else:
            values = cls.from_mapping(fields).to_dict()
            named = set(fields)
        return {k: v for k, v in values.items() if k in named}

    def to_dict(self, *, defaults: bool = True) -> Dict[str, Any]:
        out = {}
        for a in attrs.fields(type(self)):
            value = getattr(self, a.name)
            if not defaults and value == a.default:
                continue
            out[a.name] = "/".join(map(str, value)) if a.name == "pp_layers" and value is not None else value
        return out

    def __str__(self) -> str:
        return ",".join(f"{key}={self.field_text(value)}" for key, value in self.to_dict(defaults=False).items())

    def differences(self, other: "Strategy") -> str:
        """The fields whose values differ from *other*'s, as ``field=value,...`` (this strategy's values, defaults
        spelt out; "" where none does): how one strategy is named beside another."""
        mine, theirs = self.to_dict(), other.to_dict()
        return ",".join(f"{k}={self.field_text(v)}" for k, v in mine.items() if v != theirs[k])

    @staticmethod
    def field_text(value: Any) -> str:
        """A field's value (as ``to_dict`` gives it) as ``Strategy.parse`` reads it back."""
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return repr(value)
        return "none" if value is None else str(value)


_STRATEGY_FIELDS = frozenset(Strategy.field_names())

# The combinations of float8, compile and async_tp no run makes, refused by Strategy and by the column codec alike
# (torchtitan: async TP needs compile, torchtitan/distributed/tensor_parallel.py maybe_enable_async_tp; the fp8
# all-gather with a recipe_name is asserted away in components/quantization/float8.py at 238fa99).
LOW_PRECISION_REFUSALS = (
    "Strategy.async_tp=true needs compile=true: the collective matmuls are made by torch.compile's micro-pipeline "
    "pass (torchtitan refuses async TP without compile); set compile=true or async_tp=false",
    "Strategy.async_tp=true needs sp=true: async TP overlaps SP's all-gathers and reduce-scatters with the matmuls; "
    "set sp=true or async_tp=false",
    "Strategy.float8_all_gather=true needs float8=tensorwise: torchao gathers fp8 weights with tensorwise scales "
    "only (torchtitan asserts it away with a recipe_name); set float8=tensorwise or float8_all_gather=false",
    "Strategy.float8 with compute_dtype=fp8: float8 casts compute_dtype's linears to fp8 and keeps the rest at "
    "compute_dtype; give compute_dtype=bf16 (or float8=none for every op at fp8)",
    "Strategy.float8_experts=true needs float8: the experts' grouped GEMMs take the float8 recipe's scaling; set "
    "float8=tensorwise or rowwise, or float8_experts=false",
    "Strategy.float8_experts=true with float8=rowwise_with_gw_hp: the recipe is torchao's Float8Linear's; the "
    "experts' grouped GEMMs (torchao's _scaled_grouped_mm) keep no high-precision weight gradient; set "
    "float8=rowwise or tensorwise, or float8_experts=false",
)


def low_precision_refusals(float8_on, tensorwise, float8_all_gather, compile, async_tp, sp, compute_fp8,
                           float8_experts, not_grad_weight_hp):
    """Which of :data:`LOW_PRECISION_REFUSALS` hold, in order: flags for one strategy or bool arrays for columns
    (``a > b`` is "a without b" for both)."""
    return (async_tp > compile, async_tp > sp, float8_all_gather > tensorwise, float8_on & compute_fp8,
            float8_experts > float8_on, float8_experts > not_grad_weight_hp)


def devices_message(dp, fsdp, cp, tp, pp) -> str:
    """The refusal of a strategy over more devices than ``MAX_STRATEGY_INTEGER``."""
    return (f"Strategy: dp * fsdp * cp * tp * pp = {dp} * {fsdp} * {cp} * {tp} * {pp} devices is beyond "
            f"{MAX_STRATEGY_INTEGER:,} (2**31 - 1), the most a strategy may span; use smaller degrees")


@attrs.frozen(kw_only=True)
class FieldDoc:
    """What a ``Strategy`` field means, in its unit, and the names other tools give it (for suggestions).

    Its default and allowed values are not restated here: :func:`strategy_fields` reads them off the field's
    attrs default and converter, so the documentation cannot drift from what ``Strategy`` accepts.
    """

    meaning: str
    unit: str = ""
    synonyms: Tuple[str, ...] = ()


# One entry a Strategy field (tests/test_cli_usability.py checks none is missing); `ndcost fields` prints it and
# docs/strategy-fields.md is generated from it. Synonyms are the names Megatron-LM, DeepSpeed, PyTorch and
# Transformers' TrainingArguments use, so an unknown field is answered by meaning as well as by spelling.
STRATEGY_FIELD_DOCS: Mapping[str, FieldDoc] = frozen_mapping({
    "dp": FieldDoc(meaning="data-parallel replicas (each holds the whole model states unless zero shards them)",
                   unit="ranks",
                   synonyms=("data_parallel", "data_parallel_size", "dp_size", "ddp")),
    "fsdp": FieldDoc(meaning="ranks the parameters, gradients and optimizer states are sharded over (FSDP / "
                             "ZeRO-3), with the cp ranks as shard_mesh says; with dp > 1 it is HSDP: dp replicas "
                             "of fsdp shards", unit="ranks",
                     synonyms=("fully_sharded", "fully_sharded_data_parallel", "fsdp_size", "hsdp",
                               "sharded_data_parallel", "shard_size")),
    "tp": FieldDoc(meaning="tensor-parallel ranks splitting the attention and MLP weights (Megatron-style)",
                   unit="ranks", synonyms=("tensor_parallel", "tensor_parallel_size", "tensor_model_parallel_size",
                                           "tp_size", "model_parallel", "mp")),
    "pp": FieldDoc(meaning="pipeline stages, each a rank holding a contiguous run of layers", unit="stages",
                   synonyms=("pipeline_parallel", "pipeline_parallel_size", "pipeline_model_parallel_size",
                             "pp_size", "stages", "num_stages")),
    "vpp": FieldDoc(meaning="model chunks per pipeline rank (interleaved schedules); 1 is not interleaved",
                    unit="chunks", synonyms=("virtual_pipeline_parallel", "virtual_pipeline_model_parallel_size",
                                             "virtual_stages", "interleave", "chunks")),
    "cp": FieldDoc(meaning="context-parallel ranks splitting each sequence", unit="ranks",
                   synonyms=("context_parallel", "context_parallel_size", "cp_size")),
    "ep": FieldDoc(meaning="expert-parallel ranks splitting the routed experts (taken out of dp * fsdp * cp * tp)",
                   unit="ranks", synonyms=("expert_parallel", "expert_model_parallel_size", "ep_size",
                                           "moe_expert_parallel")),
    "etp": FieldDoc(meaning="tensor-parallel ranks splitting each routed expert's width (1: every TP rank holds "
                            "its experts whole; Megatron-LM's --expert-tensor-parallel-size defaults to tp, which "
                            "its reader sets)", unit="ranks",
                    synonyms=("expert_tensor_parallel", "expert_tensor_parallel_size", "etp_size")),
    "zero": FieldDoc(meaning="ZeRO stage without FSDP: 1 shards optimizer states and master copy over dp (and cp, "
                             "as shard_mesh says), 2 also gradients, 3 also parameters; 0 shards nothing",
                     unit="stage",
                     synonyms=("zero_stage", "deepspeed_zero", "zero_optimization", "distributed_optimizer")),
    "sp": FieldDoc(meaning="sequence parallelism: the activations outside tensor-parallel regions split over tp",
                   synonyms=("sequence_parallel", "sequence_parallelism")),
    "cp_algo": FieldDoc(meaning="how context parallelism exchanges keys and values: ring (torch's), ulysses "
                                "(all-to-alls of heads), colossal (Colossal-AI's ring) or hybrid (Transformer "
                                "Engine's a2a+p2p); the time model prices colossal's and hybrid's exchanges as "
                                "ring's (their double ring and all-to-all stage not apart), the memory model each "
                                "as its own",
                        synonyms=("cp_comm_type", "context_parallel_algorithm", "cp_algorithm", "cp_method")),
    "schedule": FieldDoc(meaning="pipeline schedule (a schedule plugin; `ndcost list schedules`)",
                         synonyms=("pipeline_schedule", "pp_schedule")),
    "micro_batch": FieldDoc(meaning="sequences in one micro-batch on one rank", unit="sequences",
                            synonyms=("micro_batch_size", "mbs", "batch_size", "per_device_train_batch_size",
                                      "train_micro_batch_size_per_gpu")),
    "num_micro_batches": FieldDoc(meaning="micro-batches a step accumulates (per data-parallel rank)",
                                  unit="micro-batches",
                                  synonyms=("gradient_accumulation_steps", "grad_accum", "accumulation_steps",
                                            "num_microbatches", "micro_batches", "gradient_accumulation")),
    "seq": FieldDoc(meaning="tokens in one sequence (required for a cost)", unit="tokens",
                    synonyms=("seq_len", "seq_length", "sequence_length", "max_seq_len", "max_seq_length",
                              "context_length", "max_length")),
    "recompute": FieldDoc(meaning="activation recomputation: full (a layer keeps its input only), selective "
                                  "(the runtime profile's op-level checkpoint policy, e.g. torchtitan's), "
                                  "core_attention (the attention function only, as Megatron-LM's selective)",
                          synonyms=("activation_checkpointing", "gradient_checkpointing", "checkpointing",
                                    "recompute_granularity", "activation_recompute")),
    "recompute_layers": FieldDoc(meaning="how many of a rank's first layers recompute (unset: all of them)",
                                 unit="layers",
                                 synonyms=("recompute_num_layers", "checkpoint_layers", "num_checkpointed_layers")),
    "vocab_parallel": FieldDoc(meaning="the embedding, head and loss split over tp by vocabulary rows (else "
                                       "replicated on every tp rank); tp must divide vocab_size (Megatron-LM pads "
                                       "it to a multiple of make_vocab_size_divisible_by * tp: a model stating the "
                                       "padded size prices that); nothing changes at tp=1. Off unless set: a "
                                       "trainer's reader applies its default (torchtitan's loss parallelism is on "
                                       "with tp > 1 unless disable_loss_parallel; Megatron-LM always splits it)",
                               synonyms=("vocab_parallel_embedding", "parallel_vocab", "vocab_parallelism")),
    "optimizer": FieldDoc(meaning="optimizer (a plugin; its states per parameter; `ndcost list optimizers`)",
                          synonyms=("optim", "optimizer_name", "opt")),
    "param_dtype": FieldDoc(meaning="dtype the parameters are stored in", unit="dtype",
                            synonyms=("dtype", "params_dtype", "weight_dtype", "torch_dtype")),
    "compute_dtype": FieldDoc(meaning="dtype the layers compute and keep activations in (unset: param_dtype); at "
                                      "fp32 the 16-bit activation records widened by the op records' ratios of "
                                      "their bytes at 4 and 2 bytes an element (an estimate under a census; no "
                                      "reserved bytes claimed)",
                              unit="dtype", synonyms=("autocast_dtype", "amp_dtype", "activation_dtype",
                                                      "mixed_precision")),
    "grad_dtype": FieldDoc(meaning="dtype of the parameter gradients (unset: param_dtype)", unit="dtype",
                           synonyms=("gradient_dtype", "main_grads_dtype", "grads_dtype", "grad_reduce_dtype")),
    "optimizer_dtype": FieldDoc(meaning="dtype of the optimizer states (unset: param_dtype)", unit="dtype",
                                synonyms=("optimizer_state_dtype", "optim_dtype", "state_dtype",
                                          "exp_avg_dtype")),
    "master_dtype": FieldDoc(meaning="dtype of a master copy of the parameters kept by the optimizer; none: no "
                                     "copy (the optimizer steps the stored parameters)", unit="dtype",
                             synonyms=("master_weights_dtype", "main_params_dtype", "master_weights",
                                       "fp32_master")),
    "pp_layers": FieldDoc(meaning="layers of each pipeline chunk in order, e.g. 7/8/8/7 (pp * vpp counts; "
                                  "unset: as even as the schedule splits them)", unit="layers",
                          synonyms=("layers_per_stage", "pipeline_split", "stage_layers",
                                    "pipeline_model_parallel_layout")),
    "moe_imbalance": FieldDoc(meaning="routed tokens the busiest expert rank gets over the balanced share; priced "
                                      "at most ep (the busiest of ep ranks gets at most every routed token: no "
                                      "effect at ep=1)",
                              unit="ratio", synonyms=("expert_imbalance", "load_imbalance", "moe_load_imbalance")),
    "allocator_overhead": FieldDoc(meaning="the caching allocator's fragmentation, as a fraction of the rest of a "
                                           "stage's bytes, added as the allocator category", unit="fraction",
                                   synonyms=("fragmentation", "allocator_fragmentation", "memory_overhead")),
    "shard_mesh": FieldDoc(meaning="the ranks FSDP and ZeRO shard over. dp_cp: also over the context-parallel ranks "
                                   "(ZeRO over dp * cp, FSDP over fsdp * cp; Megatron-LM's distributed optimizer); "
                                   "dp: ZeRO over dp, FSDP over fsdp, the cp ranks replicating the weights "
                                   "(gradients still reduced over every replica); fsdp_cp: FSDP over fsdp * cp "
                                   "whenever that is more than one rank, fsdp=1 included, dp replicating (HSDP), "
                                   "with no zero: torchtitan's dp_shard_cp mesh, so its data_parallel_replicate_degree "
                                   "R, data_parallel_shard_degree S and context_parallel_degree C are dp=R, fsdp=S, "
                                   "cp=C, shard_mesh=fsdp_cp (FSDP 1 CP 8: fsdp=1,cp=8,shard_mesh=fsdp_cp, "
                                   "parameters sharded 8 ways; R=2, S=1, C=2: dp=2,cp=2,shard_mesh=fsdp_cp, HSDP "
                                   "over the cp ranks; zero=3,cp=8 shards as many ways, priced with ZeRO-3's "
                                   "one-module-at-a-time buffers instead of FSDP2's)",
                           synonyms=("fsdp_mesh", "shard_group", "dp_shard_cp", "data_parallel_with_cp")),
    "reshard_after_forward": FieldDoc(meaning="FSDP frees a layer's gathered parameters after its forward and "
                                              "gathers them again for its backward; false (FSDP2's fully_shard("
                                              "reshard_after_forward=False), torchtitan's default with pp > 1) keeps "
                                              "them from the forward to the backward: the stage holds all its "
                                              "layers gathered at the backward's start and the backward gathers "
                                              "nothing. No effect where nothing gathers parameters (no FSDP, zero "
                                              "0-2); refused with zero=3 (DeepSpeed's stage3_param_persistence_"
                                              "threshold keeps small parameters whole instead, another rule)",
                                      synonyms=("fsdp_reshard_after_forward", "reshard")),
    "offload_optimizer": FieldDoc(meaning="optimizer states and master copy live in host memory and the "
                                          "optimizer steps on the CPU (ZeRO-Offload, Megatron-LM's "
                                          "--optimizer-cpu-offload)",
                                  synonyms=("optimizer_cpu_offload", "cpu_offload_optimizer", "offload_optim")),
    "offload_params": FieldDoc(meaning="parameters (and their gradients) live in host memory, copied to the device "
                                       "as layers need them (ZeRO-Infinity offload_param, FSDP2 CPUOffloadPolicy)",
                               synonyms=("offload_param", "cpu_offload", "param_offload", "cpu_offload_params")),
    "offload_activations": FieldDoc(meaning="saved activations are copied to host memory after the forward and back "
                                            "for the backward (torch.autograd.graph.save_on_cpu)",
                                    synonyms=("activation_offload", "cpu_offload_activations", "offload_activation")),
    "float8": FieldDoc(meaning="torchao Float8Linear training (torchtitan's float8 converter), dynamic scaling: the "
                               "attention projections' and dense / shared MLP's GEMMs at the hardware's fp8 peak (its "
                               "efficiency matmul_fp8), "
                               "their inputs, weights and output gradients cast (amax read, then read and written "
                               "as fp8: 2 w + 1 bytes an element at compute width w; six casts a linear a step, "
                               "as torchao's matmul_with_hp_or_float8_args runs them); the attention scores, the "
                               "router, the routed experts (unless float8_experts) and the output head stay at "
                               "compute_dtype; saved "
                               "activations unchanged (the high-precision input is saved). rowwise scales the "
                               "backward's second use of a tensor along its other axis, through a transposed "
                               "copy (2 w bytes an element more), and under TP casts what each linear reads "
                               "gathered, where tensorwise's Float8 TP styles cast the shard before SP's gather; "
                               "its scaled GEMM runs at the hardware's matmul efficiency, as tensorwise's (slower "
                               "on small shapes: pytorch/torchtitan#1207). rowwise_with_gw_hp (rowwise's TP) "
                               "computes the weight's gradient at compute_dtype from the saved input and the "
                               "output gradient: a linear casts its output gradient once and its weight once "
                               "(tensorwise) in the backward, and half the backward's GEMM FLOPs run at the fp8 "
                               "peak. No amax history (dynamic scaling keeps none). Needs a hardware fp8 peak",
                       synonyms=("fp8", "fp8_recipe", "float8_recipe", "recipe_name", "fp8_training",
                                 "float8_linear", "enable_float8_linear")),
    "float8_all_gather": FieldDoc(meaning="FSDP2 gathers the Float8 linears' weights as fp8 (torchao "
                                          "enable_fsdp_float8_all_gather: 1 byte an element gathered and held, "
                                          "each shard cast before its gather instead of the whole weight after); "
                                          "float8=tensorwise only; no effect where FSDP gathers nothing",
                                  synonyms=("enable_fsdp_float8_all_gather", "fp8_all_gather", "fp8_param_gather",
                                            "fp8_param")),
    "float8_experts": FieldDoc(meaning="the routed experts' grouped GEMMs in fp8 too, under float8's recipe "
                                       "(torchtitan's float8 moe_fqns / quantize.grouped_mm.float8, torchao's "
                                       "_scaled_grouped_mm; Transformer Engine's grouped linears under Megatron-LM's "
                                       "--fp8-format; DeepSeek-V3's FP8 training): their FLOPs at the fp8 peak, "
                                       "each copy's input, output gradient and the rank's expert weights cast as "
                                       "float8's linears are; saved activations unchanged. Needs float8; no "
                                       "effect on a model without routed experts",
                               synonyms=("fp8_experts", "float8_moe", "fp8_moe", "moe_fqns", "float8_grouped_mm",
                                         "fp8_grouped_gemm")),
    "compile": FieldDoc(meaning="torch.compile of each layer (torchtitan [compile] enable, per TransformerBlock): "
                                "each chain of pointwise ops between matmuls reads its inputs and writes its "
                                "outputs once (an analytic fused count a kind: norms, residual adds, rotary, the "
                                "MLP activation; copies, linear attention's gating and a complex rotary, which "
                                "Inductor does not fuse (the runtime's rotary), as eager); saved activations "
                                "unchanged (the partitioner's recompute of pointwise ops is not priced); the "
                                "launch floor (a pass's kernels times the host's dispatch) stays eager's: compile's "
                                "fewer, cheaper launches are not priced, so where that floor binds (few tokens a "
                                "rank) compile changes nothing",
                        synonyms=("torch_compile", "compile_model", "enable_compile", "inductor")),
    "async_tp": FieldDoc(meaning="async tensor parallelism (torchtitan enable_async_tensor_parallel, torch "
                                 "_micro_pipeline_tp): SP's all-gathers and reduce-scatters fused with their "
                                 "matmuls, tp pieces a collective, each shard's NVLink pull behind a piece's matmul "
                                 "(the backward's summed input gradients still NCCL's); needs compile, sp and tp "
                                 "within an NVLink domain",
                         synonyms=("enable_async_tensor_parallel", "async_tensor_parallel", "tp_comm_overlap",
                                   "micro_pipeline_tp")),
    "gradient_sync": FieldDoc(meaning="when the data-parallel ranks reduce the gradients a step accumulates. auto: "
                                      "each engine's own: FSDP / ZeRO-3 reduce-scatter a layer's gradients as each "
                                      "micro-batch's backward makes them, ZeRO-2 reduce-scatters after each "
                                      "micro-batch's backward (DeepSpeed's, every micro-step: its gradients are "
                                      "held as shards), DDP and ZeRO-1 reduce once, behind the last micro-batch's "
                                      "backward (DDP's no_sync, Megatron-LM's grad buffers, DeepSpeed's ZeRO-1 at "
                                      "the accumulation boundary). every_micro_batch: FSDP / ZeRO-2 / ZeRO-3 as "
                                      "auto; DDP all-reduces after each micro-batch's backward; refused with "
                                      "zero=1 (it reduces at the accumulation boundary). "
                                      "last_micro_batch: DDP and ZeRO-1 as auto; FSDP as torch.distributed."
                                      "pipelining runs it (torchtitan with pp > 1: set_requires_gradient_sync(False) "
                                      "and set_reshard_after_backward(False) until the last micro-batch): the "
                                      "stage's gradients held whole in grad_dtype (FSDP2's reduce dtype) from the "
                                      "first backward, its layers kept gathered, one reduce-scatter of them all "
                                      "after the last backward; refused with zero=2 or 3 (DeepSpeed's no_sync "
                                      "refuses gradient partitioning)",
                              synonyms=("no_sync", "requires_gradient_sync", "grad_sync", "gradient_reduction",
                                        "reduce_grads")),
    "pp_engine": FieldDoc(meaning="the pipeline engine moving activations and their gradients between stages. "
                                  "auto: as megatron. megatron: a receive tensor a transfer, which becomes the "
                                  "micro-batch's input (or output gradient) and is freed with it (Megatron-LM's "
                                  "p2p_communication.py): nothing beyond the activations. torch: torch.distributed."
                                  "pipelining's PipelineStage (torchtitan with pp > 1), which allocates once, for "
                                  "every micro-batch of the step, a receive buffer for each local stage's input "
                                  "(all but the first stage) and one for its output's gradient (all but the last), "
                                  "kept across steps: num_micro_batches x a stage boundary's bytes each, "
                                  "communication at every moment, less what the activations count of the "
                                  "micro-batches in flight (the received buffer is their input); and each stage "
                                  "holds its micro-batches' outputs in flight to their backward (fwd_cache: a "
                                  "stage boundary each, activations; the last stage's logits, every micro-batch's "
                                  "under pp_return_outputs); no effect at pp=1",
                          synonyms=("pipeline_engine", "pp_runtime", "pipeline_runtime", "pp_backend",
                                    "pipeline_backend")),
    "pp_return_outputs": FieldDoc(meaning="whether torch.distributed.pipelining's schedule returns the last "
                                          "stage's outputs (schedule.step(return_outputs=...), torch's default "
                                          "True; torchtitan passes False from e5ef99aa, 2025-10-22). true: the "
                                          "last stage keeps every micro-batch's output (its 16-bit logits, split "
                                          "by tp under vocab_parallel) until the next step (stage.py "
                                          "output_chunks), and step() concatenates them once its backward is done "
                                          "(_merge_outputs): num_micro_batches outputs at every moment after the "
                                          "last forward, twice that at the merge. No effect without "
                                          "pp_engine=torch at pp > 1",
                                  synonyms=("return_outputs", "pp_outputs", "keep_outputs", "save_forward_output",
                                            "output_chunks")),
    "fsdp_engine": FieldDoc(meaning="the engine gathering FSDP's sharded parameters (fsdp > 1, or shard_mesh=fsdp_cp "
                                    "over cp ranks). auto: as torch. torch: PyTorch's FSDP2 (fully_shard, "
                                    "torchtitan's), which copies each all-gather's output into the parameters' "
                                    "unsharded storage on the compute stream (_fsdp_collectives.py "
                                    "foreach_all_gather_copy_out): those bytes read and written at HBM are compute "
                                    "time. megatron: Megatron-FSDP (Megatron-LM's --use-megatron-fsdp), whose "
                                    "parameters are views of the gathered buffer: no copy. No effect without "
                                    "FSDP (ZeRO-3 gathers into buffers its parameters are views of, as megatron)",
                            synonyms=("fsdp_backend", "fsdp_impl", "fsdp_implementation", "fsdp_version",
                                      "sharding_engine")),
    "ddp_engine": FieldDoc(meaning="the engine all-reducing whole gradients over data-parallel replicas (dp * cp > 1 "
                                   "without FSDP or gradient sharding: zero 0 or 1), which decides when the "
                                   "gradients exist. auto: as torch. torch: PyTorch's DistributedDataParallel "
                                   "(torchtitan's replicate, Accelerate's) at its default gradient_as_bucket_view="
                                   "False: its buckets, made when the model is wrapped, hold every gradient (in "
                                   "grad_dtype) beside the ones autograd makes, communication at every moment "
                                   "(PyTorch's DDP docs: the bucket view saves 'the total gradients size'). "
                                   "torch_bucket_view: gradient_as_bucket_view=True: the gradients are views of the "
                                   "buckets, every one whole from the first backward, once. megatron: Megatron-LM's "
                                   "DDP, whose contiguous grad buffer (main_grad, in grad_dtype) is whole from the "
                                   "first backward, as torch_bucket_view. deepspeed: DeepSpeed's engine at ZeRO 0 or "
                                   "1, gradients as autograd makes them (at ZeRO 0 its flat copy of one bucket at a "
                                   "time during the reduction is left out; ZeRO-1's bucket is "
                                   "reduce_bucket_elements); at ZeRO 1-3 with the optimizer on the device (not "
                                   "its BF16_Optimizer: ZeRO-1 with bf16 parameters and fp32 gradients) also its "
                                   "ZeRO optimizer's step, which holds the partition's gradients alone (ZeRO-1 "
                                   "frees the others at the boundary) and copies them to fp32 (a flat copy, then "
                                   "fp32: ZeRO-3 a sub-group at a time, sub_group_elements) after taking their "
                                   "norm in fp64 a tensor at a time (the embedding's or head's the largest "
                                   "counted), and at ZeRO 0 with 16-bit parameters and gradients its "
                                   "FP16_Optimizer's (each gradient copied to fp32, the copies flattened: 8 bytes "
                                   "a parameter), DeepSpeed 0.19.8 measured on the CPU (tests/test_deepspeed_zero.py). "
                                   "Left out: the time of the engines' passes "
                                   "over the gradients around the reduction (torch's copies into and out of its "
                                   "buckets, the division by the replicas). No effect without such replicas (but "
                                   "for DeepSpeed's optimizer step)",
                           synonyms=("ddp_backend", "ddp_impl", "ddp_implementation", "data_parallel_engine",
                                     "gradient_as_bucket_view", "dp_engine")),
    "reduce_bucket_elements": FieldDoc(
        meaning="DeepSpeed ZeRO's contiguous gradient bucket, one buffer of this many elements in param_dtype that "
                "gradients are copied into for their reduction (zero_optimization.reduce_bucket_size under "
                "contiguous_gradients; DeepSpeed's default 500,000,000), whatever the model's size. ZeRO 1 holds it "
                "from the step's first gradient to the reduction at the accumulation boundary, ZeRO 2 from each "
                "backward's first gradient to its end, ZeRO 3 for the whole run (deepspeed/runtime/zero/"
                "stage_1_and_2.py setup_buckets, stage3.py). 0: none (every other engine, and DeepSpeed's "
                "BF16_Optimizer at ZeRO 1 with fp32 gradients). Left out: the copy's time",
        unit="elements", synonyms=("reduce_bucket_size", "bucket_size", "ipg_bucket_size", "contiguous_gradients")),
    "reduce_buckets": FieldDoc(meaning="how many reduce buckets of reduce_bucket_elements ZeRO 1 and 2 hold: 2 "
                                       "under DeepSpeed's overlap_comm (a double buffer), else 1; ZeRO 3 holds one",
                               unit="buffers", synonyms=("overlap_comm", "double_buffer")),
    "reuse_distance_elements": FieldDoc(
        meaning="DeepSpeed ZeRO-3's stage3_max_reuse_distance (its default 1,000,000,000): a module's gathered "
                "parameters stay gathered where the step's trace reuses them before gathering this many more "
                "parameter elements (deepspeed/runtime/zero/partitioned_param_coordinator.py "
                "__params_to_release), so the last layers of the forward (and the head) are held gathered to their "
                "backward: at the loss, and at the last layer's backward. 0: every module released after its use "
                "(one gathered at a time). Needs zero=3 and pp=1. An estimate at the granularity of a layer's "
                "parameters (a layer recomputed under full or selective recompute kept whole or not at all, one run "
                "once kept as the tail of its parameters); left out: the tied embedding's reuse by the head, "
                "prefetching (stage3_prefetch_bucket_size), the persistent small parameters "
                "(stage3_param_persistence_threshold), the backward's gathers it saves (time)", unit="elements",
        synonyms=("stage3_max_reuse_distance", "max_reuse_distance", "reuse_distance")),
    "live_parameters_elements": FieldDoc(
        meaning="DeepSpeed ZeRO-3's stage3_max_live_parameters (its default 1,000,000,000) where it prefetches "
                "(stage3_prefetch_bucket_size > 0, its default): the prefetcher marks the gathered parameters it "
                "passes over as used again later (deepspeed/runtime/zero/partitioned_param_coordinator.py "
                "fetch_sub_module, __params_to_release), so what it gathers stays gathered to its backward, up to "
                "this many elements: the stage holds the least of it and its parameters gathered at the loss, its "
                "parameters but the head's and final norm's at the last layer's backward, its first layer's and the "
                "embedding's at the end (DeepSpeed 0.19.8 measured on the CPU, tests/test_deepspeed_zero.py). 0: no "
                "prefetching (one module gathered at a time, or reuse_distance_elements' rule). Needs zero=3 and "
                "pp=1. Its backward gathers again only the layers' elements past the bound (time; counted on "
                "DeepSpeed too). Left out: the prefetch's overshoot by part of a module; a tied head's weight (the "
                "embedding's) is taken as released with the head", unit="elements",
        synonyms=("stage3_max_live_parameters", "max_live_parameters", "live_parameters")),
    "sub_group_elements": FieldDoc(
        meaning="DeepSpeed ZeRO-3's sub_group_size (its default 1,000,000,000): its optimizer steps the rank's "
                "partition a sub-group of about this many elements at a time, each sub-group's gradients copied "
                "to fp32 for its step (deepspeed/runtime/zero/stage3.py _prepare_fp32_grad_for_sub_group), so the "
                "step's transient copy is of the least of it and the partition (ddp_engine=deepspeed). 0: one "
                "sub-group, the whole partition. Needs zero=3, pp=1 and ddp_engine=deepspeed. Left out: a "
                "sub-group's overshoot by its last parameter's partition", unit="elements",
        synonyms=("sub_group_size", "sub_group")),
    "loss_engine": FieldDoc(meaning="the implementation of the cross-entropy loss, which decides the output "
                                    "layer's backward peak (a logit's bytes, 16-bit logits). auto: as torch. torch: "
                                    "F.cross_entropy on fp32 logits (Transformers', torchtitan's): log_softmax's "
                                    "fp32 output kept, 12 bytes at the backward's peak; under vocab_parallel at "
                                    "tp > 1, torch's loss_parallel (torch/distributed/tensor/parallel/loss.py, "
                                    "torchtitan's), whose separate ops peak at 16. megatron: Megatron-LM's "
                                    "vocab_parallel_cross_entropy (megatron/core/tensor_parallel/cross_entropy.py) "
                                    "at any tp, in place on its fp32 copy: 6. compiled: the same loss under "
                                    "torch.compile (torchtitan's [compile] components with \"loss\"): Inductor "
                                    "keeps the 16-bit logits and a row's logsumexp and writes the 16-bit gradient "
                                    "in one kernel, the fp32 copies never made: 2 kept, 4 at the peak",
                            synonyms=("loss_impl", "loss_implementation", "loss_backend", "cross_entropy_engine",
                                      "cross_entropy_impl")),
    "cp_rotate": FieldDoc(meaning="how a K/V-passing context-parallel ring (cp_algo ring, colossal or hybrid) "
                                  "moves the keys and values. allgather (torch's default): one all-gather of every "
                                  "rank's blocks a pass, hidden behind the first "
                                  "step's attention only (torch's _AllGatherRotater, torchtitan's "
                                  "context_parallel_rotate_method \"allgather\", Megatron-LM's --cp-comm-type "
                                  "allgather). p2p: the next block sent to the next rank while each step's "
                                  "attention runs, cp - 1 sends a pass (torch's _AllToAllRotater, torchtitan's "
                                  "\"alltoall\"; Megatron-LM's --cp-comm-type p2p, its default). Memory: torch's ring "
                                  "attention's backward holds all cp blocks and a send copy under allgather, three "
                                  "blocks under p2p (compose/memory.py _ring_attention_working). Refused as p2p "
                                  "with cp_algo=ulysses (no ring); no effect at cp=1",
                          synonyms=("context_parallel_rotate_method", "rotate_method", "cp_rotate_method",
                                    "kv_rotation", "cp_rotation")),
    "ep_dispatcher": FieldDoc(meaning="how expert parallelism sends tokens to their experts and back. alltoall: "
                                      "a token's copy for each of its experts, in one all-to-all of the EP group "
                                      "(torchtitan's \"standard\", Megatron-LM's --moe-token-dispatcher-type "
                                      "alltoall). deepep: DeepEP's dispatch and combine (arXiv:2412.19437 section "
                                      "3.2.2; Megatron-LM's flex dispatcher with the deepep or hybridep backend): a "
                                      "token sent once to each EP rank holding any of its experts, and across "
                                      "NVLink domains once over the network to each domain holding any, then "
                                      "forwarded on NVLink, the two legs pipelined; a model's group-limited "
                                      "routing (n_group, topk_group) bounds the domains. The expected ranks and "
                                      "domains a token reaches assume its experts uniform among those its routing "
                                      "allows; overlapped with compute (DualPipe), its kernels hold 20 SMs the "
                                      "compute beside them lacks; memory: the dispatched tokens as alltoall's "
                                      "(DeepEP's own registered buffers are not counted); no effect at ep=1",
                              synonyms=("moe_token_dispatcher_type", "token_dispatcher", "moe_comm_backend",
                                        "moe_dispatcher", "expert_dispatcher")),
})


def _allowed_text(converter: Any, default: Any) -> str:
    kind = getattr(converter, "column_kind", "")
    if kind in ("int", "float"):
        bound = (f">= {converter.minimum}" if converter.maximum is None
                 else f"{converter.minimum} to {converter.maximum}")
        text = f"{'integers' if kind == 'int' else 'numbers'} {bound}"
    elif kind == "bool":
        text = "true, false"
    elif kind in ("choice", "dtype"):
        text = ", ".join(converter.allowed)
    elif kind == "plugin":
        text = f"a registered {converter.namespace}/<name>"
    else:  # split
        text = "layer counts joined by '/'"
    return text + (", or unset" if default is None else "")


def strategy_fields() -> Tuple[Dict[str, Any], ...]:
    """Every ``Strategy`` field as ``{"name", "meaning", "unit", "default", "allowed", "synonyms"}``, in order.

    ``default`` and ``allowed`` are read off the field itself (its attrs default, its converter's facts); the
    words from :data:`STRATEGY_FIELD_DOCS`.
    """
    out = []
    for a in attrs.fields(Strategy):
        doc = STRATEGY_FIELD_DOCS[a.name]
        out.append({"name": a.name, "meaning": doc.meaning, "unit": doc.unit, "default": a.default,
                    "allowed": _allowed_text(a.converter, a.default), "synonyms": list(doc.synonyms)})
    return tuple(out)


def closest_strategy_fields(key: str, n: int = 3) -> Tuple[str, ...]:
    """The fields an unknown name most likely means: one it is a synonym of, else the closest in spelling
    among the fields and their synonyms (``tensor_parallel`` -> ``tp``, not ``vocab_parallel``)."""
    text = str(key).strip().lower().replace("-", "_")
    by_name = {name: name for name in Strategy.field_names()}
    for name, doc in STRATEGY_FIELD_DOCS.items():
        by_name.update({synonym: name for synonym in doc.synonyms})
    if text in by_name:
        return (by_name[text],)
    close = difflib.get_close_matches(text, list(by_name), n=n * 3)
    return tuple(dict.fromkeys(by_name[c] for c in close))[:n]


def _refuse_unknown_fields(fields: Mapping[Any, Any]) -> None:
    names = Strategy.field_names()
    for key in fields:
        if key not in _STRATEGY_FIELDS:
            close = closest_strategy_fields(str(key))
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise InvalidValue(f"Strategy: unknown field {key!r}; {hint}fields: {', '.join(names)} "
                               f"(`ndcost fields` says what each means)")


# ---------------------------------------------------------------------------
# the hardware
# ---------------------------------------------------------------------------
# a number followed by letters or a slash: "80GB", "3.35 TB/s", "1e-6 s"
_UNIT_SUFFIXED = re.compile(r"^\s*[-+]?(\d[\d_,]*\.?\d*|\.\d+)([eE][-+]?\d+)?\s*[A-Za-z/%]")


def _to_float(value: Any) -> Any:
    """A number as a float; anything else unchanged, for the field's validator to refuse by name."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _to_float_mapping(value: Any) -> Any:
    return MappingProxyType({k: _to_float(v) for k, v in value.items()}) if isinstance(value, Mapping) else value


def check_number(owner: str, field: str, value: Any, unit: str, *, zero_allowed: bool = False,
                 at_most: Optional[float] = None) -> None:
    """Refuse *value* unless a finite number in *unit*, positive (or >= 0 where *zero_allowed*).

    A string is refused, a unit-suffixed one ("80GB") saying units are not parsed.
    """
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            if _UNIT_SUFFIXED.match(value):
                raise InvalidValue(f"{owner}: {field} is {value!r}; units are not parsed: state a plain number "
                                   f"in {unit}") from None
            raise InvalidValue(f"{owner}: {field} must be a number in {unit}, got the string {value!r}") from None
        raise InvalidValue(f"{owner}: {field} is the string {value!r}, not a number; write the number in {unit} "
                           f"without quotes")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidValue(f"{owner}: {field} must be a number in {unit}, got {value!r}")
    number = float(value)
    if not math.isfinite(number):
        raise InvalidValue(f"{owner}: {field} must be a finite number in {unit}, got {value!r}")
    if number < 0 or (number == 0 and not zero_allowed):
        raise InvalidValue(f"{owner}: {field} must be {'>= 0' if zero_allowed else '> 0'} ({unit}), got {value!r}")
    if at_most is not None and number > at_most:
        raise InvalidValue(f"{owner}: {field} must be at most {at_most:g} ({unit}), got {value!r}")


def _check_name(owner: str, value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidValue(f"{owner}: name must be a non-empty string, got {value!r}")


@attrs.frozen(kw_only=True)
class NetworkLevel:
    """One level of the network: ``within_node`` or ``across_nodes``, its bandwidth per device and latency."""

    name: str
    bytes_per_second: float = attrs.field(converter=_to_float)
    latency_seconds: float = attrs.field(default=0.0, converter=_to_float)

    def __attrs_post_init__(self):
        _check_name("network level", self.name)
        owner = f"network level {self.name!r}"
        check_number(owner, "bytes_per_second", self.bytes_per_second, "bytes per second a device")
        check_number(owner, "latency_seconds", self.latency_seconds, "seconds", zero_allowed=True)


def _check_memory_bytes(instance, attribute, value):
    if isinstance(value, str):
        check_number(f"hardware {instance.name!r}", "memory_bytes", value, "bytes (an integer)")
    positive_int(instance, attribute, value)


def _check_cuda_context_bytes(instance, attribute, value):
    if isinstance(value, str):
        check_number(f"hardware {instance.name!r}", "cuda_context_bytes", value, "bytes (an integer)",
                     zero_allowed=True)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidValue(f"hardware {instance.name!r}: cuda_context_bytes must be a whole number of bytes, 0 or "
                           f"more (for example 536870912 for 512 MiB), got {value!r}")


# A prior, not a measurement of any shipped host: DeepSpeed's CPU-Adam stepping 10 billion parameters in 2.57 s, the
# order Ren et al. 2021, ZeRO-Offload (arXiv:2101.06840, Table 3) report for their test node's host CPUs (the figure
# was taken from that table without re-checking it here). A hardware file states its own host's figure where known.
CPU_ADAM_PARAMETERS_PER_SECOND = 10e9 / 2.57
# NVLink SHARP generations NCCL prices apart (nvlsEfficiency in NCCL's src/graph/tuning.cc); None: no NVLS
NVLS_ARCHITECTURES = (None, "hopper", "blackwell")
NODE_FABRICS = ("switch", "mesh")  # how a node joins its devices (Hardware.node_fabric)


def capability_tuple(text: str) -> Optional[Tuple[int, int]]:
    """``"9.0"`` as ``(9, 0)``; None where *text* is not a CUDA compute capability ``"major.minor"``."""
    major, dot, minor = str(text).partition(".")
    return (int(major), int(minor)) if dot and major.isdigit() and minor.isdigit() else None


@attrs.frozen(kw_only=True)
class Hardware:
    """One accelerator and its network, as a hardware spec YAML states it.

    Every figure is a finite number, positive (a latency may be 0); an efficiency is a fraction of the
    peak in (0, 1]; units are the field's own (bytes, bytes per second, FLOP per second, seconds).
    ``host_to_device_bytes_per_second`` is one device's host link (PCIe) in one direction, None where
    unstated (offloading is then refused); ``cpu_optimizer_parameters_per_second`` the parameters a node's
    host CPUs step a second with a CPU optimizer (every device of the node shares them), by default the
    ZeRO-Offload paper's CPU-Adam figure (:data:`CPU_ADAM_PARAMETERS_PER_SECOND`). ``sm_count`` is the
    device's streaming multiprocessors (compute units), the waves of the GEMM prior; ``kernel_tables`` its
    measured kernel figures (:mod:`ndcost.kernels`, checked here), None where unstated (the priors apply).
    ``nvlink_domain_devices``: the devices one NVLink fabric joins (whole nodes; by default one node, 72 on a
    GB200 NVL72 rack); ``nics_per_node``: a node's network interfaces, the ``across_nodes`` level's bandwidth
    being one's (by default one a device); ``nvls_architecture``: ``hopper`` or ``blackwell`` where the NVLink
    switches reduce in-switch (NVLS, NVLink SHARP), picking NCCL's NVLS constants; None without.
    ``node_fabric``: how a node joins its devices: ``switch`` (NVSwitch: each device's whole link bandwidth
    reaches any peer) or ``mesh`` (point to point, ``devices_per_node - 1`` equal links a device: AMD's
    Infinity Fabric, Huawei's HCCS), where a group of ``m`` devices of a node uses ``m - 1`` of the links
    (:func:`ndcost.compose.topology.group_link`).
    ``compute_capability``: a CUDA device's ``"major.minor"`` (``"9.0"`` on Hopper), which a runtime's kernel
    choice may depend on (:attr:`ndcost.plugins.runtimes.RuntimeProfile.attention_backends`); None on others.
    ``cuda_context_bytes`` is the device memory a training process holds outside PyTorch's caching allocator
    (the CUDA context and the kernels' module images; cuBLAS workspaces are inside the allocator, NCCL's
    buffers are left out; 0 where a spec does not state it): what fits is judged against ``memory_bytes -
    cuda_context_bytes`` (:attr:`usable_memory_bytes`; docs/guides/searchers.md, section 6).
    """

    name: str
    memory_bytes: int = attrs.field(validator=_check_memory_bytes)
    hbm_bytes_per_second: float = attrs.field(converter=_to_float)
    peak_flops_per_second: Mapping[str, float] = attrs.field(converter=_to_float_mapping)
    devices_per_node: int = attrs.field(default=8, validator=positive_int)
    network: Tuple[NetworkLevel, ...] = attrs.field(default=(), converter=tuple)
    efficiency: Mapping[str, float] = attrs.field(factory=dict, converter=_to_float_mapping)
    host_to_device_bytes_per_second: Optional[float] = attrs.field(default=None, converter=_to_float)
    cpu_optimizer_parameters_per_second: float = attrs.field(default=CPU_ADAM_PARAMETERS_PER_SECOND,
                                                             converter=_to_float)
    cuda_context_bytes: int = attrs.field(default=0, validator=_check_cuda_context_bytes)
    description: str = ""
    sm_count: Optional[int] = attrs.field(default=None, validator=_optional_positive_int)
    kernel_tables: Optional[Mapping[str, Any]] = None
    nvlink_domain_devices: int = attrs.field(default=attrs.Factory(lambda self: self.devices_per_node,
                                                                   takes_self=True))
    nics_per_node: int = attrs.field(default=attrs.Factory(lambda self: self.devices_per_node, takes_self=True))
    nvls_architecture: Optional[str] = None
    compute_capability: Optional[str] = attrs.field(default=None, converter=attrs.converters.optional(str))
    node_fabric: str = "switch"

    def __attrs_post_init__(self):
        _check_name("hardware", self.name)
        owner = f"hardware {self.name!r}"
        if self.cuda_context_bytes >= self.memory_bytes:
            raise InvalidValue(f"{owner}: cuda_context_bytes={self.cuda_context_bytes} is not below memory_bytes="
                               f"{self.memory_bytes}; state the context's bytes (about 5.4e+8 on an H100), not the "
                               f"device's")
        check_number(owner, "hbm_bytes_per_second", self.hbm_bytes_per_second, "bytes per second")
        if self.host_to_device_bytes_per_second is not None:
            check_number(owner, "host_to_device_bytes_per_second", self.host_to_device_bytes_per_second,
                         "bytes per second a device, one direction")
        check_number(owner, "cpu_optimizer_parameters_per_second", self.cpu_optimizer_parameters_per_second,
                     "parameters per second a node")
        if not isinstance(self.peak_flops_per_second, Mapping):
            raise InvalidValue(f"{owner}: peak_flops_per_second must map a dtype to its peak "
                               f"({{bf16: 989.0e+12}}), got {self.peak_flops_per_second!r}")
        if not self.peak_flops_per_second:
            raise InvalidValue(f"hardware {self.name!r} states no peak FLOP/s (peak_flops_per_second: {{bf16: ...}})")
        for dtype, peak in self.peak_flops_per_second.items():
            check_number(owner, f"peak_flops_per_second.{dtype}", peak, "FLOP per second")
        if not isinstance(self.efficiency, Mapping):
            raise InvalidValue(f"{owner}: efficiency must map an op class to a fraction of the peak "
                               f"({{matmul: 0.77}}), got {self.efficiency!r}")
        for key, fraction in self.efficiency.items():
            check_number(owner, f"efficiency.{key}", fraction, "a fraction of the peak, (0, 1]", at_most=1.0)
        for level in self.network:
            if not isinstance(level, NetworkLevel):
                raise InvalidValue(f"{owner}: network must hold NetworkLevel values, got {level!r}")
        if self.kernel_tables is not None:
            from ndcost.kernels import parse_kernel_tables
            parse_kernel_tables(owner, self.kernel_tables)
        for field in ("nvlink_domain_devices", "nics_per_node"):
            positive_int(self, attrs.fields_dict(Hardware)[field], getattr(self, field))
        if self.nvlink_domain_devices % self.devices_per_node:
            raise InvalidValue(f"{owner}: nvlink_domain_devices {self.nvlink_domain_devices} is not a whole number "
                               f"of nodes of {self.devices_per_node} devices; state a multiple of devices_per_node")
        if self.nvls_architecture not in NVLS_ARCHITECTURES:
            raise InvalidValue(f"{owner}: nvls_architecture {self.nvls_architecture!r} is not one of "
                               f"{', '.join(map(str, NVLS_ARCHITECTURES))} (omit it where the switches lack NVLS)")
        if self.node_fabric not in NODE_FABRICS:
            raise InvalidValue(f"{owner}: node_fabric {self.node_fabric!r} is not one of {', '.join(NODE_FABRICS)} "
                               f"(switch: NVSwitch; mesh: a link between each pair of a node's devices)")
        if self.compute_capability is not None and capability_tuple(self.compute_capability) is None:
            raise InvalidValue(f"{owner}: compute_capability {self.compute_capability!r} is not a CUDA compute "
                               f"capability \"major.minor\" (\"9.0\" on an H100); omit it on a device without one")

    @property
    def usable_memory_bytes(self) -> int:
        """The bytes PyTorch's allocator can reserve: the device's memory less the CUDA context."""
        return self.memory_bytes - self.cuda_context_bytes

    def peak_flops(self, dtype: str) -> float:
        try:
            return float(self.peak_flops_per_second[dtype])
        except KeyError:
            raise InvalidValue(f"hardware {self.name!r} states no peak for {dtype!r}; it states "
                               f"{', '.join(self.peak_flops_per_second)}") from None

    def level(self, name: str) -> NetworkLevel:
        for level in self.network:
            if level.name == name:
                return level
        raise InvalidValue(f"hardware {self.name!r} has no network level {name!r}; it has "
                           f"{', '.join(lv.name for lv in self.network) or 'none'}")


# ---------------------------------------------------------------------------
# results
# ---------------------------------------------------------------------------
@attrs.frozen(kw_only=True)
class StageMemory:
    """What one pipeline stage's device holds at its worst moment, by category (bytes), and the host memory
    its offloading fills (``host_bytes``, at the host's own worst moment; 0 without offloading)."""

    stage: int
    bytes_by_category: Mapping[str, int] = attrs.field(converter=frozen_mapping)
    peak_bytes: int
    layers: int = 0
    host_bytes: int = 0
    # what PyTorch's caching allocator reserves for that peak; None where not claimed (StrategyCost says why)
    reserved_bytes: Optional[int] = None
    provenance: Mapping[str, str] = attrs.field(factory=dict, converter=frozen_mapping)

    def to_dict(self) -> Dict[str, Any]:
        return {"stage": self.stage, "layers": self.layers, "bytes_by_category": dict(self.bytes_by_category),
                "peak_bytes": self.peak_bytes, "host_bytes": self.host_bytes, "reserved_bytes": self.reserved_bytes,
                "provenance": dict(self.provenance)}


# the groups a step's exposed communication is told apart by (TimeBreakdown.exposed_<group>_seconds): TP's,
# CP's and EP's (and expert TP's) collectives inside the layers, FSDP's (and ZeRO-3's) parameter gathers and
# gradient reduce-scatters, the data-parallel gradient reduction and parameter gather at the step's end, the
# pipeline's sends
EXPOSED_GROUPS = ("tp", "cp", "ep", "fsdp", "dp", "pp")


def most_exposed(seconds_by_group: Mapping[str, Optional[float]]) -> str:
    """The group whose collectives expose the most of a step (the first of equals, in EXPOSED_GROUPS' order),
    "" where none exposes any."""
    seconds = {g: seconds_by_group.get(g) or 0.0 for g in EXPOSED_GROUPS}
    group = max(EXPOSED_GROUPS, key=lambda g: seconds[g])
    return group if seconds[group] > 0 else ""


@attrs.frozen(kw_only=True)
class TimeBreakdown:
    """A step's seconds by component; see the time model for what each leaves out."""

    step_seconds: float
    tokens_per_second: float
    mfu: float
    compute_seconds: float
    # the busiest rank's collectives, overlapped or not (the pipeline's sends: the rank's own, or those on the fill
    # and drain path where more): at least exposed_communication_seconds
    communication_seconds: float
    exposed_communication_seconds: float
    bubble_seconds: float
    optimizer_seconds: float
    offload_seconds: float = 0.0          # host-device copies (PCIe) on the busiest rank, overlapped or not
    exposed_offload_seconds: float = 0.0  # of them, what the step waits for
    # exposed_communication_seconds by the group whose collectives the step waits for (their sum): TP's, CP's and
    # EP's inside the layers, FSDP's gathers and reduce-scatters, the data-parallel reduction at the step's end,
    # the pipeline's sends
    exposed_tp_seconds: float = 0.0
    exposed_cp_seconds: float = 0.0
    exposed_ep_seconds: float = 0.0
    exposed_fsdp_seconds: float = 0.0
    exposed_dp_seconds: float = 0.0
    exposed_pp_seconds: float = 0.0
    provenance: Mapping[str, str] = attrs.field(factory=dict, converter=frozen_mapping)

    def to_dict(self) -> Dict[str, Any]:
        out = attrs.asdict(self)
        out["provenance"] = dict(self.provenance)
        return out


@attrs.frozen(kw_only=True)
class StrategyCost:
    """A strategy's cost on one model and device: memory per stage, the peak, and (once priced) time.

    ``host_bytes`` is the most a device of any stage puts in host memory by offloading, ``host_bytes_per_node``
    the most the devices of one node put there together (``Hardware.devices_per_node`` a node).
    """

    strategy: Strategy
    stages: Tuple[StageMemory, ...] = attrs.field(converter=tuple)
    peak_bytes: int
    valid: bool = True
    reason: str = ""
    time: Optional[TimeBreakdown] = None
    host_bytes: int = 0
    host_bytes_per_node: int = 0
    # the most any stage's caching allocator reserves (ndcost.allocator); None with the reason where not claimed
    reserved_bytes: Optional[int] = None
    reserved_reason: str = ""
    # whether it fits the device (None where not judged) and on what: "reserved" (reserved_bytes plus the
    # hardware's cuda_context_bytes) or "allocated" (peak_bytes in its place, where reserved is not claimed)
    fits: Optional[bool] = None
    fits_basis: str = ""
    provenance: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)

    def sources(self) -> Dict[str, str]:
        """Which plugin produced each figure: every memory category, the peak and every time component.

        Read from :attr:`provenance` (which the resolver fills with registry
        keys and the module and distribution behind each), so a figure a
        third-party plugin priced names that plugin. A figure nobody priced
        says ``unpriced`` and why.
        """
        prov = self.provenance
        composition = str(prov.get("composition", "unstated"))
        records = (prov.get("records") or {}).get(self.strategy.seq) or {}
        activations = records.get("activations", composition)
        working = records.get("working") or {}
        if isinstance(activations, Mapping):  # a kind without a working record is priced by what it keeps
            working = {kind: working.get(kind, source) for kind, source in activations.items()}
        params = str(prov.get("parameters", composition))
        out = {
            "parameters": params, "gradients": params, "master": params,
            "optimizer_states": str((prov.get("optimizers") or {}).get(self.strategy.optimizer, composition)),
            "activations": _by_kind(activations), "working": _by_kind(working or activations),
            "output": str(records.get("output", composition)),
            "communication": composition,
            "allocator": f"Strategy.allocator_overhead={self.strategy.allocator_overhead!r} of the rest",
            "peak_bytes": composition, "host_bytes": composition, "host_bytes_per_node": composition,
        }
        time = dict(self.time.provenance) if self.time is not None else {}
        unpriced = (prov.get("time") or {}).get("unpriced") if self.time is None else None
        model = "; ".join(str(time[k]) for k in ("model", "hardware") if k in time) or \
            "unpriced" + (f": {unpriced}" if unpriced else "")
        schedule = str((prov.get("schedules") or {}).get(self.strategy.schedule, model))
        out.update({
            "step_seconds": model, "tokens_per_second": model, "mfu": model, "optimizer_seconds": model,
            "compute_seconds": "; ".join(str(time[k]) for k in ("compute", "hardware") if k in time) or model,
            "communication_seconds": str(time.get("communication", model)),
            "exposed_communication_seconds": str(time.get("communication", model)),
            "bubble_seconds": schedule if self.time is not None else model,
            "offload_seconds": model, "exposed_offload_seconds": model,
        })
        # the exposed communication by group: the same collectives, told apart by the group that runs them
        out.update({f"exposed_{group}_seconds": out["exposed_communication_seconds"] for group in EXPOSED_GROUPS})
        return out

    def source(self, figure: str) -> str:
        """Which plugin produced *figure* (a memory category, ``peak_bytes`` or a time component)."""
        sources = self.sources()
        try:
            return sources[figure]
        except KeyError:
            raise UnknownKey(f"no figure {figure!r} in a strategy's cost; figures: {', '.join(sources)}") from None

    def to_dict(self) -> Dict[str, Any]:
        out = {"strategy": str(self.strategy), "valid": self.valid, "reason": self.reason,
               "peak_bytes": self.peak_bytes, "reserved_bytes": self.reserved_bytes,
               "reserved_reason": self.reserved_reason, "fits": self.fits, "fits_basis": self.fits_basis,
               "host_bytes": self.host_bytes,
               "host_bytes_per_node": self.host_bytes_per_node, "stages": [s.to_dict() for s in self.stages],
               "provenance": dict(self.provenance), "sources": self.sources()}
        if self.time is not None:
            out["time"] = self.time.to_dict()
        return out


def _by_kind(value: Any) -> str:
    if isinstance(value, Mapping):
        return "; ".join(f"{kind}: {source}" for kind, source in value.items())
    return str(value)
