"""`ndcost compare MODEL --strategy A --strategy B ...`: strategies (and hardware) side by side."""
from __future__ import annotations

import argparse
import math
import textwrap
from typing import Any, Dict, List, Sequence, Tuple

import attrs

HELP = "set strategies (and hardware) side by side: memory, whether each fits, the step and where it waits"

EPILOG = """\
Each --strategy is priced on each --hardware, one row each, in the order given; `*` marks, of those
that fit, the most tokens a second a device (strategies of other batches and device counts compare
by throughput). Below the table each strategy is named once: the first whole, the others by the
fields they change, and why one cannot run. With --from, the file's own strategy is row 1 and each
--strategy lists fields overriding it (a what-if on a run as configured); a --from for each file
sets several files side by side (the what-ifs over the first), each priced with its own model and
runtime.
Columns: devices (the strategy's world size), peak and reserved GiB of the worst stage (reserved "-"
where not simulated), whether it fits (the reserved bytes, else the peak, against the hardware's
memory less its CUDA context), the step's seconds, tokens a second a device, MFU, and the step's
parts in seconds: compute, exposed communication, pipeline bubble, and which group's collectives
(tp, cp, ep, fsdp, dp, pp) expose the most of it; with --tokens, in their place the days, GPU-hours
and (at --price) dollars to train them. --plot draws each row's worst stage's memory by category
beside its step by part.
"""

_GIB = 2 ** 30
_WIDTH = 100
_TIME_PARTS = (("compute", "compute_seconds"), ("exposed communication", "exposed_communication_seconds"),
               ("bubble", "bubble_seconds"), ("optimizer", "optimizer_seconds"),
               ("exposed offload", "exposed_offload_seconds"))


def _by_group() -> Tuple[Tuple[str, str], ...]:
    """(name, TimeBreakdown field) of each group's exposed communication (the time model's groups)."""
    from ndcost.values import EXPOSED_GROUPS
    return tuple((f"exposed {g}", f"exposed_{g}_seconds") for g in EXPOSED_GROUPS)


