"""The formulas beside the census, and the parameter count beside Transformers' own model: ``ndcost verify``.

A model author shipping a family plugin checks it here: for every layer kind
(and the output layer), each figure the formulas give (the family's parameter
count, the op records' activation bytes, the analytic FLOPs and traffic)
beside what the census measures running Transformers' modules on fake tensors
(and Transformers' parameters, built on the meta device). A difference above
the threshold is flagged with both figures: any difference in parameters
(counts are exact), more than :data:`DEFAULT_THRESHOLD` of the census's figure
elsewhere. Where the census cannot run (no torch, a model type Transformers
lacks, a kind the runtime does not build) each row says so instead of failing.

Both sides are reached through the registry (``census/kind_records``,
``census/output_record``, ``census/module_parameters``,
``estimator/activations/op_records``, ``estimator/flops/analytic`` and
``estimator/flops/census``), so a third party's override is what is checked.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import attrs

from ndcost import manager, models
from ndcost.errors import InvalidValue, NdcostError
from ndcost.records import routed_in_record
from ndcost.values import OPS, PARTS, ModelSpec
from ndcost.work import as_run

__all__ = ["verify", "Verification", "VerifyRow", "DEFAULT_THRESHOLD"]

# Bytes and FLOPs within 2% of the census are taken to agree; parameters must match exactly.
DEFAULT_THRESHOLD = 0.02

# KindRecord fields compared: (field, unit); the selective ones under the runtime's checkpoint policy.
_SELECTIVE_FIELDS = ("selective_per_token", "selective_tp_per_token", "recomputed_attention_mm_share",
                     "recomputed_other_mm_share", "recomputed_scores_share")
_RECORD_FIELDS = tuple((name, "bytes/token") for name in ("saved_per_token", "saved_tp_per_token", "working_per_token",
                                                          "working_tp_per_token") + _SELECTIVE_FIELDS[:2]) + tuple(
    (name, "share of the forward's FLOPs") for name in _SELECTIVE_FIELDS[2:])
# KindWork fields compared: (quantity, field, unit).
_WORK_FIELDS = (("flops.attention_mm_per_token", "attention_mm_flops_per_token", "FLOPs/token"),
                ("flops.other_mm_per_token", "other_mm_flops_per_token", "FLOPs/token"),
                ("flops.routed_mm_per_token", "routed_mm_flops_per_token", "FLOPs/token"),
                ("flops.score_per_pair", "score_flops_per_pair", "FLOPs/pair"),
                ("flops.linrec_per_token", "linrec_flops_per_token", "FLOPs/token"),
                ("traffic.elementwise_per_token", "elementwise_elements_per_token", "elements/token"),
                ("traffic.replicated_per_token", "replicated_elements_per_token", "elements/token"),
                # of the above, what autograd records no backward for (KindWork.forward_only_*)
                ("forward_only.attention_mm_per_token", "forward_only_attention_mm_flops_per_token", "FLOPs/token"),
                ("forward_only.other_mm_per_token", "forward_only_other_mm_flops_per_token", "FLOPs/token"),
                ("forward_only.routed_mm_per_token", "forward_only_routed_mm_flops_per_token", "FLOPs/token"),
                ("forward_only.score_per_pair", "forward_only_score_flops_per_pair", "FLOPs/pair"),
                ("forward_only.linrec_per_token", "forward_only_linrec_flops_per_token", "FLOPs/token"),
                ("forward_only.elementwise_per_token", "forward_only_elementwise_elements_per_token",
                 "elements/token"),
                ("forward_only.replicated_per_token", "forward_only_replicated_elements_per_token", "elements/token"))


@attrs.frozen(kw_only=True)
class VerifyRow:
    """One figure of one kind: the formulas' and the census's, and whether they diverge beyond the threshold.

    ``census`` is the census's measurement, or for ``parameters.*`` the count
    of Transformers' model on the meta device. ``relative_difference`` is
    ``(formula - census) / census``; None where either figure is missing
    (``note`` says why) or the census's is 0. ``flagged`` where both are
    present and differ by more than ``threshold`` (0 for parameters: any
    difference), or the census's is 0 and the formulas' is not.
    """

    kind: str
    quantity: str
    unit: str
    formula: Optional[float]
    census: Optional[float]
    relative_difference: Optional[float]
    threshold: float
    flagged: bool
    note: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class Verification:
    """Every row of a model's verification at one sequence length under one runtime."""

    model: str
    seq: int
    runtime: str
    threshold: float
    rows: Tuple[VerifyRow, ...]

    @property
    def flagged(self) -> Tuple[VerifyRow, ...]:
        return tuple(row for row in self.rows if row.flagged)

    def to_dict(self) -> Dict[str, Any]:
        return {"model": self.model, "seq": self.seq, "runtime": self.runtime, "threshold": self.threshold,
                "parameter_threshold": 0, "flagged": len(self.flagged), "rows": [r.to_dict() for r in self.rows]}


