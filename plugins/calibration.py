"""Calibration: per-op-class efficiencies fitted from measured layer times (see docs/calibration.md).

A measurement is one layer of a model, run alone at a micro-batch of
``micro_batch`` sequences of ``seq`` tokens on one device, timed forward and
forward plus backward. The time model prices the same layer with the
hardware's efficiencies; the fit changes those efficiencies as little as
possible, in log space, so that the model reproduces every measurement:

    minimize  sum_c (log e_c - log e_c_prior)^2
    subject to  model_seconds_i(e) = measured_seconds_i  for every measurement i

solved by Gauss-Newton steps on ``log(model / measured)`` with the minimum-norm
update (the Jacobian by finite differences of the time model itself, so the
fit is exact for the model as it prices, rooflines included). With more
independent measurements than classes no exact fit exists, and the update is
the least-squares one. A class no measurement exercises keeps its prior. The
measurements fitted are the consensus (:func:`_consensus`): one the fit misses
by more than a tolerance is left out and named, so a layer the time model does
not price cannot move an efficiency the others share.

The forward measurement involves only the forward classes (``matmul``,
``attention``, ``memory``, ``linrec``), the backward (forward plus backward
less forward) only the ``*_backward`` ones, so each pass is fitted on its own.
``dispatch_seconds``, the per-launch floor of a pass, is fitted beside them on
the launch-bound layers (:func:`_fit_dispatch`). The plugin registers the
method as ``calibration/min_norm_log``.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import attrs
import numpy as np

from ndcost.errors import InvalidValue
from ndcost.hookspecs import hookimpl
from ndcost.specio import read_text

FORWARD_CLASSES = ("matmul", "attention", "linrec", "memory")
BACKWARD_CLASSES = tuple(f"{c}_backward" for c in FORWARD_CLASSES)
DISPATCH = "dispatch_seconds"  # fitted beside the classes (in --classes too); launch_seconds cannot be told apart
# classes no layer measurement in the compute dtype times, moved with the class they are stated beside: the Float8
# linears' GEMMs keep their share of the fp8 peak beside the compute dtype's (compose/time.py, matmul_fp8)
MOVES_WITH = {"matmul_fp8": "matmul"}


@attrs.frozen(kw_only=True)
class Measurement:
    """One layer timed on one device: forward seconds and, where measured, forward plus backward."""

    spec: Any = attrs.field(repr=False)
    kind: str
    seq: int
    micro_batch: int = 1
    dtype: str = "bf16"
    forward_seconds: float
    forward_backward_seconds: Optional[float] = None
    label: str = ""
    runtime: str = "hf-cuda"  # what ran it: its modules, its attention kernel (SDPA, or eager where no SDPA)
    census: str = "auto"      # "auto": the census's FLOPs and traffic where a census runs here; "off": the formulas'
    work: Any = attrs.field(default=None, repr=False, eq=False)

    def model_work(self):
        """The time model's work for this layer as the resolver builds it under :attr:`runtime` (the runtime's
        attention kernel, the census's figures where one runs), built once."""
        from ndcost.resolver import resolve
        if self.work is None:
            object.__setattr__(self, "work", resolve(self.spec, runtime=self.runtime, census=self.census)
                               .model_work(self.seq))
        return self.work

    @property
    def backward_seconds(self) -> Optional[float]:
        if self.forward_backward_seconds is None:
            return None
        return self.forward_backward_seconds - self.forward_seconds


