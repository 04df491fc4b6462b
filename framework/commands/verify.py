"""`ndcost verify MODEL [--seq S] [--strict] [--json]`: the formulas beside the census, kind by kind."""
from __future__ import annotations

HELP = ("check a model's formulas against the census and its parameter count against Transformers' model "
        "(divergences flagged; --strict exits 1 on any)")

# The human table fits 100 columns: kind and quantity names clipped, the notes wrapped.
_WIDTH = 100
_KIND_WIDTH = 18
_QUANTITY_WIDTH = 30


def add_arguments(parser) -> None:
    from ndcost.verification import DEFAULT_THRESHOLD

    parser.add_argument("model", metavar="MODEL",
                        help="a model name from specs/models, a spec YAML, a config.json, or a folder holding one")
    parser.add_argument("--seq", type=int, default=4096, help="sequence length in tokens (default 4096)")
    parser.add_argument("--runtime", default="hf-cuda", help="runtime profile (runtime/<name>; default hf-cuda)")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help=f"relative difference above which bytes and FLOPs are flagged (default "
                             f"{DEFAULT_THRESHOLD}, i.e. {DEFAULT_THRESHOLD * 100:g}%%); parameters are flagged on any "
                             f"difference")
    parser.add_argument("--strict", action="store_true", help="exit 1 when any row is flagged")
    parser.add_argument("--no-cache", action="store_true", help="measure again instead of reading the census cache")


def _figure(value) -> str:
    if value is None:
        return "-"
    if float(value).is_integer() and abs(value) < 1e13:
        return f"{int(value):,}"
    if abs(value) < 1000:
        return f"{value:.4g}"
    return f"{value:,.1f}" if abs(value) < 1e9 else f"{value:.4e}"


def _difference(row) -> str:
    if row.relative_difference is None:
        return "n/a" if row.formula is not None and row.census is not None else "-"
    return f"{100 * row.relative_difference:+.2f}%"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def run(args):
    import textwrap

    from ndcost.cli import Output, table
    from ndcost.errors import InvalidValue
    from ndcost.verification import verify

    if args.seq < 1:
        raise InvalidValue(f"--seq must be a positive number of tokens, got {args.seq}")
    if not 0 <= args.threshold < 1:
        raise InvalidValue(f"--threshold must be a fraction in [0, 1) (0.02 is 2%), got {args.threshold}")
    result = verify(args.model, seq=args.seq, runtime=args.runtime, threshold=args.threshold,
                    use_cache=not args.no_cache)
    rows = [[_clip(r.kind, _KIND_WIDTH), _clip(r.quantity, _QUANTITY_WIDTH), _figure(r.formula), _figure(r.census),
             _difference(r), "FLAG" if r.flagged else ""] for r in result.rows]
    notes = list(dict.fromkeys(f"{r.kind} {r.quantity}: {r.note}" if r.flagged else r.note
                               for r in result.rows if r.note))
    flagged = result.flagged
    lines = [f"verify {result.model} at {result.seq} tokens under {result.runtime}: the formulas beside the census, "
             f"the parameters beside Transformers' model on the meta device; flagged: any parameter difference, "
             f"bytes and FLOPs beyond {result.threshold:.1%} of the census", "",
             table(rows, ["kind", "quantity", "formula", "census", "diff", "flag"], align="llrrrl")]
    if notes:
        lines += ["", "notes:"] + [textwrap.fill(n, _WIDTH, initial_indent="  ", subsequent_indent="    ")
                                   for n in notes]
    lines.append("")
    lines.append(f"{len(flagged)} of {len(result.rows)} rows flagged" if flagged else
                 f"no row flagged ({len(result.rows)} rows)")
    lines[0] = textwrap.fill(lines[0], _WIDTH)
    text = "\n".join(lines)
    failure = ""
    if args.strict and flagged:
        first = flagged[0]
        failure = (f"--strict: {len(flagged)} row(s) flagged, the first {first.kind} {first.quantity}: formula "
                   f"{_figure(first.formula)}, census {_figure(first.census)}")
    return Output(data=result.to_dict(), text=text, exit_code=1 if failure else 0, failure=failure)
