"""`ndcost plugins`: which entry points loaded, from which distribution, and what they registered."""
from __future__ import annotations

HELP = "list the loaded plugins and the keys each registered"


def add_arguments(parser) -> None:
    parser.add_argument("--keys", action="store_true", help="list every registered key in the table")


def run(args):
    from ndcost import manager
    from ndcost.cli import Output, table

    loaded = manager.plugins()
    data = [{"name": p.name, "distribution": p.distribution, "version": p.version,
             "registered": list(p.registered), **({"error": p.error} if p.error else {})}
            for p in loaded.plugins]
    rows = []
    for p in loaded.plugins:
        what = (", ".join(p.registered) if args.keys
                else f"{len(p.registered)} key{'' if len(p.registered) == 1 else 's'}")
        rows.append([p.name, p.distribution, p.version, p.module, f"FAILED: {p.error}" if p.error else what])
    text = table(rows, ["plugin", "distribution", "version", "module", "registered"], align="lllll")
    overrides = loaded.registry.overrides()
    if overrides:
        text += "\n\noverrides:\n" + "\n".join(
            f"  {e.key}: {e.source} replaces {e.overrides or 'nothing'}" for e in overrides)
    return Output(data=data, text=text)