@attrs.frozen(kw_only=True)
class Fit:
    """Fitted efficiencies, the priors they moved from, and each measurement's modeled and measured seconds."""

    hardware: str
    efficiency: Mapping[str, float]
    prior: Mapping[str, float]
    fitted: Tuple[str, ...]
    rows: Tuple[Mapping[str, Any], ...]
    pinned: Tuple[str, ...] = ()
    method: str = "calibration/min_norm_log"
    left_out: Tuple[str, ...] = ()       # labels of the measurements outside the consensus (not fitted on)
    tolerance: float = 0.10              # |log(model / measured)| beyond which a measurement is left out
    rms_log_error_prior: float = 0.0     # over the passes fitted on, under the hardware's stated efficiencies
    rms_log_error_fitted: float = 0.0    # the same under the fitted ones
    launch_seconds: Tuple[float, float] = (0.0, 0.0)    # (hardware's, fitted): the GPU's floor a kernel
    dispatch_seconds: Tuple[float, float] = (0.0, 0.0)  # (hardware's, fitted): the host's per eager op
    dispatch_fitted_on: Tuple[str, ...] = ()  # labels of the launch-bound measurements dispatch was fitted on
    dispatch_note: str = ""                   # how dispatch was fitted, or why it kept the hardware's figure
    moved_with: Mapping[str, str] = attrs.field(factory=lambda: dict(MOVES_WITH))  # a class -> the class it moved with

    @property
    def change(self) -> Dict[str, float]:
        """How far each efficiency moved from the hardware's figure, as a fraction of it."""
        return {k: v / self.prior[k] - 1.0 for k, v in self.efficiency.items() if k in self.prior}

    def to_dict(self) -> Dict[str, Any]:
        return {"hardware": self.hardware, "method": self.method, "fitted": list(self.fitted),
                "pinned_by_components": list(self.pinned), "moved_with": dict(self.moved_with),
                "efficiency": dict(self.efficiency), "prior": dict(self.prior),
                "efficiency_change_fraction": self.change, "left_out": list(self.left_out),
                "tolerance": self.tolerance, "rms_log_error_prior": self.rms_log_error_prior,
                "rms_log_error_fitted": self.rms_log_error_fitted,
                "launch_seconds": self.launch_seconds[1], "launch_seconds_prior": self.launch_seconds[0],
                "dispatch_seconds": self.dispatch_seconds[1], "dispatch_seconds_prior": self.dispatch_seconds[0],
                "dispatch_fitted_on": list(self.dispatch_fitted_on), "dispatch_note": self.dispatch_note,
                "measurements": [dict(r) for r in self.rows]}

    def yaml_block(self) -> str:
        lines = ["efficiency:"] + [f"  {k}: {v:.4f}" for k, v in self.efficiency.items()]
        lines += ["kernel_tables:", f"  launch_seconds: {self.launch_seconds[1]:.3g}",
                  f"  dispatch_seconds: {self.dispatch_seconds[1]:.3g}"]
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# reading measurements
# ---------------------------------------------------------------------------
_SHAPE_WORDS = {
    "hidden_size": r"hidden\s+(\d+)", "intermediate_size": r"intermediate\s+(\d+)",
    "num_attention_heads": r"(\d+)\s+heads", "num_key_value_heads": r"(\d+)\s+KV\s+heads",
    "head_dim": r"head\s+dim\s+(\d+)",
}


def _spec_from_text(text: str, params: Optional[int]):
    """A Llama-shaped ModelSpec from a measurement's description ("hidden 4096, intermediate 14336, ...")."""
    from ndcost.layer import LayerKind
    from ndcost.values import LayerGroup, ModelSpec

    found = {}
    for name, pattern in _SHAPE_WORDS.items():
        match = re.search(pattern, text, flags=re.IGNORECASE)
        if match:
            found[name] = int(match.group(1))
    missing = [n for n in ("hidden_size", "intermediate_size", "num_attention_heads") if n not in found]
    if missing:
        raise InvalidValue("the measurement names no model and its description does not state the layer's "
                           f"{', '.join(missing)}; add \"model\": \"<name or config.json>\" to it or pass --model")
    try:  # through the llama family, so the census can rebuild the layer
        from ndcost.models import load_model
        spec = load_model({"model_type": "llama", "_name_or_path": "measured-layer", "num_hidden_layers": 1,
                           "vocab_size": 32000, **found})
    except Exception:  # no family plugin: the shape alone (priced analytically)
        spec = ModelSpec(name="measured-layer", model_type="llama", family="llama", vocab_size=32000,
                         layers=(LayerGroup(kind="dense", count=1),),
                         kind_specs={"dense": LayerKind(attention="gqa", mlp="dense")}, **found)
    if params is not None:
        from ndcost.plugins.estimators.flops import analytic_parameters
        counted = sum(analytic_parameters(spec, spec.kinds[0]).values())
        if counted != int(params):
            raise InvalidValue(f"the layer read from the measurement's description has {counted:,} parameters, "
                               f"the measurement states {int(params):,}; name its model with \"model\" or --model")
    return spec


