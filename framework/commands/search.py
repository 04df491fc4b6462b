"""`ndcost search MODEL --devices N --hardware H --global-batch B --seq S`: the fastest strategies that fit."""
from __future__ import annotations

import textwrap
from typing import Any, List

HELP = ("search every parallel strategy for exactly N devices and rank those that fit by step time "
        "(peak_bytes is allocated bytes, which fitting judges; reserved_bytes what the simulated caching "
        "allocator reserves, null where not claimed)")

_GIB = 2 ** 30
_WIDTH = 100
_FIGURES = ("peak_bytes", "reserved_bytes", "step_seconds", "tokens_per_second", "mfu")


def add_arguments(parser) -> None:
    parser.add_argument("model", metavar="MODEL", nargs="?",
                        help="a model name from specs/models, a spec YAML, a config.json or a folder holding one "
                             "(with --from: only to replace the file's)")
    parser.add_argument("--from", dest="from_config", metavar="KIND:PATH",
                        help="search around a trainer's configuration (torchtitan:JOB.toml, megatron:ARGS, "
                             "deepspeed:CONFIG.json, hyperparallel:TRAIN.yaml): its model, devices, global batch, "
                             "sequence length and runtime, and every field the search does not choose (dtypes, "
                             "optimizer, Float8, compile, ...) held, unless given here")
    parser.add_argument("--devices", metavar="N[,N...]",
                        help="the devices, exactly (every strategy uses all of them); a list searches each")
    parser.add_argument("--hardware", default="h200", metavar="H[,H...]",
                        help="registered hardware names or spec YAMLs (default h200); a list searches each")
    parser.add_argument("--global-batch", type=int, metavar="B",
                        help="sequences a step (dp * fsdp * micro_batch * num_micro_batches)")
    parser.add_argument("--seq", type=int, metavar="S", help="tokens a sequence")
    parser.add_argument("--memory-cap", type=float, metavar="GiB",
                        help="memory a device's caching allocator may reserve (default: the hardware's memory "
                             "less its CUDA context, cuda_context_bytes)")
    parser.add_argument("--top", type=int, default=10, metavar="K", help="how many to show (default 10)")
    parser.add_argument("--csv", action="store_true", help="write CSV (the --json columns) to stdout")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="a PNG of step time against memory a device, Pareto front marked (the plot extra)")
    parser.add_argument("--tokens", type=float, metavar="T", help="add the time and GPU-hours to train T tokens")
    parser.add_argument("--price", type=float, metavar="USD_PER_GPU_HOUR", help="with --tokens: add their cost")
    parser.add_argument("--workers", type=int, default=1, metavar="N", help="price chunks in N local processes")
    parser.add_argument("--scheduler", metavar="ADDRESS",
                        help="price chunks on the Dask distributed cluster at ADDRESS (the dask extra)")
    parser.add_argument("--runtime", help="the runtime profile (default hf-cuda, or the one --emit's trainer runs)")
    parser.add_argument("--census", default="auto", choices=("auto", "on", "off"),
                        help="auto: measure where a census can run, else the formulas; off: the formulas alone")
    parser.add_argument("--across-nodes", action="store_true",
                        help="also search tp and etp groups larger than a node")
    parser.add_argument("--exhaustive", action="store_true",
                        help="price every micro_batch, even above one that does not fit")
    parser.add_argument("--pp-splits", default="even", choices=("even", "balanced"),
                        help="even: pipelines whose pp * vpp divides the layers; balanced: also those it does not "
                             "divide, cut by torchtitan's split (pp_layers; DeepSeek-V3's 61 layers take no "
                             "pipeline otherwise; a longer search)")
    parser.add_argument("--emit", metavar="KIND[:PATH]",
                        help="write the fastest strategy a trainer can run as its configuration (torchtitan, "
                             "megatron, deepspeed; `ndcost list trainers`): on stdout in place of the table, or to "
                             "PATH beside it); the search holds the trainer's default precision (its recipe) "
                             "unless --hold gives the dtypes")
    parser.add_argument("--schedules", metavar="NAMES",
                        help="the pipeline schedules searched, e.g. 1f1b,interleaved (a trainer's: torchtitan runs "
                             "no Megatron-LM all-to-all overlap); default every registered one "
                             "(`ndcost list schedules`)")
    parser.add_argument("--hold", metavar="FIELDS",
                        help='strategy fields every candidate holds, not searched, e.g. "param_dtype=bf16,'
                             'grad_dtype=fp32,master_dtype=fp32,optimizer_dtype=fp32" or "optimizer=sgd"')


