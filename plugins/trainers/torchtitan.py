"""torchtitan's job TOML (``trainer/torchtitan``): read into a strategy, and written from one.

The schema is torchtitan's ``torchtitan/config/job_config.py`` and its meshes
``torchtitan/distributed/parallel_dims.py`` (pytorch/torchtitan at 238fa99,
the last commit with TOML job files; older files' ``[training] compile`` and
``batch_size`` are read too). What the reader keeps of torchtitan's semantics:

- FSDP shards over ``dp_shard * cp`` whenever either is above 1 (the mesh
  ``fsdp`` / ``dp_shard_cp``), replicated over ``data_parallel_replicate_degree``
  (HSDP): ``dp`` = replicate, ``fsdp`` = shard. With ``data_parallel_shard_degree``
  1 and ``context_parallel_degree`` C > 1 FSDP still shards over the C ranks:
  ``shard_mesh=fsdp_cp`` (FSDP over ``fsdp * cp`` with ``fsdp`` 1, replicated
  over ``dp``) says it.
- ``-1`` shard degree: the devices left over, from ``--devices``.
- Loss parallelism is on whenever TP is (``disable_loss_parallel`` false):
  ``vocab_parallel``; TP always runs sequence parallel on the norms: ``sp``.
  With ``disable_loss_parallel`` true torchtitan still splits the embedding
  and head weights over TP while ndcost's ``vocab_parallel=false`` replicates
  them: those weights are over-counted by ``(tp - 1) / tp``.
- Batches: ``local_batch_size`` sequences per data-parallel rank, gradient
  accumulation ``global / (local * replicate * shard)``; under PP the local
  batch is cut into ``pipeline_parallel_microbatch_size`` micro-batches. Each
  accumulation step runs the pipeline schedule again (a bubble each), while
  ndcost prices one flush of all the micro-batches: stated in ``defaults``.
- The pipeline split is torchtitan's own (``generate_llm_fqn_per_model_part``,
  the embedding and the head each weighing ``..._stage_less_layers`` layers) or
  ``module_fqns_per_model_part``, as ``pp_layers``.
- ``selective_ac_option`` N (every N-th layer checkpointed whole) is
  ``recompute=full`` with ``recompute_layers`` = layers // N, priced as the
  first layers of the rank (the same count; which layers differs for a model
  mixing layer kinds), and only without PP.
- The runtime is ``torchtitan-cuda``: torchtitan's Llama repeats the keys and
  values to every query head before SDPA (``repeat_kv``), which SDPA saves and
  ring CP passes (``--runtime`` overrides it).
- Mixed precision (FSDP2 ``MixedPrecisionPolicy``, or autocast without FSDP):
  parameters, gradients and optimizer states in ``training.dtype`` (fp32
  by default), computed in ``mixed_precision_param``; no master copy.

- Float8: the ``float8`` converter (``[model] converters``, or 2024's
  ``[float8] enable_float8_linear``) with its ``recipe_name`` (unset:
  tensorwise) and ``enable_fsdp_float8_all_gather`` (``[quantize.linear.float8]``
  at 238fa99, ``[float8]`` before) as ``float8`` and ``float8_all_gather``;
  ``[compile] enable`` with ``"model"`` among its components (or the older
  ``[training] compile``) as ``compile``, with ``"loss"`` among them as
  ``loss_engine=compiled``; ``enable_async_tensor_parallel`` with TP as ``async_tp``.

The grouped-GEMM float8 converter (``[quantize.grouped_mm.float8] fqns``, or 2025's
``[float8] moe_fqns``) beside the float8 one is ``float8_experts``.

Refused by name (not priced yet): MX converters,
float8 emulation, the memory-budget checkpointing
mode, the all-to-all CP rotation, the zero-bubble and looped-BFS schedules,
TorchFT.
"""
from __future__ import annotations

import math
import sys
from types import MappingProxyType
from typing import Any, Dict, List, Optional, Tuple

import attrs

from ndcost.compose.placement import weighted_split
from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.plugins.trainers import boolean, dtype, integer
from ndcost.trainers import TrainerConfig, field_error
from ndcost.values import FLOAT8_RECIPES, Strategy

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10
    import tomli as tomllib

KIND = "torchtitan"
# The runtime profile a torchtitan job is priced under: its models' attention (specs/runtimes/torchtitan-cuda.yaml)
RUNTIME = "torchtitan-cuda"

# (model name, flavor) -> specs/models name; torchtitan/models/*/__init__.py at 238fa99 defines the flavors (qwen3's
# dense 0.6B to 32B at 0310b49, the widths of Qwen's own configs; deepseek_v3's 16B and 236B at 0014ac2,
# DeepSeek-V2-Lite's and DeepSeek-V2's widths and routers, which Transformers builds as deepseek_v2)
MODELS = {
    ("llama3", "8B"): "llama-3.1-8b",
    ("llama3", "70B"): "llama-3.1-70b",
    ("llama3", "405B"): "llama-3.1-405b",
    ("deepseek_v3", "16B"): "deepseek-v2-lite",
    ("deepseek_v3", "236B"): "deepseek-v2",
    ("deepseek_v3", "671B"): "deepseek-v3",
    ("qwen3", "0.6B"): "qwen3-0.6b",
    ("qwen3", "1.7B"): "qwen3-1.7b",
    ("qwen3", "4B"): "qwen3-4b",
    ("qwen3", "8B"): "qwen3-8b",
    ("qwen3", "14B"): "qwen3-14b",
    ("qwen3", "32B"): "qwen3-32b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
    ("qwen3", "235B-A22B"): "qwen3-235b-a22b",
}
# torchtitan's schedule names (torch.distributed.pipelining) -> ndcost's schedule plugins; single-stage ones first
SCHEDULES = {"1F1B": "1f1b", "GPipe": "gpipe", "Interleaved1F1B": "interleaved", "DualPipeV": "dualpipev"}
_SINGLE_STAGE = ("1F1B", "GPipe")
OPTIMIZERS = {"AdamW": "adamw", "Adam": "adam"}
_SCHEDULE_NAMES = {v: k for k, v in SCHEDULES.items()}
_OPTIMIZER_NAMES = {v: k for k, v in OPTIMIZERS.items()}