def _hardware_of_device(device: str, registry: Any = None) -> Optional[str]:
    """A registered hardware name for a device name such as 'NVIDIA H200' (None where none matches).

    Every ``hardware/<name>`` is a candidate, the longest first (so a name
    containing another wins), compared without spaces and dashes: a third
    party's hardware is recognized as the built-ins are.
    """
    if registry is None:
        from ndcost import manager
        registry = manager.registry()
    text = device.lower().replace(" ", "").replace("-", "")
    for name in sorted(registry.names("hardware"), key=lambda n: (-len(n), n)):
        if name.replace("-", "") in text:
            return name
    return None


def _ms(entry: Mapping[str, Any], *names) -> Optional[float]:
    for name in names:
        if entry.get(name) is not None:
            value = float(entry[name])
            return value / 1000.0 if name.endswith("_ms") else value
    return None


def read_measurements(path: str, model: Any = None, kind: Optional[str] = None, census: str = "auto",
                      runtime: str = "hf-cuda") -> Tuple[List[Measurement], Optional[str], List[Mapping[str, Any]]]:
    """The layer measurements of a JSON file, the hardware it names (or None), and its components.

    The file is one measurement (the form of shared/calibration/*.json) or
    ``{"hardware": ..., "measurements": [...]}``. A measurement states
    ``seq``, ``forward_ms`` (or ``forward_seconds``), optionally
    ``forward_backward_ms`` and ``backward_ms``, ``micro_batch`` (1),
    ``dtype`` (bf16), ``kind`` (or ``kind_layer_index``), and its layer by
    ``model`` or ``config`` (anything ``ndcost.models.load_model`` takes: a
    name, a path, a config mapping); *model* overrides it. Without a model,
    the layer's shape is read from its ``what`` description. The output of
    ``benchmarks/measure_cuda.py`` (``{"device": ..., "layers": [...]}``)
    is read as it is. ``components`` (``benchmarks/bench_time.py``) are op
    classes timed alone: ``{"op_class", "flops" or "bytes", "seconds"}``.
    Each layer is priced as the resolver prices it under *runtime* (its
    attention kernel: SDPA, or eager for a model without SDPA, as Transformers
    picks); with ``census="auto"`` from the census's FLOPs and traffic where a
    census can run (the analytic figures otherwise), ``"off"`` analytically.
    """
    if not Path(path).exists():
        raise InvalidValue(f"no measurements file {path!r}")
    try:
        data = json.loads(read_text(path, "measurements file"))
    except (json.JSONDecodeError, RecursionError) as exc:
        raise InvalidValue(f"{path}: not JSON ({exc or 'nested too deeply'})") from None
    hardware = data.get("hardware") if isinstance(data, Mapping) else None
    if isinstance(data, Mapping) and "measurements" in data:
        entries = data["measurements"]
    elif isinstance(data, Mapping) and "layers" in data:  # benchmarks/measure_cuda.py's output
        entries = [e for e in data["layers"] if not isinstance(e, Mapping) or (e.get("forward_ms") is not None
                   and not (isinstance(e["forward_ms"], float) and math.isnan(e["forward_ms"])))]
        hardware = hardware or _hardware_of_device(str(data.get("device", "")))
    elif isinstance(data, list):  # a bare list of measurement objects
        entries = data
    else:
        entries = [data]
    if not isinstance(entries, list) or not entries:
        raise InvalidValue(f"{path}: expected a measurement object, a list of them or {{\"measurements\": [...]}}")
    components = list(data.get("components") or []) if isinstance(data, Mapping) else []
    for n, component in enumerate(components):
        if not isinstance(component, Mapping) or component.get("op_class") not in FORWARD_CLASSES + BACKWARD_CLASSES \
                or not component.get("seconds") or not (component.get("flops") or component.get("bytes")):
            raise InvalidValue(f"{path} component {n}: needs op_class (one of "
                               f"{', '.join(FORWARD_CLASSES + BACKWARD_CLASSES)}), seconds, and flops or bytes")
    out = []
    for n, entry in enumerate(entries):
        where = f"{path} measurement {n}"
        if not isinstance(entry, Mapping):
            raise InvalidValue(f"{where}: expected a measurement object ({{\"seq\": ..., \"forward_ms\": ...}}), "
                               f"got {type(entry).__name__} {json.dumps(entry)[:60]}")
        forward = _ms(entry, "forward_ms", "forward_seconds")
        if forward is None or entry.get("seq") is None:
            raise InvalidValue(f"{where}: needs seq and forward_ms (and forward_backward_ms to fit the backward)")
        both = _ms(entry, "forward_backward_ms", "forward_backward_seconds")
        backward = _ms(entry, "backward_ms", "backward_seconds")
        if both is None and backward is not None:
            both = forward + backward
        if both is not None and both <= forward:
            raise InvalidValue(f"{where}: forward_backward ({both * 1e3:g} ms) must exceed forward ({forward * 1e3:g} ms)")
        source = model if model is not None else (entry.get("model") or entry.get("config"))
        if source is not None:
            from ndcost.models import load_model
            spec = load_model(source)
        else:
            spec = _spec_from_text(str(entry.get("what", "")), entry.get("params"))
        layer_kind = kind or entry.get("kind")
        if layer_kind is None and entry.get("kind_layer_index") is not None:
            layer_kind = spec.layer_kinds(include_mtp=True)[int(entry["kind_layer_index"])]
        layer_kind = layer_kind or spec.kinds[0]
        if layer_kind not in spec.kinds:
            raise InvalidValue(f"{where}: {spec.name!r} has no layer kind {layer_kind!r}; kinds: {', '.join(spec.kinds)}")
        out.append(Measurement(spec=spec, kind=layer_kind, seq=int(entry["seq"]), runtime=runtime, census=census,
                               micro_batch=int(entry.get("micro_batch", 1)), dtype=str(entry.get("dtype", "bf16")),
                               forward_seconds=forward, forward_backward_seconds=both,
                               label=str(entry.get("label") or entry.get("case") or
                                         f"{spec.name}/{layer_kind}@{entry['seq']}")))
    return out, hardware, components


