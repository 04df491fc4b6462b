"""``trainer/deepspeed``: a DeepSpeed config JSON, read and written.

The schema is DeepSpeed's docs/_pages/config-json.md (deepspeedai/DeepSpeed
edaa722); the batch rules are deepspeed/runtime/config.py's
(``_set_batch_related_parameters``, ``_batch_assertion``): ``train_batch_size =
micro * gradient_accumulation_steps * world``, where the world is the
data-parallel ranks (the devices over ``sequence_parallel_size``, and over
``tensor_parallel.autotp_size``), one of the three inferred where it is missing.

The file names no model and no sequence length: the model is given (MODEL,
``from_config(model=...)``) and the length with ``--strategy seq=N``.
Precision: ``fp16``/``bf16`` keep half-precision parameters and gradients
(``data_types.grad_accum_dtype`` otherwise: "the default is to match the model
type") and an fp32 master copy and fp32 optimizer states (ZeRO,
arXiv:1910.02054 section 3: 2 + 2 + 12 bytes a parameter);
``bf16_master_weights_and_grads`` / ``bf16_optimizer_states`` keep those in bf16.

The ZeRO optimizers' contiguous gradient bucket (``reduce_bucket_size``,
``contiguous_gradients``, ``overlap_comm``) is ``reduce_bucket_elements`` and
``reduce_buckets`` (:func:`_reduce_bucket`); ZeRO-3's ``stage3_max_reuse_distance`` is
``reuse_distance_elements``, its ``stage3_max_live_parameters`` ``live_parameters_elements`` where it prefetches,
its ``sub_group_size`` ``sub_group_elements`` (what its step copies to fp32 at a time).

``activation_checkpointing`` configures deepspeed.checkpointing, which
recomputes only where the model calls it: the reader leaves ``recompute`` as
the strategy gives it (``--strategy recompute=full``), prices
``cpu_checkpointing`` as ``offload_activations`` (the checkpoints moved to host
memory) and ``partition_activations`` as nothing at tp = 1 (it splits the
checkpoints over the model-parallel ranks).
"""
from __future__ import annotations

import json
import math
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional

from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.trainers import TrainerConfig, field_error
from ndcost.values import MAX_STRATEGY_INTEGER, Strategy, deepspeed_bf16_optimizer

KIND = "deepspeed"
OPTIMIZERS = {"adam": "adamw", "adamw": "adamw", "fusedadam": "adamw", "cpuadam": "adamw", "deepspeedcpuadam": "adamw"}

# Top-level sections with no bearing on what ndcost prices.
IGNORED = ("steps_per_print", "wall_clock_breakdown", "gradient_clipping", "scheduler", "prescale_gradients",
           "gradient_predivide_factor", "sparse_gradients", "dump_state", "tensorboard", "wandb", "csv_monitor",
           "comet", "flops_profiler", "comms_logger", "checkpoint", "zero_allow_untested_optimizer",
           "memory_breakdown", "seed", "elasticity", "aio", "communication_data_type", "monitor_config")
