"""`ndcost estimate MODEL --strategy "..."`: a strategy's memory per pipeline stage by category, and the peak."""
from __future__ import annotations

import argparse

HELP = "estimate a training strategy's memory per device, per pipeline stage by category (and step time)"

EPILOG = """\
The table: GiB one device of each pipeline stage holds at the moment its bytes peak.
  at             that moment: output backward (the loss and head's backward), last layer backward
                 (the stage's last layer's backward), end of backward, embedding backward,
                 optimizer step
  parameters, gradients, master, optimizer_states
                 the model states (master: a higher-precision copy of the parameters, master_dtype)
  activations    what the forward keeps for the backward, over the micro-batches in flight
  working        a layer's backward's transient peak above what it keeps (recomputed tensors,
                 gradients of activations, kernel workspaces)
  output         the final norm, head and loss: logits and their gradient
  communication  buffers of collectives: FSDP / ZeRO-3 parameter gathers, gradients waiting for
                 their reduce-scatter (FSDP, ZeRO-2), DDP's and DeepSpeed's gradient buckets,
                 sequence-, expert- and context-parallel exchanges, the pipeline's receive buffers
                 (pp_engine=torch)
  allocator      the caching allocator's fragmentation: allocator_overhead times the rest
Under offload_optimizer, offload_params or offload_activations a `host:` line gives the host memory
a device fills (its worst stage's) and a node's devices together; the step line the offload copies.
  reserved       (--wide) what PyTorch's caching allocator reserves for the peak, simulated
                 (ndcost.allocator, in place of allocator_overhead); "-" where nothing was simulated
The peak line judges fits: the reserved bytes (the peak where reserved is not claimed) against the
hardware's memory less its CUDA context (cuda_context_bytes, held outside the allocator). Where it
does not fit, the strategies one change away that do (same devices and tokens a step) are listed,
fastest first (--json: fits_with).
By default (100 columns) optim is master + optimizer_states, other is communication + allocator;
--wide shows every category. The header names the dtypes and the optimizer priced. `ndcost fields`
lists every strategy field; `ndcost list models|hardware|runtimes|schedules|optimizers` the names.
"""

_GIB = 2 ** 30
_WIDTH = 100
# the default table's columns: (header, categories summed); --wide shows each category alone
_NARROW = (("params", ("parameters",)), ("grads", ("gradients",)), ("optim", ("master", "optimizer_states")),
           ("acts", ("activations",)), ("working", ("working",)), ("output", ("output",)),
           ("other", ("communication", "allocator")))


def add_arguments(parser) -> None:
    parser.add_argument("model", metavar="MODEL", nargs="?",
                        help="a model name from specs/models, a spec YAML, a config.json or a folder holding one "
                             "(with --from: only where the file names no model, or to replace it)")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("--strategy",
                        help='the strategy, e.g. "fsdp=4,tp=2,seq=4096,micro_batch=1" (seq is required; '
                             '`ndcost fields` lists every field); with --from, fields added to or overriding '
                             "the file's")
    parser.add_argument("--from", dest="from_config", metavar="KIND:PATH",
                        help="read the model and strategy from a trainer's configuration: torchtitan:JOB.toml, "
                             "megatron:ARGS, deepspeed:CONFIG.json, hyperparallel:TRAIN.yaml (`ndcost list "
                             "trainers`)")
    parser.add_argument("--devices", type=int, metavar="N",
                        help="with --from: the world size, where the file does not imply it (Megatron-LM's and "
                             "DeepSpeed's come from the launcher) or has a -1 degree")
    parser.add_argument("--hardware", default="h200", help="a registered hardware name or a spec YAML (default h200)")
    parser.add_argument("--runtime", help="the runtime profile (default hf-cuda, or the one --from's trainer runs)")
    parser.add_argument("--census", default="auto", choices=("auto", "on", "off"),
                        help="auto: measure where a census can run, else the formulas; off: the formulas alone")
    parser.add_argument("--wide", action="store_true",
                        help="a column for every memory category (wider than 100 columns)")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="a PNG of each stage's bytes by category at its worst moment (reserved and usable "
                             "memory marked), the step's parts in its title (the plot extra)")


def usage_error(args):
    """The arguments that must go together: a MODEL and --strategy, or --from (and --devices only with it)."""
    if args.from_config is None:
        if args.model is None:
            return "give a MODEL and --strategy, or --from KIND:PATH"
        if args.strategy is None:
            return "give --strategy (e.g. \"fsdp=8,seq=4096\"), or --from KIND:PATH"
        if args.devices is not None:
            return "--devices goes with --from KIND:PATH (a strategy states its devices itself)"
    return None


