"""`ndcost calibrate`: fit a hardware's per-op-class efficiencies from measured layer times, or its kernel
tables from measured kernels (``--kernels``) or a torch.profiler trace (``--trace``)."""
from __future__ import annotations

HELP = ("fit a hardware's per-op-class efficiencies from measured layer times, or its kernel tables from "
        "measured kernels or a torch.profiler trace (see docs/calibration.md)")
LAYER_ONLY = ("model", "kind", "classes", "only")


def add_arguments(parser) -> None:
    parser.add_argument("measurements", metavar="MEASUREMENTS.json", nargs="*",
                        help="measured layer times, one file or several fitted together: one measurement, or "
                             "{\"hardware\": ..., \"measurements\": [...]}")
    parser.add_argument("--hardware", default=None,
                        help="hardware whose efficiencies (or kernel tables) are the priors: a name or a spec YAML "
                             "(default: the first file's, else h200)")
    parser.add_argument("--model", default=None,
                        help="the measured layer's model (name, config.json or spec YAML), where the file names none")
    parser.add_argument("--kind", default=None, help="the measured layer's kind (default: the model's first)")
    parser.add_argument("--classes", default=None,
                        help="comma-separated efficiency classes to fit (default: every class the layers exercise)")
    parser.add_argument("--only", default=None, metavar="PATTERNS",
                        help="fit only the measurements whose label matches one of these comma-separated globs "
                             "(e.g. 'llama3_8b@*,qwen3_8b@*'); the others are still shown, priced by the fit")
    parser.add_argument("--tolerance", type=float, default=0.10,
                        help="leave out of the fit a measurement it misses by more than this share of the measured "
                             "time (default 0.10): a layer the time model does not price, such as a launch-bound "
                             "short one or an MoE layer's routing, must not move an efficiency the others share")
    parser.add_argument("--census", default="auto", choices=("auto", "off"),
                        help="price each layer from the census's FLOPs and traffic (auto, where it can run) or "
                             "analytically (off)")
    parser.add_argument("--runtime", default="hf-cuda", help="the runtime profile the census runs (default hf-cuda)")
    parser.add_argument("--output", "--out", default=None, metavar="HARDWARE.yaml",
                        help="write the hardware's spec with the fitted efficiencies (or kernel tables) to this file")
    parser.add_argument("--kernels", default=None, metavar="KERNELS.json",
                        help="fit the hardware's kernel_tables from benchmarks/measure_kernels.py's JSON")
    parser.add_argument("--trace", default=None, metavar="TRACE.json",
                        help="fit the hardware's kernel_tables from a torch.profiler Chrome trace "
                             "(export_chrome_trace, recorded with record_shapes=True)")


def usage_error(args):
    if args.kernels and args.trace:
        return "give --kernels or --trace, not both"
    if args.kernels or args.trace:
        given = [f"--{name}" for name in LAYER_ONLY if getattr(args, name)]
        if args.measurements or given:
            return (f"--{'kernels' if args.kernels else 'trace'} fits kernel tables; "
                    f"{' '.join(args.measurements) or ', '.join(given)} belong(s) to a layer fit: run them apart")
    elif not args.measurements:
        return "give the measured layer times (MEASUREMENTS.json), or --kernels or --trace"
    return None