READ_SECTIONS = ("optimizer", "zero_optimization", "bf16", "fp16", "activation_checkpointing", "tensor_parallel",
                 "data_types", "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                 "sequence_parallel_size")
# Sections with a bearing on the cost that are not priced or not read yet.
REFUSED: Mapping[str, str] = {
    "compile": "torch.compile (DeepCompile) is not priced yet; set compile.deepcompile false (or remove "
               "\"compile\") in a copy to price it eagerly",
    "torch_autocast": "torch.autocast under DeepSpeed is not read yet; remove \"torch_autocast\" in a copy and give "
                      "the dtypes with --strategy",
    "amp": "Apex AMP is not read yet; use \"fp16\" or \"bf16\" in a copy",
    "pipeline": "DeepSpeed pipeline parallelism is set in the model code (PipelineModule), not read; give pp with "
                "--strategy on a copy without it",
    "expert_parallel": "DeepSpeed AutoEP is not read yet; give ep with --strategy on a copy without it",
    "sparse_attention": "sparse attention is not priced; remove it in a copy",
    "compression_training": "compression (quantized or pruned training) is not priced; remove it in a copy",
    "data_efficiency": "random-LTD and curriculum data routing are not priced; remove it in a copy",
    "curriculum_learning": "a sequence-length curriculum is not priced; give the length with --strategy seq=N "
                           "on a copy without it",
    "hybrid_engine": "the hybrid engine (RLHF generation) is not priced; remove it in a copy",
}
ZERO_IGNORED = ("allgather_partitions", "allgather_bucket_size", "reduce_scatter", "stage3_param_persistence_threshold",
                "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                "elastic_checkpoint", "ignore_unused_parameters", "round_robin_gradients",
                "log_trace_cache_warnings", "load_from_fp32_weights", "stage3_module_granularity_threshold",
                "use_multi_rank_bucket_allreduce", "memory_efficient_linear")
ZERO_REFUSED: Mapping[str, str] = {
    "zero_hpz_partition_size": "ZeRO++ hierarchical partitioning is not priced yet; remove it in a copy",
    "zero_quantized_weights": "ZeRO++ quantized weights are not priced yet; set it false in a copy",
    "zero_quantized_gradients": "ZeRO++ quantized gradients are not priced yet; set it false in a copy",
    "zenflow": "ZenFlow's stale, selective optimizer updates are not priced; remove \"zenflow\" in a copy to "
               "price ZeRO-Offload",
    "mics_shard_size": "MiCS sharding is not priced yet; remove it in a copy",
}

# zero_optimization's defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size, stage3_max_reuse_distance,
# stage3_prefetch_bucket_size, stage3_max_live_parameters and sub_group_size in elements; contiguous_gradients
# true, overlap_comm true at stage 3 alone
REDUCE_BUCKET_ELEMENTS = 500_000_000
REUSE_DISTANCE_ELEMENTS = 1_000_000_000
PREFETCH_BUCKET_ELEMENTS = 50_000_000
LIVE_PARAMETERS_ELEMENTS = 1_000_000_000
SUB_GROUP_ELEMENTS = 1_000_000_000
# sub_group_elements=0 (one sub-group) written as a sub_group_size no partition reaches (stage3.py's own default)
WHOLE_PARTITION_SUB_GROUP = 1_000_000_000_000


class _File:
    """The JSON document and the refusals that name its fields."""

    def __init__(self, path: str, data: Mapping[str, Any]):
        self.path = path
        self.data = data
        self.read: List[str] = []
        self.ignored: List[str] = []

    def refuse(self, field: str, problem: str, fix: str) -> InvalidValue:
        return field_error(KIND, self.path, field, problem, fix)

    def section(self, name: str) -> Mapping[str, Any]:
        value = self.data.get(name, {})
        if not isinstance(value, Mapping):
            raise self.refuse(name, f"expected an object, got {json.dumps(value)}", f"give \"{name}\": {{...}}")
        return value

    def value(self, where: Mapping[str, Any], key: str, field: str, kind: type, default: Any = None) -> Any:
        if key not in where:
            return default
        value = where[key]
        if value == "auto":
            raise self.refuse(field, "\"auto\" is filled in by the Hugging Face Trainer, which ndcost does not run",
                              "give the value in a copy")
        if kind is bool:
            ok = isinstance(value, bool)
        elif kind is int:  # JSON writes 5e8 as a float; a whole number is an integer
            ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
                and float(value).is_integer() and value >= 0
            value = int(value) if ok else value
        else:
            ok = isinstance(value, kind)
        if not ok:
            raise self.refuse(field, f"expected {kind.__name__ if kind is not int else 'a whole number'}, got "
                              f"{json.dumps(value)}", f"give \"{key}\" as {kind.__name__}")
        self.read.append(field)
        return value


class DeepSpeedFormat:
    name = KIND
    description = "DeepSpeed: a config JSON (ZeRO stage, offload, batch sizes, precision); the model is given"
    writes = True
    runtime = ""  # Transformers' modules as a plain install runs them: the default, hf-cuda
    # bf16.enabled: bf16 parameters and gradients, fp32 master copy and optimizer states; zero_optimization's
    # defaults where a stage runs them (a search holds them there alone: search._HELD_ZERO_FIELDS)
    recipe = MappingProxyType({"param_dtype": "bf16", "grad_dtype": "bf16", "optimizer_dtype": "fp32",
                               "master_dtype": "fp32", "ddp_engine": "deepspeed",
                               "reduce_bucket_elements": REDUCE_BUCKET_ELEMENTS,
                               "reuse_distance_elements": REUSE_DISTANCE_ELEMENTS,
                               "live_parameters_elements": LIVE_PARAMETERS_ELEMENTS,
                               "sub_group_elements": SUB_GROUP_ELEMENTS})

    def read(self, path: str, *, devices: Optional[int]) -> TrainerConfig:
        from ndcost.specio import read_text

        text = read_text(path, "DeepSpeed config")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise field_error(KIND, path, "file", f"not JSON ({exc})", "give a DeepSpeed config JSON") from None
        if not isinstance(data, dict):
            raise field_error(KIND, path, "file", f"expected a JSON object, got {type(data).__name__}",
                              "give a DeepSpeed config JSON object")
        f = _File(path, data)
        for key in data:
            if key in REFUSED:
                raise f.refuse(key, "not priced" if "not priced" in REFUSED[key] else "not read", REFUSED[key])
            if key in IGNORED:
                f.ignored.append(key)
            elif key not in READ_SECTIONS:
                f.ignored.append(f"{key} (unrecognized; no bearing assumed)")
        if devices is None:
            raise f.refuse("--devices", "a DeepSpeed launch takes its world size from the launcher, which ndcost "
                           "does not run", "give the world size: --devices N (from_config(..., devices=N))")
        defaults: List[str] = []
        fields: Dict[str, Any] = {}
        # autotp_size 0 (DeepSpeed's default, deepspeed/runtime/tensor_parallel/config.py) is no tensor parallelism
        tp = f.value(f.section("tensor_parallel"), "autotp_size", "tensor_parallel.autotp_size", int, 1) or 1
        f.ignored.extend(f"tensor_parallel.{k}" for k in f.section("tensor_parallel") if k != "autotp_size")
        cp = f.value(data, "sequence_parallel_size", "sequence_parallel_size", int, 1) or 1
        if devices % (tp * cp):
            raise f.refuse("tensor_parallel.autotp_size * sequence_parallel_size", f"{tp} * {cp} does not divide "
                           f"the world size {devices} (--devices)", "give a world size that is a multiple of it")
        dp = devices // (tp * cp)
        fields.update(dp=dp, tp=tp, cp=cp)
        if cp > 1:
            fields["cp_algo"] = "ulysses"
            defaults.append("sequence_parallel_size is DeepSpeed-Ulysses: cp_algo=ulysses")
        if tp > 1:
            defaults.append("AutoTP splits the decoder layers' linears over tp; the embedding stays whole and the head "
                            "is split only where the model's AutoTP policy names it: priced whole, "
                            "vocab_parallel=false")
        fields.update(_zero(f, defaults))
        fields.update(_batch(f, dp, defaults))
        fields.update(_precision(f, defaults))
        fields.update(_reduce_bucket(f, fields, defaults))
        fields.update(_reuse_distance(f, fields, defaults))
        fields.update(_live_parameters(f, fields, defaults))
        fields.update(_sub_group(f, fields, defaults))
        fields.update(_checkpointing(f, tp, defaults))
        optimizer = f.section("optimizer")
        kind = f.value(optimizer, "type", "optimizer.type", str) if optimizer else None
        if kind is None:
            defaults.append("no \"optimizer\": the client's optimizer, priced as adamw")
        elif kind.lower() not in OPTIMIZERS:
            raise f.refuse("optimizer.type", f"{kind!r} is not priced (Adam, AdamW, FusedAdam, CPUAdam are)",
                           "price Adam: set \"type\": \"AdamW\" in a copy")
        if optimizer.get("params") is not None:
            f.ignored.append("optimizer.params")
        fields["optimizer"] = "adamw"
        try:
            strategy = Strategy.from_mapping(fields)
        except InvalidValue as exc:
            raise f.refuse("the parallel sizes", str(exc), "change them in a copy") from None
        return TrainerConfig(kind=KIND, path=path, strategy=strategy, model=None, devices=devices,
                             global_batch=fields["micro_batch"] * fields["num_micro_batches"] * dp,
                             read_fields=tuple(f.read), ignored_fields=tuple(f.ignored), defaults=tuple(defaults))

    def write(self, strategy: Strategy, *, model: Any = None, global_batch: Optional[int] = None) -> str:
        return json.dumps(_document(strategy, global_batch), indent=2) + "\n"


def _zero(f: _File, defaults: List[str]) -> Dict[str, Any]:
    zero = f.section("zero_optimization")
    stage = f.value(zero, "stage", "zero_optimization.stage", int, 0)
    if stage > 3:
        raise f.refuse("zero_optimization.stage", f"expected 0 to 3, got {stage}", "give a ZeRO stage 0-3")
    fields: Dict[str, Any] = {"zero": stage, "ddp_engine": "deepspeed"}  # its engine's reduction at ZeRO 0-1
    for key in zero:
        if key in ZERO_REFUSED:
            raise f.refuse(f"zero_optimization.{key}", "not priced", ZERO_REFUSED[key])
        if key in ZERO_IGNORED:
            f.ignored.append(f"zero_optimization.{key}")
    offloads = (("offload_optimizer", "offload_optimizer"), ("offload_param", "offload_params"))
    for key, field in offloads:
        section = zero.get(key)
        if section is None:
            continue
        if not isinstance(section, Mapping):
            raise f.refuse(f"zero_optimization.{key}", f"expected an object, got {json.dumps(section)}",
                           f"give \"{key}\": {{\"device\": \"cpu\"}}")
        device = f.value(section, "device", f"zero_optimization.{key}.device", str, "cpu")
        if device == "nvme":
            raise f.refuse(f"zero_optimization.{key}.device", "nvme offload is not priced (ndcost prices host "
                           "memory)", "price it on the CPU: set \"device\": \"cpu\" in a copy")
        if device not in ("cpu", "none"):
            raise f.refuse(f"zero_optimization.{key}.device", f"expected cpu, nvme or none, got {device!r}",
                           "give \"cpu\"")
        if key == "offload_optimizer" and section.get("ratio", 1.0) != 1.0:
            raise f.refuse(f"zero_optimization.{key}.ratio", "a partial optimizer offload is not priced",
                           "remove \"ratio\" in a copy (all of it offloaded)")
        if key == "offload_param" and device == "cpu" and stage != 3:
            raise f.refuse(f"zero_optimization.{key}", f"parameter offload needs ZeRO stage 3 (stage {stage})",
                           "set \"stage\": 3 or remove it")
        f.ignored.extend(f"zero_optimization.{key}.{k}" for k in section if k not in ("device", "ratio"))
        if device == "cpu":
            fields[field] = True
    if f.value(zero, "cpu_offload", "zero_optimization.cpu_offload", bool, False):
        fields["offload_optimizer"] = True
        defaults.append("zero_optimization.cpu_offload (deprecated) is offload_optimizer.device cpu")
    if fields.get("offload_params") and not fields.get("offload_optimizer"):
        raise f.refuse("zero_optimization.offload_param", "parameter offload with the optimizer on the device "
                       "(ZeRO-Infinity's partitioned parameters on the host, the fp32 master copy and states "
                       "stepped on the GPU) is not priced: ndcost prices parameter offload with the optimizer "
                       "stepping them on the host", "add \"offload_optimizer\": {\"device\": \"cpu\"} in a copy, "
                       "or remove offload_param")
    return fields


_BUCKET_KEYS = ("contiguous_gradients", "reduce_bucket_size", "overlap_comm")


def _bf16_optimizer(zero: int, param_dtype: Optional[str], grad_dtype: Optional[str], offloaded: bool) -> bool:
    """Whether DeepSpeed runs its BF16_Optimizer, which has no reduce bucket, in place of the ZeRO optimizer:
    ZeRO-1 with bf16 parameters and fp32 gradients, the optimizer on the device (engine.py
    ``_do_optimizer_sanity_check``)."""
    return bool(deepspeed_bf16_optimizer(zero, param_dtype == "bf16", grad_dtype == "fp32", not offloaded))


def _reduce_bucket(f: _File, fields: Mapping[str, Any], defaults: List[str]) -> Dict[str, Any]:
    """The ZeRO optimizer's contiguous gradient bucket (``reduce_bucket_elements``, ``reduce_buckets``).

    ZeRO 1-2 copy gradients into ``reduce_bucket_size`` elements of the parameters' dtype (two with
    ``overlap_comm``), contiguous whenever the optimizer is offloaded (stage_1_and_2.py); ZeRO-3 one bucket
    (stage3.py); :func:`_bf16_optimizer` none.
    """
    stage = fields["zero"]
    zero = f.section("zero_optimization")
    if stage == 0:  # DeepSpeed's engine reduces without a ZeRO optimizer
        f.ignored.extend(f"zero_optimization.{key}" for key in _BUCKET_KEYS if key in zero)
        return {}
    contiguous = f.value(zero, "contiguous_gradients", "zero_optimization.contiguous_gradients", bool, True)
    elements = f.value(zero, "reduce_bucket_size", "zero_optimization.reduce_bucket_size", int,
                       REDUCE_BUCKET_ELEMENTS)
    overlap = f.value(zero, "overlap_comm", "zero_optimization.overlap_comm", bool, stage == 3)
    offloaded = bool(fields.get("offload_optimizer"))
    if _bf16_optimizer(stage, fields.get("param_dtype"), fields.get("grad_dtype"), offloaded):
        defaults.append("ZeRO-1 with bf16 parameters and fp32 gradients runs DeepSpeed's BF16_Optimizer: no reduce "
                        "bucket")
        return {}
    if not (contiguous or offloaded and stage < 3) or not elements:
        return {}
    buckets = 2 if overlap and stage < 3 else 1
    defaults.append(f"ZeRO-{stage}'s contiguous gradient bucket: {buckets} of {elements:,} elements "
                    f"(reduce_bucket_elements, reduce_buckets)")
    return {"reduce_bucket_elements": elements, "reduce_buckets": buckets}


def _zero3_elements(f: _File, fields: Mapping[str, Any], defaults: List[str], key: str, field: str,
                    default: int) -> Optional[int]:
    """ZeRO-3's ``zero_optimization.<key>`` in elements, DeepSpeed's *default* where unset (said as read into
    *field*); None at the other stages, which ignore it."""
    zero = f.section("zero_optimization")
    if fields["zero"] != 3:
        if key in zero:
            f.ignored.append(f"zero_optimization.{key}")
        return None
    elements = f.value(zero, key, f"zero_optimization.{key}", int, default)
    if key not in zero:
        defaults.append(f"ZeRO-3's {key}: {elements:,} elements ({field})")
    return elements


def _reuse_distance(f: _File, fields: Mapping[str, Any], defaults: List[str]) -> Dict[str, Any]:
    """ZeRO-3's ``stage3_max_reuse_distance`` as ``reuse_distance_elements``."""
    distance = _zero3_elements(f, fields, defaults, "stage3_max_reuse_distance", "reuse_distance_elements",
                               REUSE_DISTANCE_ELEMENTS)
    return {} if distance is None else {"reuse_distance_elements": distance}


_LIVE_KEYS = ("stage3_prefetch_bucket_size", "stage3_max_live_parameters")


def _sub_group(f: _File, fields: Mapping[str, Any], defaults: List[str]) -> Dict[str, Any]:
    """ZeRO-3's ``sub_group_size`` as ``sub_group_elements``."""
    elements = _zero3_elements(f, fields, defaults, "sub_group_size", "sub_group_elements", SUB_GROUP_ELEMENTS)
    if elements is None:
        return {}
    if elements > MAX_STRATEGY_INTEGER:
        defaults.append(f"zero_optimization.sub_group_size {elements:,}, past a strategy's integers: one sub-group, "
                        f"the rank's whole partition (sub_group_elements=0; exact where it is no larger)")
        return {"sub_group_elements": 0}
    return {"sub_group_elements": elements}


def _live_parameters(f: _File, fields: Mapping[str, Any], defaults: List[str]) -> Dict[str, Any]:
    """ZeRO-3's ``stage3_max_live_parameters`` as ``live_parameters_elements`` where it prefetches
    (``stage3_prefetch_bucket_size`` > 0), else 0. ``"auto"`` is read as DeepSpeed's own config reads it (its
    default; the Hugging Face Trainer fills the prefetch bucket with 0.9 * hidden_size ** 2, positive too)."""
    zero = f.section("zero_optimization")
    if fields["zero"] != 3:
        f.ignored.extend(f"zero_optimization.{key}" for key in _LIVE_KEYS if key in zero)
        return {}
    values = []
    for key, default in zip(_LIVE_KEYS, (PREFETCH_BUCKET_ELEMENTS, LIVE_PARAMETERS_ELEMENTS), strict=True):
        if zero.get(key) == "auto":
            f.read.append(f"zero_optimization.{key}")
            defaults.append(f"zero_optimization.{key} \"auto\": DeepSpeed's default {default:,}")
            values.append(default)
        else:
            values.append(f.value(zero, key, f"zero_optimization.{key}", int, default))
    prefetch, live = values
    return {"live_parameters_elements": live if prefetch else 0}


def _batch(f: _File, dp: int, defaults: List[str]) -> Dict[str, Any]:
    """micro_batch and num_micro_batches as deepspeed/runtime/config.py infers and checks them."""
    names = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    train, micro, accumulation = (f.value(f.data, n, n, int) for n in names)
    for name, value in zip(names, (train, micro, accumulation), strict=True):
        if value is not None and value < 1:
            raise f.refuse(name, f"expected a positive integer, got {value}", f"give \"{name}\" >= 1")
    if train is None and micro is None:
        raise f.refuse("train_batch_size", "neither it nor train_micro_batch_size_per_gpu is given (DeepSpeed "
                       "requires one)", "give \"train_micro_batch_size_per_gpu\"")
    if train is not None and micro is not None and accumulation is None:
        accumulation = train // micro // dp
        defaults.append(f"gradient_accumulation_steps = {train} // {micro} // {dp} = {accumulation}")
    elif train is not None and micro is None:
        accumulation = accumulation or 1
        micro = train // dp // accumulation
        defaults.append(f"train_micro_batch_size_per_gpu = {train} // {dp} // {accumulation} = {micro}")
    elif train is None:
        accumulation = accumulation or 1
        train = micro * accumulation * dp
        defaults.append(f"train_batch_size = {micro} * {accumulation} * {dp} = {train}")
    assert micro is not None and accumulation is not None
    if train is not None and train < dp:
        raise f.refuse("train_batch_size", f"{train} is below the {dp} data-parallel ranks (--devices over "
                       f"autotp_size and sequence_parallel_size): each takes at least one sequence a step",
                       f"give a train_batch_size of at least {dp}, or fewer --devices")
    if micro < 1 or accumulation < 1 or train != micro * accumulation * dp:
        raise f.refuse("train_batch_size, train_micro_batch_size_per_gpu, gradient_accumulation_steps",
                       f"{train} != {micro} * {accumulation} * {dp} data-parallel ranks (--devices over "
                       f"autotp_size and sequence_parallel_size)",
                       "give a train_batch_size that is their product, or another --devices")
    return {"micro_batch": micro, "num_micro_batches": accumulation}


def _precision(f: _File, defaults: List[str]) -> Dict[str, Any]:
    bf16, fp16 = f.section("bf16"), f.section("fp16")
    on_bf16 = f.value(bf16, "enabled", "bf16.enabled", bool, False) if bf16 else False
    on_fp16 = f.value(fp16, "enabled", "fp16.enabled", bool, False) if fp16 else False
    f.ignored.extend(f"fp16.{k}" for k in fp16 if k != "enabled")  # loss scaling
    f.ignored.extend(f"bf16.{k}" for k in bf16 if k not in ("enabled", "bf16_master_weights_and_grads",
                                                             "bf16_optimizer_states"))
    if on_bf16 and on_fp16:
        raise f.refuse("bf16.enabled", "given with fp16.enabled (DeepSpeed refuses both)", "keep one in a copy")
    accumulate = f.value(f.section("data_types"), "grad_accum_dtype", "data_types.grad_accum_dtype", str)
    if accumulate is not None and accumulate not in ("fp32", "fp16", "bf16"):
        raise f.refuse("data_types.grad_accum_dtype", f"expected fp32, fp16 or bf16, got {accumulate!r}",
                       "give one of them")
    if not (on_bf16 or on_fp16):
        defaults.append("neither fp16 nor bf16 enabled: fp32 parameters, gradients and optimizer states")
        if accumulate not in (None, "fp32"):
            raise f.refuse("data_types.grad_accum_dtype", f"{accumulate} gradients of fp32 parameters are not "
                           "read", "remove it in a copy")
        return {"param_dtype": "fp32"}
    half = "bf16" if on_bf16 else "fp16"
    master = optimizer = "fp32"
    if on_bf16:
        if f.value(bf16, "bf16_master_weights_and_grads", "bf16.bf16_master_weights_and_grads", bool, False):
            master = "bf16"
        if f.value(bf16, "bf16_optimizer_states", "bf16.bf16_optimizer_states", bool, False):
            if master != "bf16":
                raise f.refuse("bf16.bf16_optimizer_states", "needs bf16_master_weights_and_grads (DeepSpeed)",
                               "set bf16_master_weights_and_grads true")
            optimizer = "bf16"
    grad = accumulate or half
    defaults.append(f"{half}: {half} parameters, {grad} gradients, {master} master copy and {optimizer} "
                    f"optimizer states")
    return {"param_dtype": half, "grad_dtype": grad, "master_dtype": master, "optimizer_dtype": optimizer}


def _checkpointing(f: _File, tp: int, defaults: List[str]) -> Dict[str, Any]:
    section = f.section("activation_checkpointing")
    if not section:
        return {}
    fields: Dict[str, Any] = {}
    if f.value(section, "partition_activations", "activation_checkpointing.partition_activations", bool, False):
        if tp > 1:
            raise f.refuse("activation_checkpointing.partition_activations", "checkpoints split over the "
                           "tensor-parallel ranks are not priced yet", "set it false in a copy")
        defaults.append("activation_checkpointing.partition_activations splits the checkpoints over the "
                        "model-parallel ranks: nothing at tp = 1")
    if f.value(section, "cpu_checkpointing", "activation_checkpointing.cpu_checkpointing", bool, False):
        fields["offload_activations"] = True
        defaults.append("activation_checkpointing.cpu_checkpointing moves the checkpoints (what a layer keeps "
                        "under recompute=full) to host memory: offload_activations=true")
    f.ignored.extend(f"activation_checkpointing.{k}" for k in section
                     if k not in ("partition_activations", "cpu_checkpointing"))
    defaults.append("activation_checkpointing recomputes only where the model calls deepspeed.checkpointing: "
                    "recompute as --strategy gives it")
    return fields


def _refuse_write(field: str, value: Any, why: str) -> InvalidValue:
    return InvalidValue(f"deepspeed writer: {field}={value}: {why}")


# (param, compute, grad, optimizer, master) as the reader gives them -> the precision section
_WRITTEN_DTYPES: Dict[tuple, Dict[str, Any]] = {
    ("bf16", None, "bf16", "fp32", "fp32"): {"bf16": {"enabled": True}},
    ("bf16", None, "bf16", "fp32", "bf16"): {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}},
    ("bf16", None, "bf16", "bf16", "bf16"): {"bf16": {"enabled": True, "bf16_master_weights_and_grads": True,
                                                      "bf16_optimizer_states": True}},
    ("bf16", None, "fp32", "fp32", "fp32"): {"bf16": {"enabled": True}, "data_types": {"grad_accum_dtype": "fp32"}},
    ("fp16", None, "fp16", "fp32", "fp32"): {"fp16": {"enabled": True}},
    ("fp32", None, None, None, "none"): {},
}