def run(args):
    from ndcost.cli import Output, table
    from ndcost.resolver import resolve
    from ndcost.search import one_change_fits, wrap_strategy
    from ndcost.values import EXPOSED_GROUPS, Strategy

    trainer = _trainer_config(args)
    if trainer is None:
        strategy = Strategy.parse(args.strategy)
        runtime = args.runtime
    else:
        strategy = trainer.strategy
        runtime = args.runtime if args.runtime_given else (trainer.runtime or args.runtime)
    args.runtime = runtime
    model = resolve(trainer.model if trainer is not None else args.model, runtime=runtime,
                    hardware=args.hardware, census=args.census)
    cost = model.evaluate(strategy)
    hardware = model.hardware
    data = cost.to_dict()
    if trainer is not None:
        data["trainer"] = trainer.to_dict()
    data.update(model=model.spec.name, hardware=hardware.name, runtime=args.runtime, census=args.census,
                dtypes={"parameters": strategy.param_dtype, "compute": strategy.compute, "gradients": strategy.grad,
                        "master": strategy.master_dtype, "optimizer_states": strategy.optimizer_state_dtype},
                optimizer=strategy.optimizer,
                memory_bytes=int(hardware.memory_bytes), cuda_context_bytes=int(hardware.cuda_context_bytes),
                usable_memory_bytes=int(hardware.usable_memory_bytes))

    categories = list(cost.stages[0].bytes_by_category) if cost.stages else []
    if args.wide:
        columns = [(c, (c,)) for c in categories]
    else:  # the groups, and a column of its own for any category they do not name
        grouped = {c for _, summed in _NARROW for c in summed}
        columns = [(name, tuple(c for c in summed if c in categories)) for name, summed in _NARROW]
        columns = [col for col in columns if col[1]] + [(c, (c,)) for c in categories if c not in grouped]
    rows = []
    for stage in cost.stages:
        rows.append([stage.stage, stage.layers]
                    + [_gib(sum(stage.bytes_by_category[c] for c in summed)) for _, summed in columns]
                    + [_gib(stage.peak_bytes)]
                    + (["-" if stage.reserved_bytes is None else _gib(stage.reserved_bytes)] if args.wide else [])
                    + [stage.provenance.get("moment", "")])
    header = (["stage", "layers"] + [name for name, _ in columns] + ["peak"] + (["reserved"] if args.wide else [])
              + ["at"])
    hardware_named = hardware.name + (f" (from {args.hardware})" if args.hardware != hardware.name else "")
    title = f"{model.spec.name} on {hardware_named} ({args.runtime}, census={args.census}):"
    if len(title) + 1 + len(str(strategy)) > _WIDTH:  # the strategy on lines of its own, cut at its commas
        title += "\n" + "\n".join("  " + part for part in wrap_strategy(str(strategy), _WIDTH - 2))
    else:
        title += f" {strategy}"
    lines = [title,
             _recipe(strategy),
             "GiB per device, each stage at its worst moment (`at`; see --help)",
             table(rows, header, align="rr" + "r" * len(columns) + "r" * (2 if args.wide else 1) + "l")]
    if not args.wide:
        lines.append("optim = master + optimizer_states, other = communication + allocator (--wide: each)")
    peak_stage = max(cost.stages, key=lambda s: s.peak_bytes).stage if cost.stages else 0
    verdict = "fits" if cost.fits else "does NOT fit"
    judged = (f"its reserved {cost.reserved_bytes / _GIB:.2f} GiB" if cost.fits_basis == "reserved"
              else "its allocated peak (reserved not claimed)")
    lines.append(f"peak: {cost.peak_bytes / _GIB:.2f} GiB ({cost.peak_bytes:,} bytes) on stage {peak_stage}; "
                 f"{verdict}: {judged} against {hardware.usable_memory_bytes / _GIB:.2f} GiB usable "
                 f"({hardware.memory_bytes / _GIB:.1f} GiB less {hardware.cuda_context_bytes / 2 ** 20:,.0f} MiB "
                 f"of CUDA context)")
    if cost.host_bytes:
        lines.append(f"host: {cost.host_bytes / _GIB:.2f} GiB a device ({cost.host_bytes:,} bytes; stages "
                     + ", ".join(_gib(s.host_bytes) for s in cost.stages) + f" GiB), "
                     f"{cost.host_bytes_per_node / _GIB:.2f} GiB a node of {hardware.devices_per_node} devices")
    if cost.reserved_bytes is not None:
        lines.append(f"reserved: {cost.reserved_bytes / _GIB:.2f} GiB ({cost.reserved_bytes:,} bytes), what PyTorch's "
                     f"caching allocator holds for the peak (simulated with its defaults; a lower bound, see "
                     f"docs/guides/searchers.md)")
    elif cost.reserved_reason:
        lines.append(f"reserved: not claimed ({cost.reserved_reason})")
    if cost.time is not None:
        t = cost.time
        lines.append(f"step: {t.step_seconds:.4g} s, {t.tokens_per_second:,.0f} tokens/s, MFU {t.mfu:.1%}\n"
                     f"  (compute {t.compute_seconds:.4g} s, exposed communication "
                     f"{t.exposed_communication_seconds:.4g} s, bubble {t.bubble_seconds:.4g} s, "
                     f"optimizer {t.optimizer_seconds:.4g} s"
                     + (f", exposed offload {t.exposed_offload_seconds:.4g} s of {t.offload_seconds:.4g} s copying"
                        if t.offload_seconds else "") + ")")
        groups = [(g, getattr(t, f"exposed_{g}_seconds")) for g in EXPOSED_GROUPS]
        if any(seconds > 0 for _, seconds in groups):
            lines.append("  exposed communication by group: " + ", ".join(
                f"{g} {seconds:.4g} s" for g, seconds in groups if seconds > 0))
    elif (cost.provenance.get("time") or {}).get("unpriced"):
        lines.append(f"step time: unpriced ({cost.provenance['time']['unpriced']})")
    if not cost.fits and cost.time is not None:
        nearest = one_change_fits(model, strategy)
        data["fits_with"] = [{"change": change, **candidate.to_dict()} for change, candidate in nearest]
        if nearest:
            lines.append("fits with one change (the same devices and tokens a step), fastest first:")
            lines += [f"  {change}: peak {c.peak_bytes / _GIB:.2f} GiB"
                      + ("" if c.reserved_bytes is None else f", reserved {c.reserved_bytes / _GIB:.2f} GiB")
                      + f", step {c.step_seconds:.4g} s, {c.tokens_per_second:,.0f} tokens/s"
                      for change, c in nearest]
        else:
            lines.append("no one change fits (recompute, ZeRO or FSDP, SP, micro-batches, twice the TP, PP or CP, "
                         "offloading, DDP's bucket views): `ndcost search` tries every strategy for the devices")
    sources = cost.provenance.get("records", {})
    for seq, prov in sources.items():
        acts = prov.get("activations", {})
        if isinstance(acts, dict):
            kinds = ", ".join(f"{k}: {v.split(' (')[0]}" for k, v in acts.items())
            lines.append(f"activations at seq {seq}: {kinds}")
        if prov.get("working"):
            lines.append("note: backward working peak unpriced for " + ", ".join(prov["working"])
                         + " (counted as what the layers keep)")
    if cost.provenance.get("autocast"):
        lines.append("note: fp32 parameters under autocast priced with the 16-bit figures for "
                     + ", ".join(cost.provenance["autocast"]) + " (not measured under autocast: the norms' fp32 "
                     "outputs, each projection's cast and fp32 rotary tables left out; the census measures them)")
    if args.plot:
        _plot(args.plot, model.spec.name, hardware, strategy, cost)
        lines.append(f"plot: {args.plot}")
    if not args.wide:  # every line within 100 columns, as the table
        lines = [wrapped for line in lines for part in line.split("\n")
                 for wrapped in (_wrap(part) if len(part) > _WIDTH else [part])]
    return Output(data=data, text="\n".join(lines))


