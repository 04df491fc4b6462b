"""Activation estimators: what each layer kind keeps for the backward, as KindRecords.

Registered as ``estimator/activations/<name>``; the resolver asks each kind's
family which it prefers (:meth:`ndcost.models.Family.activation_estimators`)
and takes the first that is available, writing the choice and the reasons for
the ones passed over into the provenance.

- ``census``: measured on fake tensors under the runtime's kernel contracts, one
  layer at a time (:mod:`ndcost.plugins.census`; needs torch and transformers,
  ``pip install ndcost[census]``);
- ``stack_census``: the same over the whole stack, for families whose layers
  cannot run alone (DeepSeek-V4's hyper-connected streams);
- ``op_records``: the op records' formulas (:mod:`ndcost.plugins.op_records`)
  under the runtime's attention kernel, with the analytic output layer.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import attrs

from ndcost.errors import NdcostError
from ndcost.hookspecs import hookimpl
from ndcost.records import KindRecord
from ndcost.values import ModelSpec

Records = Tuple[Dict[str, KindRecord], Optional[KindRecord]]


def _registry():
    from ndcost import manager
    return manager.registry()


def _family(spec: ModelSpec) -> Any:
    return _registry().find(f"family/{spec.model_type}")


def _census_missing() -> Optional[str]:
    """Why the census cannot run here (its extra is not installed), or None."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        return (f"the census needs {' and '.join(missing)}, which are not installed "
                f"(pip install 'ndcost[census]')")
    return None


@attrs.frozen(kw_only=True)
class CensusActivations:
    """One layer of each kind measured alone (cached on disk: a cached model needs no torch)."""

    name: str = "census"
    stack: bool = False
    needs_census: bool = True
    description: str = "census: measured on fake tensors under the runtime's kernel contracts, one layer at a time"

    def available(self, spec: ModelSpec, runtime: Optional[str]) -> Optional[str]:
        if runtime is None:
            return "no runtime profile says which kernels run"
        stacked = bool(getattr(_family(spec), "stack_census", False))
        if stacked and not self.stack:
            return f"the {spec.model_type} family's layers cannot be measured one at a time (a stack census can)"
        if self.stack and not stacked:
            return f"the {spec.model_type} family's layers run alone (the one-layer census measures them)"
        return None

    def records(self, spec: ModelSpec, kinds: Sequence[str], seq: int, runtime: str) -> Records:
        from ndcost.plugins import census
        quiet = {"progress": None} if _census_missing() else {}  # a cache hit needs no torch; a miss fails quietly
        try:
            measured = dict(census.kind_records(spec, seq, runtime=runtime, **quiet))
        except ImportError as exc:  # a cache miss without the census extra
            raise _unavailable(exc) from None
        missing = [k for k in kinds if k not in measured]
        if missing:
            from ndcost.errors import CensusUnavailable
            raise CensusUnavailable(f"the census measured no layer of kind(s) {', '.join(missing)}")
        return {k: measured[k] for k in kinds}, census.output_record(spec, seq, runtime, **quiet)


def _unavailable(exc: Exception) -> NdcostError:
    from ndcost.errors import CensusUnavailable
    return CensusUnavailable(_census_missing() or f"{type(exc).__name__}: {exc}")


def analytic_output_record(spec: ModelSpec, seq: int, overrides: Optional[Mapping[str, Any]] = None) -> KindRecord:
    """The output layer where no census measured it: final norm, head, Transformers' fp32 loss (bf16 run).

    Kept per token: what the final norm keeps (``norm_bytes`` an element and
    ``norm_row_bytes`` a token, the family's, see specs/op_records.yaml: 6 h + 4
    for LlamaRMSNorm), the head's 16-bit input (``2 h``), the loss's int64 shifted
    labels (8: ForCausalLMLoss pads and shifts them, a new tensor nll_loss keeps)
    and its fp32 log-softmax (``4 V``, the part a vocabulary-parallel loss
    splits). The backward peaks inside the log-softmax's backward: the norm's and
    the head's saves, its kept output, the incoming fp32 gradient and the fp32
    gradient it makes (``4 V + 4 V + 4 V``); the logits' 16-bit gradient comes
    after the kept output is freed. The census of Transformers' loss measures the
    same ``12 V`` (a Llama at 2048 tokens). Left out: the loss's scalars (bytes a
    sequence, not a token).
    """
    from ndcost.plugins import op_records
    values = op_records.Values({**op_records.family_values(spec), **(overrides or {})}, op_records.load_op_records(),
                               label=f"model {spec.name!r} output layer")
    h, vocab = spec.hidden_size, spec.vocab_size
    norm_and_head = (values["norm_bytes"] + values["bytes_act"]) * h + values["norm_row_bytes"]
    return KindRecord(kind="output", seq=int(seq), source="analytic output layer (ndcost.plugins.estimators)",
                      saved_per_token=float(norm_and_head + 8), saved_tp_per_token=float(4 * vocab),
                      working_per_token=float(norm_and_head), working_tp_per_token=float(12 * vocab))