def _row(kind: str, quantity: str, unit: str, formula: Optional[float], census: Optional[float],
         threshold: float, note: str = "") -> VerifyRow:
    if formula is None or census is None:
        rel, flagged = None, False
    elif census == 0:
        rel, flagged = None, formula != 0
        if flagged:
            note = note or "the census measures 0"
    else:
        rel = (formula - census) / abs(census)
        flagged = formula != census if threshold == 0 else abs(rel) > threshold
    return VerifyRow(kind=kind, quantity=quantity, unit=unit, formula=formula, census=census,
                     relative_difference=rel, threshold=threshold, flagged=flagged, note=note)


def _attempt(call: Callable[[], Any]) -> Tuple[Any, str]:
    """``(call(), "")``, or ``(None, why)`` where the census side cannot run here."""
    try:
        return call(), ""
    except ImportError as exc:
        return None, f"the census needs torch and transformers (pip install 'ndcost[census]'): {exc}"
    except NdcostError as exc:
        return None, " ".join(str(exc).split())
    except Exception as exc:  # Transformers refusing a config: reported on the rows, never a failed verification
        return None, f"{type(exc).__name__}: {' '.join(str(exc).split())}"


# ---------------------------------------------------------------------------
# parameters
# ---------------------------------------------------------------------------
def _parameter_rows(spec: ModelSpec, count: Any, registry: Any) -> List[VerifyRow]:
    config = {**dict(spec.hf_config), "model_type": spec.hf_config.get("model_type", spec.model_type)}
    read, why = _attempt(lambda: registry.get("census/module_parameters")(config))
    order = spec.layer_kinds(include_mtp=False)
    if read is not None and len(read["layers"]) != len(order):
        why = f"Transformers' model has {len(read['layers'])} decoder layers, the spec {len(order)}"
        read = None
    rows = []
    mtp_kinds = {g.kind for g in spec.layers if g.mtp}
    for kind in spec.kinds:
        ours = dict(count.by_kind[kind])
        theirs: Optional[Dict[str, int]] = None
        note = why
        if read is not None:
            if kind in mtp_kinds and kind not in order:
                note = "Transformers builds no MTP layer"
            else:
                at = [i for i, k in enumerate(order) if k == kind]
                theirs = {p: int(v) for p, v in read["layers"][at[0]].items()}
                differ = [i for i in at if read["layers"][i] != read["layers"][at[0]]]
                if differ:
                    note = (f"Transformers' layers {', '.join(map(str, differ))} of this kind differ from its "
                            f"first, layer {at[0]}, the one compared here (parameters.total counts them all)")
        for part in [p for p in PARTS if p in ours or (theirs and p in theirs)]:
            rows.append(_row(kind, f"parameters.{part}", "parameters", ours.get(part, 0),
                             None if theirs is None else theirs.get(part, 0), 0, note))
        rows.append(_row(kind, "parameters.layer", "parameters", sum(ours.values()),
                         None if theirs is None else sum(theirs.values()), 0, note))
    for part in ("embedding", "head", "final_norm", "other"):
        ours_n = int(getattr(count, part))
        theirs_n = None if read is None else int(read[part])
        if ours_n or theirs_n:
            rows.append(_row("model", f"parameters.{part}", "parameters", ours_n, theirs_n, 0, why))
    total = None if read is None else int(sum(sum(p.values()) for p in read["layers"]) + read["embedding"]
                                          + read["head"] + read["final_norm"] + read["other"])
    rows.append(_row("model", "parameters.total", "parameters", int(count.total), total, 0, why))
    return rows


# ---------------------------------------------------------------------------
# activations, FLOPs and traffic
# ---------------------------------------------------------------------------
# A MoE kind's saved rows with the routed experts' bytes taken out of each side where that side files them
# (ndcost.records.routed_in_record): the composition prices those from the op records for both, scaled by
# moe_imbalance and etp, and takes the rest of each record as it is.
_ROUTED_APART = {"saved_per_token": ("saved_less_routed_per_token", 0),
                 "saved_tp_per_token": ("saved_less_routed_tp_per_token", 1)}