def pinned_efficiencies(components: Sequence[Mapping[str, Any]], hardware) -> Dict[str, float]:
    """Each component class's efficiency: its total work over the time the hardware's roof allows for it."""
    ideal: Dict[str, float] = {}
    seconds: Dict[str, float] = {}
    for c in components:
        name = c["op_class"]
        if c.get("flops"):
            ideal[name] = ideal.get(name, 0.0) + float(c["flops"]) / hardware.peak_flops(str(c.get("dtype", "bf16")))
        else:
            ideal[name] = ideal.get(name, 0.0) + float(c["bytes"]) / float(hardware.hbm_bytes_per_second)
        seconds[name] = seconds.get(name, 0.0) + float(c["seconds"])
    return {name: ideal[name] / seconds[name] for name in seconds}


# ---------------------------------------------------------------------------
# the model of a measurement, and the fit
# ---------------------------------------------------------------------------
def layer_times(measurement: Measurement, hardware, efficiency: Mapping[str, float]) -> Tuple[float, float]:
    """The time model's forward and backward seconds of a measured layer under *efficiency*."""
    from ndcost.compose import time as time_model
    from ndcost.values import Strategy

    work = measurement.model_work()
    strategy = Strategy(seq=measurement.seq, micro_batch=measurement.micro_batch, param_dtype=measurement.dtype)
    cols = time_model.strategy_columns([strategy])
    seconds = time_model.layer_seconds(work, cols, hardware, dict(efficiency))
    index = list(work.kinds).index(measurement.kind)
    return float(seconds["forward"][0, index]), float(seconds["backward"][0, index])


