"""`ndcost estimate MODEL --strategy "..."`: a strategy's memory per pipeline stage by category, and the peak."""
from __future__ import annotations

HELP = "estimate a training strategy's memory per device, per pipeline stage by category (and step time)"

_GIB = 2 ** 30


def add_arguments(parser) -> None:
    parser.add_argument("model", metavar="MODEL",
                        help="a model name from specs/models, a spec YAML, a config.json or a folder holding one")
    parser.add_argument("--strategy", required=True,
                        help='the strategy, e.g. "fsdp=4,tp=2,seq=4096,micro_batch=1" (seq is required)')
    parser.add_argument("--hardware", default="h200", help="a registered hardware name or a spec YAML (default h200)")
    parser.add_argument("--runtime", default="hf-cuda", help="the runtime profile (default hf-cuda)")
    parser.add_argument("--census", default="auto", choices=("auto", "on", "off"),
                        help="auto: measure where a census can run, else the formulas; off: the formulas alone")


def run(args):
    from ndcost.cli import Output, table
    from ndcost.resolver import resolve
    from ndcost.values import Strategy

    strategy = Strategy.parse(args.strategy)
    model = resolve(args.model, runtime=args.runtime, hardware=args.hardware, census=args.census)
    cost = model.evaluate(strategy)
    hardware = model.hardware
    data = cost.to_dict()
    data.update(model=model.spec.name, hardware=hardware.name, runtime=args.runtime, census=args.census,
                memory_bytes=int(hardware.memory_bytes), fits=cost.peak_bytes <= hardware.memory_bytes)

    categories = list(cost.stages[0].bytes_by_category) if cost.stages else []
    rows = []
    for stage in cost.stages:
        rows.append([stage.stage, stage.layers]
                    + [f"{stage.bytes_by_category[c] / _GIB:.2f}" for c in categories]
                    + [f"{stage.peak_bytes / _GIB:.2f}", stage.provenance.get("moment", "")])
    header = ["stage", "layers"] + categories + ["peak", "at"]
    lines = [f"{model.spec.name} on {hardware.name} ({args.runtime}, census={args.census}): {strategy}",
             "GiB per device, each stage at its worst moment",
             table(rows, header, align="rr" + "r" * len(categories) + "rl")]
    peak_stage = max(cost.stages, key=lambda s: s.peak_bytes).stage if cost.stages else 0
    verdict = "fits" if data["fits"] else "does NOT fit"
    lines.append(f"peak: {cost.peak_bytes / _GIB:.2f} GiB ({cost.peak_bytes:,} bytes) on stage {peak_stage}; "
                 f"{verdict} in {hardware.memory_bytes / _GIB:.1f} GiB")
    if cost.time is not None:
        t = cost.time
        lines.append(f"step: {t.step_seconds:.4g} s, {t.tokens_per_second:,.0f} tokens/s, MFU {t.mfu:.1%} "
                     f"(compute {t.compute_seconds:.4g} s, exposed communication "
                     f"{t.exposed_communication_seconds:.4g} s, bubble {t.bubble_seconds:.4g} s, "
                     f"optimizer {t.optimizer_seconds:.4g} s)")
    elif (cost.provenance.get("time") or {}).get("unpriced"):
        lines.append(f"step time: unpriced ({cost.provenance['time']['unpriced']})")
    sources = cost.provenance.get("records", {})
    for seq, prov in sources.items():
        acts = prov.get("activations", {})
        if isinstance(acts, dict):
            kinds = ", ".join(f"{k}: {v.split(' (')[0]}" for k, v in acts.items())
            lines.append(f"activations at seq {seq}: {kinds}")
        if prov.get("working"):
            lines.append("note: backward working peak unpriced for " + ", ".join(prov["working"])
                         + " (counted as what the layers keep)")
    return Output(data=data, text="\n".join(lines))