def _record_rows(kind: str, ours: Any, theirs: Any, threshold: float, ours_why: str,
                 theirs_why: str, selective_why: str = "", routed: Optional[Tuple[float, float]] = None
                 ) -> List[VerifyRow]:
    """The record's rows; *selective_why* is why the formulas state no selective figure, where they do not;
    *routed* a MoE kind's routed experts' bytes a token, all and their width's part (the saved rows then leave
    them out: :data:`_ROUTED_APART`)."""
    rows = []
    for name, unit in _RECORD_FIELDS:
        f = None if ours is None else getattr(ours, name)
        c = None if theirs is None else getattr(theirs, name)
        note = ours_why if ours is None else (theirs_why if theirs is None else "")
        if routed is not None and name in _ROUTED_APART:
            name, at = _ROUTED_APART[name]
            f = None if f is None else f - routed_in_record(False, *routed)[at]
            c = None if c is None else c - routed_in_record(True, *routed)[at]
            note = note or ("the routed experts' bytes apart, as the composition takes them from the op records "
                            "for both sides (the census files their width's part under TP)")
        if f is None and c is None:
            continue  # neither side states it (the output layer's selective figure)
        if ours is not None and f is None:
            note = note or (selective_why if name in _SELECTIVE_FIELDS else "") or "the formulas state no figure"
        if theirs is not None and c is None:
            note = note or "the census states no figure"
        rows.append(_row(kind, name, unit, f, c, threshold, note))
    for name in ("ops", "ops_tp"):
        f_ops = {} if ours is None else dict(getattr(ours, name))
        c_ops = {} if theirs is None else dict(getattr(theirs, name))
        for op in [o for o in OPS if o in f_ops or o in c_ops]:
            f = None if ours is None else float(f_ops.get(op, 0.0))
            c = None if theirs is None else float(c_ops.get(op, 0.0))
            if f == 0 and c == 0:
                continue
            note = ours_why if ours is None else (theirs_why if theirs is None else "")
            rows.append(_row(kind, f"{name}.{op}", "bytes/token", f, c, threshold, note))
    # what the layer saves of the tensors its model hands every layer (the stage's, counted once there)
    f_shared = {} if ours is None else dict(ours.shared_saved_per_token)
    c_shared = {} if theirs is None else dict(theirs.shared_saved_per_token)
    for handed in sorted(set(f_shared) | set(c_shared)):
        f = None if ours is None else float(f_shared.get(handed, 0.0))
        c = None if theirs is None else float(c_shared.get(handed, 0.0))
        note = ours_why if ours is None else (theirs_why if theirs is None else "")
        rows.append(_row(kind, f"shared_saved_per_token.{handed}", "bytes/token", f, c, threshold, note))
    return rows


def _work_rows(kind: str, seq: int, ours: Any, theirs: Any, threshold: float, ours_why: str,
               theirs_why: str) -> List[VerifyRow]:
    rows = []
    note = ours_why if ours is None else (theirs_why if theirs is None else "")
    for quantity, name, unit in _WORK_FIELDS:
        f = None if ours is None else float(getattr(ours, name))
        c = None if theirs is None else float(getattr(theirs, name))
        if not f and not c:
            continue  # neither side has this op class (a dense kind's routed matmuls)
        rows.append(_row(kind, quantity, unit, f, c, threshold, note))
    f = None if ours is None else float(ours.forward_flops(seq))
    c = None if theirs is None else float(theirs.forward_flops(seq))
    rows.append(_row(kind, "flops.forward", f"FLOPs/sequence of {seq}", f, c, threshold, note))
    return rows