def _document(s: Strategy, global_batch: Optional[int]) -> Dict[str, Any]:
    """*s* as a DeepSpeed config; a field DeepSpeed's config cannot express is refused by name.

    ``seq`` is left out: no DeepSpeed field states it (reading back takes it from ``--strategy seq=N``).
    """
    for name, why in (("pp", "DeepSpeed's pipeline parallelism is set in the model code (PipelineModule)"),
                      ("fsdp", "DeepSpeed shards with ZeRO: write zero=3 over dp"),
                      ("ep", "DeepSpeed's expert parallelism is not written"),
                      ("etp", "DeepSpeed's expert parallelism is not written"),
                      ("vpp", "DeepSpeed has no interleaved pipeline")):
        if getattr(s, name) != 1:
            raise _refuse_write(name, getattr(s, name), why)
    if s.cp > 1 and s.cp_algo != "ulysses" or s.cp == 1 and s.cp_algo != "ring":
        raise _refuse_write("cp_algo", s.cp_algo, "DeepSpeed's sequence parallelism is Ulysses (cp_algo=ulysses)")
    if s.recompute != "none" or s.recompute_layers is not None:
        raise _refuse_write("recompute", s.recompute, "DeepSpeed's config does not turn recomputation on (the "
                            "model calls deepspeed.checkpointing); give it with --strategy when reading back")
    if s.vocab_parallel:
        raise _refuse_write("vocab_parallel", "true", "AutoTP leaves the embedding and head whole")
    if s.loss_engine in ("megatron", "compiled"):
        raise _refuse_write("loss_engine", s.loss_engine, "the model's own loss runs eagerly (Transformers': "
                            "torch's cross_entropy): loss_engine=auto or torch")
    if s.sp:
        raise _refuse_write("sp", "true", "AutoTP has no sequence parallelism over tp")
    if s.offload_params and s.zero != 3:
        raise _refuse_write("offload_params", "true", f"DeepSpeed offloads parameters under ZeRO-3 only "
                            f"(zero={s.zero})")
    if s.ddp_engine not in ("auto", "deepspeed"):
        raise _refuse_write("ddp_engine", s.ddp_engine, "DeepSpeed's engine reduces the gradients autograd makes "
                            "(no DDP buckets, no grad buffer): ddp_engine=deepspeed")
    if s.pp_engine != "auto":
        raise _refuse_write("pp_engine", s.pp_engine, "no DeepSpeed config field says this (its pipeline is set in "
                            "the model code, PipelineModule): pp_engine=auto")
    for name in ("pp_layers", "moe_imbalance", "allocator_overhead", "shard_mesh", "reshard_after_forward",
                 "float8", "float8_all_gather", "compile", "async_tp", "gradient_sync", "cp_rotate",
                 "ep_dispatcher"):
        default = Strategy().to_dict()[name]
        if getattr(s, name) != default:
            raise _refuse_write(name, getattr(s, name), "no DeepSpeed config field says this")
    if s.optimizer != "adamw":
        raise _refuse_write("optimizer", s.optimizer, "written for AdamW only")
    dtypes = (s.param_dtype, s.compute_dtype, s.grad_dtype, s.optimizer_dtype, s.master_dtype)
    if dtypes not in _WRITTEN_DTYPES:
        raise _refuse_write("param_dtype", s.param_dtype, "DeepSpeed's precisions are fp16 or bf16 (grad_dtype the "
                            "same, or fp32 for bf16; master_dtype fp32 or bf16; compute_dtype unset) and fp32 alone")
    batch = s.micro_batch * s.num_micro_batches * s.dp
    if global_batch is not None and global_batch != batch:
        raise _refuse_write("global_batch", global_batch, f"micro_batch * num_micro_batches * dp = {batch}")
    doc: Dict[str, Any] = {"train_batch_size": batch, "train_micro_batch_size_per_gpu": s.micro_batch,
                           "gradient_accumulation_steps": s.num_micro_batches,
                           "optimizer": {"type": "AdamW"}}
    doc.update(_WRITTEN_DTYPES[dtypes])
    zero: Dict[str, Any] = {"stage": s.zero}
    zero.update(_written_bucket(s))
    if s.zero == 3:  # without a live bound ZeRO-3 does not prefetch
        zero["stage3_max_reuse_distance"] = s.reuse_distance_elements
        zero.update({"stage3_max_live_parameters": s.live_parameters_elements} if s.live_parameters_elements
                    else {"stage3_prefetch_bucket_size": 0})
        zero["sub_group_size"] = s.sub_group_elements or WHOLE_PARTITION_SUB_GROUP
    for name in ("reuse_distance_elements", "live_parameters_elements", "sub_group_elements"):
        if s.zero != 3 and getattr(s, name):
            raise _refuse_write(name, getattr(s, name), f"it is ZeRO-3's: zero=3, or {name}=0")
    if s.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu"}
    if s.offload_params:
        zero["offload_param"] = {"device": "cpu"}
    doc["zero_optimization"] = zero
    if s.tp > 1:
        doc["tensor_parallel"] = {"autotp_size": s.tp}
    if s.cp > 1:
        doc["sequence_parallel_size"] = s.cp
    if s.offload_activations:
        doc["activation_checkpointing"] = {"cpu_checkpointing": True}
    return doc


