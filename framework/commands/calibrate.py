"""`ndcost calibrate`: fit a hardware's per-op-class efficiencies from measured layer times."""
from __future__ import annotations

HELP = "fit a hardware's per-op-class efficiencies from measured layer times (see docs/calibration.md)"


def add_arguments(parser) -> None:
    parser.add_argument("measurements", metavar="MEASUREMENTS.json", nargs="+",
                        help="measured layer times, one file or several fitted together: one measurement, or "
                             "{\"hardware\": ..., \"measurements\": [...]}")
    parser.add_argument("--hardware", default=None,
                        help="hardware whose efficiencies are the priors (default: the first file's, else h200)")
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
    parser.add_argument("--output", default=None, metavar="HARDWARE.yaml",
                        help="write the hardware's spec with the fitted efficiencies to this file")


def run(args):
    import textwrap

    import attrs

    from ndcost import manager
    from ndcost.cli import Output, table

    registry = manager.registry()
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
        result = attrs.evolve(result, rows=tuple(validation_rows(shown, hardware, result.efficiency)))
    data = result.to_dict()
    if args.output:
        _write_hardware(hardware, result.efficiency, args.output)
        data["written"] = args.output
    fitted_on = {m.label for m in measurements} - set(result.left_out)
    data["fitted_on"] = sorted(fitted_on)
    rows = [[k, result.prior[k], v, f"{result.change[k]:+.1%}".replace("-0.0%", "+0.0%"),
             "components" if k in result.pinned else "fitted" if k in result.fitted else "prior"]
            for k, v in result.efficiency.items()]
    text = f"hardware {hardware.name}: efficiencies fitted by {result.method}\n"
    text += table(rows, ["class", "prior", "efficiency", "moved", "how"], align="lrrrl")
    text += "\n\n" + table([[_row_label(r["label"], fitted_on, result.left_out),
                             r["measured_forward_seconds"] * 1e3, r["model_forward_seconds"] * 1e3,
                             (r["measured_forward_backward_seconds"] or float("nan")) * 1e3,
                             r["model_forward_backward_seconds"] * 1e3] for r in result.rows],
                           ["measurement", "fwd ms", "model fwd ms", "fwd+bwd ms", "model fwd+bwd ms"], align="lrrrr")
    notes = [f"fit error, root mean square of log(model / measured) over the {len(fitted_on)} measurements "
             f"fitted on: {result.rms_log_error_prior:.2%} with {hardware.name}'s efficiencies, "
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


def _write_hardware(hardware, efficiency, path) -> None:
    """The hardware's spec with *efficiency*, named after the file (an estimate on it says whose figures)."""
    from pathlib import Path

    import yaml

    doc = {"name": Path(path).stem, "description": f"{hardware.name} calibrated: {hardware.description}",
           "memory_bytes": hardware.memory_bytes,
           "hbm_bytes_per_second": hardware.hbm_bytes_per_second,
           "peak_flops_per_second": dict(hardware.peak_flops_per_second),
           "devices_per_node": hardware.devices_per_node,
           "network": {level.name: {"bytes_per_second": level.bytes_per_second,
                                    "latency_seconds": level.latency_seconds} for level in hardware.network},
           "efficiency": {k: round(float(v), 4) for k, v in efficiency.items()},
           "cpu_optimizer_parameters_per_second": hardware.cpu_optimizer_parameters_per_second,
           "nvlink_domain_devices": hardware.nvlink_domain_devices, "nics_per_node": hardware.nics_per_node}
    if hardware.nvls_architecture is not None:
        doc["nvls_architecture"] = hardware.nvls_architecture
    if hardware.host_to_device_bytes_per_second is not None:
        doc["host_to_device_bytes_per_second"] = hardware.host_to_device_bytes_per_second
    with open(path, "w") as handle:
        handle.write("# written by `ndcost calibrate`; efficiencies fitted from measured layer times\n")
        yaml.safe_dump(doc, handle, sort_keys=False)