def run(args):
    import textwrap

    import attrs

    from ndcost import manager
    from ndcost.cli import Output, table

    registry = manager.registry()
    if args.kernels or args.trace:
        return _run_kernel_tables(args, registry)
    read_measurements = registry.get("calibration/read_measurements")
    measurements, components, named = [], [], None
    for path in args.measurements:
        found, hardware_named, timed_alone = read_measurements(path, model=args.model, kind=args.kind,
                                                               census=args.census, runtime=args.runtime)
        measurements += found
        components += timed_alone
        named = named or hardware_named
    hardware_name = args.hardware or named or "h200"
    if hardware_name.endswith((".yaml", ".yml")):
        from ndcost.specio import load_hardware_yaml
        hardware = load_hardware_yaml(hardware_name)
    else:
        hardware = registry.get(f"hardware/{hardware_name}")
    method = registry.get("calibration/min_norm_log")
    classes = [c.strip() for c in args.classes.split(",") if c.strip()] if args.classes else None
    shown = measurements
    if args.only:
        import fnmatch
        patterns = [p.strip() for p in args.only.split(",") if p.strip()]
        measurements = [m for m in measurements if any(fnmatch.fnmatch(m.label, p) for p in patterns)]
        if not measurements:
            from ndcost.errors import InvalidValue
            raise InvalidValue(f"--only {args.only!r} matches none of the measurements "
                               f"({', '.join(m.label for m in shown)})")
    result = method(measurements, hardware, classes=classes, components=components, tolerance=args.tolerance)
    if len(shown) != len(measurements):
        validation_rows = registry.get("calibration/validation_rows")
        fitted = registry.get("calibration/with_launch_costs")(hardware, result.launch_seconds[1],
                                                                result.dispatch_seconds[1])
        result = attrs.evolve(result, rows=tuple(validation_rows(shown, fitted, result.efficiency)))
    data = result.to_dict()
    if args.output:
        _write_hardware(hardware, result, args.output, args.measurements)
        data["written"] = args.output
    fitted_on = {m.label for m in measurements} - set(result.left_out)
    data["fitted_on"] = sorted(fitted_on)
    rows = [[k, result.prior[k], v, f"{result.change[k]:+.1%}".replace("-0.0%", "+0.0%"),
             "components" if k in result.pinned else "fitted" if k in result.fitted
             else f"with {result.moved_with[k]}" if k in result.moved_with else "prior"]
            for k, v in result.efficiency.items()]
    text = f"hardware {hardware.name}: efficiencies fitted by {result.method}\n"
    text += table(rows, ["class", "prior", "efficiency", "moved", "how"], align="lrrrl")
    (launch_prior, launch), (dispatch_prior, dispatch) = result.launch_seconds, result.dispatch_seconds
    text += (f"\ndispatch_seconds {dispatch_prior:.3g} -> {dispatch:.3g} s ({_moved(dispatch_prior, dispatch)}), "
             f"{result.dispatch_note}" + (f": {', '.join(result.dispatch_fitted_on)}" if result.dispatch_fitted_on
                                          else "") +
             f"\nlaunch_seconds {launch_prior:.3g} -> {launch:.3g} s (only the larger of the two prices a pass: "
             f"layer timings cannot tell them apart)")
    text += "\n\n" + table([[_row_label(r["label"], fitted_on, result.left_out),
                             r["measured_forward_seconds"] * 1e3, r["model_forward_seconds"] * 1e3,
                             (r["measured_forward_backward_seconds"] or float("nan")) * 1e3,
                             r["model_forward_backward_seconds"] * 1e3] for r in result.rows],
                           ["measurement", "fwd ms", "model fwd ms", "fwd+bwd ms", "model fwd+bwd ms"], align="lrrrr")
    notes = [f"fit error, root mean square of log(model / measured) over the {len(fitted_on)} measurements "
             f"fitted on: {result.rms_log_error_prior:.2%} with {hardware.name}'s efficiencies and launch costs, "
             f"{result.rms_log_error_fitted:.2%} fitted"]
    if result.left_out:
        notes.append(f"left out (the fit misses them by more than {result.tolerance:.0%}: outside what the time "
                     f"model prices, see docs/calibration.md; --tolerance to change): {', '.join(result.left_out)}")
    text += "\n\n" + "\n".join(textwrap.fill(note, 100, subsequent_indent="  ") for note in notes)
    text += "\n\nfor the hardware YAML:\n" + result.yaml_block()
    if args.output:
        text += f"\n\nwrote {args.output}"
    return Output(data=data, text=text)


def _row_label(label, fitted_on, left_out) -> str:
    return label + ("" if label in fitted_on else " (left out)" if label in left_out else " (not fitted)")


