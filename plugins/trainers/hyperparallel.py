"""HyperParallel's trainer ``train.yaml`` (``trainer/hyperparallel``): read into a strategy and a runtime profile.

The schema is HyperParallel's ``hyper_parallel/trainer/config/`` (mindspore-ai/hyper-parallel: ``trainer.py``
``TrainerConfig``, ``parallelism.py`` ``AcceleratorConfig``, ``ActivationCheckpointConfig`` and ``PlanOverride``,
``training.py``) and its meshes ``hyper_parallel/trainer/runtime/distributed.py``
(``create_distributed_setup_from_config``). What the reader keeps of them:

- The world size comes from the launcher (``--devices``); the data-parallel
  degree is ``world / (tp * cp * pp)``, and FSDP shards over
  ``fsdp_config.dp_shard_size`` ranks of the ``dp * cp`` pool, replicated over
  the rest (HSDP). A shard group that is a multiple of ``cp`` larger than it is
  ``fsdp = dp_shard_size / cp`` (FSDP over ``fsdp * cp``); any other is priced
  as ``shard_mesh=dp`` with ``fsdp = dp_shard_size`` (the same bytes a device
  holds; the gathers run over other ranks). ``fsdp_config.edp_shard_size`` is
  not checked against ndcost's own split of the routed experts.
- ``plan_overrides`` entries with ``replace_module`` (no ``when``) install
  HyperParallel's fused modules (its RMSNorm, its flash / grouped-query
  attention, its grouped experts): the run is priced under the ``hf-npu``
  runtime profile (specs/runtimes/hf-npu.yaml), whose census runs the NPU
  kernels' contracts; hf-npu also fuses the gated MLP, which a file may not
  replace (stated in ``defaults``). Without replacements the runtime is left to
  ``--runtime``.
- ``activation_checkpoint.mode`` selective is the runtime profile's selective
  policy (``recompute=selective``); ``swap_inputs`` copies the checkpointed
  inputs to the host: ``offload_activations``.
- ``training.global_batch_size`` over ``micro_batch_size`` and the data-parallel
  degree is the micro-batches a step accumulates.
- ``model.torch_dtype`` is the parameters' dtype (everything in it unless
  ``mixed_precision.enabled``, then computed in ``fsdp_config.mix_precision``'s
  ``param_dtype``); ``optimizer.fp32_main_params`` keeps an fp32 master copy.

Refused by name: compile, low precision, ``activation_swap``, pipeline
parallelism (its schedule is not read), a ``replace_module`` of a module other
than a norm, an attention or the experts.
"""
from __future__ import annotations

import os
from types import MappingProxyType
from typing import Any, Dict, List, Optional, Set, Tuple

import attrs

from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.plugins.trainers import boolean, dtype, integer
from ndcost.trainers import TrainerConfig, field_error
from ndcost.values import Strategy

KIND = "hyperparallel"
RUNTIME = "hf-npu"  # the runtime profile of HyperParallel's fused modules on Ascend NPUs
# replaced module types by the end of their class name -> what HyperParallel installs in their place
_REPLACED = (("RMSNorm", "fused RMSNorm"), ("Attention", "fused attention"), ("Experts", "grouped experts"))
# what the hf-npu profile replaces (its replacements and attention), named as _REPLACED names them
_RUNTIME_FUSES = ("fused RMSNorm", "fused attention", "gated MLP (npu_swiglu)")
_CP_ALGOS = ("ulysses", "colossal", "hybrid", "ring")
OPTIMIZERS = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd", "Adagrad": "adagrad"}


class _File:
    def __init__(self, path: str, data: Dict[str, Any]):
        self.path, self.data = path, data
        self.read: Set[str] = set()

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for key in dotted.split("."):
            if not isinstance(node, dict) or key not in node:
                return default
            node = node[key]
        self.read.add(dotted)
        return node

    def error(self, field: str, problem: str, fix: str):
        return field_error(KIND, self.path, field, problem, fix)

    def ignored(self) -> Tuple[str, ...]:
        return tuple(name for name in _leaves(self.data) if name not in self.read
                     and not any(name.startswith(f"{r}.") or name.startswith(f"{r}[") for r in self.read))


