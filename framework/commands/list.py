"""`ndcost list models|hardware|runtimes|schedules|optimizers|trainers`: the names a command or a strategy
accepts."""
from __future__ import annotations

HELP = "list the shipped models, or the registered hardware, runtimes, schedules, optimizers or trainer formats"

# what to list -> the registry namespace holding it (models are the spec YAMLs in specs/models/)
KINDS = {"models": None, "hardware": "hardware", "runtimes": "runtime", "schedules": "schedule",
         "optimizers": "optimizer", "trainers": "trainer"}
_WIDTH = 100  # the text table's columns; --json has the whole description


def add_arguments(parser) -> None:
    parser.add_argument("what", choices=tuple(KINDS), help="what to list")


def run(args):
    from ndcost.cli import Output, table

    rows = _models() if args.what == "models" else _registered(KINDS[args.what])
    header = ["name", "description", "source"]
    name_width = max([len(header[0])] + [len(r["name"]) for r in rows])
    source_width = max([len(header[2])] + [len(r["source"]) for r in rows])
    room = max(20, _WIDTH - name_width - source_width - 4)
    text = table([[r["name"], _clip(r["description"], room), r["source"]] for r in rows], header, align="lll")
    return Output(data=rows, text=text)


def _clip(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[:width - 3].rstrip() + "..."


def _models():
    from ndcost.models import known_models, model_path
    from ndcost.specio import load_yaml

    out = []
    for name in known_models():
        spec = load_yaml(model_path(name).read_text()) or {}
        config = spec.get("config") or {}
        out.append({"name": name, "description": str(spec.get("description", "")),
                    "model_type": config.get("model_type"), "source": "specs/models"})
    return out


def _registered(namespace: str):
    from ndcost import manager

    registry = manager.registry()
    out = []
    for name in registry.names(namespace):
        entry = registry.entry(f"{namespace}/{name}")
        value = entry.value
        description = str(getattr(value, "description", "") or getattr(value, "summary", ""))
        row = {"name": name, "description": description, "source": entry.source.distribution,
               "module": entry.source.module}
        if namespace == "optimizer":
            row["states_per_parameter"] = value.states_per_parameter
            states = value.states_per_parameter
            row["description"] = f"{description} ({states} state{'' if states == 1 else 's'} a parameter)"
        out.append(row)
    return out