def _int_list(flag: str, text: str, example: str) -> List[int]:
    from ndcost.errors import InvalidValue
    out = []
    for item in (p.strip() for p in text.split(",")):
        if not item.isdigit() or int(item) < 1:
            raise InvalidValue(f"{flag} {text}: {item!r} is not a positive whole number; for example {flag} {example}")
        out.append(int(item))
    return out


def _check(args) -> None:
    from ndcost.errors import InvalidValue
    for flag, value, example in (("--global-batch", args.global_batch, "1024"), ("--seq", args.seq, "4096"),
                                 ("--top", args.top, "10"), ("--workers", args.workers, "4")):
        if value < 1:
            raise InvalidValue(f"{flag} {value}: must be a positive whole number; for example {flag} {example}")
    if args.memory_cap is not None and not args.memory_cap > 0:
        raise InvalidValue(f"--memory-cap {args.memory_cap:g}: must be a positive number of GiB; for example "
                           f"--memory-cap 80")
    if args.tokens is not None and (not args.tokens >= 1 or args.tokens != int(args.tokens)):
        raise InvalidValue(f"--tokens {args.tokens:g}: must be a positive whole number of tokens; for example "
                           f"--tokens 15e12")
    if args.price is not None and args.tokens is None:
        raise InvalidValue(f"--price {args.price:g} prices the tokens to train: give --tokens T too")
    if args.price is not None and not args.price >= 0:
        raise InvalidValue(f"--price {args.price:g}: must be 0 or more US dollars a GPU-hour")
    if args.csv and args.json:
        raise InvalidValue("--csv and --json both given: choose one")
    if args.emit is not None:
        kind, _, path = args.emit.partition(":")
        if not kind.strip():
            raise InvalidValue(f"--emit {args.emit!r}: expected KIND or KIND:PATH, e.g. --emit torchtitan:job.toml")
        if not path and (args.json or args.csv):
            raise InvalidValue(f"--emit {kind} writes the configuration on stdout, as --json/--csv would: give "
                               f"--emit {kind}:PATH to write it to a file")
        if "," in args.devices or "," in args.hardware:
            raise InvalidValue("--emit writes one strategy: give one --devices and one --hardware")


EMIT_DEPTH = 5000


def usage_error(args):
    """Without --from: a MODEL, --devices, --global-batch and --seq, each required."""
    if args.from_config is None:
        missing = [flag for flag, value in (("MODEL", args.model), ("--devices", args.devices),
                                            ("--global-batch", args.global_batch), ("--seq", args.seq))
                   if value is None]
        if missing:
            return (f"give {', '.join(missing)} (or --from KIND:PATH, a trainer's configuration, which states "
                    f"them)")
    return None


def _from_trainer(args) -> None:
    """With --from: what the file states, into *args* where not given here (its report on stderr)."""
    import sys

    from ndcost.errors import InvalidValue
    from ndcost.search import held_by
    from ndcost.trainers import from_config, parse_source

    kind, path = parse_source(args.from_config)
    devices = int(args.devices) if args.devices is not None and args.devices.strip().isdigit() else None
    config = from_config(kind, path, devices=devices, model=args.model)
    print(config.report(), file=sys.stderr)
    args.model = config.model
    if args.devices is None:
        if config.devices is None:
            raise InvalidValue(f"--from {args.from_config}: the file does not state its devices; give --devices N")
        args.devices = str(config.devices)
    if args.global_batch is None:
        if config.global_batch is None:
            raise InvalidValue(f"--from {args.from_config}: the file does not state its global batch; give "
                               f"--global-batch B")
        args.global_batch = config.global_batch
    if args.seq is None:
        args.seq = config.strategy.seq
    if args.runtime is None:
        args.runtime = config.runtime
    # the file's fields the search does not choose, held beneath --hold's
    given = ",".join(f"{k}={v}" for k, v in held_by(config.strategy).items())
    args.hold = ",".join(part for part in (given, args.hold or "") if part)


