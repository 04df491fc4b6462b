"""``trainer/megatron``: a Megatron-LM launch script, command line or args file, read and written.

The schema is Megatron-LM's megatron/training/arguments.py (NVIDIA/Megatron-LM
d98e8a6); the semantics kept are its own:

- the data-parallel size is ``world / (tp * pp * cp)`` (arguments.py,
  ``args.data_parallel_size``), the world size coming from the launcher:
  ``--devices N``;
- the distributed optimizer shards the fp32 main parameters and the optimizer
  states over the data-parallel group with context parallelism
  (megatron/core/optimizer/distrib_optimizer.py), ``zero=1`` over dp * cp
  (``shard_mesh=dp_cp``), gradients kept whole: ``6 + 12 / dp`` bytes a
  parameter, as megatron/training/theoretical_memory_usage.py counts;
- ``--bf16`` / ``--fp16`` keep bf16/fp16 parameters, fp32 main gradients
  (bf16 with ``--grad-reduce-in-bf16``), an fp32 main copy of the parameters
  and fp32 Adam states (megatron/core/optimizer/optimizer.py,
  ``Float16OptimizerWithFloat16Params``);
- sequence parallelism is turned off without tensor parallelism, the expert
  tensor-parallel size defaults to tp, the vocabulary is padded to a multiple
  of ``make_vocab_size_divisible_by * tp`` and always split over tp;
- ``--recompute-granularity selective`` recomputes the core attention only
  (``recompute=core_attention``); ``full`` with ``--recompute-method block``
  recomputes a rank's first ``--recompute-num-layers`` layers;
- ``--overlap-moe-expert-parallel-comm`` runs the combined 1F1B schedule
  (``schedule=interleaved-a2a-overlap``, or ``1f1b-a2a-overlap`` without
  pipelining), refused where Megatron-LM's TransformerConfig asserts.

The model shape flags become a Transformers config mapping (llama, qwen2,
qwen3, mixtral, qwen3_moe, glm4_moe (shared experts) or gpt2, as the shape says) where the vocabulary is
known (``--vocab-size``); a tokenizer file is not read, so without
``--vocab-size`` the model must be given.
"""
from __future__ import annotations

import math
import re
from types import MappingProxyType
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.plugins.trainers import _shell
from ndcost.trainers import TrainerConfig, field_error
from ndcost.values import Strategy

KIND = "megatron"