def verify(model: Any, seq: int = 4096, runtime: str = "hf-cuda", threshold: float = DEFAULT_THRESHOLD,
           use_cache: bool = True) -> Verification:
    """The formulas beside the census for every kind of *model* at *seq* tokens under *runtime* (see module)."""
    if isinstance(seq, bool) or not isinstance(seq, int) or seq < 1:
        raise InvalidValue(f"verify: seq must be a positive number of tokens, got {seq!r}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold < 1:
        raise InvalidValue(f"verify: threshold must be a fraction in [0, 1) (0.02 is 2%), got {threshold!r}")
    registry = manager.registry()
    registry.get(f"runtime/{runtime}")  # an unknown runtime is refused with the known names
    spec = models.load_model(model)
    count = models.parameters(spec)
    rows = _parameter_rows(spec, count, registry)

    formulas = registry.get("estimator/activations/op_records")
    analytic, measured = registry.get("estimator/flops/analytic"), registry.get("estimator/flops/census")
    census_kinds, census_why = _attempt(functools.partial(registry.get("census/kind_records"), spec, seq,
                                                          runtime=runtime, use_cache=use_cache))
    census_output, output_why = _attempt(functools.partial(registry.get("census/output_record"), spec, seq,
                                                           runtime=runtime, use_cache=use_cache))
    kernel, _ = _attempt(functools.partial(formulas.attention_kernel, spec, runtime))
    family = models.family_for(spec.model_type)
    ours_works: Dict[str, Any] = {}
    theirs_works: Dict[str, Any] = {}
    formula_output = None
    for kind in spec.kinds:
        got, ours_why = _attempt(functools.partial(formulas.records, spec, [kind], seq, runtime))
        ours = got[0][kind] if got is not None else None
        if got is not None:
            formula_output = got[1]
        theirs, theirs_why = None, census_why
        if census_kinds is not None:
            theirs = census_kinds.get(kind)
            if theirs is None:
                theirs_why = f"the census measured no layer of this kind (runtime {runtime} builds none)"
        selective_why = "" if ours is None else (formulas.selective_unpriced(spec, kind, runtime) or "")
        routed, _ = _attempt(functools.partial(formulas.routed_bytes, spec, kind, seq, runtime))
        rows += _record_rows(kind, ours, theirs, threshold, ours_why, theirs_why, selective_why,
                             routed if routed and routed[0] else None)
        by_part = count.by_kind.get(kind)
        work_ours, work_ours_why = _attempt(functools.partial(analytic.kind_work, spec, kind, seq, ours, by_part))
        if work_ours is not None:  # as the resolver prices it, the pairs the runtime's kernel computes
            work_ours = as_run(work_ours, spec, kind, kernel, seq, family.kernel_launches if family is not None else {})
            if kernel == "eager" and work_ours.has_attention:
                work_ours = work_ours.every_pair(seq)  # as the time model prices eager attention
        work_theirs, work_theirs_why = (None, theirs_why) if theirs is None else _attempt(
            functools.partial(measured.kind_work, spec, kind, seq, theirs, by_part))
        if work_ours is not None:
            ours_works[kind] = work_ours
        if work_theirs is not None:
            theirs_works[kind] = work_theirs
        rows += _work_rows(kind, seq, work_ours, work_theirs, threshold, work_ours_why, work_theirs_why)
    rows += _record_rows("output", formula_output, census_output, threshold,
                         "" if formula_output is not None else "the formulas priced no kind", output_why)
    rows += _output_work_rows(spec, seq, count, analytic, formula_output, census_output, ours_works,
                              theirs_works, threshold, output_why)
    return Verification(model=spec.name, seq=seq, runtime=runtime, threshold=float(threshold), rows=tuple(rows))


def _output_work_rows(spec: ModelSpec, seq: int, count: Any, analytic: Any, formula_output: Any,
                      census_output: Any, ours_works: Mapping[str, Any], theirs_works: Mapping[str, Any],
                      threshold: float, output_why: str) -> List[VerifyRow]:
    """The head's FLOPs and the loss's elementwise bytes, analytic beside the census's output layer."""
    works = {**theirs_works, **ours_works}  # the head's figures do not depend on them, but a ModelWork needs each
    if len(works) != len(spec.kinds):
        return []  # a kind neither side priced: its rows say why
    ours, _ = _attempt(lambda: analytic.model_work(spec, seq, {}, count, works))
    theirs, why = (None, output_why) if census_output is None else _attempt(lambda: analytic.model_work(
        spec, seq, {"output": census_output}, count, works))
    if ours is None:
        return []
    rows = [_row("output", "flops.head_per_token", "FLOPs/token", float(ours.head_flops_per_token),
                 None if theirs is None else float(theirs.head_flops_per_token), threshold, why)]
    if theirs is not None and theirs.loss_bytes_per_token is not None:
        rows.append(_row("output", "traffic.loss_bytes_per_token", "bytes/token", ours.loss_bytes_per_token,
                         float(theirs.loss_bytes_per_token), threshold,
                         "the formulas state no loss traffic (the time model prices it analytically)"
                         if ours.loss_bytes_per_token is None else ""))
    return rows