def _written_bucket(s: Strategy) -> Dict[str, Any]:
    """zero_optimization's bucket keys that read back as *s*'s ``reduce_bucket_elements`` and ``reduce_buckets``
    (:func:`_reduce_bucket`); a bucket DeepSpeed would not make, or one it would make that *s* has not, refused."""
    elements, buckets = s.reduce_bucket_elements, s.reduce_buckets
    if s.zero == 0 or _bf16_optimizer(s.zero, s.param_dtype, s.grad, s.offload_optimizer):
        if elements or buckets != 1:
            raise _refuse_write("reduce_bucket_elements", elements, "DeepSpeed makes its reduce bucket in a ZeRO "
                                "optimizer (zero 1-3; at zero 1 with bf16 parameters and fp32 gradients its "
                                "BF16_Optimizer has none): reduce_bucket_elements=0, reduce_buckets=1")
        return {}
    if not elements:
        if s.offload_optimizer and s.zero < 3:
            raise _refuse_write("reduce_bucket_elements", 0, f"ZeRO-{s.zero} with its optimizer offloaded always "
                                f"copies gradients into its contiguous bucket: give reduce_bucket_elements "
                                f"(DeepSpeed's default {REDUCE_BUCKET_ELEMENTS:,})")
        if buckets != 1:
            raise _refuse_write("reduce_buckets", buckets, "two buckets of none: give reduce_bucket_elements")
        return {"contiguous_gradients": False}
    written: Dict[str, Any] = {"contiguous_gradients": True, "reduce_bucket_size": elements}
    if s.zero < 3:
        written["overlap_comm"] = buckets == 2
    elif buckets != 1:
        raise _refuse_write("reduce_buckets", buckets, "ZeRO-3 makes one bucket: reduce_buckets=1")
    return written


@hookimpl
def ndcost_register(register):
    register(f"trainer/{KIND}", DeepSpeedFormat())