def run(args):
    import attrs

    from ndcost.cli import Output, csv_text
    from ndcost.search import plot_search, search_grid

    if args.from_config is not None:
        _from_trainer(args)
    _check(args)
    devices = _int_list("--devices", args.devices, "64,128")
    hardware = [h.strip() for h in args.hardware.split(",") if h.strip()]
    # --emit writes the fastest strategy the trainer can express: it looks past the shown --top, through the best
    # EMIT_DEPTH (strategies the trainer has no form for, such as fsdp for DeepSpeed's ZeRO-3, can fill the top)
    writer = _writer_of(args)
    depth = max(args.top, EMIT_DEPTH) if args.emit is not None or writer else args.top
    runtime = _runtime(args)
    results = search_grid(
        args.model, devices=devices, hardware=hardware, global_batch=args.global_batch, seq=args.seq,
        memory_cap_bytes=None if args.memory_cap is None else int(args.memory_cap * _GIB), top=depth,
        runtime=runtime, census=args.census, workers=args.workers, scheduler=args.scheduler,
        tokens=None if args.tokens is None else int(args.tokens), price_per_gpu_hour=args.price,
        keep_points=bool(args.plot), within_node=not args.across_nodes, exhaustive=args.exhaustive,
        pp_splits=args.pp_splits, held=_held(args),
        schedules=tuple(n.strip() for n in (args.schedules or "").split(",") if n.strip()))
    if writer:  # a file searched around: what its trainer can run (ndcost writes it back)
        results = [_expressible(r, writer, args.top if args.emit is None else depth) for r in results]
    if args.plot:
        plot_search(results, args.plot)
    data = [c.to_dict() for r in results for c in r.candidates]
    emitted = None
    if args.emit is not None:
        kind, _, path = args.emit.partition(":")
        emitted = _emit(results[0], kind.strip().lower(), path)
        results = [attrs.evolve(r, candidates=r.candidates[:args.top]) for r in results]
        data = [c.to_dict() for r in results for c in r.candidates]
        if not path:
            return Output(data=data, text=emitted)
    if args.csv:
        return Output(data=data, text=csv_text(data))
    text = "\n\n".join(_render(r, runtime) for r in results)
    if args.plot:
        text += f"\n\nplot: {args.plot}"
    if emitted is not None:
        text += f"\n\n{args.emit.partition(':')[0]} configuration: {args.emit.partition(':')[2]}"
    return Output(data=data, text=text)


def _writer_of(args) -> str:
    """With --from, the file's trainer kind where ndcost writes its configurations ("" otherwise)."""
    from ndcost.trainers import parse_source, trainer_format

    if args.from_config is None:
        return ""
    kind = parse_source(args.from_config)[0]
    return kind if trainer_format(kind).writes else ""


def _expressible(result: Any, kind: str, top: int) -> Any:
    """*result* with the candidates *kind*'s writer can express (``ndcost.to_config``), the best *top*; how many
    faster ones it passed over, said on stderr."""
    import sys

    import attrs

    from ndcost.errors import InvalidValue
    from ndcost.trainers import to_config

    kept: List[Any] = []
    passed = 0
    for candidate in result.candidates:
        try:
            to_config(kind, candidate.strategy, model=result.model, global_batch=result.global_batch)
        except InvalidValue:
            passed += 0 if len(kept) >= top else 1
            continue
        if len(kept) < top:
            kept.append(candidate)
    if passed:
        print(f"--from {kind}: passed over {passed} faster strateg{'y' if passed == 1 else 'ies'} {kind} has no "
              f"form for (the table lists what it can run)", file=sys.stderr)
    return attrs.evolve(result, candidates=tuple(kept))


def _runtime(args) -> str:
    """--runtime; without it, the runtime --emit's trainer runs (its reader prices a file under it), else hf-cuda."""
    from ndcost.trainers import trainer_format

    if args.runtime is not None:
        return args.runtime
    if args.emit is not None:
        return trainer_format(args.emit.partition(":")[0].strip().lower()).runtime or "hf-cuda"
    return "hf-cuda"


def _held(args) -> Any:
    """--hold's fields; with --emit KIND, the trainer's recipe beneath them: its engines, and its default
    precision unless --hold gives a dtype."""
    from ndcost.search import held_fields
    from ndcost.trainers import trainer_format

    held = held_fields(args.hold or "")
    if args.emit is not None:
        recipe = trainer_format(args.emit.partition(":")[0].strip().lower()).recipe
        own_precision = any(k.endswith("_dtype") for k in held)
        held = {**{k: v for k, v in recipe.items() if not (own_precision and k.endswith("_dtype"))}, **held}
    return held