# Flags read, by the type of their value (Megatron-LM megatron/training/arguments.py).
INT_FLAGS = (
    "tensor-model-parallel-size", "pipeline-model-parallel-size", "num-layers-per-virtual-pipeline-stage",
    "num-virtual-stages-per-pipeline-rank", "context-parallel-size", "expert-model-parallel-size",
    "expert-tensor-parallel-size", "recompute-num-layers", "micro-batch-size", "global-batch-size", "seq-length",
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "num-query-groups", "kv-channels",
    "vocab-size", "num-experts", "moe-router-topk", "moe-ffn-hidden-size", "make-vocab-size-divisible-by",
    "max-position-embeddings", "moe-layer-freq", "moe-shared-expert-intermediate-size",
    "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "num-distributed-optimizer-instances")
FLOAT_FLAGS = ("attention-dropout", "hidden-dropout", "rotary-base", "norm-epsilon")
STR_FLAGS = ("recompute-granularity", "recompute-method", "normalization", "position-embedding-type", "optimizer",
             "tokenizer-type", "fp8-format", "fp8-recipe", "pipeline-model-parallel-layout",
             "moe-token-dispatcher-type", "moe-flex-dispatcher-backend", "data-parallel-sharding-strategy",
             "outer-dp-sharding-strategy")
LIST_FLAGS = ("cp-comm-type",)
BOOL_FLAGS = (
    "sequence-parallel", "use-distributed-optimizer", "bf16", "fp16", "swiglu", "group-query-attention",
    "untie-embeddings-and-output-weights", "disable-bias-linear", "add-qkv-bias", "qk-layernorm",
    "grad-reduce-in-bf16", "optimizer-cpu-offload", "recompute-activations", "account-for-embedding-in-pipeline-split",
    "account-for-loss-in-pipeline-split", "moe-enable-deepep", "use-megatron-fsdp", "overlap-moe-expert-parallel-comm")

# Flags with a bearing on the cost that are not priced or not read yet: refused by name, with the fix.
REFUSED: Mapping[str, str] = {
    "fp8-param-gather": "fp8 primary weights (Transformer Engine's fp8 parameters, gathered in fp8 by the distributed "
                        "optimizer) are not priced; remove --fp8-param-gather in a copy to price bf16 weights cast "
                        "to fp8",
    "fp4-format": "fp4 training is not priced yet; remove --fp4-format in a copy to price it in bf16",
    "moe-shared-expert-gate": "a gated shared expert has no Transformers model type ndcost maps; give MODEL and "
                              "remove the flag in a copy",
    "use-torch-fsdp2": "torch FSDP2 under Megatron-LM is not read yet; price it as fsdp=N with --strategy on a "
                       "copy without it",
    "multi-latent-attention": "multi-latent attention shapes are not read yet; give MODEL and remove the flag "
                              "in a copy",
    "mtp-num-layers": "multi-token prediction layers are not read yet; give MODEL and remove the flag in a copy",
    "hybrid-override-pattern": "hybrid (Mamba) stacks are not read yet; give MODEL and remove the flag in a copy",
    "distribute-saved-activations": "checkpoints split over tp are not priced yet; remove the flag in a copy",
    "use-precision-aware-optimizer": "the precision-aware optimizer's dtypes are not read yet; give them as "
                                     "--strategy dtypes on a copy without it",
    "main-grads-dtype": "not read yet; give grad_dtype with --strategy on a copy without it",
    "main-params-dtype": "not read yet; give master_dtype with --strategy on a copy without it",
    "exp-avg-dtype": "not read yet; give optimizer_dtype with --strategy on a copy without it",
    "exp-avg-sq-dtype": "not read yet; give optimizer_dtype with --strategy on a copy without it",
    "optimizer-offload-fraction": "a partial optimizer offload is not priced; remove the flag in a copy "
                                  "(all of it offloaded)",
    "tp-comm-overlap": "overlapped tensor-parallel communication (userbuffers) is not priced yet; remove the "
                       "flag in a copy to price it without the overlap",
    "cpu-offloading": "activation offloading under Megatron-LM is not read yet; remove the flag in a copy and "
                      "give offload_activations=true with --strategy",
}

# Flags with no bearing on what ndcost prices: logging, data, paths, learning rate, initialisation, kernels'
# numerics. A flag neither read, refused nor listed here is reported as unrecognized.
IGNORED_PREFIXES = (
    "lr", "min-lr", "decoupled-", "weight-decay", "adam-", "sgd-", "clip-grad", "init-method", "train-iters",
    "train-samples", "eval-", "log-", "save", "load", "no-load-", "no-save-", "tensorboard", "wandb-", "profile",
    "exit-", "data-", "split", "vocab-file", "merge-file", "tokenizer-model", "tiktoken-", "num-workers", "seed",
    "ckpt-", "distributed-timeout", "timing-log", "mock-data", "no-mmap-bin-files", "no-create-attention-mask",
    "moe-aux-loss", "moe-router-load-balancing", "moe-z-loss", "use-mcore-models", "rotary-percent",
    "apply-layernorm-1p", "no-position-embedding", "calculate-per-token-loss", "manual-gc", "use-checkpoint-",
    "dist-ckpt", "auto-detect-ckpt-format",
    "step-batch-size-schedule", "loss-scale", "initial-loss-scale", "min-loss-scale", "hysteresis",
    "bias-", "no-bias-", "spec", "rerun-", "check-for-nan", "accumulate-allreduce-grads-in-fp32",
    "fp8-amax-", "fp8-margin")  # delayed scaling's settings: refused with --fp8-recipe delayed, unused otherwise
# Values of a kernel choice the runtime profile does not run: --transformer-impl local builds Megatron-LM's own
# layers (megatron/core/models/gpt/gpt_layer_specs.py get_gpt_layer_local_spec: its softmax, norms and linears, which
# keep and launch what Transformer Engine's do not)
REFUSED_VALUES: Mapping[Tuple[str, str], str] = {
    ("transformer-impl", "local"): "Megatron-LM's own layers are not priced (the runtime megatron-te-cuda prices "
                                   "Transformer Engine's, Megatron-LM's default); remove the flag in a copy to price "
                                   "--transformer-impl transformer_engine",
}
# Kernel and overlap choices: they bear on the cost, but ndcost prices them from the runtime profile and the
# time model, not from the flag; reported as such.
KERNEL_PREFIXES = (
    "overlap-grad-reduce", "overlap-param-gather", "moe-grouped-gemm", "delay-wgrad-compute",
    "attention-backend", "cross-entropy-loss-fusion", "empty-unused-memory-level", "masked-softmax-fusion",
    "no-masked-softmax-fusion", "attention-softmax-in-fp32", "use-flash-attn", "transformer-impl")

# The runtime profile a Megatron-LM run is priced under (--transformer-impl transformer_engine, its default;
# specs/runtimes/megatron-te-cuda.yaml): Transformer Engine's attention, cuDNN's fused kernel from Hopper on (with
# GPT-OSS's sinks, softmax_type="learnable"), its fused pointwise kernels, fla's linear attention kernels.
RUNTIME = "megatron-te-cuda"
PROGRAM_FLAGS = ("--num-layers", "--micro-batch-size", "--tensor-model-parallel-size", "--hidden-size",
                 "--pipeline-model-parallel-size", "--global-batch-size")
# --cp-comm-type as (cp_algo, cp_rotate): p2p and a2a+p2p pass K/V blocks a step (Transformer Engine's
# AttnFuncWithCPAndKVP2P, transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py; under
# a2a+p2p between its all-to-all groups), allgather gathers them (AttnFuncWithCPAndKVAllGather), a2a is Ulysses
# --data-parallel-sharding-strategy under --use-megatron-fsdp (megatron/core/distributed/fsdp; default no_shard):
# what it shards over the data-parallel ranks with context parallelism, as ndcost's ZeRO stages and FSDP
MEGATRON_FSDP = {"no_shard": {}, "optim": {"zero": 1}, "optim_grads": {"zero": 2},
                 "optim_grads_params": {"zero": 0, "fsdp": None}}
CP_COMM_TYPES = {"p2p": ("ring", "p2p"), "allgather": ("ring", "allgather"), "a2a": ("ulysses", "allgather"),
                 "a2a+p2p": ("hybrid", "p2p")}


def _is_program(args: List[str]) -> bool:
    """A Megatron-LM training command: ``... something.py --flags`` with one of the flags it always takes."""
    scripts = [k for k, a in enumerate(args) if a.endswith(".py") and " " not in a]
    return bool(scripts) and any(a.split("=", 1)[0] in PROGRAM_FLAGS for a in args[scripts[0] + 1:])


class MegatronFormat:
    name = KIND
    description = "Megatron-LM: a launch script (bash arrays, variables, if), a command line or an args file"
    writes = True
    # --bf16: bf16 parameters, fp32 main gradients, fp32 main parameters and optimizer states
    runtime = RUNTIME
    recipe = MappingProxyType({"param_dtype": "bf16", "grad_dtype": "fp32", "optimizer_dtype": "fp32",
                               "master_dtype": "fp32", "loss_engine": "megatron", "ddp_engine": "megatron"})

    # --- reading ------------------------------------------------------------------------------------------
    def read(self, path: str, *, devices: Optional[int]) -> TrainerConfig:
        from ndcost.specio import read_text

        text = read_text(path, "Megatron-LM configuration")
        args, launcher = self._arguments(path, text)
        flags, order = _flags(args)
        read, ignored, refused = [], list(launcher), []
        for flag in order:
            name = flag[2:]
            if name in REFUSED or (name, " ".join(flags[flag])) in REFUSED_VALUES:
                refused.append(flag)
            elif _known(name):
                read.append(flag)
            elif name.startswith(KERNEL_PREFIXES):
                ignored.append(f"{flag} (a kernel or overlap choice: priced by the runtime profile and the time "
                               f"model, not by the flag)")
            elif name.startswith(IGNORED_PREFIXES):
                ignored.append(flag)
            else:
                ignored.append(f"{flag} (unrecognized; no bearing assumed)")
        if refused:
            first = refused[0]
            why = REFUSED.get(first[2:]) or REFUSED_VALUES[first[2:], " ".join(flags[first])]
            raise field_error(KIND, path, first, "not priced" if "not priced" in why else "not read", why)
        for flag in read:
            for word in flags[flag]:
                if _shell.unknown_names(word):
                    raise field_error(KIND, path, flag, f"its value is {', '.join(_shell.unknown_names(word))}, "
                                      f"which the script does not set", "give the value in a copy (the variable "
                                      "set, or the number written)")
        if devices is None:
            raise field_error(KIND, path, "--devices", "a Megatron-LM launch takes its world size from the "
                              "launcher, which ndcost does not run", "give the world size: --devices N "
                              "(from_config(..., devices=N))")
        values = _Values(path, flags)
        strategy, defaults, global_batch = _strategy(values, devices)
        model, model_notes = _model(values, strategy.tp)
        defaults.append(f"runtime {RUNTIME}: Megatron-LM runs Transformer Engine's fused kernels (its attention, "
                        f"cuDNN's from Hopper on, sinks included; fused norms, rotary, activation and residual "
                        f"adds) and flash-linear-attention's gated delta rule, not Transformers' eager ones")
        return TrainerConfig(kind=KIND, path=path, strategy=strategy, model=model, runtime=RUNTIME, devices=devices,
                             global_batch=global_batch, read_fields=tuple(read), ignored_fields=tuple(ignored),
                             defaults=tuple(defaults + model_notes))

    def _arguments(self, path: str, text: str) -> Tuple[List[str], List[str]]:
        """The training program's words and the launcher's flags (ignored), from an args file or a script."""
        try:
            plain = _shell.split_words(text)
        except _shell.ShellError as exc:
            raise field_error(KIND, path, "file", f"not a Megatron-LM command line or launch script ({exc})",
                              "give a bash launch script, a command line or an args file of --flags") from None
        if plain and plain[0].startswith("--"):  # an args file: the program's flags only
            return plain, []
        try:
            worlds = [w for w in _shell.program_arguments(text, _is_program) if w.commands]
        except _shell.ShellError as exc:
            raise field_error(KIND, path, str(exc).split(":", 1)[0], str(exc).split(":", 1)[-1].strip(),
                              "write the command the script runs (its expanded flags) into a file and read "
                              "that") from None
        if not worlds:
            raise field_error(KIND, path, "file", "no Megatron-LM training command found (a line running "
                              "pretrain_gpt.py or another .py program with --num-layers, --micro-batch-size or "
                              "a parallel size)", "give the launch script, the command line or an args file")
        programs = []
        for world in worlds:
            commands = {tuple(c) for c, _ in world.commands}
            if len(commands) > 1:
                lines = ", ".join(str(line) for _, line in world.commands)
                raise field_error(KIND, path, "file", f"runs more than one training command (lines {lines})",
                                  "keep the one to price in a copy")
            programs.append(world.commands[0][0])
        priced = {_cost_bearing(p) for p in programs}
        if len(priced) > 1:
            tests = sorted({t for w in worlds for t in w.undecided})
            raise field_error(KIND, path, "; ".join(tests), "the flags the script passes depend on these tests, "
                              "which ndcost cannot decide (a file test, or a variable the script does not set)",
                              "give the values the tests read in a copy, or the command line itself")
        program = programs[0]
        start = next(k for k, a in enumerate(program) if a.endswith(".py") and " " not in a)
        launched = [a.split("=", 1)[0] for a in program[1:start] if a.startswith("-")]
        launcher = [f"{program[0]} {' '.join(launched)} (the launcher's; the world size is --devices)"]
        return program[start + 1:], launcher if launched else []

    # --- writing ------------------------------------------------------------------------------------------
    def write(self, strategy: Strategy, *, model: Any = None, global_batch: Optional[int] = None) -> str:
        flags = _strategy_flags(strategy, global_batch)
        if model is not None:
            flags += _model_flags(model, strategy.tp)
        elif strategy.pp_layers is not None:  # the split is read back against the layer count
            flags.append(f"--num-layers {sum(strategy.pp_layers)}")
        if strategy.loss_engine != "megatron":  # after the rest: a strategy's other refusals say more
            raise _refuse_write("loss_engine", strategy.loss_engine, "Megatron-LM computes the loss with its own "
                                "vocab_parallel_cross_entropy (in place): loss_engine=megatron")
        lines = [f"    {flag} \\" for flag in flags]
        devices = strategy.devices
        per_node = min(devices, 8) if devices % min(devices, 8) == 0 else devices
        header = ["#!/bin/bash", f"# Written by ndcost: {strategy}",
                  f"# Read it back with: ndcost estimate --from megatron:THIS_FILE --devices {devices}",
                  f"torchrun --nproc_per_node {per_node} --nnodes {devices // per_node} pretrain_gpt.py \\"]
        if lines:
            lines[-1] = lines[-1][:-2]
        return "\n".join(header + lines) + "\n"


def _known(name: str) -> bool:
    return name in INT_FLAGS or name in FLOAT_FLAGS or name in STR_FLAGS or name in LIST_FLAGS or \
        name in BOOL_FLAGS


def _flags(args: Sequence[str]) -> Tuple[Dict[str, List[str]], List[str]]:
    """Each ``--flag``'s value words (argparse: the last occurrence wins) and the flags in order, once each."""
    flags: Dict[str, List[str]] = {}
    order: List[str] = []
    current: Optional[str] = None
    for word in args:
        if word.startswith("--") and len(word) > 2:
            name, eq, value = word.partition("=")
            current = name
            flags[name] = [value] if eq else []
            if name not in order:
                order.append(name)
        elif current is not None:
            flags[current].append(word)
    return flags, order


def _cost_bearing(program: List[str]) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    """The flags of *program* that bear on the cost (read or refused), to compare a script's undecided runs."""
    flags, _ = _flags(program)
    return tuple(sorted((k, tuple(v)) for k, v in flags.items() if _known(k[2:]) or k[2:] in REFUSED
                        or any(k[2:] == name for name, _ in REFUSED_VALUES)))


class _Values:
    """The read flags' values, converted and checked, each refusal naming the flag."""

    def __init__(self, path: str, flags: Mapping[str, List[str]]):
        self.path = path
        self.flags = flags

    def present(self, name: str) -> bool:
        return f"--{name}" in self.flags

    def _words(self, name: str) -> List[str]:
        return self.flags[f"--{name}"]  # placeholders (values the script does not set) were refused on reading

    def one(self, name: str) -> Optional[str]:
        if not self.present(name):
            return None
        words = self._words(name)
        if len(words) != 1:
            raise field_error(KIND, self.path, f"--{name}", f"expected one value, got {len(words)}: "
                              f"{' '.join(words) or 'none'}", f"give --{name} VALUE")
        return words[0]

    def integer(self, name: str, default: Optional[int] = None, minimum: int = 1) -> Optional[int]:
        text = self.one(name)
        if text is None:
            return default
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise field_error(KIND, self.path, f"--{name}", f"expected an integer >= {minimum}, got {text!r}",
                              f"give --{name} N")
        return value

    def number(self, name: str, default: float) -> float:
        text = self.one(name)
        if text is None:
            return default
        try:
            value = float(text)
        except ValueError:
            raise field_error(KIND, self.path, f"--{name}", f"expected a number, got {text!r}",
                              f"give --{name} X") from None
        if not math.isfinite(value) or value < 0:
            raise field_error(KIND, self.path, f"--{name}", f"expected a finite number >= 0, got {text!r}",
                              f"give --{name} X")
        return value

    def text(self, name: str, default: Optional[str] = None) -> Optional[str]:
        text = self.one(name)
        return default if text is None else text

    def switch(self, name: str) -> bool:
        if self.present(name):
            words = self._words(name)
            if words:
                raise field_error(KIND, self.path, f"--{name}", f"a switch takes no value, got "
                                  f"{' '.join(words)}", f"write --{name} alone")
            return True
        return False

    def refuse(self, flag: str, problem: str, fix: str) -> InvalidValue:
        return field_error(KIND, self.path, flag, problem, fix)


def _ep_dispatcher(v: _Values, ep: int, defaults: List[str]) -> str:
    """--moe-token-dispatcher-type (arguments.py): flex with its deepep or hybridep backend (HybridEP: DeepEP's
    hierarchical dispatch, in Megatron-LM's examples) or --moe-enable-deepep is deepep; alltoall is alltoall;
    allgather (its default) is priced as alltoall's traffic, and said so."""
    kind = v.text("moe-token-dispatcher-type", "allgather")
    backend = v.text("moe-flex-dispatcher-backend", "deepep")
    if v.switch("moe-enable-deepep") or kind == "flex":
        if backend not in ("deepep", "hybridep"):
            raise v.refuse("--moe-flex-dispatcher-backend", f"{backend!r} is not priced",
                           "give deepep or hybridep (ep_dispatcher=deepep), or --moe-token-dispatcher-type alltoall")
        return "deepep"
    if kind not in ("alltoall", "allgather"):
        raise v.refuse("--moe-token-dispatcher-type", f"{kind!r} is not one of Megatron-LM's dispatchers "
                       "(allgather, alltoall, flex)", "give one of them")
    if kind == "allgather" and ep > 1:
        defaults.append("--moe-token-dispatcher-type allgather (Megatron-LM's default) is priced as alltoall's "
                        "traffic: ep_dispatcher=alltoall")
    return "alltoall"


def _megatron_fsdp(v: _Values, dp: int, cp: int, defaults: List[str]) -> Dict[str, Any]:
    """The fields of ``--use-megatron-fsdp``'s ``--data-parallel-sharding-strategy``: ``optim`` and ``optim_grads``
    are ZeRO 1 and 2, ``optim_grads_params`` FSDP over the data-parallel ranks (with the cp ranks where cp > 1:
    ``shard_mesh=fsdp_cp``), ``no_shard`` (the default) what the distributed optimizer alone gives."""
    name = v.text("data-parallel-sharding-strategy", "no_shard")
    if name not in MEGATRON_FSDP:
        raise v.refuse("--data-parallel-sharding-strategy", f"{name!r} is not one of Megatron-FSDP's "
                       f"({', '.join(MEGATRON_FSDP)})", "give one of them")
    outer = v.text("outer-dp-sharding-strategy", "no_shard")
    if outer != "no_shard":
        raise v.refuse("--outer-dp-sharding-strategy", f"{outer!r}: sharding across the outer data-parallel "
                       "groups (HSDP) is not read yet", "give no_shard in a copy")
    instances = v.integer("num-distributed-optimizer-instances", 1)
    if instances != 1:
        raise v.refuse("--num-distributed-optimizer-instances", f"{instances}: replicated optimizer shards (HSDP) "
                       "are not read yet", "give 1 in a copy")
    fields = dict(MEGATRON_FSDP[name])
    if not v.present("data-parallel-sharding-strategy"):
        defaults.append("--data-parallel-sharding-strategy no_shard (Megatron-FSDP's default): nothing sharded "
                        "beyond the distributed optimizer")
    if "fsdp" in fields:
        fields.update(dp=1, fsdp=dp, fsdp_engine="megatron", **({"shard_mesh": "fsdp_cp"} if cp > 1 else {}))
        defaults.append(f"Megatron-FSDP optim_grads_params shards the parameters, gradients and optimizer states "
                        f"over the {dp * cp} data-parallel ranks with context parallelism: fsdp={dp}"
                        + (", shard_mesh=fsdp_cp" if cp > 1 else "") + ", fsdp_engine=megatron")
    return fields


def _strategy(v: _Values, devices: int) -> Tuple[Strategy, List[str], int]:
    defaults: List[str] = []
    tp = v.integer("tensor-model-parallel-size", 1)
    pp = v.integer("pipeline-model-parallel-size", 1)
    cp = v.integer("context-parallel-size", 1)
    assert tp is not None and pp is not None and cp is not None
    model_ranks = tp * pp * cp
    if devices % model_ranks:
        raise v.refuse("--tensor-model-parallel-size * --pipeline-model-parallel-size * --context-parallel-size",
                       f"{tp} * {pp} * {cp} = {model_ranks} does not divide the world size {devices} (--devices)",
                       "give a world size that is a multiple of it, or change the degrees in a copy")
    dp = devices // model_ranks
    fields: Dict[str, Any] = {"tp": tp, "pp": pp, "cp": cp, "dp": dp}
    ep = v.integer("expert-model-parallel-size", 1)
    etp = v.integer("expert-tensor-parallel-size")
    if etp is None:  # arguments.py: the expert tensor-parallel size defaults to tp; a dense model has none
        etp = tp if v.present("num-experts") or ep != 1 else 1
        if etp > 1:
            defaults.append(f"--expert-tensor-parallel-size = --tensor-model-parallel-size = {tp}")
    fields.update(ep=ep, etp=etp)
    fields["ep_dispatcher"] = _ep_dispatcher(v, ep, defaults)

    vpp = 1
    if v.present("num-layers-per-virtual-pipeline-stage") and v.present("num-virtual-stages-per-pipeline-rank"):
        raise v.refuse("--num-layers-per-virtual-pipeline-stage", "given with --num-virtual-stages-per-pipeline-"
                       "rank (Megatron-LM takes one of them)", "keep one in a copy")
    per_chunk = v.integer("num-layers-per-virtual-pipeline-stage")
    if per_chunk is not None:
        layers = v.integer("num-layers")
        if layers is None or layers % pp or (layers // pp) % per_chunk:
            raise v.refuse("--num-layers-per-virtual-pipeline-stage", f"{per_chunk} layers a chunk does not "
                           f"divide --num-layers {layers} over {pp} pipeline stages", "give --num-layers a "
                           "multiple of pp * the layers a chunk")
        vpp = layers // pp // per_chunk
    elif v.present("num-virtual-stages-per-pipeline-rank"):
        vpp = v.integer("num-virtual-stages-per-pipeline-rank", 1) or 1
    split: Optional[Tuple[int, ...]]
    if v.present("pipeline-model-parallel-layout"):
        vpp, split = _layout_split(v, pp, vpp)
    else:
        split = _pipeline_split(v, pp, vpp)
    if vpp > 1:
        fields.update(vpp=vpp, schedule="interleaved")
    if split is not None:
        fields["pp_layers"] = split

    sp = v.switch("sequence-parallel")
    if sp and tp == 1:
        defaults.append("--sequence-parallel is turned off without tensor parallelism (tp = 1)")
    fields["sp"] = sp and tp > 1
    sharded = _megatron_fsdp(v, dp, cp, defaults) if v.switch("use-megatron-fsdp") else {}
    fields.update(sharded)
    if v.switch("use-distributed-optimizer") and not sharded:
        fields["zero"] = 1
        defaults.append("the distributed optimizer shards the fp32 main parameters and the optimizer states "
                        "over the data-parallel ranks with context parallelism (dp * cp): zero=1, "
                        "shard_mesh=dp_cp")
    types = v.flags.get("--cp-comm-type")
    if types is not None:
        names = {w for w in v._words("cp-comm-type")}
        if len(names) != 1:
            raise v.refuse("--cp-comm-type", f"a type a layer ({' '.join(types) or 'none'}) is not priced",
                           "give one type for every layer in a copy")
        name = names.pop()
        if name not in CP_COMM_TYPES:
            raise v.refuse("--cp-comm-type", f"{name!r} is not one of Megatron-LM's types "
                           f"({', '.join(CP_COMM_TYPES)})", "give one of them")
        fields["cp_algo"], fields["cp_rotate"] = CP_COMM_TYPES[name]
    elif cp > 1:
        fields["cp_rotate"] = "p2p"
        defaults.append("--cp-comm-type defaults to p2p (megatron/training/arguments.py): cp_algo=ring, "
                        "cp_rotate=p2p")

    fields.update(_recompute(v))
    if v.switch("overlap-moe-expert-parallel-comm"):
        fields["schedule"] = _a2a_overlap(v, fields)
    micro = v.integer("micro-batch-size")
    if micro is None:
        raise v.refuse("--micro-batch-size", "missing (Megatron-LM requires it)", "give --micro-batch-size N")
    global_batch = v.integer("global-batch-size", micro * dp)
    assert global_batch is not None
    if not v.present("global-batch-size"):
        defaults.append(f"--global-batch-size = --micro-batch-size * data-parallel size = {global_batch}")
    if global_batch % (micro * dp):
        raise v.refuse("--global-batch-size", f"{global_batch} is not a multiple of --micro-batch-size {micro} "
                       f"times the data-parallel size {dp} (= --devices {devices} / (tp {tp} * pp {pp} * cp {cp}))",
                       "give a global batch that is, or another --devices")
    fields.update(micro_batch=micro, num_micro_batches=global_batch // (micro * dp))
    seq = v.integer("seq-length")
    if seq is not None:
        fields["seq"] = seq
    fields["vocab_parallel"] = tp > 1
    if tp > 1:
        defaults.append("Megatron-LM splits the vocabulary over tp: vocab_parallel=true")
    fields["loss_engine"] = "megatron"
    defaults.append("Megatron-LM's loss is its vocab_parallel_cross_entropy, in place at any tp: loss_engine=megatron")
    fields["ddp_engine"] = "megatron"  # its DDP's contiguous grad buffer (no effect under FSDP or one replica)
    fields.update(_precision(v, defaults))
    fields.update(_float8(v, defaults))
    optimizer = v.text("optimizer", "adam")
    if optimizer not in ("adam", "sgd"):
        raise v.refuse("--optimizer", f"{optimizer!r} is not priced (adam and sgd are)", "price adam: set "
                       "--optimizer adam in a copy")
    fields["optimizer"] = "adamw" if optimizer == "adam" else "sgd"
    if not v.present("optimizer"):
        defaults.append("--optimizer adam (decoupled weight decay: adamw)")
    if v.switch("optimizer-cpu-offload"):
        fields["offload_optimizer"] = True
    try:
        strategy = Strategy.from_mapping(fields)
    except InvalidValue as exc:  # a Strategy rule the flags break (ep * etp not dividing the ranks)
        raise v.refuse("the parallel sizes", str(exc), "change the degrees in a copy") from None
    return strategy, defaults, global_batch


def _layout_split(v: _Values, pp: int, vpp: int) -> Tuple[int, Tuple[int, ...]]:
    """(vpp, pp_layers) of ``--pipeline-model-parallel-layout``, as Megatron-LM parses and checks it.

    megatron/core/transformer/pipeline_parallel_layer_layout.py (NVIDIA/Megatron-LM d98e8a64dd):
    ``parse_str_to_list`` (commas dropped, ``(...)*n`` then ``x*n`` unrolled, stages split at ``|``: ``E``
    the embedding, ``t`` a decoder layer, ``m`` an MTP layer, ``L`` the loss), the stages in virtual-stage
    order (``vpp = stages / pp``), and ``validate_layer_layout`` (the embedding first, the loss last, once each).
    """
    flag = "--pipeline-model-parallel-layout"
    text = (v.text("pipeline-model-parallel-layout") or "").replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda m: m.group(1) * int(m.group(2)), text)
    stages = text.split("|")
    odd = sorted(set(text) - set("ELtm|"))
    if odd:
        raise v.refuse(flag, f"layer character(s) {', '.join(map(repr, odd))} are not Megatron-LM's (E, L, t, m)",
                       "give a layout such as 'Et*3|(tt|)*29L'")
    if len(stages) % pp:
        raise v.refuse(flag, f"{len(stages)} stages do not divide over --pipeline-model-parallel-size {pp}",
                       "give pp times the virtual stages a rank")
    if (vpp > 1 or v.present("num-virtual-stages-per-pipeline-rank")) and len(stages) != pp * vpp:
        raise v.refuse(flag, f"{len(stages)} stages, but the virtual stages a rank say {pp * vpp}",
                       "keep the layout alone in a copy")
    for flag_name in ("decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
                      "account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split"):
        if v.present(flag_name):
            raise v.refuse(flag, f"given with --{flag_name}", "keep one way of splitting in a copy")
    if not (text.startswith("E") and text.endswith("L") and text.count("E") == text.count("L") == 1):
        raise v.refuse(flag, "Megatron-LM takes the embedding (E) first and the loss (L) last, once each",
                       "give a layout such as 'Et*3|(tt|)*29L'")
    if "m" in text:
        raise v.refuse(flag, "multi-token prediction layers (m) are not read yet", "give MODEL and a layout "
                       "without them in a copy")
    split = tuple(stage.count("t") for stage in stages)
    layers = v.integer("num-layers")
    if layers is not None and sum(split) != layers:
        raise v.refuse(flag, f"places {sum(split)} decoder layers where --num-layers is {layers}",
                       "give every layer once")
    if 0 in split:
        raise v.refuse(flag, f"a stage holds no decoder layer ({'/'.join(map(str, split))}): a standalone "
                       "embedding or loss stage ndcost does not price", "give every stage a layer")
    return len(stages) // pp, split


def _pipeline_split(v: _Values, pp: int, vpp: int) -> Optional[Tuple[int, ...]]:
    """``pp_layers`` as Megatron-LM builds an uneven pipeline, or None for an even one.

    megatron/core/transformer/transformer_block.py ``get_num_layers_to_build`` (NVIDIA/Megatron-LM d98e8a64dd):
    ``--decoder-first/last-pipeline-num-layers`` give the first and last ranks theirs and the other ranks share
    the rest evenly; ``--account-for-embedding/loss-in-pipeline-split`` count the embedding and the loss a layer
    each, split evenly, the first chunk and the last one layer fewer. A rank's layers split evenly over its
    ``vpp`` chunks, chunk ``c`` of rank ``r`` being virtual stage ``c * pp + r``.
    """
    first, last = v.integer("decoder-first-pipeline-num-layers"), v.integer("decoder-last-pipeline-num-layers")
    embedding = v.switch("account-for-embedding-in-pipeline-split")
    loss = v.switch("account-for-loss-in-pipeline-split")
    flag = next((f"--{name}" for name, given in (("decoder-first-pipeline-num-layers", first is not None),
                                                  ("decoder-last-pipeline-num-layers", last is not None),
                                                  ("account-for-embedding-in-pipeline-split", embedding),
                                                  ("account-for-loss-in-pipeline-split", loss)) if given), None)
    if flag is None:
        return None
    layers = v.integer("num-layers")
    if layers is None:
        raise v.refuse(flag, "an uneven pipeline split needs the layer count", "give --num-layers")
    if pp == 1:
        raise v.refuse(flag, "splits a pipeline, and --pipeline-model-parallel-size is 1", "remove it in a copy")
    if (first is not None or last is not None) and (embedding or loss):
        raise v.refuse(flag, "given with --account-for-embedding/loss-in-pipeline-split, which Megatron-LM does "
                       "not take together", "keep one way of splitting in a copy")
    if first is not None or last is not None:
        middle = layers - (first or 0) - (last or 0)
        stages = pp - (first is not None) - (last is not None)
        if middle < 0 or (middle % stages if stages else middle):
            raise v.refuse(flag, f"leaves {middle} of the {layers} layers to {stages} middle stages, which "
                           "Megatron-LM asserts divide evenly", "give first and last counts that leave a multiple")
        ranks = [middle // stages if stages else 0] * pp
        ranks[0], ranks[-1] = first if first is not None else ranks[0], last if last is not None else ranks[-1]
    else:
        total = layers + embedding + loss
        if total % pp:
            raise v.refuse(flag, f"{layers} layers with the embedding and loss counted ({total}) do not divide "
                           f"over {pp} stages", "give a pipeline size that divides them")
        ranks = [total // pp] * pp
    if any(r % vpp for r in ranks):
        raise v.refuse(flag, f"the ranks' layers {'/'.join(map(str, ranks))} do not split evenly over {vpp} "
                       "virtual stages a rank", "give counts that divide by the virtual stages")
    chunks = [r // vpp for _ in range(vpp) for r in ranks]
    chunks[0] -= embedding
    chunks[-1] -= loss
    if min(chunks) < 1:
        raise v.refuse(flag, f"leaves a pipeline stage without a layer ({'/'.join(map(str, chunks))}), a "
                       "standalone embedding or loss stage ndcost does not price", "give every stage a layer")
    return tuple(chunks)


def _a2a_overlap(v: _Values, fields: Mapping[str, Any]) -> str:
    """--overlap-moe-expert-parallel-comm: the combined 1F1B schedule (plugins/schedules.py), under the conditions
    TransformerConfig.__post_init__ asserts (megatron/core/transformer/transformer_config.py)."""
    flag = "--overlap-moe-expert-parallel-comm"
    if fields["ep"] < 2:
        raise v.refuse(flag, "needs expert parallelism (Megatron-LM asserts --expert-model-parallel-size > 1)",
                       "give --expert-model-parallel-size > 1 or remove the flag in a copy")
    if v.text("moe-token-dispatcher-type", "allgather") not in ("alltoall", "flex"):
        raise v.refuse(flag, "needs the alltoall or flex token dispatcher (Megatron-LM asserts it; its default is "
                       "allgather)", "give --moe-token-dispatcher-type alltoall or flex")
    if fields["pp"] > 1 and fields.get("vpp", 1) < 2:
        raise v.refuse(flag, "with pipeline parallelism needs virtual stages (Megatron-LM asserts it)",
                       "give --num-virtual-stages-per-pipeline-rank >= 2")
    if fields.get("recompute") == "full" or v.present("recompute-method"):
        raise v.refuse(flag, "runs without full recomputation or a recompute method (Megatron-LM asserts it)",
                       "remove --recompute-granularity full and --recompute-method in a copy")
    return "interleaved-a2a-overlap" if fields["pp"] > 1 else "1f1b-a2a-overlap"


def _recompute(v: _Values) -> Dict[str, Any]:
    granularity = v.text("recompute-granularity")
    if v.switch("recompute-activations"):
        granularity = "selective"  # arguments.py: --recompute-activations sets granularity selective
    method = v.text("recompute-method")
    layers = v.integer("recompute-num-layers", minimum=0)
    if granularity is None:
        return {}
    if granularity == "selective":
        if method is not None:
            raise v.refuse("--recompute-method", "given with selective granularity (Megatron-LM refuses it)",
                           "remove --recompute-method in a copy")
        return {"recompute": "core_attention"}
    if granularity != "full":
        raise v.refuse("--recompute-granularity", f"expected full or selective, got {granularity!r}",
                       "give full or selective")
    if method == "block":
        if layers is None:
            raise v.refuse("--recompute-num-layers", "missing with --recompute-method block (the layers a stage "
                           "recomputes)", "give --recompute-num-layers N")
        return {"recompute": "full", "recompute_layers": layers}
    if method == "uniform":
        if layers not in (None, 1):
            raise v.refuse("--recompute-num-layers", f"uniform recomputation of {layers} layers a checkpoint "
                           f"keeps one input every {layers} layers, which ndcost does not price",
                           "price --recompute-num-layers 1 or --recompute-method block in a copy")
        return {"recompute": "full"}
    raise v.refuse("--recompute-method", f"expected uniform or block with full granularity, got {method!r}",
                   "give --recompute-method uniform or block")


def _precision(v: _Values, defaults: List[str]) -> Dict[str, Any]:
    bf16, fp16 = v.switch("bf16"), v.switch("fp16")
    if bf16 and fp16:
        raise v.refuse("--bf16", "given with --fp16", "keep one in a copy")
    if not (bf16 or fp16):
        if v.switch("grad-reduce-in-bf16"):
            raise v.refuse("--grad-reduce-in-bf16", "given without --bf16", "add --bf16 or remove it")
        defaults.append("neither --bf16 nor --fp16: fp32 parameters, gradients and optimizer states")
        return {"param_dtype": "fp32"}
    half = "bf16" if bf16 else "fp16"
    grad = "bf16" if bf16 and v.switch("grad-reduce-in-bf16") else "fp32"
    defaults.append(f"--{half}: {half} parameters, {grad} main gradients, fp32 main parameters and optimizer states")
    return {"param_dtype": half, "grad_dtype": grad, "master_dtype": "fp32", "optimizer_dtype": "fp32"}


def _float8(v: _Values, defaults: List[str]) -> Dict[str, Any]:
    """``--fp8-format`` with ``--fp8-recipe tensorwise`` (Transformer Engine's Float8CurrentScaling: per-tensor
    scales from the tensor's own amax, as torchao's tensorwise dynamic scaling) is ``float8=tensorwise``; TE's
    other recipes are refused: ``delayed`` (the default) scales from an amax history, ``mxfp8`` and ``blockwise``
    scale blocks. e4m3 and hybrid (e5m2 gradients) move the same bytes."""
    form = v.text("fp8-format")
    recipe = v.text("fp8-recipe", "delayed")
    if form is None:
        if v.present("fp8-recipe"):
            defaults.append("--fp8-recipe without --fp8-format: float8 off (Megatron-LM's args.fp8 is None)")
        return {}
    if form not in ("e4m3", "hybrid"):
        raise v.refuse("--fp8-format", f"expected e4m3 or hybrid, got {form!r}", "give --fp8-format hybrid")
    if recipe == "delayed":
        raise v.refuse("--fp8-recipe", "delayed scaling (the default) scales from an amax history of "
                       "--fp8-amax-history-len steps, which ndcost's float8 (dynamic scaling) does not price",
                       "give --fp8-recipe tensorwise (current scaling) in a copy")
    if recipe != "tensorwise":
        raise v.refuse("--fp8-recipe", f"{recipe!r} (block-scaled) is not priced", "give --fp8-recipe tensorwise "
                       "in a copy")
    defaults.append(f"--fp8-format {form} --fp8-recipe tensorwise: Transformer Engine's current scaling, priced as "
                    "float8=tensorwise with float8_experts (the layers' linears and the experts' grouped linears in "
                    "fp8, the head and router at the compute dtype)")
    return {"float8": "tensorwise", "float8_experts": True}


def _model(v: _Values, tp: int) -> Tuple[Optional[Dict[str, Any]], List[str]]:
    """The Transformers config mapping the shape flags describe, or None where the vocabulary is unknown."""
    vocab = v.integer("vocab-size")
    if vocab is None:
        return None, ["the vocabulary comes from the tokenizer, which ndcost does not read: give MODEL"]
    layers, hidden, heads = (v.integer(k) for k in ("num-layers", "hidden-size", "num-attention-heads"))
    for flag, value in (("num-layers", layers), ("hidden-size", hidden), ("num-attention-heads", heads)):
        if value is None:
            raise v.refuse(f"--{flag}", "missing (Megatron-LM requires it)", f"give --{flag} N")
    assert layers is not None and hidden is not None and heads is not None
    notes: List[str] = []
    swiglu = v.switch("swiglu")
    ffn = v.integer("ffn-hidden-size")
    if ffn is None:  # arguments.py: 4h, or 2/3 of it rounded down to a multiple of 64 under SwiGLU
        ffn = int((4 * hidden * 2 / 3) / 64) * 64 if swiglu else 4 * hidden
        notes.append(f"--ffn-hidden-size = {ffn} (Megatron-LM's default for this width)")
    if hidden % heads and not v.present("kv-channels"):
        raise v.refuse("--num-attention-heads", f"{heads} does not divide --hidden-size {hidden}",
                       "give --kv-channels")
    head_dim = v.integer("kv-channels", hidden // heads)
    groups = v.integer("num-query-groups", 1) if v.switch("group-query-attention") else heads
    assert head_dim is not None and groups is not None
    divisor = v.integer("make-vocab-size-divisible-by", 128)
    assert divisor is not None
    multiple = divisor * tp  # megatron/core/tokenizers/utils/build_tokenizer.py vocab_size_with_padding
    padded = -(-vocab // multiple) * multiple
    if padded != vocab:
        notes.append(f"vocabulary padded from {vocab} to {padded} (a multiple of {divisor} * tp)")
    norm = v.text("normalization", "LayerNorm")
    position = v.text("position-embedding-type", "learned_absolute")
    bias = not v.switch("disable-bias-linear")
    qkv_bias = v.switch("add-qkv-bias")
    qk_norm = v.switch("qk-layernorm")
    tied = not v.switch("untie-embeddings-and-output-weights")
    experts = v.integer("num-experts")
    if v.present("moe-layer-freq") and v.integer("moe-layer-freq") != 1:
        raise v.refuse("--moe-layer-freq", "dense layers between the MoE layers are not read yet",
                       "give MODEL, or --moe-layer-freq 1 in a copy")
    attention_dropout = v.number("attention-dropout", 0.1)
    hidden_dropout = v.number("hidden-dropout", 0.1)
    max_positions = v.integer("max-position-embeddings", v.integer("seq-length", 4096))
    eps = v.number("norm-epsilon", 1e-5)
    config: Dict[str, Any] = {
        "vocab_size": padded, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "max_position_embeddings": max_positions, "tie_word_embeddings": tied}
    shape = f"--normalization {norm}, --position-embedding-type {position}, swiglu {swiglu}"
    if norm == "RMSNorm" and position == "rope" and swiglu:
        # No hidden_dropout: the Transformers decoder layers these map to (Llama, Qwen2/3, Mixtral, Qwen3-MoE,
        # GLM-4-MoE) apply none, and their configs have no such field, so the census (which runs them) keeps
        # no mask; passed on, the key would have the formulas alone price masks the census does not.
        config.update(num_key_value_heads=groups, head_dim=head_dim, intermediate_size=ffn, rms_norm_eps=eps,
                      hidden_act="silu", attention_dropout=attention_dropout,
                      rope_parameters={"rope_type": "default", "rope_theta": v.number("rotary-base", 10000.0)})
        if hidden_dropout:
            notes.append(f"--hidden-dropout {hidden_dropout:g} not priced: ndcost prices Transformers' decoder "
                         f"layer for this shape, which has no hidden dropout; Megatron-LM keeps a 1-byte mask "
                         f"of the hidden width after the attention and after the MLP ({2 * hidden} bytes a "
                         f"token a layer more; 0 with --hidden-dropout 0)")
        if experts is None:
            if qk_norm:
                if bias or qkv_bias:
                    raise v.refuse("--qk-layernorm", "with linear biases: no Transformers model type ndcost maps "
                                   "has this shape", "give MODEL")
                config.update(model_type="qwen3", attention_bias=False)
            elif qkv_bias and not bias:
                config.update(model_type="qwen2")
            else:
                config.update(model_type="llama", attention_bias=bias, mlp_bias=bias)
        else:
            topk = v.integer("moe-router-topk", 2)
            expert_ffn = v.integer("moe-ffn-hidden-size", ffn)
            shared = v.integer("moe-shared-expert-intermediate-size")
            assert expert_ffn is not None
            if bias or (qkv_bias and shared is None):
                raise v.refuse("--disable-bias-linear" if bias else "--add-qkv-bias", "an MoE with these linear "
                               "biases has no Transformers model type ndcost maps", "give MODEL")
            if shared is not None:  # glm4_moe: its shared experts are one MLP n_shared_experts times as wide
                if shared % expert_ffn:
                    raise v.refuse("--moe-shared-expert-intermediate-size", f"{shared} is not a multiple of "
                                   f"--moe-ffn-hidden-size {expert_ffn} (glm4_moe's shared-expert width)",
                                   "give MODEL")
                config.update(model_type="glm4_moe", n_routed_experts=experts, num_experts_per_tok=topk,
                              moe_intermediate_size=expert_ffn, n_shared_experts=shared // expert_ffn,
                              first_k_dense_replace=0, use_qk_norm=qk_norm, attention_bias=qkv_bias,
                              num_nextn_predict_layers=0, partial_rotary_factor=1.0, n_group=1, topk_group=1,
                              norm_topk_prob=True, routed_scaling_factor=1.0)
            elif qk_norm:
                config.update(model_type="qwen3_moe", num_experts=experts, num_experts_per_tok=topk,
                              moe_intermediate_size=expert_ffn, decoder_sparse_step=1, mlp_only_layers=[],
                              attention_bias=False)
            else:
                config.update(model_type="mixtral", num_local_experts=experts, num_experts_per_tok=topk,
                              intermediate_size=expert_ffn)
        return config, notes
    if norm == "LayerNorm" and position == "learned_absolute" and not swiglu:
        if experts is not None or qk_norm or not bias or groups != heads or head_dim * heads != hidden:
            raise v.refuse("--num-experts" if experts is not None else "--disable-bias-linear" if not bias
                           else "--qk-layernorm" if qk_norm else "--num-query-groups",
                           "a GPT-2-shaped model (LayerNorm, learned positions) must be dense, biased, with full "
                           "multi-head attention to map to gpt2", "give MODEL")
        config = {"model_type": "gpt2", "vocab_size": padded, "n_embd": hidden, "n_layer": layers, "n_head": heads,
                  "n_inner": ffn, "n_positions": max_positions, "activation_function": "gelu",
                  "layer_norm_epsilon": eps, "attn_pdrop": attention_dropout, "resid_pdrop": hidden_dropout,
                  "embd_pdrop": hidden_dropout, "tie_word_embeddings": tied}
        return config, notes
    raise v.refuse("--normalization", f"{shape}: no Transformers model type ndcost maps has this shape "
                   "(llama-like: RMSNorm, rope, swiglu; gpt2-like: LayerNorm, learned_absolute, gelu)", "give MODEL")


# --- writing -----------------------------------------------------------------------------------------------
_MEGATRON_DTYPES = {  # (param, compute, grad, optimizer, master) as the reader gives them -> precision flags
    ("bf16", None, "fp32", "fp32", "fp32"): ["--bf16"],
    ("bf16", None, "bf16", "fp32", "fp32"): ["--bf16", "--grad-reduce-in-bf16"],
    ("fp16", None, "fp32", "fp32", "fp32"): ["--fp16"],
    ("fp32", None, None, None, "none"): [],
}


def _refuse_write(field: str, value: Any, why: str) -> InvalidValue:
    return InvalidValue(f"megatron writer: {field}={value}: {why}")


def _split_flags(s: Strategy) -> List[str]:
    """``pp_layers`` as ``--decoder-first/last-pipeline-num-layers`` where only the first and the last rank differ
    and a rank's chunks are equal, else as ``--pipeline-model-parallel-layout`` (what the reader reads back)."""
    if s.pp_layers is None:
        return []
    chunks = s.pp_layers
    per_rank = [{chunks[c * s.pp + r] for c in range(s.vpp)} for r in range(s.pp)]
    ranks = [next(iter(p)) * s.vpp for p in per_rank]
    if any(len(p) > 1 for p in per_rank) or len(set(ranks[1:-1])) > 1:
        stages = [f"t*{n}" for n in chunks]
        return [f"--pipeline-model-parallel-layout 'E{'|'.join(stages)}L'"]
    flags = [f"--decoder-first-pipeline-num-layers {ranks[0]}"]
    if s.pp > 2 and ranks[-1] != ranks[1]:
        flags.append(f"--decoder-last-pipeline-num-layers {ranks[-1]}")
    return flags


def _strategy_flags(s: Strategy, global_batch: Optional[int]) -> List[str]:
    """*s* as Megatron-LM flags; a field Megatron-LM cannot express is refused by name."""
    if s.zero == 3:
        raise _refuse_write("zero", s.zero, "Megatron-FSDP's optim_grads_params shards the parameters as FSDP "
                            "does: fsdp=N (zero=1 is the distributed optimizer, zero=2 Megatron-FSDP's optim_grads)")
    if s.fsdp > 1 and s.dp > 1:
        raise _refuse_write("dp", s.dp, "Megatron-FSDP shards over every data-parallel rank (HSDP's outer "
                            "replication is not written): dp=1 with fsdp")
    if s.fsdp > 1 and s.shard_mesh != ("fsdp_cp" if s.cp > 1 else "dp_cp"):
        raise _refuse_write("shard_mesh", s.shard_mesh, "Megatron-FSDP shards over the data-parallel ranks with "
                            "context parallelism: shard_mesh=fsdp_cp where cp > 1")
    if s.ddp_engine not in ("auto", "megatron"):
        raise _refuse_write("ddp_engine", s.ddp_engine, "Megatron-LM's DDP keeps the gradients in its contiguous "
                            "grad buffer: ddp_engine=megatron")
    if s.fsdp > 1 and s.fsdp_engine != "megatron":
        raise _refuse_write("fsdp_engine", s.fsdp_engine, "Megatron-LM shards the parameters with Megatron-FSDP, "
                            "whose parameters are views of the gathered buffer (no copy-out): fsdp_engine=megatron")
    if s.vocab_parallel != (s.tp > 1):
        raise _refuse_write("vocab_parallel", str(s.vocab_parallel).lower(), f"Megatron-LM always splits the "
                            f"vocabulary over tp (vocab_parallel={'true' if s.tp > 1 else 'false'} at tp={s.tp})")
    if s.sp and s.tp == 1:
        raise _refuse_write("sp", "true", "Megatron-LM turns sequence parallelism off at tp=1")
    if (s.vpp > 1 and s.schedule not in ("interleaved", "interleaved-a2a-overlap")) or (
            s.vpp == 1 and s.schedule not in ("1f1b", "1f1b-a2a-overlap")):
        raise _refuse_write("schedule", s.schedule, "Megatron-LM runs 1f1b, or interleaved with vpp > 1, each with "
                            "or without --overlap-moe-expert-parallel-comm (the -a2a-overlap schedules)")
    if s.schedule.endswith("-a2a-overlap") and (s.ep < 2 or s.recompute == "full"):
        raise _refuse_write("schedule", s.schedule, "Megatron-LM's --overlap-moe-expert-parallel-comm needs ep > 1 "
                            "and no full recomputation")
    comm_types = {pair: name for name, pair in CP_COMM_TYPES.items()}
    if s.cp_algo not in {algo for algo, _ in comm_types}:
        raise _refuse_write("cp_algo", s.cp_algo, "Megatron-LM's --cp-comm-type has p2p and allgather (ring), a2a "
                            "(ulysses), a2a+p2p (hybrid)")
    if (s.cp_algo, s.cp_rotate) not in comm_types:
        raise _refuse_write("cp_rotate", s.cp_rotate, f"Megatron-LM's cp_algo={s.cp_algo} is --cp-comm-type "
                            + " or ".join(f"{name} (cp_rotate={rotate})" for name, (algo, rotate)
                                          in CP_COMM_TYPES.items() if algo == s.cp_algo))
    if s.recompute == "selective":
        raise _refuse_write("recompute", "selective", "an op-level policy is not Megatron-LM's; its selective is "
                            "recompute=core_attention")
    if s.recompute_layers is not None and s.recompute != "full":
        raise _refuse_write("recompute_layers", s.recompute_layers, "Megatron-LM counts recomputed layers only "
                            "with recompute=full")
    if s.pp_engine == "torch":
        raise _refuse_write("pp_engine", "torch", "Megatron-LM's pipeline receives a tensor a transfer and frees it "
                            "with its micro-batch (p2p_communication.py): pp_engine=auto or megatron")
    for name in ("offload_params", "offload_activations", "moe_imbalance", "allocator_overhead",
                 "reshard_after_forward", "float8_all_gather", "compile", "async_tp", "gradient_sync",
                 "reduce_bucket_elements", "reduce_buckets", "reuse_distance_elements", "live_parameters_elements",
                 "sub_group_elements") + (
                     () if s.fsdp > 1 else ("shard_mesh",)):
        # the distributed optimizer shards over dp * cp: dp_cp; Megatron-LM runs no torch.compile nor FSDP2
        default = Strategy().to_dict()[name]
        if getattr(s, name) != default:
            raise _refuse_write(name, getattr(s, name), "no Megatron-LM flag says this (leave it at its default)")
    if s.optimizer not in ("adamw", "sgd"):
        raise _refuse_write("optimizer", s.optimizer, "Megatron-LM's --optimizer is written for adamw or sgd")
    if s.float8 not in ("none", "tensorwise"):
        raise _refuse_write("float8", s.float8, "Transformer Engine's recipes under Megatron-LM price as "
                            "tensorwise only (--fp8-recipe tensorwise)")
    if s.float8_experts != (s.float8 != "none"):
        raise _refuse_write("float8_experts", s.float8_experts, "Megatron-LM's --fp8-format runs every Transformer "
                            "Engine linear in fp8, the experts' grouped ones too: float8_experts=true with float8")
    dtypes = (s.param_dtype, s.compute_dtype, s.grad_dtype, s.optimizer_dtype, s.master_dtype)
    if dtypes not in _MEGATRON_DTYPES:
        raise _refuse_write("param_dtype", s.param_dtype, "Megatron-LM's precisions are --bf16 or --fp16 "
                            "(grad_dtype=fp32, or bf16 with --grad-reduce-in-bf16; master_dtype=fp32,"
                            "optimizer_dtype=fp32; compute_dtype unset) and fp32 alone (the other dtypes unset)")
    flags = [f"--tensor-model-parallel-size {s.tp}", f"--pipeline-model-parallel-size {s.pp}",
             f"--context-parallel-size {s.cp}"]
    if s.vpp > 1:
        flags.append(f"--num-virtual-stages-per-pipeline-rank {s.vpp}")
    flags += _split_flags(s)
    if s.cp > 1 or s.cp_algo != "ring" or s.cp_rotate != "allgather":
        flags.append("--cp-comm-type " + comm_types[s.cp_algo, s.cp_rotate])
    if s.ep > 1 or s.etp > 1 or s.tp > 1:  # explicit: without them an MoE's expert tp would default to tp
        flags.append(f"--expert-model-parallel-size {s.ep} --expert-tensor-parallel-size {s.etp}")
    if s.ep > 1:
        flags.append("--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep"
                     if s.ep_dispatcher == "deepep" else "--moe-token-dispatcher-type alltoall")
    if s.schedule.endswith("-a2a-overlap"):
        flags.append("--overlap-moe-expert-parallel-comm")
    if s.sp:
        flags.append("--sequence-parallel")
    if s.zero == 1:
        flags.append("--use-distributed-optimizer")
    elif s.zero == 2 or s.fsdp > 1:  # Megatron-FSDP takes the distributed optimizer beside it
        sharding = "optim_grads" if s.zero == 2 else "optim_grads_params"
        flags.append(f"--use-megatron-fsdp --data-parallel-sharding-strategy {sharding} --use-distributed-optimizer")
    if s.recompute == "core_attention":
        flags.append("--recompute-granularity selective")
    elif s.recompute == "full":
        flags.append("--recompute-granularity full")
        flags.append("--recompute-method uniform --recompute-num-layers 1" if s.recompute_layers is None
                     else f"--recompute-method block --recompute-num-layers {s.recompute_layers}")
    batch = s.micro_batch * s.num_micro_batches * s.dp * s.fsdp
    if global_batch is not None and global_batch != batch:
        raise _refuse_write("global_batch", global_batch, f"micro_batch {s.micro_batch} * num_micro_batches "
                            f"{s.num_micro_batches} * dp * fsdp {s.dp * s.fsdp} = {batch} sequences a step")
    flags += [f"--micro-batch-size {s.micro_batch}", f"--global-batch-size {batch}"]
    if s.seq is not None:
        flags.append(f"--seq-length {s.seq}")
    flags += _MEGATRON_DTYPES[dtypes]
    if s.optimizer == "sgd":
        flags.append("--optimizer sgd")
    if s.offload_optimizer:
        flags.append("--optimizer-cpu-offload")
    if s.float8 == "tensorwise":
        flags.append("--fp8-format hybrid --fp8-recipe tensorwise")
    return flags


def _model_flags(model: Any, tp: int) -> List[str]:
    """A model's shape as Megatron-LM flags (llama, qwen2, qwen3, mixtral, qwen3_moe); other types refused."""
    from ndcost.models import load_model

    spec = load_model(model)
    c = dict(spec.hf_config)
    kind = c.get("model_type")
    if kind not in ("llama", "qwen2", "qwen3", "mixtral", "qwen3_moe"):
        raise _refuse_write("model", spec.name, f"model_type {kind!r} is not written as Megatron-LM flags "
                            "(llama, qwen2, qwen3, mixtral and qwen3_moe are)")
    heads = c["num_attention_heads"]
    flags = [f"--num-layers {c['num_hidden_layers']}", f"--hidden-size {c['hidden_size']}",
             f"--num-attention-heads {heads}", f"--kv-channels {c.get('head_dim') or c['hidden_size'] // heads}",
             f"--ffn-hidden-size {c['intermediate_size']}", "--swiglu", "--normalization RMSNorm",
             "--position-embedding-type rope", f"--vocab-size {c['vocab_size']}",
             "--make-vocab-size-divisible-by 1" if c["vocab_size"] % tp == 0 else "",
             f"--attention-dropout {float(c.get('attention_dropout') or 0.0)}",
             f"--hidden-dropout {float(c.get('hidden_dropout') or 0.0)}",
             f"--max-position-embeddings {c.get('max_position_embeddings') or 4096}"]
    kv = c.get("num_key_value_heads") or heads
    if kv != heads:
        flags.append(f"--group-query-attention --num-query-groups {kv}")
    if not c.get("tie_word_embeddings", False):
        flags.append("--untie-embeddings-and-output-weights")
    if kind == "llama" and c.get("attention_bias") != c.get("mlp_bias"):
        raise _refuse_write("model", spec.name, "llama with attention_bias != mlp_bias has no Megatron-LM flag")
    if not (kind == "llama" and c.get("attention_bias")):
        flags.append("--disable-bias-linear")
    if kind == "qwen2":
        flags.append("--add-qkv-bias")
    if kind in ("qwen3", "qwen3_moe"):
        flags.append("--qk-layernorm")
    if kind == "mixtral":
        flags += [f"--num-experts {c['num_local_experts']}", f"--moe-router-topk {c['num_experts_per_tok']}",
                  f"--moe-ffn-hidden-size {c['intermediate_size']}"]
    if kind == "qwen3_moe":
        if c.get("mlp_only_layers") or c.get("decoder_sparse_step", 1) != 1:
            raise _refuse_write("model", spec.name, "dense layers between MoE layers are not written")
        flags += [f"--num-experts {c['num_experts']}", f"--moe-router-topk {c['num_experts_per_tok']}",
                  f"--moe-ffn-hidden-size {c['moe_intermediate_size']}"]
    return [f for f in flags if f]


@hookimpl
def ndcost_register(register):
    register(f"trainer/{KIND}", MegatronFormat())


