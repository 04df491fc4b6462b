"""`ndcost census MODEL --seq N [--runtime P]`: what each layer kind keeps and computes, measured on fake tensors."""
from __future__ import annotations

HELP = "measure each layer kind's saved bytes, working peak, FLOPs and traffic on fake tensors (census)"

# The fields of a kind in --json, in the order `ndcost census --json` prints them (docs/architecture.md).
FIELDS = ("saved_per_token", "saved_tp_per_token", "working_per_token", "working_tp_per_token",
          "selective_per_token", "selective_tp_per_token", "recomputed_attention_mm_share",
          "recomputed_other_mm_share", "recomputed_scores_share", "ops", "ops_tp", "flops_by_part",
          "flops_all_pairs_by_part", "traffic", "shared_saved_per_token")


def add_arguments(parser) -> None:
    parser.add_argument("model", help="a model name from specs/models, a spec YAML, a config.json, "
                                      "or a folder holding config.json")
    parser.add_argument("--seq", type=int, required=True,
                        help="sequence length in tokens (the census runs one sequence per micro-batch)")
    parser.add_argument("--runtime", default="hf-cuda", help="runtime profile (runtime/<name>; default hf-cuda)")
    parser.add_argument("--no-cache", action="store_true", help="measure again instead of reading the cache")


def _fields(record) -> dict:
    data = record.to_dict()
    return {name: data[name] for name in FIELDS}


def run(args):
    from ndcost import manager
    from ndcost.cli import Output, table
    from ndcost.errors import InvalidValue
    from ndcost.models import load_model

    registry = manager.registry()
    kind_records, output_record = registry.get("census/kind_records"), registry.get("census/output_record")

    if args.seq < 1:
        raise InvalidValue(f"--seq must be a positive number of tokens, got {args.seq}")
    spec = load_model(args.model)
    use_cache = not args.no_cache
    kinds = kind_records(spec, args.seq, runtime=args.runtime, use_cache=use_cache)
    output = output_record(spec, args.seq, runtime=args.runtime, use_cache=use_cache)
    data = {"seq": args.seq, "runtime": args.runtime,
            "kinds": {kind: _fields(record) for kind, record in kinds.items()},
            "output": _fields(output)}

    def cell(value):
        return "-" if value is None else f"{value:,.1f}"

    rows = []
    for kind, record in [*kinds.items(), ("output", output)]:
        rows.append([kind, cell(record.saved_per_token), cell(record.saved_tp_per_token),
                     cell(record.working_per_token),
                     cell(record.working_tp_per_token), cell(record.selective_per_token),
                     cell(record.selective_tp_per_token), f"{sum(record.flops_by_part.values()):,.0f}"])
    text = (f"census of {spec.name} at {args.seq} tokens under {args.runtime} (bytes per token at TP 1; "
            f"a rank at TP t keeps x + x_tp / t)\n")
    text += table(rows, ["kind", "saved", "saved_tp", "working", "working_tp", "selective", "selective_tp",
                         "forward FLOPs"], align="lrrrrrrr")
    return Output(data=data, text=text)