def fit(measurements: Sequence[Measurement], hardware, classes: Optional[Sequence[str]] = None,
        iterations: int = 50, components: Sequence[Mapping[str, Any]] = (), tolerance: float = 0.10) -> Fit:
    """Efficiencies that reproduce *measurements*, moved as little as possible (log space) from the hardware's.

    *components* pin the classes they time alone (:func:`pinned_efficiencies`)
    before the layers fit the others. The layers fitted are the consensus
    (:func:`_consensus`): a measurement the fit misses by more than
    *tolerance* (in log time) is left out and reported, so layers the time
    model does not price (launch-bound, MoE routing, ...) cannot decide an
    efficiency the others share. Unless *classes* leaves it out, ``dispatch_seconds`` is fitted on the
    launch-bound measurements among those left out (:func:`_fit_dispatch`).
    """
    from ndcost.compose import time as time_model

    if not (isinstance(tolerance, (int, float)) and 0 < tolerance < 1):
        raise InvalidValue(f"tolerance must be a number between 0 and 1 (a share of the measured time), "
                           f"got {tolerance!r}")
    stated, _ = time_model.efficiencies(hardware)
    pinned = pinned_efficiencies(components, hardware)
    prior = {**stated, **pinned}
    fit_dispatch = classes is None or DISPATCH in classes
    candidates = tuple(c for c in (classes or FORWARD_CLASSES + BACKWARD_CLASSES) if c not in pinned and c != DISPATCH)
    unknown = sorted(set(candidates) - set(FORWARD_CLASSES + BACKWARD_CLASSES))
    if unknown:
        raise InvalidValue(f"cannot fit efficiency class(es) {', '.join(unknown)}; fittable: "
                           f"{', '.join(FORWARD_CLASSES + BACKWARD_CLASSES + (DISPATCH,))}")
    # with dispatch fitted, the efficiencies' consensus is found with launches free, so a launch-bound layer is
    # left to the dispatch fit whatever figure the hardware states now (the fit reproduces itself)
    problem = _Problem(with_launch_costs(hardware, 0.0, 0.0) if fit_dispatch else hardware, prior, measurements)
    names: Tuple[str, ...] = ()
    if problem.targets and candidates:  # the classes some measurement is sensitive to
        sensitive = np.abs(problem.jacobian(np.zeros(len(candidates)), candidates)) > 1e-9
        names = tuple(c for j, c in enumerate(candidates) if sensitive[:, j].any())
    if not names and not pinned and not fit_dispatch:
        raise InvalidValue("no efficiency class affects the measured times; check the measurements' layers")
    if names:
        kept = _consensus(problem, names, iterations, tolerance)
    elif fit_dispatch:  # no efficiency fitted: the layers the hardware's own price within the tolerance
        kept = [i for i, miss in enumerate(problem.misses(np.zeros(0), ())) if miss <= tolerance]
    else:
        kept = list(range(len(measurements)))
    x = problem.solve(names, kept, iterations)
    efficiency = dict(prior)
    for name, value in zip(names, x, strict=True):
        efficiency[name] = prior[name] * math.exp(value)
    launch, dispatch = launch_costs_of(hardware)
    fitted_hardware, on_dispatch, note = hardware, [], "not fitted (--classes leaves it out)"
    if fit_dispatch:
        per_launch, on_dispatch, note = _fit_dispatch(measurements, hardware, efficiency, kept, tolerance,
                                                      max(launch, dispatch))
        fitted_hardware = with_launch_costs(hardware, min(launch, per_launch), per_launch)
        if on_dispatch:  # the efficiencies refitted under the fitted floor (it binds none of their passes)
            x = _Problem(fitted_hardware, prior, measurements).solve(names, kept, iterations)
            efficiency.update({n: prior[n] * math.exp(v) for n, v in zip(names, x, strict=True)})
    for name, base in MOVES_WITH.items():  # from the hardware's figures: a pinned base moves them too
        efficiency[name] = stated[name] * efficiency[base] / stated[base]
    too_high = {k: v for k, v in efficiency.items() if v > 1.0}
    if too_high:
        raise InvalidValue(f"the fit needs efficiencies above 1 ({', '.join(f'{k}={v:.3f}' for k, v in too_high.items())}): "
                           f"the measurements are faster than {hardware.name!r}'s peaks allow; check the hardware "
                           f"(--hardware) and that the measured layer is the one named")
    fitted_on = [measurements[i] for i in sorted(set(kept) | set(on_dispatch))]
    launch_fitted, dispatch_fitted = launch_costs_of(fitted_hardware)
    return Fit(hardware=hardware.name, efficiency=efficiency, prior=stated,
               fitted=tuple(pinned) + names + ((DISPATCH,) if on_dispatch else ()),
               rows=tuple(validation_rows(measurements, fitted_hardware, efficiency)), pinned=tuple(pinned),
               left_out=tuple(m.label for i, m in enumerate(measurements) if i not in kept and i not in on_dispatch),
               tolerance=tolerance,
               rms_log_error_prior=rms_log_error(fitted_on, hardware, stated),
               rms_log_error_fitted=rms_log_error(fitted_on, fitted_hardware, efficiency),
               launch_seconds=(launch, launch_fitted), dispatch_seconds=(dispatch, dispatch_fitted),
               dispatch_fitted_on=tuple(measurements[i].label for i in on_dispatch), dispatch_note=note)