def _write_hardware(hardware, result, path, sources) -> None:
    """The hardware's spec with the fit's efficiencies and launch costs, named after the file (an estimate on it
    says whose figures); ``kernel_tables.source`` says what the launch costs were fitted on and when."""
    import datetime
    from pathlib import Path

    import yaml

    doc = {"name": Path(path).stem, "description": f"{hardware.name} calibrated: {hardware.description}",
           "memory_bytes": hardware.memory_bytes,
           "hbm_bytes_per_second": hardware.hbm_bytes_per_second,
           "peak_flops_per_second": dict(hardware.peak_flops_per_second),
           "devices_per_node": hardware.devices_per_node,
           "network": {level.name: {"bytes_per_second": level.bytes_per_second,
                                    "latency_seconds": level.latency_seconds} for level in hardware.network},
           "efficiency": {k: round(float(v), 4) for k, v in result.efficiency.items()},
           "cpu_optimizer_parameters_per_second": hardware.cpu_optimizer_parameters_per_second,
           "nvlink_domain_devices": hardware.nvlink_domain_devices, "nics_per_node": hardware.nics_per_node}
    if hardware.nvls_architecture is not None:
        doc["nvls_architecture"] = hardware.nvls_architecture
    if hardware.node_fabric != "switch":  # what a group's share of the node's links reads
        doc["node_fabric"] = hardware.node_fabric
    if hardware.compute_capability is not None:  # what a runtime's kernel choice reads
        doc["compute_capability"] = hardware.compute_capability
    if hardware.cuda_context_bytes:  # what "fits" leaves out of the memory
        doc["cuda_context_bytes"] = hardware.cuda_context_bytes
    if hardware.host_to_device_bytes_per_second is not None:
        doc["host_to_device_bytes_per_second"] = hardware.host_to_device_bytes_per_second
    if hardware.sm_count is not None:  # what prices GEMMs by shape, kept as stated
        doc["sm_count"] = hardware.sm_count
    tables = dict(hardware.kernel_tables or {})
    if result.dispatch_fitted_on:
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        tables.update(launch_seconds=float(result.launch_seconds[1]),
                      dispatch_seconds=float(result.dispatch_seconds[1]),
                      source=f"launch and dispatch fitted by ndcost calibrate on {when} from {', '.join(sources)}: "
                             f"{', '.join(result.dispatch_fitted_on)}" + (f"; {tables['source']}" if "source" in tables
                                                                          else ""))
    if tables:
        doc["kernel_tables"] = tables
    with open(path, "w") as handle:
        handle.write("# written by `ndcost calibrate`; efficiencies fitted from measured layer times\n")
        yaml.safe_dump(doc, handle, sort_keys=False)