def _leaves(node: Any, prefix: str = "") -> List[str]:
    if isinstance(node, dict) and node:
        return [leaf for key, value in node.items() for leaf in _leaves(value, f"{prefix}{'.' if prefix else ''}{key}")]
    if isinstance(node, list) and node and all(isinstance(item, dict) for item in node):
        return [leaf for i, item in enumerate(node) for leaf in _leaves(item, f"{prefix}[{i}]")]
    return [prefix]


def _load(path: str) -> _File:
    from ndcost.specio import load_yaml, read_text

    try:
        data = load_yaml(read_text(path, f"{KIND} config"), f"{KIND} config {path}")
    except InvalidValue as exc:
        raise field_error(KIND, path, "file", str(exc).split(": ", 1)[-1], "give a HyperParallel train.yaml") from None
    if not isinstance(data, dict) or not {"model", "accelerator"} <= set(data):
        raise field_error(KIND, path, "file", "no model and accelerator sections: not a HyperParallel trainer "
                          "train.yaml", "give a train.yaml of hyper_parallel/trainer/config/trainer.py's schema")
    return _File(path, data)


def _model(f: _File, model: Any) -> Any:
    """The model given beside the file, else the one the file names, as a specs/models name or a local config."""
    from ndcost.models import known_models, load_model

    if model is not None:
        return model
    for field in ("model.pretrained_model_name_or_path", "model.config_path"):
        named = f.get(field)
        if named is None:
            continue
        if not isinstance(named, str):
            raise f.error(field, f"{named!r} is not a model name or path", "give a name or a path")
        if os.path.exists(named):
            found: Any = named
        else:
            found = os.path.basename(named.rstrip("/")).lower()
            if found not in known_models():
                raise f.error(field, f"{named!r}: no ndcost model {found!r} (ndcost list models)",
                              f"give the model: ndcost estimate MODEL --from {KIND}:{f.path}")
        layers = f.get("model.num_hidden_layers")
        if layers is not None:  # a cropped model (the trainer's config override)
            layers = integer(KIND, f.path, "model.num_hidden_layers", layers)
            config = dict(load_model(found).hf_config)
            config["num_hidden_layers"] = layers
            return config
        return found
    raise f.error("model", "names no pretrained_model_name_or_path or config_path",
                  f"give the model: ndcost estimate MODEL --from {KIND}:{f.path}")


def _refusals(f: _File) -> None:
    found = []
    if boolean(KIND, f.path, "compile.enabled", f.get("compile.enabled", False)):
        found.append(("compile.enabled = true", "set compile.enabled: false"))
    low = f.get("training.low_precision")
    if isinstance(low, dict) and low.get("enabled"):
        found.append(("training.low_precision.enabled = true", "turn low precision off"))
    swap = f.get("activation_swap", "none")
    if swap not in ("none", None):
        found.append((f"activation_swap = {swap}", "set activation_swap: none"))
    if found:
        raise f.error(", ".join(field for field, _ in found), "not priced yet",
                      " and ".join(fix for _, fix in found) + " in a copy")


def _replacements(f: _File) -> Tuple[List[str], Optional[str]]:
    """What ``plan_overrides``' ``replace_module`` entries install, and the cp algorithm a ``when: cp`` entry names."""
    entries = f.get("plan_overrides", [])
    f.read.discard("plan_overrides")  # each entry is read or ignored on its own
    if not isinstance(entries, list):
        raise f.error("plan_overrides", f"{entries!r} is not a list", "give a list of entries")
    installed: List[str] = []
    algo = None
    for i, entry in enumerate(entries):
        where = f"plan_overrides[{i}]"
        if not isinstance(entry, dict):
            raise f.error(where, f"{entry!r} is not a mapping", "give match and an action")
        if entry.get("when") == "cp":
            named = str(entry.get("inner_wrapper", "")).lower()
            algo = next((a for a in _CP_ALGOS if a in named), algo)
            f.read.add(where)
        if entry.get("replace_module") is None or entry.get("when") is not None:
            continue
        f.read.add(where)
        module_type = entry.get("module_type")
        if not isinstance(module_type, str):
            raise f.error(f"{where}.module_type", f"{module_type!r}: replace_module needs the replaced type",
                          "give the module_type's import path")
        factory = entry["replace_module"]
        target = factory.get("_target_") if isinstance(factory, dict) else factory
        what = next((name for suffix, name in _REPLACED if module_type.endswith(suffix)), None)
        if what is None or not str(target).startswith("hyper_parallel."):
            raise f.error(f"{where}.replace_module", f"{target!r} replacing {module_type} is not priced (ndcost's "
                          f"{RUNTIME} runtime prices HyperParallel's fused RMSNorm, attention and grouped experts)",
                          "remove the entry in a copy, or price it under a runtime profile of your own (--runtime)")
        installed.append(what)
    return list(dict.fromkeys(installed)), algo