def launch_costs_of(hardware) -> Tuple[float, float]:
    """*hardware*'s (launch_seconds, dispatch_seconds): its ``kernel_tables``' figures, else the priors."""
    from ndcost.kernels import launch_costs, parse_kernel_tables
    tables = None if hardware.kernel_tables is None else parse_kernel_tables(hardware.name, hardware.kernel_tables)
    return launch_costs(tables)[:2]


def with_launch_costs(hardware, launch_seconds: float, dispatch_seconds: float):
    """*hardware* with its ``kernel_tables`` stating these launch and dispatch seconds (the rest kept)."""
    tables = dict(hardware.kernel_tables or {})
    tables.setdefault("source", "ndcost calibrate")
    return attrs.evolve(hardware, kernel_tables={**tables, "launch_seconds": float(launch_seconds),
                                                  "dispatch_seconds": float(dispatch_seconds)})


def _fit_dispatch(measurements: Sequence[Measurement], hardware, efficiency: Mapping[str, float],
                  kept: Sequence[int], tolerance: float, prior: float) -> Tuple[float, List[int], str]:
    """The per-launch seconds of a pass, fitted on the launch-bound measurements: (seconds, their indices, how).

    A pass takes ``max(roofline, launches x max(launch_seconds, dispatch_seconds))`` (``compose/time.py``
    ``_launch_bound``), so a pass is either roofline-bound (the efficiencies price it) or launch-bound (only the
    larger of the two seconds does): the two cannot be told apart by layer timings, and the larger is fitted,
    as ``dispatch_seconds``. The candidates are the measurements the efficiency fit left out for being slower
    than their roofline (under the fitted efficiencies, launches free) by more than *tolerance*; each implies
    ``measured / launches`` (the geometric mean over its passes that slow), and one implying more than the
    fitted measurements' own ``measured / launches`` allow (their floor would then exceed them by more than
    *tolerance*) is slower for another reason. The rest are fitted on the consensus rule of
    :func:`_consensus`: from their median, those within *tolerance* kept, refitted (the geometric mean, the
    least squares in log time) until the set settles; fewer than three, or no majority, all fitted. Without
    a candidate the figure stays at *prior*. The launch counts are the model's own (the figure times the
    launches)."""
    free = with_launch_costs(hardware, 0.0, 0.0)
    unit = with_launch_costs(hardware, 0.0, 1.0)  # every pass launch-bound at one second a launch: its launches
    passes = []  # (index, measured seconds, roofline seconds, launches) of every measured pass
    for i, m in enumerate(measurements):
        roof, launches = layer_times(m, free, efficiency), layer_times(m, unit, efficiency)
        for p, seconds in ((0, m.forward_seconds), (1, m.backward_seconds)):
            if seconds is not None and launches[p] > 0:
                passes.append((i, seconds, roof[p], launches[p]))
    ceiling = min((s / n for i, s, _, n in passes if i in kept), default=math.inf) * math.exp(tolerance)
    implied: Dict[int, List[float]] = {}
    for i, seconds, roof, launches in passes:
        if i not in kept and math.log(seconds / roof) > tolerance:
            implied.setdefault(i, []).append(math.log(seconds / launches))
    alone = {i: float(np.mean(v)) for i, v in implied.items() if math.exp(np.mean(v)) <= ceiling}
    if not alone:
        return prior, [], (f"kept at {prior:.3g} s: no measurement is launch-bound (none the efficiencies leave "
                           f"more than {tolerance:.0%} slower than its roofline within {ceiling:.3g} s a launch)")
    everyone = chosen = sorted(alone)
    if len(everyone) >= 3:
        start = float(np.median([alone[i] for i in everyone]))
        for _ in range(len(everyone)):
            now = [i for i in everyone if abs(alone[i] - start) <= tolerance]
            if now == chosen:
                break
            if 2 * len(now) <= len(everyone):
                chosen = everyone
                break
            chosen = now
            start = float(np.mean([v for i in chosen for v in implied[i]]))
    logs = [v for i in chosen for v in implied[i]]
    seconds = math.exp(float(np.mean(logs)))
    return seconds, chosen, f"fitted on {len(logs)} launch-bound pass(es), at most {ceiling:.3g} s a launch"