@attrs.frozen(kw_only=True)
class OpRecordsActivations:
    """The op records' formulas, under the attention kernel the runtime runs for the model."""

    name: str = "op_records"
    needs_census: bool = False
    description: str = "formulas: the op records' bytes (specs/op_records.yaml) under the runtime's attention kernel"

    def available(self, spec: ModelSpec, runtime: str) -> Optional[str]:
        return None

    def attention_kernel(self, spec: ModelSpec, runtime: Optional[str]) -> str:
        """The kernel the formulas price: the runtime's (its SDPA fallback where the family refuses SDPA);
        without a runtime profile, eager, as the published formulas assume."""
        from ndcost.plugins import op_records
        profile = None if runtime is None else _registry().find(f"runtime/{runtime}")
        return op_records.runtime_attention(spec, profile)

    def repeats_kv(self, spec: ModelSpec, runtime: Optional[str]) -> bool:
        """Whether the runtime's attention takes keys and values repeated to every query head."""
        from ndcost.plugins import op_records
        profile = None if runtime is None else _registry().find(f"runtime/{runtime}")
        return op_records.runtime_repeats_kv(spec, profile)

    def _overrides(self, spec: ModelSpec, runtime: Optional[str]) -> Dict[str, int]:
        if runtime is None:  # the published formulas' eager attention: Megatron's softmax in the compute dtype
            return {"softmax_upcast": 0}
        from ndcost.plugins import op_records
        profile = _registry().find(f"runtime/{runtime}")
        out = {"kv_repeated": 1} if self.repeats_kv(spec, runtime) else {}
        if not op_records.runtime_eager_linear_rule(spec, profile):
            out["linrec_eager"] = 0
        return out

    @staticmethod
    def _policy(runtime: Optional[str]) -> Tuple[str, Any]:
        """The runtime's selective checkpoint policy: its name, and the policy (None where unregistered); no
        runtime: ``("", None)``, the records' own selective mode."""
        if runtime is None:
            return "", None
        name = _registry().get(f"runtime/{runtime}").selective_policy
        return name, _registry().find(f"checkpoint_policy/{name}")

    def records(self, spec: ModelSpec, kinds: Sequence[str], seq: int, runtime: str,
                values: Optional[Mapping[str, Any]] = None) -> Records:
        """The kinds' and the output layer's records; *values* set op-record values over the runtime's
        (``bytes_act`` 4: fp32 activations)."""
        from ndcost.plugins import op_records
        kernel, overrides = self.attention_kernel(spec, runtime), self._overrides(spec, runtime)
        policy = self._policy(runtime)[1]
        profile = None if runtime is None else _registry().find(f"runtime/{runtime}")
        fused = {k: op_records.runtime_values(spec, k, profile) for k in kinds}  # the runtime's fused modules'
        norm = {name: value for name, value in op_records.runtime_values(spec, spec.kinds[0], profile).items()
                if name.startswith("norm")}  # the final norm's
        given = dict(values or {})
        return ({k: op_records.formula_record(spec, k, seq, attention=kernel,
                                              overrides={**overrides, **fused[k], **given}, policy=policy)
                 for k in kinds},
                analytic_output_record(spec, seq, {**norm, **given}))

    def widening(self, spec: ModelSpec, kinds: Sequence[str], seq: int,
                 runtime: str) -> Tuple[Dict[str, Tuple[float, float]], Tuple[float, float]]:
        """Per kind, and for the output layer, the ratios of the bytes a token kept with 4-byte activations
        to those with 2-byte ones (``bytes_act``): the part beside the sequence, the part split by TP (1 where
        none is kept). What the formulas keep in a fixed dtype (fp32 statistics, int64 labels) does not grow; a
        norm's 16-bit tensor does (``norm_bytes`` + 2, up to an fp32 input and an fp32 normalized tensor: 8)."""
        from ndcost.plugins import op_records
        profile = None if runtime is None else _registry().find(f"runtime/{runtime}")
        norm_bytes = op_records.values_for(spec, spec.kinds[0], seq=seq, overrides=op_records.runtime_values(
            spec, spec.kinds[0], profile))["norm_bytes"]
        narrow, narrow_out = self.records(spec, kinds, seq, runtime)
        wide, wide_out = self.records(spec, kinds, seq, runtime,
                                      values={"bytes_act": 4, "norm_bytes": min(float(norm_bytes) + 2.0, 8.0)})

        def ratios(a: KindRecord, b: KindRecord) -> Tuple[float, float]:
            return tuple(float(getattr(b, f)) / float(getattr(a, f)) if getattr(a, f) else 1.0  # type: ignore[return-value]
                         for f in ("saved_per_token", "saved_tp_per_token"))

        return {k: ratios(narrow[k], wide[k]) for k in kinds}, ratios(narrow_out, wide_out)

    def selective_unpriced(self, spec: ModelSpec, kind: str, runtime: Optional[str]) -> Optional[str]:
        """Why the formulas give *kind* no figure under the runtime's selective policy, or None.

        The records price recomputing the attention core (a policy of scope
        ``core_attention``, or no runtime) for every kind, and an op-level
        policy where they list the layer's calls (``calls`` in
        specs/op_records.yaml; :func:`ndcost.plugins.op_records.policy_unpriced`).
        """
        from ndcost.plugins import op_records
        name, policy = self._policy(runtime)
        if policy is None:
            why = f"checkpoint_policy/{name} is not registered" if name else None
        elif policy.scope != "layer":
            why = None
        else:
            kernel = self.attention_kernel(spec, runtime)
            values = op_records.values_for(spec, kind, seq=1, attention=kernel,
                                           overrides=self._overrides(spec, runtime))
            why = op_records.policy_unpriced(values, op_records.attention_kernel(kernel).call)
        return None if why is None else (
            f"runtime {runtime}'s selective is checkpoint_policy/{name}, which the formulas do not price for this "
            f"layer ({why}): use census='auto' (pip install 'ndcost[census]'), or recompute=core_attention "
            f"(Megatron-LM's selective) or full")

    def core_attention_kept(self, spec: ModelSpec, kinds: Sequence[str], seq: int,
                            runtime: str) -> Dict[str, Tuple[float, float]]:
        """Per kind, bytes a token (not split, split by TP) a layer keeps under core-attention recompute."""
        from ndcost.plugins import op_records
        kernel, overrides = self.attention_kernel(spec, runtime), self._overrides(spec, runtime)
        out = {}
        for kind in kinds:
            values = op_records.values_for(spec, kind, seq=seq, micro_batch=1, tp=1, sp=False, cp=1,
                                           attention=kernel, overrides=overrides)
            kept = {"sequence": 0.0, "tp": 0.0}
            core = {"sequence": 0.0, "tp": 0.0}
            for *_, split, value in op_records.term_bytes(values, None):
                kept[split] = kept.get(split, 0.0) + float(value)
            for *_, split, value in op_records.term_bytes(values, "core_attention"):
                core[split] = core.get(split, 0.0) + float(value)
            out[kind] = ((kept["sequence"] - core["sequence"]) / seq, (kept["tp"] - core["tp"]) / seq)
        return out

    def routed_bytes(self, spec: ModelSpec, kind: str, seq: int,
                     runtime: Optional[str] = None) -> Tuple[float, float]:
        """A MoE kind's routed experts' bytes a token at TP 1: (all of them, the part one expert's width scales).

        Read off the formulas by doubling the routed tokens and halving the
        experts' width (``dropless_tok_factor``, ``etp``), so whatever the
        records count for the routed experts is what imbalance and ETP scale;
        under *runtime*, as its fused modules keep them (``op_records.runtime_values``).
        """
        from ndcost.plugins import op_records
        profile = None if runtime is None else _registry().find(f"runtime/{runtime}")
        fused = op_records.runtime_values(spec, kind, profile)

        def total(**overrides: Any) -> float:
            values = op_records.values_for(spec, kind, seq=seq, micro_batch=1, tp=1, sp=False, cp=1,
                                           overrides={**fused, **overrides})
            return float(op_records.total_bytes(values))

        base = total(dropless_tok_factor=1, etp=1)
        doubled = total(dropless_tok_factor=2, etp=1)
        halved = total(dropless_tok_factor=1, etp=2)
        return (doubled - base) / seq, 2 * (base - halved) / seq


@hookimpl
def ndcost_register(register):
    from ndcost.plugins import census  # torch-free until a census runs
    register("census/kind_records", census.kind_records)
    register("census/output_record", census.output_record)
    from ndcost.plugins.census import modules  # torch-free until a model is built
    register("census/module_parameters", modules.module_parameters)
    for estimator in (CensusActivations(), CensusActivations(name="stack_census", stack=True,
                                                               description="census over the whole stack, for "
                                                                           "layers that cannot run alone"),
                      OpRecordsActivations()):
        register(f"estimator/activations/{estimator.name}", estimator)