def _data_parallel(f: _File, devices: Optional[int], tp: int, cp: int,
                   pp: int) -> Tuple[Dict[str, Any], List[str], int]:
    """dp, fsdp (and shard_mesh) from the world size and the FSDP shard group (runtime/distributed.py), with
    HyperParallel's data-parallel degree."""
    if devices is None:
        raise f.error("accelerator", "the world size comes from the launcher", "give --devices N "
                      "(from_config(..., devices=N))")
    if devices % (tp * cp * pp):
        raise f.error("accelerator", f"tp {tp} * cp {cp} * pp {pp} = {tp * cp * pp} does not divide the {devices} "
                      "devices", "give --devices a multiple of it")
    dp = devices // (tp * cp * pp)
    pool = dp * cp
    shard = integer(KIND, f.path, "fsdp_config.dp_shard_size", f.get("fsdp_config.dp_shard_size", 1))
    if pool % shard:
        raise f.error("fsdp_config.dp_shard_size", f"{shard} does not divide dp * cp = {dp} * {cp} = {pool}",
                      "give a divisor of it")
    if shard == 1:
        return {"dp": dp}, [], dp
    if shard % cp == 0 and shard > cp:
        return {"dp": pool // shard, "fsdp": shard // cp}, [], dp
    if dp % shard == 0:
        return {"dp": dp // shard, "fsdp": shard, "shard_mesh": "dp"}, [
            f"FSDP over {shard} of the dp * cp = {pool} ranks: priced as shard_mesh=dp, fsdp={shard} (the bytes a "
            "device holds; its gathers span other ranks)"], dp
    raise f.error("fsdp_config.dp_shard_size", f"{shard} with cp {cp} and {dp} data-parallel ranks has no ndcost "
                  "form", f"give a multiple of cp {cp} or a divisor of {dp}")


def read(path: str, *, devices: Optional[int], model: Any = None) -> TrainerConfig:
    """The strategy and runtime a HyperParallel train.yaml runs (see the module docstring)."""
    f = _load(path)
    _refusals(f)
    model = _model(f, model)
    tp, cp, ep, pp = (integer(KIND, f.path, f"accelerator.{k}", f.get(f"accelerator.{k}", 1))
                      for k in ("tp_size", "cp_size", "ep_size", "pp_size"))
    if pp > 1:
        raise f.error("accelerator.pp_size", f"{pp}: HyperParallel's pipeline schedule is not read yet",
                      "price it with --strategy beside --from, or set pp_size: 1 in a copy")
    fields, defaults, data_ranks = _data_parallel(f, devices, tp, cp, pp)
    fields.update(tp=tp, cp=cp, ep=ep)
    if ep > 1:
        defaults.append("no expert tensor parallelism (etp=1: the accelerator names none)")
        edp = f.get("fsdp_config.edp_shard_size")
        if edp is not None:
            defaults.append(f"fsdp_config.edp_shard_size {edp}: the routed experts are split as ndcost splits them "
                            "(the shard group re-cut by ep * etp), not checked against it")
    if "fsdp" in fields and not boolean(KIND, f.path, "fsdp_config.reshard_after_forward",
                                        f.get("fsdp_config.reshard_after_forward", True)):
        fields["reshard_after_forward"] = False
    if tp > 1:
        fields["sp"] = boolean(KIND, f.path, "accelerator.sequence_parallel", f.get("accelerator.sequence_parallel",
                                                                                      False))
        fields["vocab_parallel"] = boolean(KIND, f.path, "accelerator.loss_parallel",
                                           f.get("accelerator.loss_parallel", False))
    installed, algo = _replacements(f)
    algo = f.get("dataloader.get_batch.cp_algorithm") or algo
    if cp > 1:
        if algo is None:
            defaults.append("no CP algorithm named (dataloader.get_batch.cp_algorithm): priced as ring")
        elif algo not in _CP_ALGOS:
            raise f.error("dataloader.get_batch.cp_algorithm", f"{algo!r} is not priced",
                          f"give one of {', '.join(_CP_ALGOS)}")
        fields["cp_algo"] = algo or "ring"
    runtime = None
    if installed:
        runtime = RUNTIME
        beyond = [what for what in _RUNTIME_FUSES if what not in installed]
        defaults.append(f"plan_overrides replace_module installs HyperParallel's {', '.join(installed)}: runtime "
                        f"{RUNTIME}" + (f", which also fuses the {', '.join(beyond)}" if beyond else ""))
    micro = integer(KIND, f.path, "training.micro_batch_size", f.get("training.micro_batch_size", 1))
    global_batch = integer(KIND, f.path, "training.global_batch_size", f.get("training.global_batch_size", 8))
    if global_batch % (micro * data_ranks):
        raise f.error("training.global_batch_size", f"{global_batch} is not a multiple of micro_batch_size {micro} "
                      f"* {data_ranks} data-parallel ranks", "give a multiple")
    fields.update(micro_batch=micro, num_micro_batches=global_batch // (micro * data_ranks))
    seq = f.get("dataset.data_config.seq_length", f.get("dataset.data_transform.max_seq_len"))
    if seq is not None:
        fields["seq"] = integer(KIND, f.path, "dataset.data_config.seq_length", seq)
    mode = f.get("activation_checkpoint.mode", "off")
    recompute = {"off": "none", None: "none", False: "none", "full": "full", "selective": "selective"}.get(mode)
    if recompute is None:
        raise f.error("activation_checkpoint.mode", f"{mode!r} is not a mode", "give off, full or selective")
    fields["recompute"] = recompute
    if recompute != "none" and boolean(KIND, f.path, "activation_checkpoint.swap_inputs",
                                       f.get("activation_checkpoint.swap_inputs", False)):
        fields["offload_activations"] = True
    fields.update(_precision(f, defaults))
    optimizer = f.get("optimizer._target_", f.get("optimizer.type", "AdamW"))
    if not isinstance(optimizer, str):
        raise f.error("optimizer._target_", f"{optimizer!r} is not an optimizer's import path", "give one")
    name = optimizer.rsplit(".", 1)[-1]
    fields["optimizer"] = OPTIMIZERS.get(name, name.lower())
    try:
        strategy = Strategy.from_mapping(fields)
    except InvalidValue as exc:
        raise f.error("accelerator", str(exc), "fix the degrees in a copy") from None
    return TrainerConfig(kind=KIND, path=path, strategy=strategy, model=model, runtime=runtime, devices=devices,
                         global_batch=global_batch, read_fields=tuple(sorted(f.read)), ignored_fields=f.ignored(),
                         defaults=tuple(defaults))


def _precision(f: _File, defaults: List[str]) -> Dict[str, Any]:
    stored = f.get("model.torch_dtype")
    if stored is None:
        defaults.append("no model.torch_dtype: parameters in fp32 (PyTorch's default)")
        stored = "float32"
    out: Dict[str, Any] = {"param_dtype": dtype(KIND, f.path, "model.torch_dtype", stored)}
    if boolean(KIND, f.path, "mixed_precision.enabled", f.get("mixed_precision.enabled", False)):
        compute = dtype(KIND, f.path, "fsdp_config.mix_precision.param_dtype",
                        f.get("fsdp_config.mix_precision.param_dtype", "bfloat16"))
        if compute != out["param_dtype"]:
            out["compute_dtype"] = compute
    if boolean(KIND, f.path, "optimizer.fp32_main_params", f.get("optimizer.fp32_main_params", False)):
        out.update(master_dtype="fp32", optimizer_dtype="fp32")
    return out


@attrs.frozen
class HyperParallelFormat:
    name: str = KIND
    description: str = "HyperParallel trainer train.yaml (accelerator, fsdp_config, plan_overrides, ...): read"
    writes: bool = False
    recipe = MappingProxyType({})  # it writes nothing
    runtime = ""  # hf-npu where the file installs HyperParallel's fused modules, else --runtime's (it writes nothing)

    def read(self, path: str, *, devices: Optional[int], model: Any = None) -> TrainerConfig:
        return read(path, devices=devices, model=model)

    def write(self, strategy: Any, *, model: Any, global_batch: Optional[int]) -> str:
        raise InvalidValue("HyperParallel's train.yaml is read, not written; write torchtitan's (--emit torchtitan)")


@hookimpl
def ndcost_register(register):
    register(f"trainer/{KIND}", HyperParallelFormat())