class _Problem:
    """Each measured pass's ``log(model / measured)`` as a function of log-scaled efficiencies, and its solver."""

    _STEP = 1e-3  # finite-difference step in log efficiency

    def __init__(self, hardware, prior: Mapping[str, float], measurements: Sequence[Measurement]):
        self.hardware, self.prior, self.count = hardware, dict(prior), len(measurements)
        self.targets: List[Tuple[Measurement, int, float]] = []  # (measurement, pass 0 fwd / 1 bwd, seconds)
        self.owner: List[int] = []                              # each target's measurement index
        for i, m in enumerate(measurements):
            for p, seconds in ((0, m.forward_seconds), (1, m.backward_seconds)):
                if seconds is not None:
                    self.targets.append((m, p, seconds))
                    self.owner.append(i)

    def rows(self, kept: Sequence[int]) -> List[int]:
        return [t for t, i in enumerate(self.owner) if i in kept]

    def residuals(self, x: np.ndarray, names: Sequence[str], rows: Optional[Sequence[int]] = None) -> np.ndarray:
        eff = dict(self.prior)
        for name, value in zip(names, x, strict=True):
            eff[name] = self.prior[name] * math.exp(value)
        chosen = range(len(self.targets)) if rows is None else rows
        return np.array([math.log(layer_times(m, self.hardware, eff)[p] / seconds)
                         for m, p, seconds in (self.targets[t] for t in chosen)])

    def jacobian(self, x: np.ndarray, names: Sequence[str], rows: Optional[Sequence[int]] = None,
                 base: Optional[np.ndarray] = None) -> np.ndarray:
        r = self.residuals(x, names, rows) if base is None else base
        return np.stack([(self.residuals(x + np.eye(len(names))[j] * self._STEP, names, rows) - r) / self._STEP
                         for j in range(len(names))], axis=1)

    def solve(self, names: Sequence[str], kept: Sequence[int], iterations: int) -> np.ndarray:
        """Gauss-Newton for the minimum-norm solution on the measurements *kept*: x_new = pinv(J) (J x - r),
        the least-squares step where no exact fit exists."""
        rows = self.rows(kept)
        x = np.zeros(len(names))
        for _ in range(iterations if names and rows else 0):
            r = self.residuals(x, names, rows)
            if np.max(np.abs(r)) < 1e-12:
                break
            j = self.jacobian(x, names, rows, base=r)
            x = np.linalg.pinv(j) @ (j @ x - r)
        return x

    def misses(self, x: np.ndarray, names: Sequence[str]) -> np.ndarray:
        """Each measurement's largest ``|log(model / measured)|`` over its passes."""
        worst = np.zeros(self.count)
        for i, r in zip(self.owner, np.abs(self.residuals(x, names)), strict=True):
            worst[i] = max(worst[i], r)
        return worst