def _run_kernel_tables(args, registry):
    """``--kernels`` / ``--trace``: the hardware's kernel tables fitted, shown against their priors, written."""
    from ndcost.cli import Output, table

    if args.kernels:
        points = registry.get("calibration/kernel_measurements")(args.kernels)
    else:
        points = registry.get("calibration/kernel_trace")(args.trace)
    hardware, current, spec = _hardware_and_tables(args.hardware or points.hardware or "h200", registry)
    fit = registry.get("calibration/kernel_tables")(points, hardware, current)
    data = fit.to_dict()
    lines = [f"hardware {hardware.name}: kernel tables fitted from {points.source}: {len(points.gemm)} matmuls, "
             f"{len(points.elementwise)} elementwise kernels, {len(points.attention)} attention kernels, timed on "
             f"{points.device}"]
    gemm_cells = [c for c in fit.cells if "m" in c]
    if gemm_cells:
        lines += ["", table([[c["dtype"], c["m"], c["n"], c["k"], c["points"], c["prior"], c["fitted"],
                              _moved(c["prior"], c["fitted"])] for c in gemm_cells],
                            ["gemm", "m", "n", "k", "points", "prior", "fitted", "moved"], align="lrrrrrrr")]
    elementwise_cells = [c for c in fit.cells if "bytes" in c]
    if elementwise_cells:
        lines += ["", table([["elementwise", c["bytes"], c["points"], c["prior"], c["fitted"],
                              _moved(c["prior"], c["fitted"])] for c in elementwise_cells],
                            ["kernels", "bytes", "points", "prior", "fitted", "moved"], align="lrrrrr")]
    attention_cells = [c for c in fit.cells if "kernel" in c]
    if attention_cells:
        lines += ["", table([[f"{c['kernel']} {c['dtype']}", c["seq"], c["heads"], c["head_dim"],
                              "yes" if c["causal"] else "no", c["points"],
                              f"{c['prior']:.3f} / {c['prior_backward']:.3f}",
                              f"{c['fitted']:.3f} / {c['fitted_backward']:.3f}"] for c in attention_cells],
                            ["attention", "seq", "heads", "head_dim", "causal", "points", "prior fwd / bwd",
                             "fitted fwd / bwd"], align="lrrrlrrr")]
    lines.append("")
    for key, s in fit.scalars.items():
        prior = "none" if s["prior"] is None else f"{s['prior']:.3g} s"
        now = "none" if s["fitted"] is None else f"{s['fitted']:.3g} s"
        lines.append(f"{key}: {prior} -> {now} (from {s['samples']} sample(s))")
    for what, e in fit.errors.items():
        lines.append(f"fit error on the {e['points']} {what} points, root mean square of log(model / measured): "
                     f"{e['rms_log_error_prior']:.2%} before, {e['rms_log_error_fitted']:.2%} fitted")
    if fit.points.skipped:
        lines.append("passed over: " + ", ".join(f"{n} {why}" for why, n in fit.points.skipped.items()))
    if args.output:
        _write_kernel_tables(spec, hardware, fit.tables, args.output, registry.get("calibration/check_kernel_tables"))
        data["written"] = args.output
        lines.append(f"wrote {args.output}")
    return Output(data=data, text="\n".join(lines))


def _moved(prior: float, fitted: float) -> str:
    return f"{fitted / prior - 1:+.1%}".replace("-0.0%", "+0.0%")


def _hardware_and_tables(name: str, registry):
    """The hardware, its current kernel tables (a mapping or None) and its spec as a mapping (its file's,
    where *name* is a YAML path, so a written file keeps every field)."""
    from collections.abc import Mapping

    import attrs

    from ndcost.specio import hardware_from_mapping, load_yaml, read_text

    if name.endswith((".yaml", ".yml")):
        spec = load_yaml(read_text(name, "hardware spec"), where=f"hardware spec {name}")
        if not isinstance(spec, Mapping):
            hardware_from_mapping(spec, where=name)  # refuses it, saying what a spec holds
        spec = dict(spec)
        current = spec.pop("kernel_tables", None)  # read here, so a file holding them loads before Hardware knows them
        return hardware_from_mapping(spec, where=name), current, spec
    hardware = registry.get(f"hardware/{name}")
    current = getattr(hardware, "kernel_tables", None)
    if current is not None and attrs.has(type(current)):
        current = attrs.asdict(current)
    spec = {}
    for field in attrs.fields(type(hardware)):
        value = getattr(hardware, field.name)
        if field.name == "kernel_tables" or value is None:
            continue
        if field.name == "network":
            value = {level.name: {"bytes_per_second": level.bytes_per_second,
                                  "latency_seconds": level.latency_seconds} for level in value}
        spec[field.name] = dict(value) if hasattr(value, "items") else value
    return hardware, current, spec


def _write_kernel_tables(spec, hardware, tables, path, check_kernel_tables) -> None:
    """*spec* with *tables* as its ``kernel_tables``, named after the file; checked by reading it back."""
    from pathlib import Path

    import yaml

    from ndcost.specio import hardware_from_mapping, load_yaml

    doc = dict(spec, name=Path(path).stem,
               description=f"{hardware.name} with kernel tables fitted: {spec.get('description', '')}".rstrip(": "),
               kernel_tables=dict(tables))
    text = ("# written by `ndcost calibrate`; kernel_tables fitted from measured kernels (docs/calibration.md)\n"
            + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=120))
    back = load_yaml(text, where=path)
    check_kernel_tables(back.pop("kernel_tables"), f"hardware spec {path}")
    hardware_from_mapping(back, where=path)
    with open(path, "w") as handle:
        handle.write(text)
