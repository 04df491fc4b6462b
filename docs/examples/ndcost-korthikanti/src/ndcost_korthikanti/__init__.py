"""A third-party activations estimator: Korthikanti et al. 2022's closed form for a GPT layer.

V. Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
Models" (2022), section 4 and Table 2: one layer at sequence length ``s``,
micro-batch ``b``, hidden ``h`` and ``a`` heads keeps ``sbh (34 + 5 as/h)``
bytes without parallelism, and ``sbh (10 + 24/t + 5 as/(ht))`` on a rank of
tensor parallelism ``t``; recomputing the attention core (their selective
recompute) drops the ``5 as/h`` term. So per token at TP 1 (a
:class:`~ndcost.records.KindRecord`): ``10 h`` bytes TP does not split and
``24 h + 5 a s`` it does.

The paper assumes what it counts: 16-bit activations, 1-byte dropout masks,
eager attention (the scores materialized) with dropout on the probabilities
and on both residual branches, a 4h GELU MLP and multi-head (not grouped)
attention. :meth:`KorthikantiActivations.available` declines any other layer
or runtime, with why, and the resolver moves on to the family's next
estimator. It leaves out what the paper leaves out: the norms' fp32
statistics, and what a layer's backward holds beyond what it keeps (its
working peak: None here). Its selective figure is the paper's (the attention
core recomputed): :meth:`KorthikantiActivations.selective_unpriced` says so
where a runtime runs another checkpoint policy, and the resolver leaves
``recompute=selective`` to the family's next estimator there.

The estimator is registered as ``estimator/activations/korthikanti``; a
family prices a kind with it where its ``activation_estimators`` names it.
``GPT2Korthikanti`` is ndcost's GPT-2 family preferring it, registered with
``override=True`` over the built-in ``family/gpt2``.
"""
from __future__ import annotations

from typing import Optional

import attrs

import ndcost
from ndcost.plugins.estimators.activations import analytic_output_record
from ndcost.plugins.families.gpt2 import GPT2Family
from ndcost.records import KindRecord

__version__ = "0.1.0"
NAME = "korthikanti"


@attrs.frozen(kw_only=True)
class KorthikantiActivations:
    """``estimator/activations/korthikanti``: meets ndcost.protocols.ActivationsEstimator."""

    name: str = NAME
    needs_census: bool = False  # a closed form: census="off" still uses it
    description: str = "Korthikanti et al. 2022, Table 2: sbh (34 + 5as/h) bytes a GPT layer"

    def available(self, spec, runtime) -> Optional[str]:
        from ndcost import manager
        from ndcost.plugins.op_records import runtime_attention

        profile = None if runtime is None else manager.registry().find(f"runtime/{runtime}")
        if profile is None:
            return f"no runtime profile {runtime!r} says which attention kernel runs"
        kernel = runtime_attention(spec, profile)  # the profile's, or its fallback where the family refuses SDPA
        if kernel != "eager":
            return f"the closed form assumes eager attention; runtime {runtime!r} runs {kernel}"
        for kind, layer in spec.kind_specs.items():
            if (layer.attention_class != "softmax" or layer.routed or layer.mlp_matrices != 2
                    or spec.num_key_value_heads not in (None, spec.num_attention_heads)
                    or spec.intermediate_size != 4 * spec.hidden_size
                    or not (layer.attention_dropout and layer.hidden_dropout)):
                return (f"kind {kind!r} is not the paper's GPT layer (multi-head attention with dropout, "
                        f"a 4h two-matrix MLP)")
        return None

    def records(self, spec, kinds, seq, runtime):
        h, a = spec.hidden_size, spec.num_attention_heads
        record = {kind: KindRecord(kind=kind, seq=seq, source=NAME,
                                   saved_per_token=10 * h, saved_tp_per_token=24 * h + 5 * a * seq,
                                   selective_per_token=10 * h, selective_tp_per_token=24 * h)
                  for kind in kinds}
        return record, analytic_output_record(spec, seq)  # the output layer: ndcost's analytic record

    def selective_unpriced(self, spec, kind, runtime) -> Optional[str]:
        """Why the paper's selective figure (the attention core recomputed) is not ``recompute=selective`` under
        *runtime*, whose checkpoint policy may be another (torchtitan's op-level one), or None."""
        from ndcost import manager

        profile = None if runtime is None else manager.registry().find(f"runtime/{runtime}")
        policy = None if profile is None else manager.registry().find(f"checkpoint_policy/{profile.selective_policy}")
        if profile is None or (policy is not None and policy.scope == "core_attention"):
            return None
        return (f"the paper's selective recompute is the attention core's; runtime {runtime}'s is "
                f"checkpoint_policy/{profile.selective_policy}")


class GPT2Korthikanti(GPT2Family):
    """ndcost's GPT-2 family, pricing its layers by the closed form first, then as the built-in does."""

    def activation_estimators(self, spec, kind):
        return (NAME,) + tuple(super().activation_estimators(spec, kind))


@ndcost.hookimpl
def ndcost_register(register):
    register(f"estimator/activations/{NAME}", KorthikantiActivations())
    register("family/gpt2", GPT2Korthikanti(), override=True)
