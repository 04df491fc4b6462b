"""The ``ndcost`` command line.

Conventions for every subcommand: ``--json`` writes exactly one strict JSON document (no NaN or Infinity)
to stdout, a refusal's ``{"error": {"command", "kind", "message"}}``; progress, warnings and logs go to
stderr; exit 0 on success, 2 for usage errors, 1 for refusals, each refusal one line saying what was wrong
and how to fix it (a traceback only with ``--debug``).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import warnings
from typing import Any, List, Optional

import attrs

from ndcost.errors import InvalidValue, NdcostError

# Subcommands in the order `ndcost --help` lists them; each is ndcost.commands.<name>.
COMMANDS = ("params", "census", "estimate", "compare", "search", "calibrate", "verify", "plugins", "list", "fields")


@attrs.frozen(kw_only=True)
class Output:
    """What a subcommand produced: a JSON-able document and its human rendering.

    ``exit_code`` 1 with a one-line ``failure`` (on stderr, after the output)
    where the command ran but its check failed (``ndcost verify --strict``).
    """

    data: Any
    text: str
    exit_code: int = 0
    failure: str = ""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # exit 2 with one line, as argparse does, plus the usage hint
        self.print_usage(sys.stderr)
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        raise SystemExit(2)


def _commands():
    for name in COMMANDS:
        try:
            yield name, importlib.import_module(f"ndcost.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"ndcost.commands.{name}":
                raise


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ndcost", description="Cost model for LLM training: memory per device and step time.")
    parser.add_argument("--version", action="version", version=f"ndcost {__import__('ndcost').__version__}")
    _add_common(parser)  # `ndcost --json plugins` as well as `ndcost plugins --json`
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name, module in _commands():
        p = sub.add_parser(name, help=module.HELP, description=module.HELP)
        _add_common(p)
        module.add_arguments(p)
        p.set_defaults(_run=module.run, _usage=getattr(module, "usage_error", None), _parser=p)
    return parser


def _add_common(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: an option left out adds no attribute, so the subcommand's parser does not reset a flag
    # given before the subcommand's name; main() reads them with getattr(..., False).
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="write one JSON document to stdout")
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks on errors")


def _json_default(value):
    import numpy as np
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if hasattr(value, "items"):
        return dict(value)
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def json_text(data: Any) -> str:
    """*data* as strict JSON (RFC 8259: no ``NaN`` or ``Infinity``); a non-finite number is refused, naming where."""
    try:
        return json.dumps(data, indent=2, default=_json_default, allow_nan=False)
    except ValueError:
        raise InvalidValue(f"the result holds a non-finite number at {_non_finite_path(data) or '?'}, which JSON "
                           f"cannot carry; please report the command") from None


def _non_finite_path(value: Any, path: str = "") -> Optional[str]:
    """The first key path to a non-finite number in *value* (the document :func:`json_text` refused)."""
    import math

    if isinstance(value, float) or type(value).__module__ == "numpy":
        try:
            values = [float(v) for v in getattr(value, "ravel", lambda: [value])()]
        except (TypeError, ValueError):
            return None
        return None if all(math.isfinite(v) for v in values) else (path or "the top")
    if hasattr(value, "items"):
        items = list(value.items())
    elif isinstance(value, (list, tuple, set, frozenset)):
        items = list(enumerate(value))
    else:
        return None
    for key, item in items:
        found = _non_finite_path(item, f"{path}.{key}" if path else str(key))
        if found:
            return found
    return None


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    args.json, args.debug = getattr(args, "json", False), getattr(args, "debug", False)
    if args._usage is not None and args._usage(args):  # arguments that go together, checked as argparse does
        args._parser.error(args._usage(args))
    try:
        with warnings.catch_warnings():  # warnings go to stderr, one line each; restored on return
            warnings.simplefilter("default")
            warnings.showwarning = lambda message, category, *rest, **kw: print(
                f"warning: {_one_line(message)}", file=sys.stderr)
            out = args._run(args)
            text = json_text(out.data) if args.json else out.text.rstrip("\n")
    except NdcostError as exc:
        if args.debug:
            raise
        return _refused(args, exc, f"ndcost {args.command}: {_one_line(exc)}")
    except (ValueError, KeyError, OSError) as exc:
        if args.debug:
            raise
        return _refused(args, exc, f"ndcost {args.command}: {_one_line(exc)} (rerun with --debug for a traceback)")
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"ndcost {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug, not a refusal: still one line unless --debug
        if args.debug:
            raise
        print(f"ndcost {args.command}: internal error, {type(exc).__name__}: {_one_line(exc)} "
              f"(rerun with --debug for a traceback and please report it)", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # the reader left (`ndcost plugins | head`): no traceback at exit either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    if out.failure:
        print(f"ndcost {args.command}: {_one_line(Exception(out.failure))}", file=sys.stderr)
    return out.exit_code


def _refused(args: argparse.Namespace, exc: BaseException, line: str) -> int:
    """A refusal: its one line on stderr, and under ``--json`` one document on stdout saying it
    (``{"error": {"command", "kind", "message"}}``), so a pipe reading JSON reads why."""
    print(line, file=sys.stderr)
    if args.json:
        try:
            sys.stdout.write(json_text({"error": {"command": args.command, "kind": type(exc).__name__,
                                                  "message": _one_line(exc)}}) + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


def _one_line(exc: BaseException) -> str:
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    return " ".join(text.split()) or type(exc).__name__


def table(rows: List[List[Any]], header: List[str], align: str = "") -> str:
    """A plain text table; *align* gives 'l' or 'r' per column (numbers right by default)."""
    cells = [[str(c) for c in header]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    if not align:
        align = "".join("r" if rows and isinstance(rows[0][i], (int, float)) else "l" for i in range(len(header)))
    lines = []
    for n, row in enumerate(cells):
        lines.append("  ".join(c.rjust(w) if a == "r" else c.ljust(w)
                               for c, w, a in zip(row, widths, align, strict=False)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def csv_text(rows: List[dict], columns: Optional[List[str]] = None) -> str:
    """*rows* (dicts) as CSV: the *columns* given, else every key in first-seen order; None as an empty cell."""
    import csv
    import io
    if columns is None:
        columns = []
        for row in rows:
            columns += [k for k in row if k not in columns]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})
    return out.getvalue()


def _cell(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