def add_arguments(parser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = EPILOG
    parser.add_argument("model", metavar="MODEL", nargs="?",
                        help="a model name from specs/models, a spec YAML, a config.json or a folder holding one "
                             "(with --from: only where the file names no model, or to replace it)")
    parser.add_argument("--strategy", action="append", default=[], metavar="STRATEGY",
                        help='a strategy, e.g. "fsdp=8,seq=4096"; give it once for each (with --from: the fields '
                             "overriding the file's, one what-if each)")
    parser.add_argument("--from", dest="from_config", metavar="KIND:PATH", action="append", default=[],
                        help="a trainer's configuration as a row, as configured: torchtitan:JOB.toml, megatron:ARGS, "
                             "deepspeed:CONFIG.json, hyperparallel:TRAIN.yaml (`ndcost list trainers`); give it "
                             "once for each file (each --strategy then overrides the first)")
    parser.add_argument("--devices", type=int, metavar="N",
                        help="with --from: the world size, where a file does not imply it")
    parser.add_argument("--hardware", default="h200", metavar="H[,H...]",
                        help="registered hardware names or spec YAMLs (default h200); a list prices each "
                             "strategy on each")
    parser.add_argument("--runtime", help="the runtime profile (default hf-cuda, or the one --from's trainer runs)")
    parser.add_argument("--census", default="auto", choices=("auto", "on", "off"),
                        help="auto: measure where a census can run, else the formulas; off: the formulas alone")
    parser.add_argument("--tokens", type=float, metavar="T",
                        help="add the days, GPU-hours (and with --price the dollars) to train T tokens")
    parser.add_argument("--price", metavar="USD[,USD...]",
                        help="with --tokens: US dollars a GPU-hour, one for every --hardware or one each, in order")
    parser.add_argument("--csv", action="store_true", help="write CSV (the --json rows' figures) to stdout")
    parser.add_argument("--plot", metavar="OUT.png",
                        help="a PNG of each row's memory by category and step time by part (the plot extra)")


def usage_error(args):
    """What must go together: a MODEL and a --strategy, or --from (--devices only with it)."""
    if not args.from_config:
        if args.model is None:
            return "give a MODEL and --strategy (once for each strategy), or --from KIND:PATH"
        if not args.strategy:
            return 'give --strategy once for each strategy to compare (e.g. --strategy "fsdp=8,seq=4096")'
        if args.devices is not None:
            return "--devices goes with --from KIND:PATH (a strategy states its devices itself)"
    if args.csv and args.json:
        return "--csv and --json both given: choose one"
    if args.price is not None and args.tokens is None:
        return "--price goes with --tokens T (the tokens to train, which the price is for)"
    return None


def run(args):
    from ndcost.cli import Output, csv_text

    hardware = [h.strip() for h in args.hardware.split(",") if h.strip()]
    if not hardware:
        from ndcost.errors import InvalidValue
        raise InvalidValue(f"--hardware {args.hardware!r}: no hardware name; for example --hardware h100,h200")
    prices = _prices(args, hardware)
    entries = _entries(args)
    rows = [_row(_resolve(e.model, e.runtime, name, args.census), e.strategy, e.label, args.tokens, price)
            for name, price in zip(hardware, prices, strict=True) for e in entries]
    _mark_best(rows)
    if args.plot:
        _plot(rows, args.plot)
    if args.csv:
        return Output(data=rows, text=csv_text(rows, _csv_columns()))
    text = _render(rows, entries, census=args.census, hardware_column=len(hardware) > 1)
    if args.plot:
        text += f"\n\nplot: {args.plot}"
    return Output(data=rows, text=text)


def _prices(args, hardware: Sequence[str]) -> List[Any]:
    """--price as one figure a hardware (None each without it)."""
    from ndcost.errors import InvalidValue

    if args.tokens is not None and not (math.isfinite(args.tokens) and args.tokens > 0):
        raise InvalidValue(f"--tokens {args.tokens:g}: must be a positive number of tokens; for example --tokens 1e12")
    if args.price is None:
        return [None] * len(hardware)
    try:
        prices = [float(p) for p in args.price.split(",")]
    except ValueError:
        raise InvalidValue(f"--price {args.price}: US dollars a GPU-hour, a number or one a --hardware "
                           f"(e.g. --price 2.5,3.5)") from None
    if len(prices) == 1:
        prices *= len(hardware)
    if len(prices) != len(hardware) or not all(math.isfinite(p) and p >= 0 for p in prices):
        raise InvalidValue(f"--price {args.price}: give one price for every --hardware or one each "
                           f"({len(hardware)}: {', '.join(hardware)}), each a finite number of dollars, none "
                           f"negative")
    return prices


@attrs.frozen(kw_only=True)
class _Entry:
    """One strategy to price: its row label, model, runtime and, for a trainer's file, where it came from."""

    label: str
    model: Any
    runtime: str
    strategy: Any
    source: str = ""


def _entries(args) -> List[_Entry]:
    """Each --strategy (MODEL's), or each --from file as configured and then each --strategy over the first."""
    import sys

    from ndcost.trainers import from_config, parse_source
    from ndcost.values import Strategy

    if not args.from_config:
        return [_Entry(label=str(i), model=args.model, runtime=args.runtime or "hf-cuda", strategy=Strategy.parse(text))
                for i, text in enumerate(args.strategy, 1)]
    out: List[_Entry] = []
    files = []
    for source in args.from_config:
        kind, path = parse_source(source)
        config = from_config(kind, path, devices=args.devices, model=args.model)
        print(config.report(), file=sys.stderr)
        files.append((kind, path))
        out.append(_Entry(label=str(len(out) + 1), model=config.model, runtime=args.runtime or config.runtime or
                          "hf-cuda", strategy=config.strategy, source=source))
    kind, path = files[0]
    for text in args.strategy:  # what-ifs over the first file
        config = from_config(kind, path, devices=args.devices, model=args.model, strategy=text)
        out.append(_Entry(label=str(len(out) + 1), model=config.model, runtime=out[0].runtime,
                          strategy=config.strategy))
    return out


def _resolve(model: Any, runtime: str, hardware: str, census: str):
    from ndcost.resolver import resolve
    return resolve(model, runtime=runtime, hardware=hardware, census=census)


def _row(model, strategy, label: str, tokens: Any = None, price: Any = None) -> Dict[str, Any]:
    """One strategy on one cost model: its figures, or why it cannot run (the figures None); with *tokens*, the
    time, GPU-hours (and at *price*, dollars) to train them."""
    from ndcost.errors import InvalidStrategy
    from ndcost.search import training_cost

    row: Dict[str, Any] = {"label": label, "model": model.spec.name, "hardware": model.hardware.name,
                           "strategy": str(strategy), "devices": int(strategy.devices), "valid": True,
                           "reason": ""}
    try:
        cost = model.evaluate(strategy)
    except InvalidStrategy as exc:
        return {**row, "valid": False, "reason": str(exc).split(": ", 1)[-1], "fits": False, "best": False}
    worst = max(cost.stages, key=lambda s: s.peak_bytes) if cost.stages else None
    time = cost.time
    row.update(peak_bytes=int(cost.peak_bytes), reserved_bytes=cost.reserved_bytes, fits=bool(cost.fits),
               fits_basis=cost.fits_basis, usable_memory_bytes=int(model.hardware.usable_memory_bytes),
               stage=None if worst is None else worst.stage,
               bytes_by_category={} if worst is None else {k: int(v) for k, v in worst.bytes_by_category.items()},
               step_seconds=None if time is None else time.step_seconds,
               tokens_per_second=None if time is None else time.tokens_per_second,
               tokens_per_second_per_device=None if time is None else time.tokens_per_second / strategy.devices,
               mfu=None if time is None else time.mfu,
               **{key: None if time is None else getattr(time, key) for _, key in _TIME_PARTS + _by_group()},
               best=False)
    if tokens is not None and time is not None:
        row["train_seconds"], row["gpu_hours"], row["cost_usd"] = training_cost(
            tokens, time.tokens_per_second, strategy.devices, price)
    return row


def _mark_best(rows: List[Dict[str, Any]]) -> None:
    """``best``: of the rows that fit, the most tokens a second a device (the first of equals): strategies of
    other batches and device counts compare by throughput, not by their steps' seconds."""
    timed = [r for r in rows if r["valid"] and r["fits"] and r.get("step_seconds") is not None]
    if timed:
        max(timed, key=lambda r: r["tokens_per_second_per_device"])["best"] = True


def _render(rows: List[Dict[str, Any]], entries: Sequence[_Entry], *, census: str, hardware_column: bool) -> str:
    """A header, a row a strategy and hardware (within 100 columns), then each strategy once: the first's whole,
    the others' fields that differ from it (a file's named), another model or runtime, and why one cannot run."""
    from ndcost.search import wrap_strategy

    costs = any("train_seconds" in r for r in rows)
    lines = textwrap.wrap(f"{rows[0]['model']} ({entries[0].runtime}, census={census}): {len(rows)} row"
                          f"{'' if len(rows) == 1 else 's'} side by side; peak and rsvd (reserved) in GiB, "
                          f"step, comp, comm, bub (the step's compute, exposed communication and bubble) in "
                          f"seconds, waits: the group whose collectives expose the most; `*` the most tokens a "
                          f"second a device that fits (`ndcost compare --help`)."
                          + (" With --tokens, days, GPU-hours (and dollars) to train them in place of the step's "
                             "parts." if costs else ""), _WIDTH)
    parts = ["days", "GPU-h"] + (["USD"] if any(r.get("cost_usd") is not None for r in rows) else []) if costs \
        else ["comp", "comm", "bub", "waits"]
    head = ["#"] + (["hardware"] if hardware_column else []) + ["devs", "peak", "rsvd", "fits", "step",
                                                                "tok/s/dev", "MFU"] + parts
    table: List[List[str]] = []
    for r in rows:
        cells = [r["label"] + ("*" if r.get("best") else "")] + ([r["hardware"]] if hardware_column else []) \
            + [str(r["devices"])]
        if not r["valid"]:  # the legend says why
            cells += ["-", "-", "no"] + ["-"] * (3 + len(parts))
        else:
            cells += [f"{r['peak_bytes'] / _GIB:.1f}",
                      "-" if r["reserved_bytes"] is None else f"{r['reserved_bytes'] / _GIB:.1f}",
                      "yes" if r["fits"] else "no"]
            if r["step_seconds"] is None:
                cells += ["-"] * (3 + len(parts))
            else:
                cells += [f"{r['step_seconds']:.3f}", f"{r['tokens_per_second_per_device']:,.0f}", f"{r['mfu']:.1%}"]
                cells += [f"{r['train_seconds'] / 86400:,.1f}", f"{r['gpu_hours']:,.0f}"] + (
                    [] if len(parts) == 2 else ["-" if r["cost_usd"] is None else f"{r['cost_usd']:,.0f}"]) \
                    if costs else [f"{r['compute_seconds']:.3f}", f"{r['exposed_communication_seconds']:.3f}",
                                   f"{r['bubble_seconds']:.3f}", _waits(r)]
        table.append(cells)
    widths = [max(len(h), *(len(c[j]) for c in table)) for j, h in enumerate(head)]
    lines.append("  ".join(h.rjust(w) for h, w in zip(head, widths, strict=True)))
    lines.append("  ".join("-" * w for w in widths))
    for cells in table:
        lines.append("  ".join(v.rjust(w) for v, w in zip(cells, widths, strict=True)).rstrip())
    first = entries[0]
    reasons: Dict[str, Dict[str, List[str]]] = {e.label: {} for e in entries}  # label -> reason -> hardware
    models = {r["label"]: r["model"] for r in rows}
    for r in rows:
        if not r["valid"]:
            reasons[r["label"]].setdefault(r["reason"], []).append(r["hardware"])
    every = len({r["hardware"] for r in rows})
    for entry in entries:
        label = entry.label
        same = entry.strategy.differences(first.strategy)
        text = (str(entry.strategy) or "(every field at its default)") if entry is first else \
            f"as #{first.label}" if not same else f"#{first.label} with {same}"
        if entry.source:
            text = f"{entry.source} as configured, {text}"
        if entry is not first and (models[label], entry.runtime) != (models[first.label], first.runtime):
            text += f" (model {models[label]}, runtime {entry.runtime})"
        named = wrap_strategy(f"#{label}: {text}", _WIDTH - 4)  # at the strategy's commas
        lines += named[:1] + ["    " + more for more in named[1:]]
        for reason, where in reasons[label].items():
            on = f" on {', '.join(where)}" if hardware_column and len(where) < every else ""
            lines += textwrap.wrap(f"cannot run{on}: {reason}", _WIDTH, initial_indent="    ",
                                   subsequent_indent="    ", break_on_hyphens=False)
    return "\n".join(lines)


def _waits(row: Dict[str, Any]) -> str:
    """The group whose collectives expose the most of a row's step ("-" where none exposes any)."""
    from ndcost.values import EXPOSED_GROUPS, most_exposed
    return most_exposed({g: row[f"exposed_{g}_seconds"] for g in EXPOSED_GROUPS}) or "-"


def _csv_columns() -> List[str]:
    """The --csv columns: the --json rows' figures (their memory by category aside)."""
    return ["label", "model", "hardware", "strategy", "devices", "valid", "reason", "peak_bytes", "reserved_bytes",
            "fits", "fits_basis", "step_seconds", "tokens_per_second", "tokens_per_second_per_device", "mfu"] \
        + [key for _, key in _TIME_PARTS + _by_group()] + ["train_seconds", "gpu_hours", "cost_usd", "best"]


def _plot(rows: Sequence[Dict[str, Any]], path: Any) -> None:
    """A PNG at *path*: each row's worst stage's bytes by category (stacked, its reserved bytes and the usable
    memory marked) beside its step's seconds by part (stacked, the exposed communication by group); rows that
    cannot run are named and left empty."""
    from ndcost.plots import bars_png

    several = len({r["hardware"] for r in rows}) > 1
    labels = [f"#{r['label']}" + (f" {r['hardware']}" if several else "") + ("" if r["valid"] else " (cannot run)")
              for r in rows]
    parts = _TIME_PARTS[:1] + _by_group() + _TIME_PARTS[2:]  # the exposed communication by group, not its total
    bars_png(path, f"{rows[0]['model']}: strategies side by side" if rows else "", labels,
             memory=[r.get("bytes_by_category", {}) for r in rows],
             reserved=[r.get("reserved_bytes") for r in rows], usable=[r.get("usable_memory_bytes") for r in rows],
             seconds=[{name: r.get(key) or 0.0 for name, key in parts} for r in rows],
             memory_label="GiB a device, worst stage")