def _plot(path, model: str, hardware, strategy, cost) -> None:
    """Each stage's bytes by category at its worst moment, the step's parts in the title."""
    import textwrap

    from ndcost.plots import bars_png

    title = f"{model} on {hardware.name}: {strategy}"
    if cost.time is not None:
        t = cost.time
        title += (f"; step {t.step_seconds:.3g} s: compute {t.compute_seconds:.3g} s, exposed communication "
                  f"{t.exposed_communication_seconds:.3g} s, bubble {t.bubble_seconds:.3g} s")
    bars_png(path, "\n".join(textwrap.wrap(title, 90)), [f"stage {s.stage}" for s in cost.stages],
             memory=[s.bytes_by_category for s in cost.stages], reserved=[s.reserved_bytes for s in cost.stages],
             usable=[hardware.usable_memory_bytes] * len(cost.stages),
             memory_label="GiB a device at the stage's worst moment")


def _trainer_config(args):
    """The trainer configuration --from names (its report on stderr), or None without --from."""
    import sys

    from ndcost.trainers import from_config, parse_source

    args.runtime_given = args.runtime is not None
    if args.runtime is None:
        args.runtime = "hf-cuda"
    if args.from_config is None:
        return None
    kind, path = parse_source(args.from_config)
    config = from_config(kind, path, devices=args.devices, model=args.model, strategy=args.strategy)
    print(config.report(), file=sys.stderr)
    return config


def _wrap(line: str):
    import textwrap
    return textwrap.wrap(line, _WIDTH, subsequent_indent="  ", break_on_hyphens=False) or [line]


def _gib(n: int) -> str:
    return f"{n / _GIB:.2f}" if n < 1000 * _GIB else f"{n / _GIB:.0f}"


def _recipe(strategy) -> str:
    """The dtypes and the optimizer the estimate priced, as the strategy resolves them."""
    from ndcost import manager

    optimizer = manager.registry().get(f"optimizer/{strategy.optimizer}")
    states = optimizer.states_per_parameter
    return (f"dtypes: parameters {strategy.param_dtype}, compute {strategy.compute}, gradients {strategy.grad}, "
            f"master {strategy.master_dtype}, optimizer states {strategy.optimizer_state_dtype}\n"
            f"optimizer: {strategy.optimizer} ({states} state{'' if states == 1 else 's'} a parameter, "
            f"{optimizer.description or 'no description'})")