def _consensus(problem: _Problem, names: Sequence[str], iterations: int, tolerance: float) -> List[int]:
    """The measurements an efficiency fit can price together within *tolerance*: those it fits on.

    A least-squares fit on every measurement lets the few the time model cannot price (a launch-bound
    short layer, an MoE layer's routing, an eager GELU: docs/calibration.md) pull a shared efficiency
    until the layers it does price miss by 25%. So the start is robust, the median over measurements
    of the efficiencies each implies alone (classes it does not exercise aside); the measurements that
    start misses by more than *tolerance* are left out, the rest fitted, and the kept set recomputed at
    the fit until it settles. With fewer than three measurements, or no majority within *tolerance*,
    every measurement is kept (there is no consensus to tell an outlier by).
    """
    n = problem.count
    everyone = list(range(n))
    if n < 3:
        return everyone
    alone = np.full((n, len(names)), np.nan)
    for i in everyone:
        rows = problem.rows([i])
        sensitive = np.abs(problem.jacobian(np.zeros(len(names)), names, rows)).max(axis=0) > 1e-9
        alone[i, sensitive] = problem.solve(names, [i], iterations)[sensitive]
    x = np.nan_to_num(np.nanmedian(alone, axis=0)) if np.isfinite(alone).any() else np.zeros(len(names))
    kept: List[int] = []
    for _ in range(n):
        now = [i for i, miss in enumerate(problem.misses(x, names)) if miss <= tolerance]
        if now == kept:
            break
        kept = now
        if 2 * len(kept) <= n:
            return everyone
        x = problem.solve(names, kept, iterations)
    return kept


def rms_log_error(measurements: Sequence[Measurement], hardware, efficiency: Mapping[str, float]) -> float:
    """The root mean square of ``log(model / measured)`` over the measurements' passes (forward, backward)."""
    errors = []
    for m in measurements:
        fwd, bwd = layer_times(m, hardware, efficiency)
        errors.append(math.log(fwd / m.forward_seconds))
        if m.backward_seconds is not None:
            errors.append(math.log(bwd / m.backward_seconds))
    return math.sqrt(sum(e * e for e in errors) / len(errors)) if errors else 0.0


def validation_rows(measurements: Sequence[Measurement], hardware, efficiency: Mapping[str, float]
                    ) -> List[Dict[str, Any]]:
    """Each measurement's measured and modeled seconds under *efficiency*."""
    rows = []
    for m in measurements:
        fwd, bwd = layer_times(m, hardware, efficiency)
        rows.append({"label": m.label, "seq": m.seq, "micro_batch": m.micro_batch,
                     "priced_from": m.model_work().work[m.kind].source,
                     "measured_forward_seconds": m.forward_seconds, "model_forward_seconds": fwd,
                     "measured_forward_backward_seconds": m.forward_backward_seconds,
                     "model_forward_backward_seconds": fwd + bwd})
    return rows


# ---------------------------------------------------------------------------
# kernel tables (the hardware YAML's ``kernel_tables``; fitted in ndcost.plugins.kernel_tables)
# ---------------------------------------------------------------------------
def check_kernel_tables(tables: Any, owner: str) -> None:
    """Refuse *tables* unless they follow the ``kernel_tables`` schema (docs/calibration.md, "Kernel tables"):
    the time model's own rule (:func:`ndcost.kernels.parse_kernel_tables`), but ``source`` may be left out
    here (the tables a fit starts from or is building state none until written)."""
    from ndcost.kernels import parse_kernel_tables

    if isinstance(tables, Mapping) and "source" not in tables:
        tables = {**tables, "source": "not stated yet"}
    parse_kernel_tables(owner, tables)


@hookimpl
def ndcost_register(register):
    register("calibration/min_norm_log", fit)
    register("calibration/read_measurements", read_measurements)
    register("calibration/validation_rows", validation_rows)
    register("calibration/with_launch_costs", with_launch_costs)
    register("calibration/check_kernel_tables", check_kernel_tables)
    from ndcost.plugins import kernel_tables  # kernel tables fitted from measured kernels or a trace
    register("calibration/kernel_measurements", kernel_tables.read_kernel_measurements)
    register("calibration/kernel_trace", kernel_tables.read_trace)
    register("calibration/kernel_tables", kernel_tables.fit_kernel_tables)
