"""`ndcost params MODEL`: a model's parameters, the total and by part and layer kind (no torch)."""
from __future__ import annotations

HELP = "count a model's parameters by part and layer kind (a name, spec YAML, config.json or its folder)"


def add_arguments(parser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="a model name from specs/models (e.g. llama-3.1-8b), a spec YAML, a config.json, "
                             "or a folder holding config.json")


def run(args):
    from ndcost.cli import Output, table
    from ndcost.models import load_model, parameters
    from ndcost.values import PARTS

    spec = load_model(args.model)
    count = parameters(spec)
    data = {"model": spec.name, **count.to_dict()}
    lines = [f"{spec.name} ({spec.model_type}, family {spec.family}): {count.total:,} parameters"]
    if count.published_total is not None and count.published_total != count.total:
        lines.append(f"published total: {count.published_total:,} (with {count.buffers:,} buffer values)")
    lines.append("")
    rows = [[part, count.by_part[part], f"{100 * count.by_part[part] / count.total:.2f}%"]
            for part in PARTS if count.by_part.get(part)]
    lines.append(table(rows, ["part", "parameters", "share"], align="lrr"))
    lines.append("")
    kinds = [[kind, count.layer_counts[kind], count.kind_total(kind),
              ", ".join(f"{p} {v:,}" for p, v in count.by_kind[kind].items())] for kind in count.by_kind]
    lines.append(table(kinds, ["layer kind", "layers", "per layer", "by part"], align="lrrl"))
    if count.mtp:
        lines.append(f"\nMTP layers (not in the total): {count.mtp:,}")
    if count.buffers:
        lines.append(f"buffers (not in the total): {count.buffers:,}")
    if count.uncounted:
        lines.append("\nnot counted from the model (assumed; the total may differ from Transformers'):")
        lines += [f"  {part}" for part in count.uncounted]
    return Output(data=data, text="\n".join(lines))