def _emit(result: Any, kind: str, path: str) -> str:
    """The fastest candidate *kind*'s writer can express (``ndcost.to_config``), written to *path* if given.

    A faster candidate the trainer cannot run (a field it has no form for) is passed over, said on stderr.
    """
    import sys

    from ndcost.errors import InvalidValue
    from ndcost.trainers import to_config, trainer_format

    if not trainer_format(kind).writes:  # an unknown kind is refused here, naming the known ones
        raise InvalidValue(f"--emit {kind}: trainer kind {kind!r} reads configurations but does not write them")
    if not result.candidates:
        raise InvalidValue(f"--emit {kind}: no strategy fits, so there is none to write")
    passed = []
    for rank, candidate in enumerate(result.candidates, 1):
        try:
            text = to_config(kind, candidate.strategy, model=result.model, global_batch=result.global_batch)
        except InvalidValue as exc:
            passed.append(f"#{rank} ({exc})")
            continue
        if passed:  # the faster ones the trainer has no form for: how many, and the fastest's reason
            print(f"--emit {kind}: passed over {len(passed)} faster strateg{'y' if len(passed) == 1 else 'ies'} "
                  f"{kind} has no form for; the fastest: {passed[0]}", file=sys.stderr)
        print(f"--emit {kind}: #{rank} {candidate.strategy}", file=sys.stderr)
        if path:
            try:
                with open(path, "w", encoding="utf-8") as out:
                    out.write(text)
            except OSError as exc:
                raise InvalidValue(f"--emit {kind}:{path}: cannot write it ({exc.strerror or exc})") from None
        return text
    raise InvalidValue(f"--emit {kind}: none of the {len(passed)} best strategies has a {kind} form; the first: "
                       f"{passed[0]}")


def _render(result: Any, runtime: str) -> str:
    """A header, the best strategies (fit in 100 columns, the strategy wrapped at commas) and what was pruned."""
    from ndcost.search import wrap_strategy

    lines = textwrap.wrap(
        f"{result.model} on {result.devices} x {result.hardware} ({runtime}), global batch {result.global_batch:,} x "
        f"{result.seq:,} tokens, cap {result.memory_cap_bytes / _GIB:.1f} GiB: {result.priced:,} strategies "
        f"priced, {result.valid:,} run, {result.fitting:,} fit; best {len(result.candidates)} by step time. "
        f"Peak is allocated bytes; reserved_bytes (--json) is the simulated caching allocator's, what fits "
        f"is judged on (the peak where it is not claimed). waits: the group whose collectives expose the most "
        f"of the step (tp, cp, ep, fsdp, dp, pp).", _WIDTH)
    head = ["#", "peak GiB", "step s", "tokens/s", "MFU", "waits"]
    extra = result.tokens is not None
    if extra:
        head += ["days", "GPU-h"] + (["USD"] if result.candidates[0].cost_usd is not None else [])
    rows = []
    for i, c in enumerate(result.candidates, 1):
        row = [str(i), f"{c.peak_bytes / _GIB:.1f}", f"{c.step_seconds:.3f}", f"{c.tokens_per_second:,.0f}",
               f"{c.mfu:.1%}", c.waits or "-"]
        if extra:
            row += [f"{c.train_seconds / 86400:,.1f}", f"{c.gpu_hours:,.0f}"]
            if c.cost_usd is not None:
                row.append(f"{c.cost_usd:,.0f}")
        strategy = ",".join(p for p in str(c.strategy).split(",") if p != f"seq={result.seq}")
        rows.append((row, strategy or "(defaults)"))
    widths = [max(len(h), *(len(r[0][j]) for r in rows)) for j, h in enumerate(head)]
    left = sum(widths) + 2 * len(widths)
    room = max(_WIDTH - left, 30)
    lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)) + "  strategy")
    lines.append("  ".join("-" * w for w in widths) + "  " + "-" * min(room, 40))
    for row, strategy in rows:
        wrapped = wrap_strategy(strategy, room)
        lines.append("  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) + "  " + wrapped[0])
        lines += [" " * left + more for more in wrapped[1:]]
    for p in result.pruning:
        lines += textwrap.wrap(f"pruned {p.removed:,} {p.of} ({p.step}): {p.reason}", _WIDTH,
                               subsequent_indent="    ")
    return "\n".join(lines)