# The fields read, by section; everything else a file holds is reported as ignored (logging, paths, lr, ...).
_READ = {
    "model": ("name", "flavor", "converters"),
    "optimizer": ("name", "implementation", "fused"),
    "training": ("local_batch_size", "batch_size", "global_batch_size", "seq_len", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "enable_cpu_offload", "compile"),
    "parallelism": ("data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
                    "disable_loss_parallel", "enable_async_tensor_parallel", "pipeline_parallel_degree",
                    "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "module_fqns_per_model_part", "context_parallel_degree", "context_parallel_rotate_method",
                    "expert_parallel_degree", "expert_tensor_parallel_degree", "expert_parallel_comm_backend",
                    "fsdp_reshard_after_forward"),
    "activation_checkpoint": ("mode", "selective_ac_option"),
    "compile": ("enable", "components", "backend"),
    "fault_tolerance": ("enable",),
    # torchtitan of 2024 switched Float8 on here; of 2025 ([model] converters = ["float8"]) set it here; at 238fa99
    # it is [quantize.linear.float8] (components/quantization/float8.py, config/job_config.py Float8Linear)
    "float8": ("enable_float8_linear", "recipe_name", "enable_fsdp_float8_all_gather",
               "precompute_float8_dynamic_scale_for_fsdp", "filter_fqns", "emulate", "moe_fqns"),
}
# the Float8Linear converter's names: [model] converters = ["float8"] (2025), "quantize.linear.float8" (238fa99)
FLOAT8_CONVERTERS = ("float8", "quantize.linear.float8")
# the grouped-GEMM converter (238fa99: torchao's _scaled_grouped_mm on the modules [quantize.grouped_mm.float8]
# fqns names); in 2025 the float8 converter did the same for [float8] moe_fqns
GROUPED_FLOAT8_CONVERTER = "quantize.grouped_mm.float8"
# filter_fqns ndcost prices: the head and the MoE router stay at the compute dtype under ndcost's float8
_FLOAT8_KEPT = ("output", "router.gate")
# [parallelism] context_parallel_rotate_method's values (torchtitan/config/job_config.py) as cp_rotate's
ROTATE_METHODS = {"allgather": "allgather", "alltoall": "p2p"}
# [parallelism] expert_parallel_comm_backend's values as ep_dispatcher's: "standard" is the all-to-all of
# torchtitan/distributed/expert_parallel.py, "deepep" DeepEP's dispatch and "hybridep" its hierarchical variant
# for NVLink-72 domains (torchtitan/distributed/deepep/)
EP_COMM_BACKENDS = {"standard": "alltoall", "deepep": "deepep", "hybridep": "deepep"}
# older files keep pipeline and context parallelism under [experimental]
_EXPERIMENTAL = ("pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                 "context_parallel_degree")


class _File:
    """The parsed TOML and the trainer's names of the fields read."""

    def __init__(self, path: str, data: Dict[str, Any]):
        self.path, self.data = path, data
        self.read: List[str] = []

    def section(self, name: str) -> Dict[str, Any]:
        """The table *name*; a dotted name (``quantize.linear.float8``) is a nested table."""
        value: Any = self.data
        for part in name.split("."):
            value = value.get(part, {}) if isinstance(value, dict) else value
            if not isinstance(value, dict):
                raise self.error(f"[{name}]", f"{value!r} is not a table", f"write it as a [{name}] section")
        return value

    def get(self, section: str, key: str, default: Any = None) -> Any:
        table = self.section(section)
        if key not in table and section == "parallelism" and key in _EXPERIMENTAL:
            section, table = "experimental", self.section("experimental")
        if key in table:
            top, _, rest = section.partition(".")  # named as ignored() names a nested table's leaves
            self.read.append(f"[{top}] {rest + '.' if rest else ''}{key}")
            return table[key]
        return default

    def error(self, field: str, problem: str, fix: str):
        return field_error(KIND, self.path, field, problem, fix)

    def ignored(self) -> Tuple[str, ...]:
        out = []
        for section, table in self.data.items():
            if not isinstance(table, dict):  # a key outside any table: torchtitan reads none
                out.append(section)
                continue
            out += [f"[{section}] {key}" for key in _leaves(table) if f"[{section}] {key}" not in self.read]
        return tuple(out)


def _optimizer(f: _File, defaults: List[str]) -> str:
    """``[optimizer] name`` and its implementation: ``implementation`` (torchtitan of 2025, "fused" its default)
    or ``fused`` (of 2024, false its default, and foreach = not fused); Adam and AdamW under foreach are the
    ``*_foreach`` optimizers, whose step makes a state-sized temporary (plugins/optimizers.py)."""
    name = _name(KIND, f.path, "[optimizer] name", f.get("optimizer", "name", "AdamW"))
    optimizer = OPTIMIZERS.get(name, name.lower())
    section = f.section("optimizer")
    if "implementation" in section:
        implementation = f.get("optimizer", "implementation")
        if implementation == "for-loop":
            raise f.error("[optimizer] implementation", "'for-loop' is not priced (it steps one parameter at a "
                          "time, its temporaries that parameter's)", 'give "fused" or "foreach"')
        if implementation not in ("fused", "foreach"):
            raise f.error("[optimizer] implementation", f"{implementation!r} is not one of torchtitan's (fused, "
                          "foreach, for-loop)", 'give "fused" or "foreach"')
        foreach = implementation == "foreach"
    elif "fused" in section:
        foreach = not boolean(KIND, f.path, "[optimizer] fused", f.get("optimizer", "fused"))
        if foreach:
            defaults.append("[optimizer] fused = false: torchtitan of 2024 passed foreach = not fused")
    else:
        foreach = False
    return f"{optimizer}_foreach" if foreach and optimizer in OPTIMIZERS.values() else optimizer


def _name(kind: str, path: str, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise field_error(kind, path, field, f"{value!r} is not a name", "give a non-empty string")
    return value.strip()


def _leaves(table: Dict[str, Any], prefix: str = "") -> List[str]:
    out = []
    for key, value in table.items():
        if isinstance(value, dict):
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}")
    return out


def _load(path: str) -> _File:
    from ndcost.specio import read_text

    try:
        data = tomllib.loads(read_text(path, f"{KIND} config"))
    except tomllib.TOMLDecodeError as exc:
        raise field_error(KIND, path, "file", f"not TOML ({exc})", "give a torchtitan job TOML") from None
    known = {"model", "training", "parallelism", "job", "activation_checkpoint", "optimizer"}
    if not known & set(data):
        raise field_error(KIND, path, "file", "no [model], [training] or [parallelism] section: not a torchtitan "
                          "job TOML", "give a torchtitan job TOML (torchtitan/models/*/train_configs/*.toml)")
    return _File(path, data)


def _model(f: _File, model: Any) -> Tuple[Any, int]:
    """The model (the one given beside the file, else the file's flavor) and its decoder layers."""
    from ndcost.models import load_model

    name = _name(KIND, f.path, "[model] name", f.get("model", "name", "llama3"))
    flavor = _name(KIND, f.path, "[model] flavor", f.get("model", "flavor", "debugmodel"))
    if model is None:
        model = MODELS.get((name, flavor))
        if model is None:
            known = ", ".join(f"{n} {fl}" for n, fl in MODELS)
            raise f.error("[model] flavor", f"no ndcost model for {name} {flavor!r} (known: {known})",
                          f"give the model: ndcost estimate MODEL --from {KIND}:{f.path}")
    return model, load_model(model).num_layers


def _refusals(f: _File) -> None:
    """Refuse, in one line, every setting the file turns on that ndcost does not price yet."""
    found = []
    other = [c for c in _converters(f) if c not in FLOAT8_CONVERTERS + (GROUPED_FLOAT8_CONVERTER,)]
    if other:
        found.append((f"[model] converters = {other}", "MX training",
                      f"keep only {' or '.join(map(repr, FLOAT8_CONVERTERS + (GROUPED_FLOAT8_CONVERTER,)))} among "
                      f"the converters"))
    if boolean(KIND, f.path, "[fault_tolerance] enable", f.get("fault_tolerance", "enable", False)):
        found.append(("[fault_tolerance] enable = true", "TorchFT", "set [fault_tolerance] enable = false"))
    if found:
        fields = ", ".join(field for field, _, _ in found)
        what = ", ".join(dict.fromkeys(what for _, what, _ in found))
        fixes = " and ".join(fix for _, _, fix in found)
        raise f.error(fields, f"{what} not priced yet", f"{fixes} in a copy to price it eagerly in bf16/fp32")


def _converters(f: _File) -> List[str]:
    converters = f.get("model", "converters", [])
    if not isinstance(converters, list) or not all(isinstance(c, str) for c in converters):
        raise f.error("[model] converters", f"{converters!r} is not a list of names", 'give e.g. ["float8"]')
    return converters


def _grouped_float8(f: _File) -> Optional[str]:
    """The setting that turns the routed experts' grouped GEMMs to fp8 (``float8_experts``), or None: the
    grouped-GEMM converter with ``[quantize.grouped_mm.float8] fqns`` (238fa99), or, with the 2025 float8
    converter, ``[float8] moe_fqns``."""
    converters = _converters(f)
    if GROUPED_FLOAT8_CONVERTER in converters:
        table, key = GROUPED_FLOAT8_CONVERTER, "fqns"
    elif "float8" in converters:
        table, key = "float8", "moe_fqns"
    else:
        return None
    fqns = f.get(table, key, [])
    if not isinstance(fqns, list) or not all(isinstance(n, str) for n in fqns):
        raise f.error(f"[{table}] {key}", f"{fqns!r} is not a list of module names", 'give ["experts"]')
    if not fqns and table == GROUPED_FLOAT8_CONVERTER:
        raise f.error(f"[{table}] {key}", "empty: the grouped-GEMM converter converts no module", 'give ["experts"]')
    return f"[{table}] {key}" if fqns else None


def _low_precision(f: _File, p: Dict[str, int]) -> Tuple[Dict[str, Any], List[str]]:
    """Float8 (torchao's Float8Linear through the converter), torch.compile and async TP as strategy fields."""
    fields: Dict[str, Any] = {}
    notes: List[str] = []
    legacy = boolean(KIND, f.path, "[float8] enable_float8_linear", f.get("float8", "enable_float8_linear", False))
    if legacy or set(_converters(f)) & set(FLOAT8_CONVERTERS):
        table = "quantize.linear.float8" if f.section("quantize.linear.float8") else "float8"
        if f.get(table, "emulate", False):
            raise f.error(f"[{table}] emulate", "emulation runs no fp8 GEMM", "remove emulate in a copy")
        recipe = f.get(table, "recipe_name")
        if recipe is not None and recipe not in FLOAT8_RECIPES[1:]:
            raise f.error(f"[{table}] recipe_name", f"{recipe!r} is not a torchao recipe ndcost prices",
                          f"give one of {', '.join(FLOAT8_RECIPES[1:])}, or leave it unset (tensorwise)")
        gather = boolean(KIND, f.path, f"[{table}] enable_fsdp_float8_all_gather",
                         f.get(table, "enable_fsdp_float8_all_gather", False))
        if gather and recipe is not None:
            raise f.error(f"[{table}] enable_fsdp_float8_all_gather", "torchtitan asserts it away with a "
                          "recipe_name", "leave recipe_name unset (tensorwise) or set the all-gather to false")
        fields["float8"] = recipe or "tensorwise"
        if recipe is None:
            notes.append("Float8 without recipe_name: tensorwise dynamic scaling (torchtitan's default config)")
        if gather and p["shard"] > 1:  # torchtitan: enable_fsdp_float8_all_gather and dp_shard_enabled
            fields["float8_all_gather"] = True
        elif gather:
            notes.append("enable_fsdp_float8_all_gather without data_parallel_shard_degree > 1: torchtitan turns "
                         "it off")
        f.get(table, "precompute_float8_dynamic_scale_for_fsdp")  # the scales' one all-reduce: not priced
        filtered = [] if legacy else f.get(table, "filter_fqns", [])
        if not isinstance(filtered, list) or any(fqn not in _FLOAT8_KEPT for fqn in filtered):
            raise f.error(f"[{table}] filter_fqns", f"{filtered!r}: ndcost's float8 converts every attention and "
                          f"MLP linear and keeps {' and '.join(_FLOAT8_KEPT)} at the compute dtype",
                          f"give a list of {', '.join(map(repr, _FLOAT8_KEPT))} in a copy")
        if "output" not in filtered and not legacy:
            notes.append("filter_fqns leaves the output head to Float8; ndcost prices the head at compute_dtype")
    grouped = _grouped_float8(f)
    if grouped:
        if "float8" not in fields:
            raise f.error(grouped, "the experts' grouped GEMMs in fp8 without the Float8 linears are not priced "
                          "(ndcost's float8_experts goes with float8)", f"add {FLOAT8_CONVERTERS[1]!r} to "
                          "[model] converters, or remove the grouped-GEMM float8 in a copy")
        fields["float8_experts"] = True
    backend = f.get("compile", "backend", "inductor")
    compiled = boolean(KIND, f.path, "[compile] enable", f.get("compile", "enable", False))
    components = f.get("compile", "components", ["model", "loss"])
    if not isinstance(components, list) or not all(isinstance(c, str) for c in components):
        raise f.error("[compile] components", f"{components!r} is not a list of names", 'give ["model", "loss"]')
    if compiled and backend != "inductor":
        raise f.error("[compile] backend", f"{backend!r}: ndcost's compile prices inductor's fusion",
                      'give "inductor"')
    old = boolean(KIND, f.path, "[training] compile", f.get("training", "compile", False))
    if (compiled and "model" in components) or old:
        fields["compile"] = True
    if compiled and "loss" in components:  # components/loss.py: build_cross_entropy_loss compiles it
        fields["loss_engine"] = "compiled"
    elif old:
        notes.append("[training] compile: whether torchtitan also compiled the loss depends on its version (from "
                     "2024-10-22, e10cb949, off from 2024-12-18, e8977b00, on again from 2025-04-02, bbb1b616): "
                     "priced eager, the larger figure; [compile] components with \"loss\" says it is compiled")
    if boolean(KIND, f.path, "[parallelism] enable_async_tensor_parallel",
               f.get("parallelism", "enable_async_tensor_parallel", False)) and p["tp"] > 1:
        if not fields.get("compile"):
            raise f.error("[parallelism] enable_async_tensor_parallel", "torchtitan refuses async TP without "
                          "compiling the model", "set [compile] enable = true (components with \"model\")")
        fields["async_tp"] = True
    return fields, notes


def _degrees(f: _File, devices: Optional[int]) -> Dict[str, int]:
    p = {}
    for key, name, default in (("data_parallel_replicate_degree", "replicate", 1),
                               ("tensor_parallel_degree", "tp", 1), ("pipeline_parallel_degree", "pp", 1),
                               ("context_parallel_degree", "cp", 1), ("expert_parallel_degree", "ep", 1),
                               ("expert_tensor_parallel_degree", "etp", 1)):
        p[name] = integer(KIND, f.path, f"[parallelism] {key}", f.get("parallelism", key, default))
    shard = f.get("parallelism", "data_parallel_shard_degree", -1)
    others = p["replicate"] * p["cp"] * p["tp"] * p["pp"]
    if shard == -1:
        if devices is None:
            raise f.error("[parallelism] data_parallel_shard_degree", "-1 takes the devices left over, and no world "
                          "size was given", "give --devices N (from_config(..., devices=N))")
        if devices % others:
            raise f.error("[parallelism] data_parallel_shard_degree",
                          f"-1 with {devices} devices: replicate * cp * tp * pp = {others} does not divide them",
                          "give --devices a multiple of it, or set the degrees")
        shard = devices // others
    shard = integer(KIND, f.path, "[parallelism] data_parallel_shard_degree", shard,
                    fix="give -1 (the devices left over) or a whole number >= 1")
    world = others * shard
    if devices is not None and world != devices:
        raise f.error("[parallelism]", f"replicate {p['replicate']} * shard {shard} * cp {p['cp']} * tp {p['tp']} * "
                      f"pp {p['pp']} = {world}, not the {devices} devices given",
                      "set data_parallel_shard_degree = -1 or give --devices to match")
    if p["ep"] == 1 and p["etp"] > 1:  # "No effect for non-MoE models, or when ep = 1" (job_config.py)
        p["etp"] = 1
    if p["ep"] > 1 and p["etp"] not in (1, p["tp"]):
        raise f.error("[parallelism] expert_tensor_parallel_degree", f"{p['etp']} with tp {p['tp']}: torchtitan "
                      "takes 1 or the tp degree", "set it to 1 or to tensor_parallel_degree")
    p["shard"], p["world"] = shard, world
    return p


def _ep_dispatcher(f: _File, p: Dict[str, int]) -> str:
    """``ep_dispatcher`` from ``[parallelism] expert_parallel_comm_backend``, refused where torchtitan refuses it
    (the DeepSeek-V3 and Qwen3 parallelize functions: DeepEP needs ep > 1 and takes no expert TP)."""
    name = _name(KIND, f.path, "[parallelism] expert_parallel_comm_backend",
                 f.get("parallelism", "expert_parallel_comm_backend", "standard"))
    if name not in EP_COMM_BACKENDS:
        raise f.error("[parallelism] expert_parallel_comm_backend", f"{name!r} is not priced",
                      f"set it to one of {', '.join(map(repr, EP_COMM_BACKENDS))}")
    if EP_COMM_BACKENDS[name] == "deepep" and (p["ep"] <= 1 or p["etp"] > 1):
        raise f.error("[parallelism] expert_parallel_comm_backend", f"{name!r} with expert_parallel_degree "
                      f"{p['ep']} and expert_tensor_parallel_degree {p['etp']}: torchtitan runs DeepEP only at "
                      "ep > 1 without expert TP", 'set expert_parallel_degree > 1 and '
                      'expert_tensor_parallel_degree = 1, or use "standard"')
    return EP_COMM_BACKENDS[name]


def _pipeline(f: _File, p: Dict[str, int], layers: int) -> Dict[str, Any]:
    """schedule, vpp and pp_layers: torchtitan's own split of the stack over pp * stages-per-rank stages."""
    if p["pp"] == 1:
        return {}
    name = _name(KIND, f.path, "[parallelism] pipeline_parallel_schedule",
                f.get("parallelism", "pipeline_parallel_schedule", "1F1B"))
    csv = f.get("parallelism", "pipeline_parallel_schedule_csv", "")
    if csv:
        raise f.error("[parallelism] pipeline_parallel_schedule_csv", f"{csv!r}: a custom schedule is not priced",
                      "remove it in a copy and name a pipeline_parallel_schedule")
    if name not in SCHEDULES:
        raise f.error("[parallelism] pipeline_parallel_schedule", f"{name!r} is not priced yet (ndcost prices "
                      f"{', '.join(SCHEDULES)})", "choose one of those in a copy")
    fqns = f.get("parallelism", "module_fqns_per_model_part")
    per_stage = f.get("parallelism", "pipeline_parallel_layers_per_stage")
    if fqns is not None:
        split = _split_from_fqns(f, fqns, layers)
    else:
        first = integer(KIND, f.path, "[parallelism] pipeline_parallel_first_stage_less_layers",
                        f.get("parallelism", "pipeline_parallel_first_stage_less_layers", 1), minimum=0)
        last = integer(KIND, f.path, "[parallelism] pipeline_parallel_last_stage_less_layers",
                       f.get("parallelism", "pipeline_parallel_last_stage_less_layers", 1), minimum=0)
        if per_stage is not None:
            per_stage = integer(KIND, f.path, "[parallelism] pipeline_parallel_layers_per_stage", per_stage)
            stages = math.ceil((layers + first + last) / per_stage)
        else:
            stages = p["pp"] * (1 if name in _SINGLE_STAGE else 2)
        split = _torchtitan_split(f, stages, layers, first, last)
    if len(split) % p["pp"]:
        raise f.error("[parallelism] pipeline_parallel_degree", f"{len(split)} stages do not divide over "
                      f"{p['pp']} ranks", "give a stage count that is a multiple of the pp degree")
    vpp = len(split) // p["pp"]
    if (name in _SINGLE_STAGE) != (vpp == 1) or (name == "DualPipeV" and vpp != 2):
        raise f.error("[parallelism] pipeline_parallel_schedule", f"{name} with {vpp} stages a rank: torchtitan "
                      "runs 1F1B and GPipe with one, Interleaved1F1B with two or more, DualPipeV with two",
                      "match the schedule to the stages per rank")
    return {"schedule": SCHEDULES[name], "vpp": vpp, "pp_layers": tuple(split)}


def _torchtitan_split(f: _File, stages: int, layers: int, first: int, last: int) -> List[int]:
    """Decoder layers of each stage as torchtitan's ``generate_llm_fqn_per_model_part`` assigns them
    (:func:`ndcost.compose.placement.weighted_split`): the embedding counts as *first* layers, the head as *last*."""
    split = weighted_split(layers, stages, first, last)
    if split is None:
        raise f.error("[parallelism] pipeline_parallel_degree", f"{stages} stages over {layers} layers (with "
                      f"{first} and {last} for the embedding and head) leave a stage empty or lighter than them",
                      "use fewer stages, or give module_fqns_per_model_part")
    return list(split)


def _split_from_fqns(f: _File, fqns: Any, layers: int) -> List[int]:
    field = "[parallelism] module_fqns_per_model_part"
    if not isinstance(fqns, list) or not all(isinstance(part, list) for part in fqns):
        raise f.error(field, "not a list of lists of module names", 'give e.g. [["tok_embeddings", "layers.0"], ...]')
    split, expected = [], 0
    for part in fqns:
        count = 0
        for name in part:
            if isinstance(name, str) and name.startswith("layers."):
                if name != f"layers.{expected}":
                    raise f.error(field, f"{name!r} out of order (expected layers.{expected})",
                                  "list the layers in model order")
                expected += 1
                count += 1
        split.append(count)
    if expected != layers or 0 in split:
        raise f.error(field, f"places {expected} layers ({split}) where the model has {layers}, every stage "
                      "holding one or more", "list every layer once")
    return split


def _batches(f: _File, p: Dict[str, int], pp: Dict[str, Any]) -> Tuple[Dict[str, int], int, List[str]]:
    local = f.get("training", "local_batch_size")
    field = "[training] local_batch_size"
    if local is None:
        local, field = f.get("training", "batch_size", 8), "[training] batch_size"
    local = integer(KIND, f.path, field, local)
    batch_degree = p["replicate"] * p["shard"]
    global_batch = f.get("training", "global_batch_size", -1)
    if global_batch == -1:
        global_batch = local * batch_degree
    global_batch = integer(KIND, f.path, "[training] global_batch_size", global_batch,
                           fix="give -1 (local_batch_size times the data-parallel degree) or a positive multiple")
    if global_batch % (local * batch_degree):
        raise f.error("[training] global_batch_size", f"{global_batch} is not a multiple of local_batch_size "
                      f"{local} * data-parallel degree {batch_degree}", "give a multiple, or -1")
    accumulation = global_batch // (local * batch_degree)
    notes = []
    if not pp:
        return {"micro_batch": local, "num_micro_batches": accumulation}, global_batch, notes
    micro = integer(KIND, f.path, "[parallelism] pipeline_parallel_microbatch_size",
                    f.get("parallelism", "pipeline_parallel_microbatch_size", 1))
    if local % micro:
        raise f.error("[parallelism] pipeline_parallel_microbatch_size", f"{micro} does not divide local_batch_size "
                      f"{local}", "give a divisor of it")
    if accumulation > 1:
        notes.append(f"gradient accumulation {accumulation} under PP: torchtitan runs the schedule {accumulation} "
                     f"times a step (a bubble each); priced as one flush of {accumulation * local // micro} "
                     "micro-batches")
    return {"micro_batch": micro, "num_micro_batches": accumulation * local // micro}, global_batch, notes


def _recompute(f: _File, p: Dict[str, int], layers: int) -> Tuple[Dict[str, Any], List[str]]:
    if "activation_checkpoint" not in f.data:
        notes = ['no [activation_checkpoint]: torchtitan\'s default mode = "selective", selective_ac_option = "2" '
                 '(every 2nd layer checkpointed whole)']
        mode, option = "selective", "2"
    else:
        notes = []
        mode = _name(KIND, f.path, "[activation_checkpoint] mode", f.get("activation_checkpoint", "mode", "selective"))
        option = f.get("activation_checkpoint", "selective_ac_option", "2")
    if mode == "none":
        return {"recompute": "none"}, notes
    if mode == "full":
        return {"recompute": "full"}, notes
    if mode != "selective":
        raise f.error("[activation_checkpoint] mode", f"{mode!r} is not priced yet (ndcost prices none, full and "
                      "selective)", 'set mode = "full" or "selective" in a copy')
    option = str(option).strip()
    if option == "op":
        return {"recompute": "selective"}, notes
    if not option.isdigit() or int(option) < 1:
        raise f.error("[activation_checkpoint] selective_ac_option", f"{option!r} is neither 'op' nor a period",
                      "give 'op' or a whole number N >= 1 (every N-th layer)")
    period = int(option)
    if period == 1:
        return {"recompute": "full"}, notes
    if p["pp"] > 1:
        raise f.error("[activation_checkpoint] selective_ac_option", f"every {period}-th layer under PP: the count "
                      "differs by stage, which ndcost's one recompute_layers cannot say",
                      "set mode = \"full\" or selective_ac_option = \"op\" in a copy")
    notes.append(f"selective_ac_option = \"{period}\": {layers // period} of the {layers} layers checkpointed whole, "
                 "priced as the rank's first ones")
    return {"recompute": "full", "recompute_layers": layers // period}, notes


def _precision(f: _File) -> Dict[str, Any]:
    fix = 'give "float32" or "bfloat16"'
    stored = dtype(KIND, f.path, "[training] dtype", f.get("training", "dtype", "float32"), ("fp32", "bf16"), fix)
    compute = dtype(KIND, f.path, "[training] mixed_precision_param",
                    f.get("training", "mixed_precision_param", "bfloat16"), ("fp32", "bf16"), fix)
    dtype(KIND, f.path, "[training] mixed_precision_reduce", f.get("training", "mixed_precision_reduce", "float32"),
          ("fp32",), 'give "float32" (the only reduce dtype torchtitan takes)')
    # training.dtype bfloat16 holds everything in bf16 (no mixed precision); else FSDP2 / autocast computes in
    # mixed_precision_param over fp32 parameters, gradients and optimizer states
    out: Dict[str, Any] = {"param_dtype": stored}
    if stored == "fp32" and compute != "fp32":
        out["compute_dtype"] = compute
    return out


def read(path: str, *, devices: Optional[int], model: Any = None) -> TrainerConfig:
    """The strategy a torchtitan job TOML runs (see the module docstring for what is kept and refused)."""
    f = _load(path)
    _refusals(f)
    model, layers = _model(f, model)
    p = _degrees(f, devices)
    defaults: List[str] = []
    fields: Dict[str, Any] = {"dp": p["replicate"], "tp": p["tp"], "pp": p["pp"], "cp": p["cp"], "ep": p["ep"],
                              "etp": p["etp"]}
    shards = p["shard"] > 1 or p["cp"] > 1  # torchtitan's fsdp_enabled
    if p["shard"] > 1:
        fields["fsdp"] = p["shard"]
    elif p["cp"] > 1:
        fields["shard_mesh"] = "fsdp_cp"
        defaults.append(f"FSDP over the {p['cp']} cp ranks with data_parallel_shard_degree 1 (torchtitan's "
                        "dp_shard_cp mesh): shard_mesh=fsdp_cp")
    if p["tp"] > 1:
        fields["sp"] = True
        defaults.append("sequence parallel with tp > 1 (torchtitan's TP plan shards the norms over the sequence)")
        disabled = f.get("parallelism", "disable_loss_parallel")
        if disabled is None:
            defaults.append("loss parallel on with tp > 1 (disable_loss_parallel = false): vocab_parallel=true")
            disabled = False
        fields["vocab_parallel"] = not boolean(KIND, f.path, "[parallelism] disable_loss_parallel", disabled)
    # torch's rotater (set_rotate_method, from torchtitan/distributed/utils.py create_context_parallel_ctx):
    # "allgather" gathers every K/V block once, "alltoall" passes one a step (_attention.py _create_rotater)
    rotate = _name(KIND, f.path, "[parallelism] context_parallel_rotate_method",
                   f.get("parallelism", "context_parallel_rotate_method", "allgather"))
    if rotate not in ROTATE_METHODS:
        raise f.error("[parallelism] context_parallel_rotate_method", f"{rotate!r} is not one of torchtitan's "
                      f"methods ({', '.join(ROTATE_METHODS)})", 'set it to "allgather" or "alltoall"')
    fields["cp_rotate"] = ROTATE_METHODS[rotate]
    if p["cp"] > 1:
        fields["cp_algo"] = "ring"
    fields["ep_dispatcher"] = _ep_dispatcher(f, p)
    pipeline = _pipeline(f, p, layers)
    fields.update(pipeline)
    batches, global_batch, notes = _batches(f, p, pipeline)
    fields.update(batches)
    defaults += notes
    recompute, notes = _recompute(f, p, layers)
    fields.update(recompute)
    defaults += notes
    fields.update(_precision(f))
    low, notes = _low_precision(f, p)
    fields.update(low)
    defaults += notes
    policy = f.get("parallelism", "fsdp_reshard_after_forward", "default")
    if policy not in ("default", "always", "never"):
        raise f.error("[parallelism] fsdp_reshard_after_forward", f"{policy!r} is not a policy",
                      'give "default", "always" or "never"')
    if shards and (policy == "never" or (policy == "default" and p["pp"] > 1)):
        fields["reshard_after_forward"] = False
        if policy == "default":
            defaults.append('fsdp_reshard_after_forward = "default" with PP: no resharding after the forward')
    if shards and p["pp"] > 1:
        # torch.distributed.pipelining's stage backward turns FSDP's gradient sync and post-backward reshard off
        # until the last micro-batch (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync)
        fields["gradient_sync"] = "last_micro_batch"
        defaults.append("FSDP under PP: gradients reduce-scattered once, after the last micro-batch's backward "
                        "(torch.distributed.pipelining): gradient_sync=last_micro_batch")
    if p["pp"] > 1:
        # torch.distributed.pipelining's PipelineStage: a receive buffer a micro-batch for each stage input and
        # output gradient, kept across steps (torch/distributed/pipelining/stage.py, _setup_forward_recv_info)
        fields["pp_engine"] = "torch"
        defaults.append("PP through torch.distributed.pipelining: a receive buffer a micro-batch, kept: "
                        "pp_engine=torch")
        defaults.append("the last stage's outputs not kept for step() to return (torchtitan passes "
                        "return_outputs=False from e5ef99aa, 2025-10-22; an older torchtitan kept them: "
                        "pp_return_outputs=true prices that)")
    if boolean(KIND, f.path, "[training] enable_cpu_offload", f.get("training", "enable_cpu_offload", False)):
        fields["offload_params"] = fields["offload_optimizer"] = True  # FSDP2 CPUOffloadPolicy
    fields["optimizer"] = _optimizer(f, defaults)
    seq = f.get("training", "seq_len", 2048)
    fields["seq"] = integer(KIND, f.path, "[training] seq_len", seq)
    if "seq_len" not in f.section("training"):
        defaults.append("no [training] seq_len: torchtitan's default 2048")
    try:
        strategy = Strategy.from_mapping(fields)
    except InvalidValue as exc:  # a combination Strategy refuses (ep not dividing the ranks, ...)
        raise f.error("[parallelism]", str(exc), "fix the degrees in a copy") from None
    defaults.append(f"runtime {RUNTIME}: torchtitan's attention repeats the keys and values to every query head "
                    "before SDPA (repeat_kv), which SDPA then saves and ring CP passes")
    return TrainerConfig(kind=KIND, path=path, strategy=strategy, model=model, devices=p["world"],
                         global_batch=global_batch, read_fields=tuple(f.read), ignored_fields=f.ignored(),
                         defaults=tuple(defaults), runtime=RUNTIME)


# --------------------------------------------------------------------------- writer


def _refuse(field: str, problem: str) -> Exception:
    return InvalidValue(f"torchtitan cannot express {field}: {problem}")


def write(strategy: Strategy, *, model: Any, global_batch: Optional[int]) -> str:
    """*strategy* as a torchtitan job TOML; :func:`read` gives it back (with ``pp_layers`` always stated under PP)."""
    from ndcost.models import load_model

    s = strategy
    flavors = {v: k for k, v in MODELS.items()}
    if model not in flavors:
        known = ", ".join(flavors)
        raise _refuse(f"model {model!r}", f"torchtitan ships a flavor of {known} only")
    layers = load_model(model).num_layers
    if s.seq is None:
        raise _refuse("seq unset", "a job states [training] seq_len; give seq")
    _check_writable(s)
    name, flavor = flavors[model]
    stored = {"fp32": "float32", "bf16": "bfloat16"}
    dp_degree = s.dp * s.fsdp
    lines = ["# written by ndcost (search --emit torchtitan): the parallel layout, batch, checkpointing and",
             "# precision of one strategy; the rest of a job (dataset, optimizer settings, checkpoints) is",
             "# torchtitan's defaults", "", "[model]", f'name = "{name}"', f'flavor = "{flavor}"']
    if s.float8 != "none":
        grouped = f', "{GROUPED_FLOAT8_CONVERTER}"' if s.float8_experts else ""
        lines.append(f'converters = ["quantize.linear.float8"{grouped}]')
    lines += ["",
             "[optimizer]", f'name = "{_OPTIMIZER_NAMES[s.optimizer.removesuffix("_foreach")]}"',
             f'implementation = "{"foreach" if s.optimizer.endswith("_foreach") else "fused"}"', "", "[training]"]
    parallel = [f"data_parallel_replicate_degree = {s.dp}", f"data_parallel_shard_degree = {s.fsdp}",
                f"tensor_parallel_degree = {s.tp}", f"context_parallel_degree = {s.cp}",
                f"pipeline_parallel_degree = {s.pp}", f"expert_parallel_degree = {s.ep}",
                f"expert_tensor_parallel_degree = {s.etp}"]
    if s.ep_dispatcher == "deepep":
        parallel.append('expert_parallel_comm_backend = "deepep"')
    if s.cp > 1 or s.cp_rotate != "allgather":
        rotate = {v: k for k, v in ROTATE_METHODS.items()}[s.cp_rotate]
        parallel.append(f'context_parallel_rotate_method = "{rotate}"')
    if s.tp > 1:
        parallel.append(f"disable_loss_parallel = {'false' if s.vocab_parallel else 'true'}")
        parallel.append(f"enable_async_tensor_parallel = {'true' if s.async_tp else 'false'}")
    if s.pp > 1:
        local = s.micro_batch * s.num_micro_batches  # one schedule a step: no gradient accumulation
        split = s.pp_layers or _even(layers, s.pp * s.vpp)
        parts, first = [], 0
        for index, count in enumerate(split):
            names = [f"layers.{i}" for i in range(first, first + count)]
            first += count
            parts.append((["tok_embeddings"] if index == 0 else []) + names
                         + (["norm", "output"] if index == len(split) - 1 else []))
        parallel += [f'pipeline_parallel_schedule = "{_SCHEDULE_NAMES[s.schedule]}"',
                     f"pipeline_parallel_microbatch_size = {s.micro_batch}",
                     "module_fqns_per_model_part = [\n" + "".join(
                         "    [" + ", ".join(f'"{n}"' for n in part) + "],\n" for part in parts) + "]"]
        policy = "default" if s.reshard_after_forward is False else "always"
    else:
        local = s.micro_batch
        policy = "default" if s.reshard_after_forward else "never"
    total = local * dp_degree * (1 if s.pp > 1 else s.num_micro_batches)
    if global_batch is not None and global_batch != total:
        raise _refuse(f"global batch {global_batch}", f"the strategy runs {total} sequences a step "
                      f"(micro_batch * num_micro_batches * dp * fsdp)")
    parallel.append(f'fsdp_reshard_after_forward = "{policy}"')
    lines += [f"local_batch_size = {local}", f"global_batch_size = {total}", f"seq_len = {s.seq}",
              f'dtype = "{stored[s.param_dtype]}"', f'mixed_precision_param = "{stored[s.compute]}"',
              'mixed_precision_reduce = "float32"']
    if s.offload_params:
        lines.append("enable_cpu_offload = true")
    lines += ["", "[parallelism]"] + parallel + ["", "[activation_checkpoint]"]
    if s.recompute == "selective":
        lines += ['mode = "selective"', 'selective_ac_option = "op"']
    elif s.recompute == "full" and s.recompute_layers is not None:
        lines += ['mode = "selective"', f'selective_ac_option = "{_period(layers, s.recompute_layers)}"']
    else:
        lines.append(f'mode = "{s.recompute}"')
    components = [name for name, on in (("model", s.compile), ("loss", s.loss_engine == "compiled")) if on]
    lines += ["", "[compile]", f"enable = {'true' if components else 'false'}",
              "components = [" + ", ".join(f'"{c}"' for c in components or ("model", "loss")) + "]", ""]
    if s.float8 != "none":
        lines += ["[quantize.linear.float8]"] + ([] if s.float8 == "tensorwise" else [f'recipe_name = "{s.float8}"'])
        lines += [f"enable_fsdp_float8_all_gather = {'true' if s.float8_all_gather else 'false'}",
                  'filter_fqns = ["output", "router.gate"]', ""]
    if s.float8_experts:
        lines += [f"[{GROUPED_FLOAT8_CONVERTER}]", 'fqns = ["experts"]', ""]
    return "\n".join(lines)


def _even(layers: int, stages: int) -> Tuple[int, ...]:
    """ndcost's own even split (compose/placement.py: ``j * L // stages`` layers before stage ``j``)."""
    return tuple((j + 1) * layers // stages - j * layers // stages for j in range(stages))


def _period(layers: int, count: int) -> int:
    for period in range(2, layers + 1):
        if layers // period == count:
            return period
    raise _refuse(f"recompute_layers={count}", f"no period N gives {layers} // N = {count} layers (torchtitan "
                  "checkpoints every N-th layer)")


def _check_writable(s: Strategy) -> None:
    """Refuse, by field, what a torchtitan job cannot say, so that reading the file back gives *s*."""
    default = Strategy()
    checks = [
        (s.shard_mesh == "dp", "shard_mesh=dp", "torchtitan's FSDP shards over dp_shard * cp"),
        (s.shard_mesh == "fsdp_cp" and not (s.fsdp == 1 and s.cp > 1), "shard_mesh=fsdp_cp with fsdp > 1 or cp=1",
         "torchtitan's FSDP over dp_shard * cp is shard_mesh=dp_cp where dp_shard > 1"),
        (s.zero != 0, f"zero={s.zero}", "torchtitan has FSDP, not ZeRO (fsdp=N, or shard_mesh=fsdp_cp over the cp "
         "ranks alone)"),
        (s.cp > 1 and s.fsdp == 1 and s.shard_mesh != "fsdp_cp", f"cp={s.cp} with fsdp=1",
         "torchtitan shards the parameters over the cp ranks whenever cp > 1: give shard_mesh=fsdp_cp"),
        (s.sp != (s.tp > 1), f"sp={str(s.sp).lower()} with tp={s.tp}", "torchtitan's TP always runs sequence "
         "parallel"),
        (s.vocab_parallel and s.tp == 1, "vocab_parallel=true with tp=1", "nothing splits at tp=1"),
        (s.cp_algo != "ring", f"cp_algo={s.cp_algo}", "torchtitan's CP is torch's ring attention (cp_algo=ring; "
         "context_parallel_rotate_method is cp_rotate)"),
        (s.etp > 1 and s.etp != s.tp or (s.ep == 1 and s.etp > 1), f"etp={s.etp}",
         "torchtitan takes etp 1, or the tp degree with ep > 1"),
        (s.pp == 1 and (s.schedule != "1f1b" or s.vpp > 1 or s.pp_layers is not None),
         f"schedule={s.schedule},vpp={s.vpp} with pp=1", "no pipeline"),
        (s.pp > 1 and s.schedule not in SCHEDULES.values(), f"schedule={s.schedule}",
         f"torchtitan runs {', '.join(SCHEDULES)}"),
        (s.recompute == "core_attention", "recompute=core_attention", "torchtitan checkpoints whole layers or by op"),
        (s.recompute == "full" and s.recompute_layers is not None and s.pp > 1, "recompute_layers with pp > 1",
         "the every-N-th-layer count differs by stage"),
        (s.recompute != "full" and s.recompute_layers is not None, f"recompute_layers with recompute={s.recompute}",
         "only full checkpointing counts layers"),
        (s.optimizer.removesuffix("_foreach") not in OPTIMIZERS.values(), f"optimizer={s.optimizer}",
         "torchtitan builds Adam or AdamW (fused or foreach)"),
        (s.param_dtype not in ("fp32", "bf16") or s.compute not in ("fp32", "bf16"),
         f"param_dtype={s.param_dtype},compute_dtype={s.compute}", "torchtitan stores and computes in fp32 or bf16"),
        (s.param_dtype == "bf16" and s.compute != "bf16", "compute_dtype above bf16 parameters",
         "torchtitan's training.dtype bfloat16 computes in bf16"),
        (s.grad != s.param_dtype, f"grad_dtype={s.grad} beside param_dtype={s.param_dtype}",
         "torchtitan keeps gradients in the parameters' dtype"),
        (s.optimizer_state_dtype != s.param_dtype, f"optimizer_dtype={s.optimizer_state_dtype} beside "
         f"param_dtype={s.param_dtype}", "torchtitan keeps optimizer states in the parameters' dtype"),
        (s.master_dtype != "none", f"master_dtype={s.master_dtype}", "torchtitan keeps no master copy (its "
         "mixed precision stores fp32 parameters: param_dtype=fp32,compute_dtype=bf16)"),
        (not s.reshard_after_forward and not (s.fsdp > 1 or s.cp > 1), "reshard_after_forward=false without FSDP",
         "nothing is gathered"),
        (s.gradient_sync != ("last_micro_batch" if s.pp > 1 and (s.fsdp > 1 or s.cp > 1) else "auto"),
         f"gradient_sync={s.gradient_sync} with pp={s.pp}", "torchtitan's FSDP reduce-scatters every micro-batch "
         "without PP and once a step with it (torch.distributed.pipelining): gradient_sync=auto without PP, "
         "last_micro_batch with PP and FSDP"),
        (s.pp_engine != ("torch" if s.pp > 1 else "auto"), f"pp_engine={s.pp_engine} with pp={s.pp}",
         "torchtitan pipelines through torch.distributed.pipelining: pp_engine=torch with PP, auto without"),
        (s.fsdp_engine == "megatron", "fsdp_engine=megatron", "torchtitan shards with FSDP2 (fully_shard): "
         "fsdp_engine=auto or torch"),
        (s.ddp_engine not in ("auto", "torch"), f"ddp_engine={s.ddp_engine}", "torchtitan replicates with "
         "PyTorch's DDP (replicate, its buckets beside the gradients): ddp_engine=auto or torch"),
        (s.loss_engine == "megatron", "loss_engine=megatron", "torchtitan's loss is torch's cross_entropy "
         "(loss_parallel under TP), compiled or not: loss_engine=auto, torch or compiled"),
        (s.offload_params != s.offload_optimizer, "offload_params without offload_optimizer (or the reverse)",
         "FSDP2's CPUOffloadPolicy offloads both"),
        (s.offload_activations, "offload_activations=true", "torchtitan's job has no activation offload"),
        (s.float8_all_gather and s.fsdp == 1, "float8_all_gather=true with fsdp=1",
         "torchtitan gathers fp8 only with data_parallel_shard_degree > 1"),
        (s.async_tp and s.tp == 1, "async_tp=true with tp=1", "torchtitan's async TP needs TP"),
        (s.ep_dispatcher == "deepep" and (s.ep == 1 or s.etp > 1), f"ep_dispatcher=deepep with ep={s.ep}, "
         f"etp={s.etp}", "torchtitan runs DeepEP only at ep > 1 without expert TP"),
        (s.reduce_bucket_elements != default.reduce_bucket_elements or s.reduce_buckets != default.reduce_buckets,
         f"reduce_bucket_elements={s.reduce_bucket_elements},reduce_buckets={s.reduce_buckets}",
         "DeepSpeed ZeRO's reduce bucket: torchtitan has none"),
        (s.reuse_distance_elements != default.reuse_distance_elements
         or s.live_parameters_elements != default.live_parameters_elements
         or s.sub_group_elements != default.sub_group_elements,
         f"reuse_distance_elements={s.reuse_distance_elements},live_parameters_elements={s.live_parameters_elements},"
         f"sub_group_elements={s.sub_group_elements}",
         "DeepSpeed ZeRO-3's: torchtitan's FSDP2 says what it keeps gathered with reshard_after_forward"),
        (s.moe_imbalance != default.moe_imbalance or s.allocator_overhead != default.allocator_overhead,
         "moe_imbalance or allocator_overhead", "they are ndcost's assumptions, not torchtitan settings"),
    ]
    for bad, field, why in checks:
        if bad:
            raise _refuse(field, why)


@attrs.frozen
class TorchtitanFormat:
    name: str = KIND
    description: str = "torchtitan job TOML ([parallelism], [training], [activation_checkpoint], ...): read, written"
    writes: bool = True
    # FSDP2's MixedPrecisionPolicy as torchtitan's defaults set it: fp32 parameters, bf16 compute
    recipe = MappingProxyType({"param_dtype": "fp32", "compute_dtype": "bf16"})
    runtime = RUNTIME

    def read(self, path: str, *, devices: Optional[int], model: Any = None) -> TrainerConfig:
        return read(path, devices=devices, model=model)

    def write(self, strategy: Any, *, model: Any, global_batch: Optional[int]) -> str:
        return write(strategy, model=model, global_batch=global_batch)


@hookimpl
def ndcost_register(register):
    register(f"trainer/{KIND}", TorchtitanFormat())
