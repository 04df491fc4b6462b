"""What an estimator tells the resolver about one layer kind: the KindRecord.

Formulas, op records and the census each produce KindRecords; the resolver
composes them with a strategy. Activation figures are bytes per token of a
micro-batch of one sequence at ``seq`` tokens, TP 1; a rank at TP t keeps
``x + x_tp / t``. FLOPs are a whole layer's forward on one sequence.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple

import attrs

from ndcost.values import frozen_mapping


def recomputed_shares(decided: Mapping[Tuple[str, bool], float]) -> Dict[str, float]:
    """``{"attention", "other", "scores"}``: the fraction of each the backward runs again, from what an op-level
    selective policy *decided* on, ``{(class, recomputed): amount}``: the FLOPs of a weight matmul of the
    attention's (``attention``), of another part's (``other``), of a matmul of no weight (``scores``: eager
    attention's, a reference linear recurrence's), and a fused attention or recurrence kernel's calls
    (``kernel``). ``scores`` is the kernel calls' fraction where a fused kernel ran, else the weightless
    matmuls'; a class nothing was decided on has 0."""
    def share(name: str) -> float:
        again, once = decided.get((name, True), 0), decided.get((name, False), 0)
        return 0.0 if again + once == 0 else float(again / (again + once))
    kernel = decided.get(("kernel", True), 0) + decided.get(("kernel", False), 0)
    return {"attention": share("attention"), "other": share("other"), "scores": share("kernel" if kernel else "scores")}


def routed_in_record(measured: bool, routed_bytes: float, width_bytes: float) -> Tuple[float, float]:
    """Where a MoE kind's routed experts' bytes a token (the op records': all of them, and the part one expert's
    width scales) sit in its KindRecord: ``(in saved_per_token, in saved_tp_per_token)``. The census measures a
    TP 2 rank with every width halved, the experts' too, so it files their width's part under TP; the op records
    state them unsplit (ep and etp split the experts, not tp)."""
    return (routed_bytes - width_bytes, width_bytes) if measured else (routed_bytes, 0.0)


@attrs.frozen(kw_only=True)
class KindRecord:
    """One layer kind's measured or analytic figures, and which plugin produced them (``source``)."""

    kind: str
    seq: int
    source: str
    saved_per_token: float
    saved_tp_per_token: float
    working_per_token: Optional[float] = None
    working_tp_per_token: Optional[float] = None
    # What the working figure leaves out: the layer's input where no op saves it (bytes a token; a
    # checkpoint keeping the input holds it besides), and the share of the layer's parameter gradients
    # made by the working moment (the memory model adds them). None: the input is in the working
    # figure, and every gradient of the layer is counted at that moment.
    working_input_per_token: Optional[float] = None
    working_grad_share: Optional[float] = None
    # The saved and working figures with fp32 parameters under bf16 autocast: the residual stream and
    # what the norms keep are fp32, each matmul casts its fp32 input anew (autocast caches only the
    # weights' casts, which the memory model prices with the parameters). None: not measured, and the
    # memory model applies the figures above.
    autocast_saved_per_token: Optional[float] = None
    autocast_saved_tp_per_token: Optional[float] = None
    autocast_working_per_token: Optional[float] = None
    autocast_working_tp_per_token: Optional[float] = None
    # The caching allocator's reserved bytes above the allocated ones (ndcost.allocator.stack_excess over the
    # census's allocation events, TP split alike): each kept layer's steady share, and the rest at the working
    # peak (first layer's segments, last layer's backward), once a stage; the output layer's record states the
    # working figure alone (its forward and backward replayed once); a stack census replays each layer's windows
    # of the whole stack's events. None: not simulated (the formulas, op records), and the composition claims no
    # reserved figure.
    reserved_per_layer_per_token: Optional[float] = None
    reserved_per_layer_tp_per_token: Optional[float] = None
    reserved_working_per_token: Optional[float] = None
    reserved_working_tp_per_token: Optional[float] = None
    # The same under the runtime's selective checkpoint policy (the census's selective passes replayed: the
    # checkpoint's kept tensors, the backward's recomputation). None: not simulated, and recompute=selective
    # claims no reserved figure.
    reserved_selective_per_layer_per_token: Optional[float] = None
    reserved_selective_per_layer_tp_per_token: Optional[float] = None
    reserved_selective_working_per_token: Optional[float] = None
    reserved_selective_working_tp_per_token: Optional[float] = None
    # And under Megatron-LM's core-attention recompute (checkpoint_policy/megatron-core-attention's pass replayed).
    reserved_core_attention_per_layer_per_token: Optional[float] = None
    reserved_core_attention_per_layer_tp_per_token: Optional[float] = None
    reserved_core_attention_working_per_token: Optional[float] = None
    reserved_core_attention_working_tp_per_token: Optional[float] = None
    # And with fp32 parameters under 16-bit autocast (the census's autocast pass replayed). None: not simulated,
    # and such a strategy claims no reserved figure.
    autocast_reserved_per_layer_per_token: Optional[float] = None
    autocast_reserved_per_layer_tp_per_token: Optional[float] = None
    autocast_reserved_working_per_token: Optional[float] = None
    autocast_reserved_working_tp_per_token: Optional[float] = None
    selective_per_token: Optional[float] = None
    selective_tp_per_token: Optional[float] = None
    # The fractions of the attention's and the other parts' forward weight-matmul FLOPs the runtime's selective
    # policy runs again in the backward, and of the attention's scores (or linear recurrence) it runs again
    # (:func:`recomputed_shares`). None: not stated, or a policy recomputing the attention function alone
    # (scope core_attention), which the time model prices as that function's forward.
    recomputed_attention_mm_share: Optional[float] = None
    recomputed_other_mm_share: Optional[float] = None
    recomputed_scores_share: Optional[float] = None
    ops: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)
    ops_tp: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)
    flops_by_part: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)
    flops_all_pairs_by_part: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)
    # Of flops_by_part, what autograd records no backward for (a module's no_grad work: DeepSeek-V3.2's indexer);
    # the time model prices no backward for it. Empty: none, or a census that did not tell it apart.
    forward_only_flops_by_part: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)
    traffic: Mapping[str, Any] = attrs.field(factory=dict, converter=frozen_mapping)
    # What the layer saves of the tensors its model computes once a forward and hands to every layer, bytes a
    # token by the layer's argument name (``position_embeddings``: Transformers' rotary cos and sin, made from
    # one row of position ids). Every layer of a stage saves the same storage, so these bytes are in none of
    # the figures above (nor the ops): the memory model counts each once a stage and micro-batch in flight,
    # whatever the recompute (a checkpoint keeps them as its inputs). TP does not split them. The autocast
    # mapping: the same with fp32 parameters under autocast (read where the autocast figures are).
    shared_saved_per_token: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)
    autocast_shared_saved_per_token: Mapping[str, float] = attrs.field(factory=dict, converter=frozen_mapping)

    def to_dict(self) -> Dict[str, Any]:
        out = {}
        for a in attrs.fields(type(self)):
            value = getattr(self, a.name)
            out[a.name] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "KindRecord":
        names = {a.name for a in attrs.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
